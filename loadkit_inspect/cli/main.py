"""``loadkit inspect CHECKPOINT [--model SPEC] [--mapper RULES] [--json] [--debug] ...``.

Exit status: 0 the checkpoint would load cleanly (without ``--model``: its headers are valid;
an inconsistent index is listed, not failed, unless ``--strict-index``), 1 it would not (or a
tensor the index names cannot be read), 2 the command could not run on this input (a clear
one-line message on stderr; with ``--json`` also a JSON ``{"error": ..., "exit_status": 2}``
on stdout), 3 an unexpected
internal error (one line; the traceback only with ``--debug``). Without ``--model`` torch is
never imported. An inspect that runs over 2 seconds shows a progress bar on stderr when stderr
is a terminal (not with ``--json``). Names and paths are printed escaped: a control character
in a tensor name never reaches the terminal raw.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from loadkit.errors import LoadkitError, printable
from loadkit_inspect.cli.arguments import InspectCommand, RenameCommand, parse_command
from loadkit_inspect.inspector import inspect_checkpoint
from loadkit_inspect.options import LoadRules

EXIT_CLEAN, EXIT_WOULD_NOT_LOAD, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # as shells report SIGINT

# The cyclic collector's thresholds while a command runs (Python's default: 700, 10, 10).
GC_THRESHOLDS = (10_000, 50, 100)


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Run the block with the cyclic garbage collector's thresholds raised, then restore them.

    An inspect keeps a few records per checkpoint key until it prints (200,000 keys: millions of
    objects, nearly none of them garbage), and with the default thresholds the collector walks
    them all again and again: a third of a large inspect's time. Collections still happen, only
    rarer. The command's own scope, never the library's: ``inspect_checkpoint`` leaves the
    collector alone.

    Example:
        >>> with fewer_collections():
        ...     gc.get_threshold() == GC_THRESHOLDS
        True
    """
    before = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)


def _fail(message: str, status: int, as_json: bool, command: str = "inspect") -> int:
    line = printable(message)
    kind = "error" if status == EXIT_BAD_INPUT else "internal error"
    print(f"loadkit {command}: {kind}: {line}", file=sys.stderr)
    if as_json:
        print(json.dumps({"error": message, "exit_status": status}))
    return status


def inspect_command(command: InspectCommand) -> int:
    """Inspect as ``command`` says, print the report; returns the exit status. A progress bar
    shows on stderr for a long inspect, only where stderr is a terminal and never with
    ``--json`` (a log or a pipe would keep every frame of it)."""
    options = command.options
    if not command.json and sys.stderr is not None and sys.stderr.isatty():
        options = {**options, "progress": True}
    if options["model"] is None and (
        options["model_args"] or options["rules"] != LoadRules() or options["probe"]
    ):
        return _fail("--model-arg, the load rules and --probe need a --model", EXIT_BAD_INPUT,
                     command.json)  # fmt: skip
    try:
        report = inspect_checkpoint(command.checkpoint, **options)
        text = report.to_json() if command.json else report.render(limit=command.limit)
    except LoadkitError as exc:
        cause = exc.__cause__ or exc.__context__
        if command.debug and cause is not None:  # user code failed inside (a --model callable)
            import traceback

            traceback.print_exception(cause)
        return _fail(str(exc), EXIT_BAD_INPUT, command.json)
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `... | head`: the reader left; the verdict still stands
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return report.exit_status


def rename_command(command: RenameCommand) -> int:
    """Write the renamed checkpoint and say what was written; returns the exit status."""
    from loadkit_inspect.rename import rename_checkpoint

    try:
        done = rename_checkpoint(
            command.src, command.dst, mapper=command.mapper, in_place=command.in_place
        )
    except (LoadkitError, OSError) as exc:  # the source, the rules or the target refused
        return _fail(str(exc), EXIT_BAD_INPUT, command.json, "rename")
    print(json.dumps(done.as_dict()) if command.json else "\n".join(done.lines()))
    return EXIT_CLEAN


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``loadkit`` with ``argv``; returns the exit status (never raises)."""
    try:
        command = parse_command(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    try:
        with fewer_collections():
            if isinstance(command, RenameCommand):
                return rename_command(command)
            return inspect_command(command)
    except KeyboardInterrupt:
        print(f"loadkit {_name(command)}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BaseException as exc:  # a bug, or user code that escaped every check: one line
        if command.debug:
            import traceback

            traceback.print_exc()
        message = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
        hint = "" if command.debug else " (rerun with --debug for the traceback)"
        return _fail(message + hint, EXIT_INTERNAL, command.json, _name(command))


def _name(command: InspectCommand | RenameCommand) -> str:
    return "rename" if isinstance(command, RenameCommand) else "inspect"


def entry() -> None:
    """The ``loadkit`` console script: ``loadkit inspect CHECKPOINT ...``."""
    raise SystemExit(main())
