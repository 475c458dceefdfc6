"""A fix for the loader that takes no mapper: ``loadkit rename``, with the rules that fix the names.

transformers' ``from_pretrained`` has no ``WeightsMapper``: where its unused keys and the
tensors it leaves at random differ the same way (a prefix, a component, a suffix), the fix is a
copy of the checkpoint with its keys renamed (``loadkit_inspect.rename``). The rules are inferred
as the ``--mapper`` suggestions are (``fixes.suggest.infer_rules``), from the pairs
``fixes.renames.pair_renames`` makes of unused keys and missing tensors (same element count,
names sharing the most components, then the same shape); where a loader raises because of the
folder's layout (shards without their index, one file oddly named, index entries vLLM cannot
match), the fix is the same command without rules. Whether it works is the caller's to prove, by
simulating both loaders on the renamed names. Torch-free.

>>> fix = RenameFix("names", {"orig_to_new_prefix": {"model.": ""}}, [], "ck", {})
>>> fix.command()
'loadkit rename ck ck-renamed --mapper \\'{"orig_to_new_prefix": {"model.": ""}}\\''
"""

from __future__ import annotations

import json
import math
import os
import shlex
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from loadkit.errors import LoadkitError, printable
from loadkit_inspect.fixes.renames import Named, pair_renames
from loadkit_inspect.fixes.suggest import (
    Rule,
    Suggestion,
    find_shifts,
    infer_rules,
    mapper_json,
    renumberings,
)
from loadkit_inspect.report.text import capped

if TYPE_CHECKING:
    from loadkit.checkpoint import TensorInfo
    from loadkit.mapper import WeightsMapper

LAYOUT, NAMES = "layout", "names"


class RenameFix(NamedTuple):
    """``loadkit rename SRC DST [--mapper RULES]``: ``kind`` is ``names`` (rules rename keys) or
    ``layout`` (the files alone are laid out anew); ``results``: each loader's verdict (its
    phrase) simulated on what the command writes."""

    kind: str
    rules: dict[str, Any] | None
    suggestions: list[Suggestion]
    src: str
    results: dict[str, str]
    clean: bool = False  # every loader judged would load what it writes cleanly

    def command(self, dst: str | None = None) -> str:
        """The command to run (``dst``: by default ``SRC-renamed`` beside the source)."""
        target = dst or default_dst(self.src)
        out = f"loadkit rename {shlex.quote(self.src)} {shlex.quote(target)}"
        if self.rules:
            out += f" --mapper {shlex.quote(json.dumps(self.rules))}"
        return out

    def render(self, limit: int) -> list[str]:
        why = (
            "it takes no mapper: a copy of the checkpoint with its keys renamed, every tensor's "
            "bytes unchanged"
            if self.kind == NAMES
            else "the files laid out as save_pretrained lays them out, every tensor unchanged"
        )
        lines = [f"suggested fix for transformers  ({why})"]
        rows = [
            f"  {s.rule.stage} {s.rule.old!r} -> {s.rule.new!r}: {len(s.pairs)} keys, e.g. "
            f"{printable(s.pairs[0][0])} -> {printable(s.pairs[0][1])}"
            for s in self.suggestions
        ]
        lines += capped(rows, len(rows), limit, "  ")
        lines.append(f"  {printable(self.command())}")
        said = " | ".join(printable(p) for p in self.results.values())
        lines.append(f"  with what it writes: {said}")
        lines.append(
            "  (simulated on the renamed names; check what it writes: loadkit "
            f"inspect {printable(default_dst(self.src))} --model hf)"
        )
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "rules": self.rules,
            "explains": [
                {
                    "stage": s.rule.stage,
                    "old": s.rule.old,
                    "new": s.rule.new,
                    "keys": len(s.pairs),
                    "example": list(s.pairs[0]),
                }
                for s in self.suggestions
            ],
            "command": self.command(),
            "results": dict(self.results),
            "clean": self.clean,
        }


def new_names(names: Iterable[str], mapper: WeightsMapper | None) -> dict[str, str]:
    """Each key -> its new name under ``mapper`` (unchanged without one); a key the rules drop,
    or two keys given one name, is a ``LoadkitError`` naming them.

    >>> from loadkit.mapper import WeightsMapper
    >>> new_names(["model.a", "b"], WeightsMapper.from_json({"orig_to_new_prefix": {"model.": ""}}))
    {'model.a': 'a', 'b': 'b'}
    """
    out: dict[str, str] = {}
    taken: dict[str, str] = {}
    for name in names:
        new = name if mapper is None else mapper.map_name(name)
        if new is None:
            raise LoadkitError(
                f"key '{printable(name)}': the rules drop it; rename changes names only (every "
                "tensor is written)"
            )
        if new in taken:
            raise LoadkitError(
                f"keys '{printable(taken[new])}' and '{printable(name)}' would both be named "
                f"'{printable(new)}' (a stacked rule fuses tensors; rename changes names only)"
            )
        taken[new] = name
        out[name] = new
    return out


def default_dst(src: str) -> str:
    """Where the suggested command writes: ``SRC-renamed`` beside a folder (or a file's
    folder), ``NAME-renamed`` in the current folder for a repo id.

    >>> default_dst("ckpt/"), default_dst("org/name"), default_dst("a/model.safetensors")
    ('ckpt-renamed', 'name-renamed', 'a-renamed')
    """
    path = src.rstrip("/")
    if os.path.isfile(path) or path.endswith(".safetensors"):
        path = os.path.dirname(path) or "."
    if not os.path.exists(path) and "/" in path and not path.startswith((".", "/")):
        path = path.rsplit("/", 1)[1].split("@", 1)[0]  # a repo id: its name, here
    return f"{path}-renamed"


def rename_rules(fp: Any, infos: Sequence[TensorInfo]) -> list[Suggestion]:
    """Rules that rename the keys ``from_pretrained`` leaves unused into the tensors it leaves
    at random (``[]``: none explains two pairs or more). ``fp``: its simulated lists (a
    ``simulate.from_pretrained.FromPretrained``: ``unexpected``, ``missing``, their ``shapes``,
    the keys it ``renamed``). Numbered siblings off by a constant get one rule per number
    (``suggest.find_shifts``); a rule that would move siblings unevenly (layer 6 into layer 0
    while 1-5 keep their numbers) is never offered (``suggest.renumberings``)."""
    looked_up = {i.name: fp.renamed.get(i.name, i.name) for i in infos}
    unexpected = set(fp.unexpected)
    model_names = [*fp.missing, *(n for n in looked_up.values() if n not in unexpected)]
    shifts = [s for s in find_shifts(looked_up, model_names) if s.anchor is not None]
    shifted = tuple(s.context + "." for s in shifts)
    suggestions = [_shift_suggestion(rule, looked_up) for s in shifts for rule in s.rules()]
    original = {v: k for k, v in fp.renamed.items()}
    by_name = {i.name: i for i in infos}
    unused = []
    for name in fp.unexpected:
        info = by_name.get(original.get(name, name))
        if info is not None and not looked_up[info.name].startswith(shifted):
            unused.append(Named(info.name, info.name, info.numel, tuple(info.shape)))
    missing = [
        Named(m, m, math.prod(fp.shapes[m]), fp.shapes[m])
        for m in fp.missing
        if m in fp.shapes and not m.startswith(shifted)
    ]
    pairs = pair_renames(unused, missing)
    inferred = infer_rules((key, tensor) for tensor, key in pairs.items())
    return suggestions + [s for s in inferred if not _scrambles(s, looked_up)]


def _shift_suggestion(rule: Rule, looked_up: dict[str, str]) -> Suggestion:
    """A shift's rule for one number, with the keys it renames."""
    return Suggestion(rule, [(k, rule.apply(k)) for k in looked_up if rule.apply(k) != k])


def _scrambles(suggestion: Suggestion, looked_up: dict[str, str]) -> bool:
    """Would the rule move numbered siblings unevenly?"""
    after = {k: suggestion.rule.apply(k) for k in looked_up}
    return bool(renumberings({k: k for k in looked_up}, after))


def rules_json(suggestions: Sequence[Suggestion]) -> dict[str, Any]:
    """The suggestions' rules as ``--mapper`` JSON."""
    return mapper_json({}, [s.rule for s in suggestions])
