"""``python -m loadkit inspect CHECKPOINT [--model SPEC] [--mapper RULES] [--json] [--debug] ...``.

Exit status: 0 the checkpoint would load cleanly (without ``--model``: its headers are valid),
1 it would not (or a folder's index disagrees with its shards), 2 the command could not run on
this input (a clear one-line message on stderr;
with ``--json`` also a JSON ``{"error": ..., "exit_status": 2}`` on stdout), 3 an unexpected
internal error (one line; the traceback only with ``--debug``). Without ``--model`` torch is
never imported. Names and paths are printed escaped: a control character in a tensor name never
reaches the terminal raw.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from types import SimpleNamespace

from loadkit.errors import printable

TYPE_CHECKING = False  # typing's, without importing typing (see loadkit.checkpoint.record)
if TYPE_CHECKING:
    import argparse

# ``inspect PATH``, the common call, as ``loadkit.inspection.arguments`` parses it: read without
# building the parser (tests/inspection/test_cli.py holds the two equal).
_PLAIN_DEFAULTS = {
    "command": "inspect", "model": None, "mapper": None, "model_args": (), "tp": None,
    "limit": 20, "debug": False, "skip_prefixes": (), "ignore_unexpected_prefixes": (),
    "ignore_unexpected_suffixes": (), "allow_missing": (), "strict_dtype": False, "probe": False,
    "strict_index": False, "replace_mapper": False, "loader": "all",
}  # fmt: skip

EXIT_CLEAN, EXIT_WOULD_NOT_LOAD, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # as shells report SIGINT


def plain_inspect(argv: Sequence[str]) -> SimpleNamespace | None:
    """``inspect PATH`` with at most ``--json``: the arguments argparse would return, or
    ``None`` for any other command line (which the parser reads)."""
    rest = [a for a in argv[1:] if a != "--json"]
    if not argv or argv[0] != "inspect" or len(argv) > 3 or len(rest) != 1 or rest[0][:1] == "-":
        return None
    return SimpleNamespace(**_PLAIN_DEFAULTS, checkpoint=rest[0], json=len(argv) == 3)


def _fail(message: str, status: int, as_json: bool) -> int:
    line = printable(message)
    print(f"loadkit inspect: {'error' if status == EXIT_BAD_INPUT else 'internal error'}: {line}",
          file=sys.stderr)  # fmt: skip
    if as_json:
        print(json.dumps({"error": message, "exit_status": status}))
    return status


def inspect_command(args: argparse.Namespace | SimpleNamespace) -> int:
    from loadkit.errors import LoadkitError
    from loadkit.inspection.inspector import inspect_checkpoint
    from loadkit.inspection.options import LoadRules

    rules = LoadRules(
        args.skip_prefixes,
        args.ignore_unexpected_prefixes,
        args.ignore_unexpected_suffixes,
        args.allow_missing,
        args.strict_dtype,
    )
    if args.model is None and (args.model_args or rules != LoadRules() or args.probe):
        return _fail("--model-arg, the load rules and --probe need a --model", EXIT_BAD_INPUT,
                     args.json)  # fmt: skip
    try:
        report = inspect_checkpoint(
            args.checkpoint,
            model=args.model,
            mapper=args.mapper,
            mapper_label="--mapper",
            replace_mapper=args.replace_mapper,
            tp=args.tp,
            rules=rules,
            model_args=dict(args.model_args),
            probe=True if args.probe else None,
            strict_index=args.strict_index,
            loader=args.loader,
        )
        text = report.to_json() if args.json else report.render(limit=args.limit)
    except LoadkitError as exc:
        cause = exc.__cause__ or exc.__context__
        if args.debug and cause is not None:  # user code failed inside (a --model callable)
            import traceback

            traceback.print_exception(cause)
        return _fail(str(exc), EXIT_BAD_INPUT, args.json)
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `... | head`: the reader left; the verdict still stands
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return report.exit_status


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``python -m loadkit`` with ``argv``; returns the exit status (never raises)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args: argparse.Namespace | SimpleNamespace | None = plain_inspect(argv)
    if args is None:
        from loadkit.inspection.arguments import build_parser, parse_args

        try:
            args = parse_args(build_parser(), argv)
        except SystemExit as exc:  # argparse: --help (0) or a usage error (2), already printed
            return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    try:
        return inspect_command(args)
    except KeyboardInterrupt:
        print("loadkit inspect: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BaseException as exc:  # a bug, or user code that escaped every check: one line
        if args.debug:
            import traceback

            traceback.print_exc()
        message = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
        hint = "" if args.debug else " (rerun with --debug for the traceback)"
        return _fail(message + hint, EXIT_INTERNAL, args.json)
