"""``python -m loadkit inspect CHECKPOINT [--model SPEC] [--mapper RULES] [--json] [--debug]``.

Exit status: 0 the checkpoint would load cleanly (without ``--model``: its headers are valid),
1 it would not, 2 the command could not run on this input (a clear one-line message on stderr;
with ``--json`` also a JSON ``{"error": ..., "exit_status": 2}`` on stdout), 3 an unexpected
internal error (one line; the traceback only with ``--debug``). Without ``--model`` torch is
never imported. Names and paths are printed escaped: a control character in a tensor name never
reaches the terminal raw.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from loadkit.errors import printable

EXIT_CLEAN, EXIT_WOULD_NOT_LOAD, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # as shells report SIGINT

INSPECT_DESCRIPTION = """\
Header-only report of a safetensors checkpoint: its key tree (tensor counts and bytes per
prefix), dtypes and shards. With --model, a load simulated on the meta device: which mapper rule
fired for which key, the pooling probe's verdict (old and new), unexpected and missing names with
the nearest names, shape mismatches and dtype casts."""

INSPECT_EPILOG = """\
exit status: 0 would load cleanly (no --model: headers valid), 1 would not load,
2 could not run on this input (unreadable checkpoint, bad --model or --mapper, bad arguments),
3 internal error (a bug: rerun with --debug for the traceback).

examples:
  python -m loadkit inspect model.safetensors
  python -m loadkit inspect path/to/folder --model plamo2
  python -m loadkit inspect path/to/hf-checkpoint --model hf
  python -m loadkit inspect ckpt.safetensors --model mypkg.models:build --json"""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    return max(value, 1)


class _Parser(argparse.ArgumentParser):
    """Help names the registry's built-in models, imported only when help is printed."""

    def format_help(self) -> str:
        from loadkit.models.registry import BUILTIN

        for action in self._actions:
            if action.help and "BUILTINS" in action.help:
                action.help = action.help.replace("BUILTINS", ", ".join(BUILTIN))
        return super().format_help()


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's formatter, told the terminal's width: left to itself it imports shutil (and
    with it bz2, lzma and zlib), a fifth of a header-only inspect's own import time."""

    def __init__(self, prog: str) -> None:
        try:
            columns = int(os.environ.get("COLUMNS", "")) or os.get_terminal_size().columns
        except (ValueError, OSError):
            columns = 80
        super().__init__(prog, width=max(columns - 2, 40))


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m loadkit`` parser (one command: ``inspect``)."""
    parser = _Parser(
        prog="python -m loadkit",
        description="See where a checkpoint's names meet a model's names, before loading.",
        formatter_class=_Formatter,
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    inspect = commands.add_parser(
        "inspect",
        help="report a checkpoint's layout, and how it would load into a model",
        description=INSPECT_DESCRIPTION,
        epilog=INSPECT_EPILOG,
        formatter_class=_Formatter,
    )
    inspect.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        help="a .safetensors file, a folder of shards, or a folder with "
        "model.safetensors.index.json",
    )
    inspect.add_argument(
        "--model",
        metavar="SPEC",
        help="hf: any Hugging Face architecture, from the config.json next to the checkpoint "
        "(hf:PATH: another config file or folder; hf-causal, hf-embed, hf-classify name the "
        "wrapper), built by transformers and wrapped as vLLM's Transformers backend does; a "
        "built-in model (BUILTINS; sized from the checkpoint's shapes); or "
        "'package.module:callable' (or 'file.py:callable') returning an nn.Module. Built on "
        "the meta device",
    )
    inspect.add_argument(
        "--mapper",
        metavar="RULES",
        help="WeightsMapper rules as JSON, or a JSON file's path, e.g. "
        '\'{"orig_to_new_prefix": {"model.": ""}}\'; replaces the model\'s hf_to_vllm_mapper',
    )
    inspect.add_argument("--json", action="store_true", help="print the report as one JSON line")
    inspect.add_argument(
        "--limit",
        metavar="N",
        type=_positive_int,
        default=20,
        help="rows per list in the text report (default 20)",
    )
    inspect.add_argument(
        "--debug",
        action="store_true",
        help="on an internal error, print the traceback (exit status 3 either way)",
    )
    return parser


def parse_inspect(argv: Sequence[str]) -> argparse.Namespace:
    """``inspect``'s arguments (``argv`` without the command), as ``main`` parses them."""
    return build_parser().parse_args(["inspect", *argv])


def _fail(message: str, status: int, as_json: bool) -> int:
    line = printable(message)
    print(f"loadkit inspect: {'error' if status == EXIT_BAD_INPUT else 'internal error'}: {line}",
          file=sys.stderr)  # fmt: skip
    if as_json:
        print(json.dumps({"error": message, "exit_status": status}))
    return status


def inspect_command(args: argparse.Namespace) -> int:
    from loadkit.errors import LoadkitError
    from loadkit.inspection.inspector import inspect_checkpoint

    try:
        report = inspect_checkpoint(
            args.checkpoint, model=args.model, mapper=args.mapper, mapper_label="--mapper"
        )
        text = report.to_json() if args.json else report.render(limit=args.limit)
    except LoadkitError as exc:
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
    try:
        args = build_parser().parse_args(argv)
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
