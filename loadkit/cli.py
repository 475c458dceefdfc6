"""``python -m loadkit inspect CHECKPOINT [--model SPEC] [--mapper RULES] [--json]``.

Exit status: 0 the checkpoint would load cleanly (without ``--model``: its headers are valid),
1 it would not, 2 the input is unusable (a clear message on stderr; with ``--json`` also a JSON
``{"error": ..., "exit_status": 2}`` on stdout). Without ``--model`` torch is never imported.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

EXIT_CLEAN, EXIT_WOULD_NOT_LOAD, EXIT_BAD_INPUT = 0, 1, 2

EPILOG = """\
exit status: 0 would load cleanly (no --model: headers valid), 1 would not load,
2 unusable input.

examples:
  python -m loadkit inspect data/some.safetensors
  python -m loadkit inspect path/to/folder --model plamo2
  python -m loadkit inspect ckpt.safetensors --model mypkg.models:build --json
  python -m loadkit inspect ckpt.safetensors --mapper '{"orig_to_new_prefix": {"model.": ""}}'
"""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    # argparse builds a formatter for every add_argument, and the default one imports shutil to
    # ask the terminal's width: the width from $COLUMNS is as good and keeps startup short.
    def __init__(self, prog: str, **kwargs: object) -> None:
        kwargs.setdefault("width", max(int(os.environ.get("COLUMNS", "100") or 100), 40) - 2)
        super().__init__(prog, **kwargs)  # type: ignore[arg-type]


def _parser() -> argparse.ArgumentParser:
    from loadkit.models.registry import BUILTIN

    ap = argparse.ArgumentParser(
        prog="python -m loadkit",
        description="See where a checkpoint's names meet a model's names, before loading.",
        formatter_class=_Formatter,
    )
    # An explicit prog spares argparse a help formatter (and its imports) on every run.
    sub = ap.add_subparsers(
        dest="command", required=True, metavar="COMMAND", prog="python -m loadkit"
    )
    ins = sub.add_parser(
        "inspect",
        help="report a checkpoint's layout, and how it would load into a model",
        description="Header-only report of a safetensors checkpoint: its key tree, dtypes and "
        "shards; with --model, a load simulated on the meta device.",
        epilog=EPILOG,
        formatter_class=_Formatter,
    )
    ins.add_argument(
        "checkpoint", help="a .safetensors file, a folder of shards, or a folder with an index"
    )
    ins.add_argument(
        "--model",
        metavar="SPEC",
        help=f"a built-in model ({', '.join(BUILTIN)}; sized from the checkpoint) or "
        "'package.module:callable' (or 'file.py:callable') returning an nn.Module",
    )
    ins.add_argument(
        "--mapper",
        metavar="RULES",
        help="WeightsMapper rules as JSON (or a JSON file's path), e.g. "
        '\'{"orig_to_new_prefix": {"model.": ""}}\'; replaces the model\'s hf_to_vllm_mapper',
    )
    ins.add_argument("--json", action="store_true", help="print the report as one JSON document")
    ins.add_argument(
        "--limit", type=int, default=20, metavar="N", help="rows per list in the text report"
    )
    return ap


def _fail(message: str, as_json: bool) -> int:
    print(f"loadkit inspect: error: {message}", file=sys.stderr)
    if as_json:
        print(json.dumps({"error": message, "exit_status": EXIT_BAD_INPUT}))
    return EXIT_BAD_INPUT


def inspect_command(args: argparse.Namespace) -> int:
    from loadkit.errors import LoadkitError
    from loadkit.inspector import inspect_checkpoint

    try:
        report = inspect_checkpoint(
            args.checkpoint, model=args.model, mapper=args.mapper, mapper_label="--mapper"
        )
    except LoadkitError as exc:
        return _fail(str(exc), args.json)
    if args.json:
        print(report.to_json())
    else:
        print(report.render(limit=max(args.limit, 1)))
    return report.exit_status


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "inspect":
        return inspect_command(args)
    raise AssertionError(args.command)  # argparse rejects other commands
