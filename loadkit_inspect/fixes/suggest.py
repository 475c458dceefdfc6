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
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from loadkit.errors import printable
from loadkit_inspect.fixes.renames import shared_ends

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

    def words(self) -> str:
        r"""The rule as its user reads it: the pattern as written, not as JSON or Python escape
        it (the pasteable ``--mapper`` JSON beside it is escaped).

        >>> print(Rule("regex", r"(?<![^.])layer\.1(?=\.|$)", "layer.0").words())
        regex '(?<![^.])layer\.1(?=\.|$)' -> 'layer.0'
        """
        from loadkit.mapper import rule_text  # a fix's words only: the header path never needs it

        return f"{rule_text(self.stage, printable(self.old))} -> '{printable(self.new)}'"


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


# --- pairs that the shapes cannot settle ---------------------------------------------------------

# Renamings transformers itself applies to legacy checkpoints (``PreTrainedModel``'s key fix on
# load: ``gamma`` -> ``weight``, ``beta`` -> ``bias``): a convention, not a guess by name.
_CONVENTIONS = {("gamma", "weight"), ("beta", "bias")}


class Ambiguity(NamedTuple):
    """A pair the second load cannot prove: other tensors the model misses, in the same place,
    have the key's shape too, so only the names chose (``wq`` into ``o_proj`` loads as cleanly
    as into ``q_proj``)."""

    key: str  # the name the key was looked up as
    chosen: str  # the model tensor the rule sends it to
    alternatives: tuple[str, ...]  # other missing tensors of the same shape, in the same place
    shape: tuple[int, ...]

    def words(self) -> str:
        others = " or ".join(f"'{a}'" for a in self.alternatives[:2])
        more = f" (and {len(self.alternatives) - 2} more)" if len(self.alternatives) > 2 else ""
        return (
            f"'{self.key}' {list(self.shape)} -> '{self.chosen}'; {others}{more} has that shape too"
        )


def ambiguities(
    suggestions: Iterable[Suggestion],
    key_shapes: Mapping[str, tuple[int, ...]],
    missing: Mapping[str, tuple[int, ...]],
) -> list[Ambiguity]:
    """The pairs of ``suggestions`` whose key would fit another missing tensor as well.

    A pair's key and tensor share components at both ends (``model.layers.0`` ... ``weight``);
    another missing tensor with the same ends and the key's shape could have taken the key, and
    a load with it would be as clean. ``key_shapes``: looked-up key name -> its tensor's shape;
    ``missing``: the model's missing tensors -> their shapes (before the rules).

    Example:
        >>> pair = ("l.0.wq.weight", "l.0.o_proj.weight")
        >>> rule = Suggestion(Rule("substr", ".wq.", ".o_proj."), [pair])
        >>> missing = {"l.0.o_proj.weight": (4, 4), "l.0.q_proj.weight": (4, 4)}
        >>> [a.alternatives for a in ambiguities([rule], {"l.0.wq.weight": (4, 4)}, missing)]
        [('l.0.q_proj.weight',)]
    """
    out = []
    for suggestion in suggestions:
        for key, chosen in suggestion.pairs:
            shape = key_shapes.get(key)
            if shape is None:
                continue
            a, b = key.split("."), chosen.split(".")
            front, back = shared_ends(a, b)
            if (
                ".".join(a[front : len(a) - back]),
                ".".join(b[front : len(b) - back]),
            ) in _CONVENTIONS:
                continue
            head, tail = b[:front], b[len(b) - back :]
            alternatives = tuple(
                name
                for name, its in missing.items()
                if name != chosen and tuple(its) == tuple(shape) and _between(name, head, tail)
            )
            if alternatives:
                out.append(Ambiguity(key, chosen, alternatives, tuple(shape)))
    return out


def _between(name: str, head: list[str], tail: list[str]) -> bool:
    """``name`` starts with the components ``head`` and ends with ``tail``, with more between."""
    parts = name.split(".")
    if len(parts) <= len(head) + len(tail):
        return False
    return parts[: len(head)] == head and parts[len(parts) - len(tail) :] == tail


def mapper_json(base: dict[str, Any], rules: Iterable[Rule]) -> dict[str, Any]:
    """``base`` (a mapper's rules as JSON) with ``rules`` appended to their stages: within a
    stage rules chain in order, so each new rule sees the name the model's own rules left."""
    out = {field: dict(table) for field, table in base.items()}
    for rule in rules:
        out.setdefault(f"orig_to_new_{rule.stage}", {})[rule.old] = rule.new
    return out


# --- renumbering: shifts, and rules that would scramble numbered siblings ------------------------


def _numbered_groups(names: Iterable[str]) -> dict[str, dict[int, set[str]]]:
    """For each dotted context followed by a number (``encoder.layer``): number -> the rest of
    each name under it (``attention.self.query.weight``)."""
    groups: dict[str, dict[int, set[str]]] = {}
    for name in names:
        parts = name.split(".")
        for j, part in enumerate(parts):
            if part.isdigit() and part.isascii():
                rest = ".".join(parts[j + 1 :])
                groups.setdefault(".".join(parts[:j]), {}).setdefault(int(part), set()).add(rest)
    return groups


def _noun(context: str) -> str:
    last = context.rpartition(".")[2]
    if last in ("layer", "layers", "h", "block", "blocks"):
        return "layers"
    return f"'{last}' numbers"


def _span(numbers: Iterable[int]) -> str:
    ns = sorted(numbers)
    if ns == list(range(ns[0], ns[-1] + 1)) and len(ns) > 2:
        return f"{ns[0]}..{ns[-1]}"
    return ", ".join(map(str, ns))


class Shift(NamedTuple):
    """The checkpoint numbers a run of siblings ``by`` off the model's numbering: every number
    under ``context`` is the model's minus ``by``, and each holds the same tensors."""

    context: str  # as the model names it: ``model.encoder.layer``
    numbers: tuple[int, ...]  # the checkpoint's, ascending
    by: int  # model number = checkpoint number + by
    anchor: str | None  # the end of ``context`` the checkpoint keys carry too, for the rules
    keys: int  # checkpoint keys under ``context``

    def words(self) -> str:
        """``checkpoint layers 1..6, model layers 0..5: shifted by 1``."""
        noun = _noun(self.context)
        model = [n + self.by for n in self.numbers]
        return (
            f"checkpoint {noun} {_span(self.numbers)}, model {noun} {_span(model)}: "
            f"shifted by {abs(self.by)} ({self.context}.N)"
        )

    def rules(self) -> list[Rule]:
        """One regex rule per number; ordered so that no rule's output is matched by a later
        one (rules of a stage chain: 1->0 before 2->1 when shifting down, 5->6 before 4->5 up).
        Empty when ``anchor`` is ``None``: see ``why_no_rules``."""
        if self.anchor is None:
            return []
        order = sorted(self.numbers, reverse=self.by > 0)
        head = "(?<![^.])" + re.escape(self.anchor + ".") if self.anchor else "^"
        out = []
        for n in order:
            new = (self.anchor + "." if self.anchor else "") + str(n + self.by)
            out.append(Rule("regex", f"{head}{n}(?=\\.|$)", new.replace("\\", "\\\\")))
        return out

    @property
    def why_no_rules(self) -> str | None:
        if self.anchor is not None:
            return None
        return (
            "the model's own mapper renames the components before the number, so no rule on "
            "the checkpoint's names can be anchored there; add one rule per number by hand"
        )


def find_shifts(looked_up: dict[str, str], model_names: Iterable[str]) -> list[Shift]:
    """Runs of numbered siblings the checkpoint numbers off by a constant from the model.

    ``looked_up``: checkpoint key -> the name the model was asked for (after its mapper);
    ``model_names``: every tensor the model has.

    Example:
        >>> keys = {f"layer.{i}.w": f"layer.{i}.w" for i in (1, 2, 3)}
        >>> [s.words() for s in find_shifts(keys, [f"layer.{i}.w" for i in (0, 1, 2)])]
        ['checkpoint layers 1..3, model layers 0..2: shifted by 1 (layer.N)']
    """
    ours = _numbered_groups(looked_up.values())
    theirs = _numbered_groups(model_names)
    shifts = []
    for context in sorted(ours.keys() & theirs.keys()):
        c, m = ours[context], theirs[context]
        if c.keys() == m.keys() or len(c) != len(m):
            continue
        by = min(m) - min(c)
        if any(m.get(n + by) != rest for n, rest in c.items()):
            continue
        under = [k for k, v in looked_up.items() if v.startswith(context + ".")]
        shifts.append(
            Shift(context, tuple(sorted(c)), by, _anchor(context, under, looked_up), len(under))
        )
    # an outer shift makes inner contexts differ too (their numbers sit under other layers):
    # keep only the outermost
    return [
        s
        for s in shifts
        if not any(o is not s and s.context.startswith(o.context + ".") for o in shifts)
    ]


def _anchor(context: str, keys: list[str], looked_up: dict[str, str]) -> str | None:
    """The trailing components of ``context`` that every checkpoint key under it also has right
    before its number (``encoder.layer`` for keys ``encoder.layer.1...`` looked up as
    ``model.encoder.layer.1...``): what a rule at the mapper's regex stage can match."""
    ctx = context.split(".") if context else []
    depth = len(ctx)
    common: int | None = None
    for key in keys:
        name = looked_up[key].split(".")
        tail = len(name) - depth - 1  # components after the number, in the looked-up name
        parts = key.split(".")
        j = len(parts) - tail - 1  # where the number should be in the key
        if j < 0 or parts[j] != name[depth]:
            return None  # the own mapper moved or renamed the number itself
        shared = 0
        while shared < min(depth, j) and parts[j - 1 - shared] == ctx[depth - 1 - shared]:
            shared += 1
        common = shared if common is None else min(common, shared)
    if common is None or (common == 0 and depth):
        return None if depth else ""
    return ".".join(ctx[depth - common :])


class Renumbering(NamedTuple):
    """Numbered siblings a set of rules would not move alike: a scrambled model."""

    context: str
    moves: dict[int, int]  # checkpoint number -> model number, for the numbers that moved
    stays: tuple[int, ...]  # numbers that keep theirs, or move otherwise

    by: int  # how ``stays`` move (0: they keep their numbers)
    keys: tuple[str, ...]  # the checkpoint keys that moved otherwise

    def words(self) -> str:
        noun = _noun(self.context)
        moved = ", ".join(f"{a} -> {b}" for a, b in sorted(self.moves.items()))
        rest = "keep their numbers" if self.by == 0 else f"move by {self.by}"
        stays = f" while {noun} {_span(self.stays)} {rest}" if self.stays else ""
        return (
            f"it would send checkpoint {noun} {moved} ({self.context}.N){stays}: a scrambled model"
        )


def renumberings(before: dict[str, str], after: dict[str, str]) -> list[Renumbering]:
    """Where rules change the numbers of siblings unevenly: for every context followed by a
    number (in ``after``'s names), the shift each key's number took (``after`` minus
    ``before``) must be one and the same for all keys under it.

    ``before`` and ``after``: checkpoint key -> the name looked up without and with the rules.

    Example:
        >>> before = {f"k{i}": f"layer.{i}.w" for i in range(1, 4)}
        >>> after = {**before, "k3": "layer.0.w"}
        >>> for r in renumberings(before, after):
        ...     print(r.words())
        it would send checkpoint layers 3 -> 0 (layer.N) while layers 1, 2 keep their numbers: a
        scrambled model
    """
    seen: dict[tuple[str, int], dict[tuple[int, int], list[str]]] = {}
    for key, new in after.items():
        old = before.get(key, key)
        a, b = list(_DIGITS.finditer(old)), list(_DIGITS.finditer(new))
        if len(a) != len(b):
            continue  # a number appears or goes: nothing to line up
        for pos, (x, y) in enumerate(zip(a, b, strict=True)):
            n, d = int(x.group()), int(y.group()) - int(x.group())
            seen.setdefault((new[: y.start()], pos), {}).setdefault((n, d), []).append(key)
    out = []
    for (context, _), moves in sorted(seen.items()):
        deltas = {d for _, d in moves}
        if len(deltas) < 2:
            continue
        count = {d: sum(len(ks) for (_, dd), ks in moves.items() if dd == d) for d in deltas}
        common = max(sorted(deltas, key=abs), key=lambda d: count[d])
        moved = {n: n + d for (n, d) in moves if d != common}
        stays = tuple(sorted({n for (n, d) in moves if d == common} - moved.keys()))
        keys = tuple(k for (n, d), ks in moves.items() if d != common for k in ks)
        out.append(Renumbering(context.rstrip("."), moved, stays, common, keys))
    return out
