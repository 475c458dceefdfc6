"""``python -m loadkit inspect CHECKPOINT [--model SPEC] [--mapper RULES] [--json]``.

Exit status: 0 the checkpoint would load cleanly (without ``--model``: its headers are valid),
1 it would not, 2 the input is unusable (a clear message on stderr; with ``--json`` also a JSON
``{"error": ..., "exit_status": 2}`` on stdout). Without ``--model`` torch is never imported.

The arguments are parsed by hand: the grammar is four options, and argparse (with the gettext,
locale and shutil it pulls in) costs more than reading a small checkpoint's headers does.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import NamedTuple

EXIT_CLEAN, EXIT_WOULD_NOT_LOAD, EXIT_BAD_INPUT = 0, 1, 2

USAGE = (
    "usage: python -m loadkit inspect CHECKPOINT [--model SPEC] [--mapper RULES] [--tp N] [--json]"
)
MAIN_HELP = f"""{USAGE}

See where a checkpoint's names meet a model's names, before loading.

commands:
  inspect   report a checkpoint's layout, and how it would load into a model
            (python -m loadkit inspect --help)
"""
INSPECT_HELP = f"""{USAGE} [--limit N]

Header-only report of a safetensors checkpoint: its key tree (tensor counts and bytes per
prefix), dtypes and shards. With --model, a load simulated on the meta device: which mapper rule
fired for which key, the pooling probe's verdict (old and new), unexpected and missing names with
the nearest names, shape mismatches and dtype casts.

positional arguments:
  CHECKPOINT      a .safetensors file, a folder of shards, or a folder with
                  model.safetensors.index.json

options:
  --model SPEC    hf: any Hugging Face architecture, from the config.json next to the
                  checkpoint (hf:PATH: another config file or folder; hf-causal, hf-embed,
                  hf-classify name the wrapper), built by transformers and wrapped as
                  vLLM's Transformers backend does; a built-in model
                  ({{builtin}}; sized from the checkpoint's shapes); or
                  'package.module:callable' (or 'file.py:callable') returning an
                  nn.Module. Built on the meta device
  --mapper RULES  WeightsMapper rules as JSON, or a JSON file's path, e.g.
                  '{{"orig_to_new_prefix": {{"model.": ""}}}}'; replaces the model's
                  hf_to_vllm_mapper
  --json          print the report as one JSON document
  --tp N          also simulate N tensor-parallel ranks (meta device): what each rank
                  would hold (rows of each checkpoint key) and what cannot work (heads or
                  intermediate size not divisible, kv heads replicated, vocabulary padding)
  --limit N       rows per list in the text report (default 20)
  -h, --help      show this help and exit

exit status: 0 would load cleanly (no --model: headers valid), 1 would not load,
2 unusable input.

examples:
  python -m loadkit inspect model.safetensors
  python -m loadkit inspect path/to/folder --model plamo2
  python -m loadkit inspect path/to/hf-checkpoint --model hf
  python -m loadkit inspect ckpt.safetensors --model mypkg.models:build --json
"""


def inspect_help() -> str:
    """``inspect --help``, naming the registry's built-in models (imported only for help).

    >>> "plamo2" in inspect_help()
    True
    """
    from loadkit.models.registry import BUILTIN

    return INSPECT_HELP.replace("{builtin}", ", ".join(BUILTIN))


class UsageError(Exception):
    """Bad command-line arguments (exit status 2, like argparse)."""


class InspectArgs(NamedTuple):
    checkpoint: str
    model: str | None = None
    mapper: str | None = None
    json: bool = False
    limit: int = 20
    tp: int | None = None


def parse_inspect(argv: Sequence[str]) -> InspectArgs | None:
    """Parse ``inspect``'s arguments; ``None`` when help was asked for (and printed)."""
    values: dict[str, str] = {}
    positional: list[str] = []
    as_json = False
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            positional += args[i:]
            break
        if arg in ("-h", "--help"):
            print(inspect_help(), end="")
            return None
        if arg == "--json":
            as_json = True
            continue
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            if name not in ("model", "mapper", "limit", "tp"):
                raise UsageError(f"unrecognized argument: {arg}")
            if not eq:
                if i >= len(args):
                    raise UsageError(f"argument --{name}: expected one argument")
                value = args[i]
                i += 1
            values[name] = value  # a repeated option: the last one wins
            continue
        if arg.startswith("-") and arg != "-":
            raise UsageError(f"unrecognized argument: {arg}")
        positional.append(arg)
    if not positional:
        raise UsageError("the following arguments are required: CHECKPOINT")
    if len(positional) > 1:
        raise UsageError(f"unrecognized arguments: {' '.join(positional[1:])}")
    try:
        limit = int(values.get("limit", "20"))
    except ValueError:
        raise UsageError(f"argument --limit: invalid int value: {values['limit']!r}") from None
    tp = None
    if "tp" in values:
        try:
            tp = int(values["tp"])
        except ValueError:
            raise UsageError(f"argument --tp: invalid int value: {values['tp']!r}") from None
        if tp < 1:
            raise UsageError(f"argument --tp: must be at least 1, not {tp}")
        if values.get("model") is None:
            raise UsageError(
                "argument --tp: needs --model (what a rank holds depends on its layers)"
            )
    return InspectArgs(
        positional[0], values.get("model"), values.get("mapper"), as_json, max(limit, 1), tp
    )


def _fail(message: str, as_json: bool) -> int:
    print(f"loadkit inspect: error: {message}", file=sys.stderr)
    if as_json:
        print(json.dumps({"error": message, "exit_status": EXIT_BAD_INPUT}))
    return EXIT_BAD_INPUT


def inspect_command(args: InspectArgs) -> int:
    from loadkit.errors import LoadkitError
    from loadkit.inspection.inspector import inspect_checkpoint

    try:
        report = inspect_checkpoint(
            args.checkpoint,
            model=args.model,
            mapper=args.mapper,
            mapper_label="--mapper",
            tp=args.tp,
        )
    except LoadkitError as exc:
        return _fail(str(exc), args.json)
    text = report.to_json() if args.json else report.render(limit=args.limit)
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `... | head`: the reader left; the verdict still stands
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return report.exit_status


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if not argv:
            raise UsageError("the following arguments are required: COMMAND")
        command, rest = argv[0], argv[1:]
        if command in ("-h", "--help"):
            print(MAIN_HELP, end="")
            return EXIT_CLEAN
        if command != "inspect":
            raise UsageError(f"unknown command {command!r} (choose from 'inspect')")
        args = parse_inspect(rest)
    except UsageError as exc:
        print(f"{USAGE}\npython -m loadkit: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args is None:
        return EXIT_CLEAN
    return inspect_command(args)
