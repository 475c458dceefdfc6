"""The report's suggested fix: mapper rules inferred from the leftovers, proven by a second load.

``suggest.infer_rules`` proposes rules from the pairs of unused keys and missing tensors; here the
rules are added to the mapper the model loads with and the load is simulated again (the caller's
``retry``). Only rules that leave fewer problems are reported, with the verdict they lead to.
Torch-free: the retry is the caller's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loadkit.inspection.records import LoadReport
from loadkit.inspection.suggest import Rule, Suggestion, infer_rules, mapper_json

if TYPE_CHECKING:
    from loadkit.mapper import WeightsMapper

_FIELDS = ("regex", "substr", "stacked", "prefix", "suffix")


@dataclass
class SuggestedFix:
    """Rules that fix (part of) the mismatch, and what the load does with them."""

    suggestions: list[Suggestion]
    mapper: dict[str, Any]  # the whole --mapper: the model's own rules plus the new ones
    complete: bool  # False: the model's own rules could not be written as JSON (only new ones)
    result: LoadReport  # the load simulated again with ``mapper``

    @property
    def rules(self) -> list[Rule]:
        return [s.rule for s in self.suggestions]

    @property
    def explains(self) -> int:
        return sum(len(s.pairs) for s in self.suggestions)

    @property
    def flag(self) -> str:
        """The command-line option to pass."""
        return f"--mapper '{json.dumps(self.mapper)}'"

    def explained_keys(self) -> dict[str, int]:
        """Looked-up key name -> index of the rule that explains it."""
        return {key: i for i, s in enumerate(self.suggestions) for key, _ in s.pairs}

    def as_dict(self) -> dict[str, Any]:
        return {
            "rules": [
                {
                    "stage": s.rule.stage,
                    "old": s.rule.old,
                    "new": s.rule.new,
                    "explains": len(s.pairs),
                    "example": list(s.pairs[0]),
                }
                for s in self.suggestions
            ],
            "mapper": self.mapper,
            "mapper_complete": self.complete,
            "clean": self.result.clean,
            "problems": self.result.problems(),
        }


def mapper_as_json(mapper: WeightsMapper | None) -> dict[str, Any] | None:
    """``mapper``'s rules as ``--mapper`` JSON, or ``None`` when a rule has no JSON form (a
    renaming object, a compiled pattern with flags, a non-string shard id)."""
    if mapper is None:
        return {}
    out: dict[str, Any] = {}
    for stage in ("renaming", *_FIELDS):
        table = getattr(mapper, f"orig_to_new_{stage}", None)
        if not table:
            continue
        if stage == "renaming":
            return None
        rules: dict[str, Any] = {}
        for key, value in table.items():
            if isinstance(key, re.Pattern):
                if key.flags & ~re.UNICODE:
                    return None
                key = key.pattern
            if isinstance(value, tuple):
                value = list(value)
            rules[key] = value
        out[f"orig_to_new_{stage}"] = rules
    try:
        json.dumps(out)
    except (TypeError, ValueError):
        return None
    return out


def _problem_count(load: LoadReport) -> int:
    c = load.counts()
    return (
        len(load.missing)
        + sum(c[s] for s in ("unexpected", "shape mismatch", "load error", "unconsumed"))
        + (load.failure is not None)
    )


def suggest_fix(
    load: LoadReport,
    used: WeightsMapper | None,
    retry: Callable[[WeightsMapper], LoadReport],
) -> SuggestedFix | None:
    """Rules for the pairs ``load`` found, proven by ``retry`` (the load simulated again with
    the given mapper in place of ``used``, the one the model loads with).

    Returns ``None`` when no rule explains two or more pairs, or when the rules do not leave
    fewer problems than ``load`` has.
    """
    unexpected = {u.name: u.looked_up for u in load.unexpected}
    looked_up = {k.name: unexpected.get(k.name, k.mapped or k.name) for k in load.keys}
    pairs = [(looked_up[m.suggestions[0]], m.name) for m in load.missing if m.suggestions]
    suggestions = infer_rules(pairs)
    if not suggestions:
        return None
    from loadkit.mapper import WeightsMapper

    new = mapper_json({}, [s.rule for s in suggestions])
    added = WeightsMapper.from_json(new)
    # `|` appends each stage's new rules after the model's own: they see the names those left.
    result = retry(added if used is None else used | added)
    if _problem_count(result) >= _problem_count(load):
        return None
    base = mapper_as_json(used)
    if base is None:
        return SuggestedFix(suggestions, new, False, result)
    return SuggestedFix(suggestions, mapper_json(base, [s.rule for s in suggestions]), True, result)
