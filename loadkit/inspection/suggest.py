"""Mapper rules that would fix a systematic mismatch, inferred from paired leftovers.

When many unused checkpoint keys and missing model tensors are paired (``renames``), their names
usually differ the same way: a prefix (``bert.`` + name), a suffix (``.gamma`` for ``.weight``),
one component in the middle (``.attn.`` for ``.attention.``), or such a difference with a layer
number inside (``layer_3.`` for ``layers.3.``: a regex). Each pair votes for the rule that turns
its key's name into its tensor's; rules with at least ``MIN_SUPPORT`` votes are proposed, most
votes first. Whether a rule really fixes the load is for the caller to prove, by simulating the
load again with it. Torch-free.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, NamedTuple

from loadkit.inspection.renames import shared_ends

MIN_SUPPORT = 2  # a rule explaining a single pair is that pair's rename, not a pattern
MAX_RULES = 4

_DIGITS = re.compile(r"\d+")


class Rule(NamedTuple):
    """One ``WeightsMapper`` rule: ``stage`` is ``prefix``, ``suffix``, ``substr`` or ``regex``."""

    stage: str
    old: str
    new: str

    def apply(self, name: str) -> str:
        """``name`` as the mapper stage would rewrite it (unchanged when the rule does not fire)."""
        if self.stage == "prefix":
            return self.new + name[len(self.old) :] if name.startswith(self.old) else name
        if self.stage == "suffix":
            return name[: -len(self.old)] + self.new if name.endswith(self.old) else name
        if self.stage == "substr":
            return name.replace(self.old, self.new, 1)
        return re.sub(self.old, self.new, name)


class Suggestion(NamedTuple):
    rule: Rule
    pairs: list[tuple[str, str]]  # (looked-up key name, model tensor) the rule explains


def _plain_rule(key: str, tensor: str) -> Rule | None:
    a, b = key.split("."), tensor.split(".")
    front, back = shared_ends(a, b)
    old, new = ".".join(a[front : len(a) - back]), ".".join(b[front : len(b) - back])
    if front == 0 and back == 0:
        return None  # nothing in common: a rename, not a pattern
    if front == 0:
        return Rule("prefix", old + "." if old else "", new + "." if new else "")
    if back == 0:
        if not old:  # a component to append: an empty suffix is no rule, "$" is
            return Rule("regex", "$", "." + new)
        return Rule("suffix", "." + old, "." + new if new else "")
    if not old:  # a component to insert: anchor it on the component before
        return Rule("substr", f"{a[front - 1]}.", f"{a[front - 1]}.{new}.")
    return Rule("substr", f".{old}.", f".{new}." if new else ".")


def _numbered(rule: Rule) -> Rule | None:
    """The rule with its numbers generalised (``layer_3.`` -> ``layers.3.``), if it has any and
    the replacement carries the same numbers in the same order."""
    nums = _DIGITS.findall(rule.old)
    if not nums or _DIGITS.findall(rule.new) != nums:
        return None
    parts = _DIGITS.split(rule.old)
    pattern = "(\\d+)".join(re.escape(p) for p in parts)
    repl_parts = _DIGITS.split(rule.new)
    repl = "".join(
        p.replace("\\", "\\\\") + (f"\\g<{i + 1}>" if i < len(nums) else "")
        for i, p in enumerate(repl_parts)
    )
    if rule.stage == "prefix":
        pattern = "^" + pattern
    elif rule.stage == "suffix":
        pattern = pattern + "$"
    return Rule("regex", pattern, repl)


def infer_rules(pairs: Iterable[tuple[str, str]]) -> list[Suggestion]:
    """Rules that turn many keys' names into their tensors' names, most pairs explained first.

    ``pairs``: (the name a key was looked up as, the model tensor it most likely is).

    Example:
        >>> pairs = [("bert.pooler.weight", "pooler.weight"), ("bert.pooler.bias", "pooler.bias")]
        >>> [s.rule for s in infer_rules(pairs)]
        [Rule(stage='prefix', old='bert.', new='')]
    """
    votes: dict[Rule, list[tuple[str, str]]] = {}
    for key, tensor in pairs:
        plain = _plain_rule(key, tensor)
        if plain is None:
            continue
        votes.setdefault(plain, []).append((key, tensor))
        numbered = _numbered(plain)
        if numbered is not None:
            votes.setdefault(numbered, []).append((key, tensor))
    out: list[Suggestion] = []
    explained: set[tuple[str, str]] = set()
    for rule, explains in sorted(votes.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        fresh = [p for p in explains if p not in explained and rule.apply(p[0]) == p[1]]
        if len(fresh) < MIN_SUPPORT:
            continue
        out.append(Suggestion(rule, fresh))
        explained.update(fresh)
        if len(out) == MAX_RULES:
            break
    return out


def mapper_json(base: dict[str, Any], rules: Iterable[Rule]) -> dict[str, Any]:
    """``base`` (a mapper's rules as JSON) with ``rules`` appended to their stages: within a
    stage rules chain in order, so each new rule sees the name the model's own rules left."""
    out = {field: dict(table) for field, table in base.items()}
    for rule in rules:
        out.setdefault(f"orig_to_new_{rule.stage}", {})[rule.old] = rule.new
    return out
