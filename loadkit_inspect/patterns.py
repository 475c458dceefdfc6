"""The load rules' patterns over both spellings of a name, and the patterns that matched nothing.

A checkpoint key has two spellings: its own (``bert.pooler.dense.bias``) and the name the mapper
gives it (``model.pooler.dense.bias`` for ``--model hf``). A user copies either, so each rule
matches both: ``--skip-prefix`` and the ignore rules a key's checkpoint name or its name after
the mapper; ``--allow-missing`` a missing tensor's model name or the checkpoint name it would have
been loaded from. That last one is the mapper run backwards, which no mapper offers: it is found
by undoing the change of leading components the mapper made to this checkpoint's other keys
(``bert`` -> ``model``), kept only when mapping it forward gives the tensor's name back. Where
no such name maps to it, only its model name is matched. Torch-free.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from loadkit.terms import Status
from loadkit_inspect.report.records import UnmatchedPattern

if TYPE_CHECKING:
    from loadkit.mapper import WeightsMapper
    from loadkit_inspect.options import LoadRules
    from loadkit_inspect.report.records import KeyOutcome, Missing


def _head_change(key: str, mapped: str) -> tuple[str, str] | None:
    """The leading components ``key`` and ``mapped`` differ by, after their shared end:
    ``("bert", "model")`` for ``bert.pooler.w`` -> ``model.pooler.w``; ``None`` when the last
    component itself changed (a renaming of the end, not of the head)."""
    a, b = key.split("."), mapped.split(".")
    shared = 0
    while shared < min(len(a), len(b)) and a[-1 - shared] == b[-1 - shared]:
        shared += 1
    if shared == 0:
        return None
    return ".".join(a[: len(a) - shared]), ".".join(b[: len(b) - shared])


class CheckpointSpelling:
    """The checkpoint names model tensors would have been loaded from, learned from the keys
    the mapper renamed (``mapped`` names) and confirmed by ``mapper`` forward.

    Example:
        >>> from loadkit import WeightsMapper
        >>> mapper = WeightsMapper(orig_to_new_prefix={"bert.": "model."})
        >>> spelling = CheckpointSpelling([("bert.encoder.w", "model.encoder.w")], mapper)
        >>> spelling.names("model.pooler.w"), spelling.names("classifier.w")
        (['bert.pooler.w'], [])
    """

    def __init__(
        self, renamed: Iterable[tuple[str, str | None]], mapper: WeightsMapper | None
    ) -> None:
        self.mapper = mapper
        self._heads: dict[str, list[str]] = {}  # a model-side head -> checkpoint-side heads
        if mapper is None:
            return
        for key, mapped in renamed:
            change = _head_change(key, mapped) if mapped and mapped != key else None
            if change is not None:
                theirs = self._heads.setdefault(change[1], [])
                if change[0] not in theirs:
                    theirs.append(change[0])

    def names(self, tensor: str) -> list[str]:
        """The checkpoint names (other than ``tensor`` itself) the mapper turns into ``tensor``."""
        if self.mapper is None or not self._heads:
            return []
        parts = tensor.split(".")
        out: list[str] = []
        for i in range(len(parts)):  # every head of the name, the empty one first
            head, rest = ".".join(parts[:i]), ".".join(parts[i:])
            for theirs in self._heads.get(head, ()):
                name = f"{theirs}.{rest}" if theirs else rest
                if name != tensor and name not in out and self.mapper.map_name(name) == tensor:
                    out.append(name)
        return out


_OPTIONS = {
    "skip_prefixes": "--skip-prefix",
    "ignore_unexpected_prefixes": "--ignore-unexpected-prefix",
    "ignore_unexpected_suffixes": "--ignore-unexpected-suffix",
    "allow_missing": "--allow-missing",
}


def unmatched_patterns(
    rules: LoadRules,
    keys: Sequence[KeyOutcome],
    missing: Sequence[Missing],
    checkpoint_names: Mapping[str, Sequence[str]],
) -> list[UnmatchedPattern]:
    """Each pattern of ``rules`` that matched nothing: a skip prefix no checkpoint key starts
    with, an ignore rule no key the model has no place for (ignored or unexpected) matches, an
    ``allow_missing`` pattern no missing tensor matches (``checkpoint_names``: tensor -> its
    checkpoint spellings); each in either spelling. A rule the
    walk applied where it found nothing (``cls`` for a ``cls.*`` key) counts as matched."""
    if not any(getattr(rules, rule) for rule in _OPTIONS):
        return []  # no pattern to match: no pass over (perhaps 200,000) keys
    names = [(k.name, k.mapped or "") for k in keys]
    no_place = [k for k in keys if k.status in (Status.IGNORED, Status.UNEXPECTED)]

    def cited(rule: str, pattern: str) -> bool:  # the walk's own rule, or ours (same head)
        said = f"{rule} {pattern!r}"
        return any(k.rule is not None and k.rule.startswith(said) for k in no_place)

    out = []
    for p in rules.skip_prefixes:
        if not any(a.startswith(p) or b.startswith(p) for a, b in names):
            out.append(UnmatchedPattern(_OPTIONS["skip_prefixes"], "skip_prefixes", p))
    for rule, test in (
        ("ignore_unexpected_prefixes", str.startswith),
        ("ignore_unexpected_suffixes", str.endswith),
    ):
        for p in getattr(rules, rule):
            hit = any(test(k.name, p) or test(k.mapped or "", p) for k in no_place)
            if not hit and not cited(rule, p):
                out.append(UnmatchedPattern(_OPTIONS[rule], rule, p))
    for p in rules.allow_missing:
        spelled = ((m.name, *checkpoint_names.get(m.name, ())) for m in missing)
        if not any(fnmatch.fnmatchcase(n, p) for ns in spelled for n in ns):
            out.append(UnmatchedPattern(_OPTIONS["allow_missing"], "allow_missing", p))
    return out
