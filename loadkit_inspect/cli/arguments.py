"""``loadkit``'s command line: the argument parser (argparse), and ``parse_command``, which
reads ``argv`` into one ``InspectCommand`` for ``loadkit_inspect.cli.main``.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from typing import Any, NamedTuple, NoReturn

from loadkit_inspect.options import LoadRules, pattern_problem

INSPECT_DESCRIPTION = """\
Header-only report of a safetensors checkpoint: its key tree (tensor counts and bytes per
prefix), dtypes and shards. With --model, a load simulated on the meta device: which mapper rule
fired for which key, unexpected and missing names with the nearest names, shape mismatches and
dtype casts; for a pooling model (one with is_pooling_model, as loadkit.as_pooling_model makes;
the built-in and hf models are not) or with --probe, the pooling probe's verdict (old and new)."""

INSPECT_EPILOG = """\
exit status: 0 would load cleanly (no --model: headers valid; an inconsistent index is
listed, not failed, unless --strict-index), 1 would not load (or a tensor the index names
cannot be read), 2 could not run on this input (unreadable checkpoint, bad --model,
--model-arg or --mapper, bad arguments), 3 internal error (a bug: rerun with --debug for the
traceback).

examples:
  loadkit inspect model.safetensors
  loadkit inspect path/to/folder --model plamo2
  loadkit inspect path/to/hf-checkpoint --model hf
  loadkit inspect org/name@main --model hf
  loadkit inspect https://host/path/model.safetensors.index.json
  loadkit inspect ckpt.safetensors --model mypkg.models:build --json
  loadkit inspect bert --model mypkg:classifier --model-arg num_labels=3 \\
      --ignore-unexpected-prefix cls. --allow-missing 'classifier.*'"""


def _limit(text: str) -> int:
    """``--limit N``: rows per list; 0 lists none (each list says how many it left out)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def _tp(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _pattern(text: str) -> str:
    problem = pattern_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"invalid pattern {text!r}: {problem}")
    return text


def model_arg(text: str) -> tuple[str, Any]:
    """``--model-arg KEY=VALUE``: VALUE as JSON when it parses, else the string itself.

    >>> model_arg("num_labels=3"), model_arg("name=bert"), model_arg("x=[1, 2]")
    (('num_labels', 3), ('name', 'bert'), ('x', [1, 2]))
    """
    key, eq, value = text.partition("=")
    if not eq or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except (ValueError, RecursionError):  # not JSON, a number too long for int(), deep nesting
        return key, value


class _Parser(argparse.ArgumentParser):
    """Help names the registry's built-in models, imported only when help is printed. A usage
    error is two lines (what is wrong, then where to look), not argparse's wrapped usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\nsee: {self.prog} --help\n")

    def format_help(self) -> str:
        from loadkit_inspect.models.registry import BUILTIN

        for action in self._actions:
            if action.help and "BUILTINS" in action.help:
                action.help = action.help.replace("BUILTINS", ", ".join(BUILTIN))
        return super().format_help()


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's formatter, told the terminal's width: left to itself it imports shutil (and
    with it bz2, lzma and zlib) for every command that goes through the parser."""

    def __init__(self, prog: str) -> None:
        try:
            columns = int(os.environ.get("COLUMNS", "")) or os.get_terminal_size().columns
        except (ValueError, OSError):
            columns = 80
        super().__init__(prog, width=max(columns - 2, 40))


RENAME_DESCRIPTION = """\
Write SRC's tensors to DST under new names: each key renamed by the WeightsMapper rules of
--mapper (the same JSON as inspect's, read as "checkpoint key -> its new name"), every tensor's
bytes copied unchanged, laid out as save_pretrained lays a checkpoint out (model.safetensors, or
shards and model.safetensors.index.json); the other files of SRC (config.json...) are copied
beside them. Without --mapper only the layout changes (shards without their index, one file
oddly named). The tensors are those vLLM reads from SRC. SRC is never changed unless
--in-place."""

RENAME_EPILOG = """\
exit status: 0 written, 2 could not (SRC unreadable, a rule that drops a key or gives two keys
one name, DST not empty), 3 internal error.

examples:
  loadkit rename path/to/ckpt path/to/fixed --mapper '{"orig_to_new_prefix": {"model.": ""}}'
  loadkit rename path/to/shards-without-index path/to/fixed
  loadkit inspect path/to/fixed --model hf"""


def build_parser() -> argparse.ArgumentParser:
    """The ``loadkit`` parser: ``inspect`` and ``rename``."""
    parser = _Parser(
        prog="loadkit",
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
    inspect.set_defaults(command_parser=inspect)
    _add_inputs(inspect)
    _add_output(inspect)
    _add_rules(inspect)
    _add_verdict(inspect)
    _add_rename(commands)
    return parser


def _add_rename(commands: Any) -> None:
    """``loadkit rename SRC DST [--mapper RULES] [--in-place] [--json] [--debug]``."""
    rename = commands.add_parser(
        "rename",
        help="write a checkpoint's tensors under new names (a fix for a loader without a mapper)",
        description=RENAME_DESCRIPTION,
        epilog=RENAME_EPILOG,
        formatter_class=_Formatter,
    )
    rename.set_defaults(command_parser=rename)
    rename.add_argument("src", metavar="SRC", help="a .safetensors file, a folder or a repo id")
    rename.add_argument("dst", metavar="DST", nargs="?", help="a new (or empty) folder")
    rename.add_argument(
        "--mapper",
        metavar="RULES",
        help="WeightsMapper rules as JSON, or a JSON file's path: each key's new name",
    )
    rename.add_argument(
        "--in-place", action="store_true", help="replace SRC's weight files and index"
    )
    rename.add_argument("--json", action="store_true", help="print what was written as JSON")
    rename.add_argument("--debug", action="store_true", help="on an internal error, the traceback")


def _add_inputs(inspect: argparse.ArgumentParser) -> None:
    """The checkpoint, the model, its arguments and the mapper."""
    inspect.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        help="a .safetensors file, a folder of shards, or a folder with "
        "model.safetensors.index.json; or a Hugging Face repo id (org/name[@revision], from the "
        "local cache), or an http(s) URL of a .safetensors file or an index (headers only)",
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
        '\'{"orig_to_new_prefix": {"model.": ""}}\'; added after the model\'s own rules, '
        "stage by stage (see --replace-mapper)",
    )
    inspect.add_argument(
        "--replace-mapper",
        action="store_true",
        help="--mapper replaces the model's own mapper (hf_to_vllm_mapper and the one its root "
        "AutoWeightsLoader is given) instead of extending it",
    )
    inspect.add_argument(
        "--model-arg",
        metavar="KEY=VALUE",
        dest="model_args",
        action="append",
        type=model_arg,
        default=[],
        help="a keyword argument for a callable --model (repeatable); VALUE is read as JSON "
        'when it parses (3, true, "x"), else as a string',
    )


def _add_output(inspect: argparse.ArgumentParser) -> None:
    """What the report shows and how: JSON, the tensor-parallel ranks, list lengths, tracebacks."""
    inspect.add_argument("--json", action="store_true", help="print the report as one JSON line")
    inspect.add_argument(
        "--tp",
        metavar="N",
        type=_tp,
        help="also simulate N tensor-parallel ranks (meta device): what each rank would hold "
        "(rows of each checkpoint key) and what cannot work (heads or intermediate size not "
        "divisible, kv heads replicated, vocabulary padding)",
    )
    inspect.add_argument(
        "--limit",
        metavar="N",
        type=_limit,
        default=20,
        help="rows per list in the text report (default 20; 0: no rows, each list still says "
        "how many it holds); --json has every row",
    )
    inspect.add_argument(
        "--debug",
        action="store_true",
        help="on an internal error, print the traceback (exit status 3 either way)",
    )


def _add_rules(inspect: argparse.ArgumentParser) -> None:
    """The load rules, as the model's root ``AutoWeightsLoader`` applies them, in their group."""
    rules = inspect.add_argument_group(
        "rules",
        "as the model's root AutoWeightsLoader applies them; each repeatable, matching a\n"
        "checkpoint name or a model name; a pattern that matches nothing is a warning",
    )
    for flag, dest, metavar, text in [
        ("--skip-prefix", "skip_prefixes", "P", "skip keys whose name starts with P"),
        (
            "--ignore-unexpected-prefix",
            "ignore_unexpected_prefixes",
            "P",
            "a name the model lacks is ignored when it starts with P",
        ),
        (
            "--ignore-unexpected-suffix",
            "ignore_unexpected_suffixes",
            "S",
            "... or when it ends with S",
        ),
    ]:
        rules.add_argument(flag, dest=dest, metavar=metavar, action="append", default=[], help=text)
    rules.add_argument(
        "--allow-missing",
        dest="allow_missing",
        metavar="PATTERN",
        type=_pattern,
        action="append",
        default=[],
        help="model tensors matching PATTERN (shell-style, e.g. 'classifier.*') may stay unfilled",
    )
    rules.add_argument(
        "--strict-dtype",
        action="store_true",
        help="any dtype cast fails the load (by default only incompatible casts do: float into "
        "int, ...)",
    )


def _add_verdict(inspect: argparse.ArgumentParser) -> None:
    """What decides the verdict (``--loader``, ``--strict-index``), and ``--probe``."""
    inspect.add_argument(
        "--loader",
        choices=("all", "vllm", "transformers"),
        default="all",
        help="whose verdict decides the exit status: vllm (the model's vLLM loading code; "
        "--model hf: vLLM's Transformers backend), transformers (--model hf only: "
        "PreTrainedModel.from_pretrained), or all the model has (default)",
    )
    inspect.add_argument(
        "--model-impl",
        choices=("auto", "vllm", "transformers"),
        default="auto",
        help="with --model hf, the implementation vLLM 0.34.0 is asked for, as its own "
        "--model-impl: auto (its native class where it has one, else the Transformers "
        "backend; default), vllm (native only), transformers (the Transformers backend)",
    )
    inspect.add_argument(
        "--strict-index",
        action="store_true",
        help="an inconsistent index fails (exit 1) even where every tensor still loads (a key "
        "in another shard than it says, a key it does not list, a wrong total_size)",
    )
    inspect.add_argument(  # a report to add, not a load rule: among the options, not "rules:"
        "--probe",
        action="store_true",
        help="report the pooling probe's verdicts for a model that is not a pooling one (only "
        "a model with is_pooling_model, as loadkit.as_pooling_model makes, gets them unasked)",
    )


_REPEATED = ("model_args", "skip_prefixes", "ignore_unexpected_prefixes",
             "ignore_unexpected_suffixes", "allow_missing")  # fmt: skip


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    args, extra = parser.parse_known_args(argv)
    # The command's own errors point at the command's help (``loadkit inspect``)
    command = vars(args).pop("command_parser", parser)
    if extra:
        command.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "rename":
        if (args.dst is None) == (not args.in_place):
            command.error("give DST (a new folder) or --in-place, not both and not neither")
        return args
    for name in _REPEATED:  # hashable, comparable values for the report's rules
        setattr(args, name, tuple(getattr(args, name)))
    if args.tp is not None and args.model is None:
        command.error("argument --tp: needs --model (what a rank holds depends on its layers)")
    return args


def parse_inspect(argv: Sequence[str]) -> argparse.Namespace:
    """``inspect``'s arguments (``argv`` without the command), as ``main`` parses them.

    >>> parse_inspect(["ck", "--allow-missing", "a.*", "--model-arg", "n=2"]).model_args
    (('n', 2),)
    """
    return parse_args(build_parser(), ["inspect", *argv])


class InspectCommand(NamedTuple):
    """``loadkit inspect``'s command line as one record: ``inspect_checkpoint``'s arguments
    (``checkpoint`` and the keywords the flags set, by the keywords' own names), and how the
    report is printed (``--json``, ``--limit``, ``--debug``)."""

    checkpoint: str
    options: dict[str, Any]
    json: bool = False
    limit: int = 20
    debug: bool = False


class RenameCommand(NamedTuple):
    """``loadkit rename``'s command line as one record."""

    src: str
    dst: str | None
    mapper: str | None = None
    in_place: bool = False
    json: bool = False
    debug: bool = False


def parse_command(argv: Sequence[str]) -> InspectCommand | RenameCommand:
    """``argv`` (the command first) as one record; argparse exits on ``--help`` or bad usage.

    >>> command = parse_command(["inspect", "ck", "--model", "plamo2", "--strict-dtype"])
    >>> command.options["model"], command.options["rules"].strict_dtype, command.json
    ('plamo2', True, False)
    """
    args = parse_args(build_parser(), argv)
    if args.command == "rename":
        return RenameCommand(args.src, args.dst, args.mapper, args.in_place, args.json, args.debug)
    rules = LoadRules(
        args.skip_prefixes,
        args.ignore_unexpected_prefixes,
        args.ignore_unexpected_suffixes,
        args.allow_missing,
        args.strict_dtype,
    )
    options = {
        "model": args.model,
        "mapper": args.mapper,
        "mapper_label": "--mapper",
        "replace_mapper": args.replace_mapper,
        "rules": rules,
        "model_args": dict(args.model_args),
        "probe": True if args.probe else None,
        "tp": args.tp,
        "strict_index": args.strict_index,
        "loader": args.loader,
        "model_impl": args.model_impl,
    }
    return InspectCommand(args.checkpoint, options, args.json, args.limit, args.debug)
