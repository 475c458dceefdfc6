"""The report's suggested fix: mapper rules inferred from the leftovers, proven by a second load.

``suggest.find_shifts`` recognises numbered siblings the checkpoint numbers off by a constant (a
regex rule per number expresses the shift); ``suggest.infer_rules`` proposes rules from the pairs
of unused keys and missing tensors. Here the rules are added to the mapper the model loads with
and the load is simulated again (the caller's ``retry``). A rule that would move numbered
siblings unevenly (checkpoint layer 6 into model layer 0 while layers 1-5 keep their numbers) is
never offered, whatever the names say. Only rules that leave fewer problems are reported, and
they are *proven* only when the second load is clean, every shape matches, no sibling moved
unevenly, and no key of a rule fits another missing tensor of its shape in the same place (the
names alone chose: ``wq`` in ``o_proj`` loads as cleanly as in ``q_proj``). Torch-free: the
retry is the caller's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loadkit.errors import printable
from loadkit.fmt import plural
from loadkit_inspect.fixes.suggest import (
    Ambiguity,
    Renumbering,
    Rule,
    Shift,
    Suggestion,
    ambiguities,
    find_shifts,
    infer_rules,
    mapper_json,
    renumberings,
)
from loadkit_inspect.report.records import LoadReport
from loadkit_inspect.report.text import capped, joined_problems

if TYPE_CHECKING:
    from loadkit.mapper import WeightsMapper

_FIELDS = ("regex", "substr", "stacked", "prefix", "suffix")


@dataclass
class SuggestedFix:
    """Rules that fix (part of) the mismatch, and what the load does with them."""

    suggestions: list[Suggestion]
    mapper: dict[str, Any]  # the --mapper to pass: the rules given (if any) plus the new ones
    complete: bool  # False: the rules given could not be written as JSON (only new ones)
    result: LoadReport  # the load simulated again with ``mapper``
    shifts: list[Shift] = field(default_factory=list)  # renumbered siblings, said in words
    rejected: list[tuple[Rule, str]] = field(default_factory=list)  # rules not offered, and why
    scrambled: list[Renumbering] = field(default_factory=list)  # left after the rules: unproven
    replace: bool = False  # the rules given replaced the model's (--replace-mapper)
    # Other loaders also judged (transformers): a mapper is vLLM's, so the flag selects vllm
    other_loaders: tuple[str, ...] = ()
    # Pairs the second load cannot prove: another missing tensor has the key's shape too
    ambiguous: list[Ambiguity] = field(default_factory=list)

    @property
    def proven(self) -> bool:
        """The second load is clean, every shape matches, no numbered sibling moved unevenly, and
        no key would fit another missing tensor as well (the names alone chose)."""
        clean = self.result.clean and not self.result.shape_mismatches
        return clean and not self.scrambled and not self.ambiguous

    @property
    def rules(self) -> list[Rule]:
        return [s.rule for s in self.suggestions]

    @property
    def explains(self) -> int:
        return sum(len(s.pairs) for s in self.suggestions)

    @property
    def flag(self) -> str:
        """The command-line options to pass: ``--mapper`` extends the model's own rules (with
        ``--replace-mapper`` when the rules given replaced them)."""
        shell = json.dumps(self.mapper).replace("'", "'\\''")  # a ' inside '...' for a shell
        flag = f"--mapper '{shell}'" + (" --replace-mapper" if self.replace else "")
        return flag + (" --loader vllm" if self.other_loaders else "")

    def explained_keys(self) -> dict[str, int]:
        """Looked-up key name -> index of the rule that explains it (a pair the shapes cannot
        settle explains nothing)."""
        unsure = {a.key for a in self.ambiguous}
        return {
            key: i
            for i, s in enumerate(self.suggestions)
            for key, _ in s.pairs
            if key not in unsure
        }

    def explained_tensors(self) -> set[str]:
        """The missing model tensors the rules fill (a pair the shapes cannot settle: none)."""
        unsure = {a.chosen for a in self.ambiguous}
        return {t for s in self.suggestions for _, t in s.pairs if t not in unsure}

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
            "shifts": [
                {
                    "context": sh.context,
                    "checkpoint_numbers": list(sh.numbers),
                    "by": sh.by,
                    "words": sh.words(),
                    "rules_why_not": sh.why_no_rules,
                }
                for sh in self.shifts
            ],
            "rejected": refused_as_list(self.rejected),
            "ambiguous": [
                {
                    "key": a.key,
                    "chosen": a.chosen,
                    "alternatives": list(a.alternatives),
                    "shape": list(a.shape),
                }
                for a in self.ambiguous
            ],
            "mapper": self.mapper,
            "mapper_complete": self.complete,
            "proven": self.proven,
            "flag": self.flag,
            "clean": self.result.clean,
            "problems": self.result.problems(),
        }

    def render(self, limit: int) -> list[str]:
        """The suggested fix's text: the rules, the renumbered siblings said in words, the
        rules refused, and the ``--mapper`` to paste with what the load does with it."""
        n = len(self.suggestions)
        these = "this rule" if n == 1 else "these rules"
        if n:
            explain = "explains" if n == 1 else "explain"
            lines = [
                f"suggested fix  ({plural(n, 'mapper rule')} {explain} "
                f"{plural(self.explains, 'renamed key')}; the load was simulated again with "
                f"{these})"
            ]
        else:
            lines = ["suggested fix  (in words: no mapper rule can express it)"]
        for sh in self.shifts:
            lines.append(f"  {printable(sh.words())}")
            why = sh.why_no_rules
            lines.append(
                f"    {plural(len(sh.numbers), 'regex rule')}, one per number"
                if why is None
                else f"    no rule: {why}"
            )
        rows = []
        for s in self.suggestions:
            key, tensor = s.pairs[0] if s.pairs else ("", "")
            example = f", e.g. {printable(key)} -> {printable(tensor)}" if s.pairs else ""
            rows.append(f"  {s.rule.words()}: {plural(len(s.pairs), 'key')}{example}")
        lines += capped(rows, len(rows), limit, "  ")
        lines += render_refused(self.rejected, limit, "  ")
        if not n:
            return lines
        return lines + self._flag_lines(these, limit)

    def _flag_lines(self, these: str, limit: int) -> list[str]:
        """The ``--mapper`` to paste, and what the load does with it."""
        lines = [f"  {self.flag}"]
        if not self.complete:
            lines.append(
                "  (the mapper given has rules JSON cannot hold: add these rules to it; the flag "
                "alone would drop them)"
            )
        vllm = " (vllm)" if self.other_loaders else ""
        if self.other_loaders:
            others = ", ".join(self.other_loaders)
            lines.append(
                f"  (mapper rules are vLLM's: {others} loads by its own rules, so the flag selects "
                "--loader vllm)"
            )
        if self.proven:
            lines.append(f"  would load cleanly with {these}{vllm}")
            lines.append(
                "  (proven: the second load is clean, every shape matches, numbered siblings keep "
                "their places)"
            )
        elif self.scrambled:
            scrambled = "; ".join(printable(r.words()) for r in self.scrambled)
            lines.append(f"  NOT proven: {scrambled}")
        elif self.result.clean:
            lines.append(f"  would load cleanly with {these}{vllm}, but NOT proven:")
        else:
            problems = joined_problems(self.result.problems())
            lines.append(f"  with {these} it would still NOT load: {problems}")
        if self.ambiguous:
            lines.append(
                "  shapes cannot tell these tensors apart: with a key in another of them the load "
                "would be as clean; the names alone chose (check each)"
            )
            rows = [f"    {printable(a.words())}" for a in self.ambiguous]
            lines += capped(rows, len(rows), limit)
        return lines


@dataclass
class NotOffered:
    """Rules the suggester considered and refused, each with why: no fix is offered (a rule
    that would scramble numbered siblings, rules whose second load is no better)."""

    rejected: list[tuple[Rule, str]]

    def as_list(self) -> list[dict[str, str]]:
        return refused_as_list(self.rejected)

    def render(self, limit: int) -> list[str]:
        """The rules considered and refused, one line each, and why."""
        return render_refused(self.rejected, limit, "")


def render_refused(rejected: list[tuple[Rule, str]], limit: int, indent: str) -> list[str]:
    """One line per rule considered and refused: the rule, and why."""
    rows = [f"{indent}not offered: {rule.words()}: {printable(why)}" for rule, why in rejected]
    return capped(rows, len(rows), limit, indent)


def refused_as_list(rejected: list[tuple[Rule, str]]) -> list[dict[str, str]]:
    """Refused rules as ``--json`` holds them: ``stage``, ``old``, ``new``, ``why``."""
    return [{"stage": r.stage, "old": r.old, "new": r.new, "why": why} for r, why in rejected]


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
    if mapper.orig_to_new_stacked and mapper.behaviour != "old":
        out["behaviour"] = mapper.behaviour  # the stacked stage's matching travels with its rules
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


def _looked_up(load: LoadReport) -> dict[str, str]:
    """Checkpoint key -> the name the model was asked for."""
    unexpected = {u.name: u.looked_up for u in load.unexpected}
    return {k.name: unexpected.get(k.name, k.mapped or k.name) for k in load.keys}


def _shift_suggestions(shift: Shift, looked_up: dict[str, str]) -> list[Suggestion]:
    out = []
    depth = len(shift.context.split(".")) if shift.context else 0
    by_number: dict[int, list[tuple[str, str]]] = {}
    for name in looked_up.values():
        if not name.startswith(shift.context + "." if shift.context else ""):
            continue
        parts = name.split(".")
        n = int(parts[depth])
        parts[depth] = str(n + shift.by)
        by_number.setdefault(n, []).append((name, ".".join(parts)))
    for rule in shift.rules():
        n = int(rule.new.rpartition(".")[2]) - shift.by
        out.append(Suggestion(rule, by_number.get(n, [])))
    return out


def _ambiguous(load: LoadReport, inferred: list[Suggestion]) -> list[Ambiguity]:
    """The inferred rules' pairs that another missing tensor of the key's shape could take."""
    shapes = {u.looked_up: u.shape for u in load.unexpected if u.shape is not None}
    return ambiguities(inferred, shapes, {m.name: m.shape for m in load.missing})


def _no_better(load: LoadReport, result: LoadReport, rules: int) -> str:
    """Why rules whose second load has as many problems as the first, or more, are refused."""
    it = "it" if rules == 1 else "them"
    return (
        f"the load simulated again with {it} is no better: {_problem_count(result)} problems, "
        f"{_problem_count(load)} without ({', '.join(result.problems())})"
    )


def _culprits(rules: list[Rule], before: dict[str, str], scrambled: list[Renumbering]) -> set[Rule]:
    """The rules that fire on a key whose number moved unevenly."""
    keys = {k for r in scrambled for k in r.keys}
    return {
        rule for rule in rules for k in keys if rule.apply(before.get(k, k)) != before.get(k, k)
    }


def suggest_fix(
    load: LoadReport,
    used: WeightsMapper | None,
    retry: Callable[[WeightsMapper], LoadReport],
    *,
    given: WeightsMapper | None = None,
    replace: bool = False,
) -> SuggestedFix | NotOffered | None:
    """Rules for the pairs ``load`` found, proven by ``retry`` (the load simulated again with
    the given mapper in place of ``used``, the one the model loads with). ``given``: the rules
    the user passed (``--mapper``), which the printed flag repeats before the new ones;
    ``replace``: they replaced the model's own rules (``--replace-mapper``).

    Returns ``None`` when no rule explains two or more pairs; ``NotOffered`` (the rules, and
    why) when every rule was refused: siblings scrambled, or a second load no better.
    """
    from loadkit.mapper import WeightsMapper

    looked_up = _looked_up(load)
    model_names = [k.target for k in load.keys if k.status == "loaded" and k.target]
    model_names += [m.name for m in load.missing]
    shifts = find_shifts(looked_up, model_names)
    shifted = tuple(s.context + "." for s in shifts)
    suggestions = [x for s in shifts for x in _shift_suggestions(s, looked_up)]
    shift_rules = {s.rule for s in suggestions}  # their pairs differ by a number alone
    pairs = [
        (looked_up[m.suggestions[0]], m.name)
        for m in load.missing
        if m.suggestions and not m.name.startswith(shifted)
    ]
    suggestions += [s for s in infer_rules(pairs) if not s.pairs[0][0].startswith(shifted)]
    if not suggestions:  # a shift the mapper cannot express: said in words, no flag
        return SuggestedFix([], {}, True, load, shifts, replace=replace) if shifts else None
    rejected: list[tuple[Rule, str]] = []
    while True:
        rules = [s.rule for s in suggestions]
        new = mapper_json({}, rules)
        added = WeightsMapper.from_json(new)
        # `|` appends each stage's new rules after the model's own: they see the names those left.
        result = retry(added if used is None else used | added)
        scrambled = renumberings(looked_up, _looked_up(result))
        culprits = _culprits(rules, looked_up, scrambled) if scrambled else set()
        if not culprits:
            break
        rejected += [(r, s.words()) for r in rules if r in culprits for s in scrambled[:1]]
        suggestions = [s for s in suggestions if s.rule not in culprits]
        if not suggestions:
            return NotOffered(rejected)
    if _problem_count(result) >= _problem_count(load):
        return NotOffered(rejected + [(r, _no_better(load, result, len(rules))) for r in rules])
    # --mapper extends the model's rules: the flag holds the rules given and the new ones
    base = mapper_as_json(given)
    flag = new if base is None else mapper_json(base, rules)
    unsure = _ambiguous(load, [s for s in suggestions if s.rule not in shift_rules])
    return SuggestedFix(
        suggestions, flag, base is not None, result, shifts, rejected, scrambled, replace,
        ambiguous=unsure,
    )  # fmt: skip
