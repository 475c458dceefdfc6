"""``python -m loadkit inspect CHECKPOINT [--model SPEC] [--mapper RULES] [--json] ...``.

Exit status: 0 the checkpoint would load cleanly (without ``--model``: its headers are valid),
1 it would not (or a folder's index disagrees with its shards), 2 nothing can be read or the
command cannot run (a clear message on stderr; with ``--json`` also a JSON ``{"error": ...,
"exit_status": 2}`` on stdout). Without ``--model`` torch is never imported.

The arguments are parsed by hand: the grammar is a dozen options, and argparse (with the gettext,
locale and shutil it pulls in) costs more than reading a small checkpoint's headers does.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

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
  --model-arg KEY=VALUE
                  a keyword argument for a callable --model (repeatable); VALUE is read
                  as JSON when it parses (3, true, "x"), else as a string
  --json          print the report as one JSON document
  --tp N          also simulate N tensor-parallel ranks (meta device): what each rank
                  would hold (rows of each checkpoint key) and what cannot work (heads or
                  intermediate size not divisible, kv heads replicated, vocabulary padding)
  --limit N       rows per list in the text report (default 20)
  -h, --help      show this help and exit

rules (as the model's root AutoWeightsLoader applies them; each repeatable):
  --skip-prefix P              skip names (after the mapper) starting with P
  --ignore-unexpected-prefix P
                               a name the model lacks is ignored when it starts with P
  --ignore-unexpected-suffix S
                               ... or when it ends with S
  --allow-missing PATTERN      model tensors matching PATTERN (shell-style, e.g.
                               'classifier.*') may stay unfilled
  --strict-dtype               any dtype cast fails the load (by default only
                               incompatible casts do: float into int, ...)
  --probe                      report the pooling probe's verdicts for a model that is
                               not a pooling one (a pooling model always gets them)

exit status: 0 would load cleanly (no --model: headers valid), 1 would not load (or a
folder's index disagrees with its shards: every problem is listed), 2 nothing can be read or
the command cannot run (bad --model, --model-arg or --mapper).

examples:
  python -m loadkit inspect model.safetensors
  python -m loadkit inspect path/to/folder --model plamo2
  python -m loadkit inspect path/to/hf-checkpoint --model hf
  python -m loadkit inspect ckpt.safetensors --model mypkg.models:build --json
  python -m loadkit inspect bert --model mypkg:classifier --model-arg num_labels=3 \\
      --ignore-unexpected-prefix cls. --allow-missing 'classifier.*'
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
    model_args: tuple[tuple[str, Any], ...] = ()
    skip_prefixes: tuple[str, ...] = ()
    ignore_unexpected_prefixes: tuple[str, ...] = ()
    ignore_unexpected_suffixes: tuple[str, ...] = ()
    allow_missing: tuple[str, ...] = ()
    strict_dtype: bool = False
    probe: bool = False


_FLAGS = {"json", "strict-dtype", "probe"}  # options without a value
_SINGLE = {"model", "mapper", "limit", "tp"}  # a repeated one: the last wins
_REPEATED = {  # option -> InspectArgs field
    "model-arg": "model_args",
    "skip-prefix": "skip_prefixes",
    "ignore-unexpected-prefix": "ignore_unexpected_prefixes",
    "ignore-unexpected-suffix": "ignore_unexpected_suffixes",
    "allow-missing": "allow_missing",
}


def model_arg(text: str) -> tuple[str, Any]:
    """``--model-arg KEY=VALUE``: VALUE as JSON when it parses, else the string itself.

    >>> model_arg("num_labels=3"), model_arg("name=bert"), model_arg("x=[1, 2]")
    (('num_labels', 3), ('name', 'bert'), ('x', [1, 2]))
    """
    key, eq, value = text.partition("=")
    if not eq or not key.isidentifier():
        raise UsageError(f"argument --model-arg: expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:  # JSONDecodeError, or a number too long for int()
        return key, value


def parse_inspect(argv: Sequence[str]) -> InspectArgs | None:
    """Parse ``inspect``'s arguments; ``None`` when help was asked for (and printed)."""
    values: dict[str, str] = {}
    lists: dict[str, list[Any]] = {field: [] for field in _REPEATED.values()}
    flags: set[str] = set()
    positional: list[str] = []
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
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            if name in _FLAGS and not eq:
                flags.add(name)
                continue
            if name not in _SINGLE and name not in _REPEATED:
                raise UsageError(f"unrecognized argument: {arg}")
            if not eq:
                if i >= len(args):
                    raise UsageError(f"argument --{name}: expected one argument")
                value = args[i]
                i += 1
            if name in _REPEATED:
                lists[_REPEATED[name]].append(model_arg(value) if name == "model-arg" else value)
            else:
                values[name] = value
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
        positional[0],
        values.get("model"),
        values.get("mapper"),
        "json" in flags,
        max(limit, 1),
        strict_dtype="strict-dtype" in flags,
        probe="probe" in flags,
        tp=tp,
        **{field: tuple(items) for field, items in lists.items()},
    )


def _fail(message: str, as_json: bool) -> int:
    print(f"loadkit inspect: error: {message}", file=sys.stderr)
    if as_json:
        print(json.dumps({"error": message, "exit_status": EXIT_BAD_INPUT}))
    return EXIT_BAD_INPUT


def inspect_command(args: InspectArgs) -> int:
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
        return _fail("--model-arg, the load rules and --probe need a --model", args.json)
    try:
        report = inspect_checkpoint(
            args.checkpoint,
            model=args.model,
            mapper=args.mapper,
            mapper_label="--mapper",
            tp=args.tp,
            rules=rules,
            model_args=dict(args.model_args),
            probe=True if args.probe else None,
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
