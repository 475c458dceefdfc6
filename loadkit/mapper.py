"""``WeightsMapper``: rewrites checkpoint names into model names.

Six stages run in a fixed order, as in vLLM 0.34.0: renaming (objects with a
``rename_source_key(key) -> (new_key, _)`` method, such as transformers' ``WeightRenaming``),
then the five rule tables regex, substr, stacked, prefix, suffix. Within a stage every rule is
tried in order against the name as the earlier rules left it, so rules chain. A table rule whose
value is ``None`` drops the weight. A stacked rule's shard id may be a list (``ShardIds``): the
one checkpoint tensor is then loaded into each of those shards in turn. ``weights_transforms``
rewrite the raw ``(name, tensor)`` stream before any name is mapped (``apply`` only). This module
does not import torch: the header-only inspector maps names without it.

The stacked stage has two behaviours, chosen when the mapper is built (every other stage is the
same in both):

- ``"old"`` (the default: what vLLM 0.34.0 still does): every key is a raw substring, every rule is
  tried in turn, so a later rule can match inside an earlier rule's output (``q_proj`` ->
  ``qkv_proj``, then ``v_proj`` inside it -> ``qkqkv_proj``, shard ``v``);
- ``"new"`` (vLLM PR #48564, not merged upstream): a key matches whole dotted components only
  (leading and trailing dots just mark component edges), the longest key is tried first, and at
  most one stacked rule applies to a name, so no rule sees another's output.

``stacked_rematches(trace)`` finds where a rule matched inside an earlier rule's output;
``rematch_examples(mapper, names)`` lists each such pair of rules once, with a name that shows it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from loadkit.errors import MapperConfigError
from loadkit.terms import BEHAVIOURS, Behaviour, check_behaviour

__all__ = [
    "ALL_STAGES",
    "STAGES",
    "MapStep",
    "MapTrace",
    "Rematch",
    "Renaming",
    "ShardId",
    "ShardIds",
    "WeightsMapper",
    "WeightsTransformFn",
    "rematch_examples",
    "renaming_label",
    "renaming_target",
    "rule_text",
    "stacked_rematches",
]


STAGES = ("regex", "substr", "stacked", "prefix", "suffix")  # the rule tables (dicts)
ALL_STAGES = ("renaming", *STAGES)  # the order names go through

ShardId = Any  # upstream uses ints and strings ("q", "k", "v", 0, 1, ...)
# One shard, or a list of shards the same checkpoint tensor is loaded into in turn.
ShardIds = Any
# A lazy transform over the raw (name, tensor) stream, applied before any name mapping.
WeightsTransformFn = Callable[[Iterable[tuple[str, Any]]], Iterable[tuple[str, Any]]]


class MapStep(NamedTuple):
    """One rule that fired: which stage, its key, the name before and after (``None``: dropped)."""

    stage: str
    rule: str
    before: str
    after: str | None


class MapTrace(NamedTuple):
    """The full story of one name: the result, the shard id and every rule that fired."""

    name: str
    result: str | None
    shard_id: ShardIds | None  # a list: the tensor goes to each of these shards in turn
    steps: tuple[MapStep, ...]

    @property
    def dropped_by(self) -> MapStep | None:
        return self.steps[-1] if self.result is None and self.steps else None


class Rematch(NamedTuple):
    """A stacked rule (``then``) that matched inside the text an earlier one (``first``) wrote."""

    first: str
    then: str
    name: str  # the name mapped
    result: str | None  # what it became


class Renaming(Protocol):
    """What ``orig_to_new_renaming`` holds: transformers' ``WeightRenaming`` has this method.

    The second item of the returned pair is ignored, as upstream ignores it.
    """

    def rename_source_key(self, key: str) -> tuple[str, Any]: ...


def renaming_label(renaming: object) -> str:
    """A short name for a renaming object in traces, ledgers and reports.

    >>> class R:
    ...     source_patterns, target_patterns, scope_prefix = ["gamma"], ["weight"], None
    >>> renaming_label(R())
    'gamma -> weight'
    """
    sources = getattr(renaming, "source_patterns", None)
    targets = getattr(renaming, "target_patterns", None)
    if not sources or not targets:
        return repr(renaming)
    text = f"{' | '.join(sources)} -> {' | '.join(targets)}"
    scope = getattr(renaming, "scope_prefix", None)  # transformers scopes a sub-model's rules
    return f"{text} (under {scope!r})" if scope else text


def rule_text(stage: str, rule: str) -> str:
    r"""A mapper rule as its user writes it, in traces, ledgers and reports: the stage, then the
    pattern itself in quotes (a regex as the regex, never its ``repr`` with doubled
    backslashes).

    >>> print(rule_text("regex", r"^bert\.(.+)"), rule_text("prefix", "model."), sep="; ")
    regex '^bert\.(.+)'; prefix 'model.'
    """
    return f"{stage} '{rule}'"


def renaming_target(renaming: object) -> str | None:
    """What a renaming object writes (its first target pattern), for reports."""
    targets = getattr(renaming, "target_patterns", None)
    return targets[0] if targets else None


def _compile(pattern: Any) -> Any:
    # Compiled patterns pass as they are, from ``re`` or from the ``regex`` module vLLM's models
    # compile theirs with: both have ``search`` and ``sub``.
    if callable(getattr(pattern, "search", None)) and callable(getattr(pattern, "sub", None)):
        return pattern
    if not isinstance(pattern, str):
        raise MapperConfigError(
            f"WeightsMapper: orig_to_new_regex keys are patterns or str, not {pattern!r}"
        )
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise MapperConfigError(f"WeightsMapper: invalid regex {pattern!r}: {exc}") from None


def _check_template(rx: Any, repl: str) -> None:
    """Raise now if ``repl`` refers to a group ``rx`` does not have.

    ``re`` compiles a template on every ``sub``, even without a match; the ``regex`` module only
    when something matches. So the template is expanded against a pattern with the same groups
    (numbers and names) that matches the empty string.
    """
    rx.sub(repl, "")
    if isinstance(rx, re.Pattern):
        return
    names = {index: name for name, index in getattr(rx, "groupindex", {}).items()}
    groups = "".join(f"(?P<{names[i]}>)" if i in names else "()" for i in range(1, rx.groups + 1))
    re.compile(groups).sub(repl, "")


@dataclass(frozen=True)
class WeightsMapper:
    """Rules that rewrite checkpoint names into model names, applied stage by stage.

    Args:
        orig_to_new_renaming: objects with ``rename_source_key(key) -> (new_key, _)``
            (transformers' ``WeightRenaming``), applied first.
        orig_to_new_regex: pattern -> replacement (back-references allowed) or ``None`` (drop).
        orig_to_new_substr: substring -> replacement of its first occurrence, or ``None``.
        orig_to_new_stacked: substring -> ``(new_substr, shard_id)``: packs a tensor into a
            stacked parameter and tags it with its shard (a list of shard ids: the tensor is
            loaded into each in turn), or ``None``.
        orig_to_new_prefix: prefix -> new prefix (``""`` prepends to every name), or ``None``.
        orig_to_new_suffix: suffix -> new suffix, or ``None``.
        weights_transforms: callables over the raw ``(name, tensor)`` stream, applied in order
            by ``apply`` before any name is mapped (a transform passes what it does not
            recognise through unchanged).
        behaviour: how the stacked stage matches (the module docstring tells both). ``"old"``,
            the default, is vLLM 0.34.0's; ``"new"`` matches whole components, first match only.

    A bad rule (an empty suffix, a regex that does not compile) raises ``MapperConfigError``
    here, when the mapper is built. The module docstring tells how the stages chain.

    >>> m = WeightsMapper(
    ...     orig_to_new_prefix={"model.": ""}, orig_to_new_suffix={".gamma": ".weight"}
    ... )
    >>> m.map_name("model.norm.gamma")
    'norm.weight'
    """

    orig_to_new_renaming: Sequence[Renaming] = field(default_factory=list)
    orig_to_new_regex: Mapping[str | re.Pattern[str], str | None] = field(default_factory=dict)
    orig_to_new_substr: Mapping[str, str | None] = field(default_factory=dict)
    orig_to_new_stacked: Mapping[str, tuple[str, ShardIds] | None] = field(default_factory=dict)
    orig_to_new_prefix: Mapping[str, str | None] = field(default_factory=dict)
    orig_to_new_suffix: Mapping[str, str | None] = field(default_factory=dict)
    weights_transforms: Sequence[WeightsTransformFn] = field(default_factory=list)
    # Keyword-only, so the six tables and the transforms keep upstream's positional order.
    behaviour: Behaviour = field(default="old", kw_only=True)

    def __post_init__(self) -> None:
        # Validate at build time: upstream only fails (or silently misbehaves) at use.
        check_behaviour(self.behaviour)
        renaming = tuple(self.orig_to_new_renaming)  # a copy: the caller's list may change
        for r in renaming:
            if not callable(getattr(r, "rename_source_key", None)):
                raise MapperConfigError(
                    f"WeightsMapper: orig_to_new_renaming holds objects with a "
                    f"rename_source_key(key) method, not {r!r}"
                )
        object.__setattr__(self, "orig_to_new_renaming", renaming)
        transforms = tuple(self.weights_transforms)
        for t in transforms:
            if not callable(t):
                raise MapperConfigError(
                    f"WeightsMapper: weights_transforms holds callables over the (name, tensor) "
                    f"stream, not {t!r}"
                )
        object.__setattr__(self, "weights_transforms", transforms)
        object.__setattr__(self, "_regex", self._compiled_regex())
        for suffix in self.orig_to_new_suffix:
            if suffix == "":
                raise MapperConfigError(
                    "WeightsMapper: an empty suffix in orig_to_new_suffix would match every name; "
                    "use orig_to_new_prefix={'': ...} to prepend, or a regex"
                )
        object.__setattr__(self, "_stacked_order", self._checked_stacked())
        for fname in ("orig_to_new_substr", "orig_to_new_prefix", "orig_to_new_suffix"):
            for key, value in getattr(self, fname).items():
                if not isinstance(key, str) or not (value is None or isinstance(value, str)):
                    raise MapperConfigError(
                        f"WeightsMapper: {fname} rules map str to str or None, "
                        f"not {key!r}: {value!r}"
                    )

    def _compiled_regex(self) -> tuple[tuple[Any, str | None], ...]:
        """Each regex rule compiled, its replacement checked against the pattern's groups."""
        compiled = []
        for pattern, repl in self.orig_to_new_regex.items():
            rx = _compile(pattern)
            if repl is not None:
                try:
                    _check_template(rx, repl)
                except Exception as exc:  # re.error, regex.error, IndexError: all say "bad"
                    raise MapperConfigError(
                        f"WeightsMapper: regex {rx.pattern!r} has an invalid replacement "
                        f"{repl!r}: {exc}"
                    ) from None
            compiled.append((rx, repl))
        return tuple(compiled)

    def _checked_stacked(self) -> tuple[tuple[str, tuple[str, ...], Any], ...]:
        """The stacked rules checked; under ``"new"`` as ``(key, components, target)`` in the
        order they are tried (``()`` under ``"old"``, which tries the table as it is)."""
        for key, value in self.orig_to_new_stacked.items():
            if not isinstance(key, str) or (
                value is not None
                and not (
                    isinstance(value, tuple)
                    and len(value) == 2
                    and isinstance(value[0], str)
                    and value[1] != []
                )
            ):
                raise MapperConfigError(
                    f"WeightsMapper: orig_to_new_stacked[{key!r}] must be (new_substr, shard_id), "
                    f"(new_substr, [shard_id, ...]) or None, not {value!r}"
                )
        if self.behaviour == "old":
            return ()
        order: list[tuple[str, tuple[str, ...], Any]] = []
        for key, value in self.orig_to_new_stacked.items():
            parts = tuple(key.strip(".").split("."))
            if "" in parts:
                raise MapperConfigError(
                    f"WeightsMapper: orig_to_new_stacked key {key!r} is not dotted name "
                    "components (behaviour='new' matches whole components)"
                )
            order.append((key, parts, value))
        # The longest key first (a fully qualified key beats its short alias); ties keep the
        # table's order (sorted is stable).
        order.sort(key=lambda rule: -len(".".join(rule[1])))
        return tuple(order)

    # --- the one walk every public method uses ---

    def trace(self, name: str) -> MapTrace:
        """Map ``name`` and record every rule that fired (for ledgers and the inspector)."""
        steps: list[MapStep] = []
        shard_id: ShardId | None = None
        key = name
        new: str | None  # each rule's result; None drops the name

        def fire(stage: str, rule: str, after: str | None) -> None:
            steps.append(MapStep(stage, rule, key, after))

        for renaming in self.orig_to_new_renaming:
            new, _ = renaming.rename_source_key(key)
            if not isinstance(new, str):
                raise MapperConfigError(
                    f"WeightsMapper: {renaming_label(renaming)}.rename_source_key({key!r}) "
                    f"returned {new!r}, not a str"
                )
            if new != key:
                fire("renaming", renaming_label(renaming), new)
                key = new
        for rx, repl in self._regex:  # type: ignore[attr-defined]
            if rx.search(key):
                new = None if repl is None else rx.sub(repl, key)
                fire("regex", rx.pattern, new)
                if new is None:
                    return MapTrace(name, None, None, tuple(steps))
                key = new
        for sub, repl in self.orig_to_new_substr.items():
            if sub in key:
                new = None if repl is None else key.replace(sub, repl, 1)
                fire("substr", sub, new)
                if new is None:
                    return MapTrace(name, None, None, tuple(steps))
                key = new
        for sub, target, new in self._stacked(key):
            fire("stacked", sub, new)
            if new is None or target is None:
                return MapTrace(name, None, None, tuple(steps))
            key, shard_id = new, target[1]
        for prefix, repl in self.orig_to_new_prefix.items():
            if key.startswith(prefix):
                new = None if repl is None else repl + key[len(prefix) :]
                fire("prefix", prefix, new)
                if new is None:
                    return MapTrace(name, None, None, tuple(steps))
                key = new
        for suffix, repl in self.orig_to_new_suffix.items():
            if key.endswith(suffix):
                new = None if repl is None else key[: -len(suffix)] + repl
                fire("suffix", suffix, new)
                if new is None:
                    return MapTrace(name, None, None, tuple(steps))
                key = new
        return MapTrace(name, key, shard_id, tuple(steps))

    def _stacked(self, key: str) -> Iterator[tuple[str, tuple[str, ShardId] | None, str | None]]:
        """The stacked rules that fire on ``key``: ``(key, target, name after it)`` in turn."""
        if self.behaviour == "old":
            # vLLM 0.34.0 (as 0.28.0): raw substrings, every rule in turn on what the last left.
            for sub, target in self.orig_to_new_stacked.items():
                if sub in key:
                    new = None if target is None else key.replace(sub, target[0], 1)
                    yield sub, target, new
                    if new is None:
                        return
                    key = new
            return
        parts = key.split(".")
        for sub, rule, target in self._stacked_order:  # type: ignore[attr-defined]
            n = len(rule)
            for i in range(len(parts) - n + 1):
                if tuple(parts[i : i + n]) == rule:
                    if target is None:
                        yield sub, None, None
                        return
                    written = [p for p in target[0].strip(".").split(".") if p]
                    yield sub, target, ".".join([*parts[:i], *written, *parts[i + n :]])
                    return  # at most one stacked rule per name: nothing sees its output

    # --- the upstream surface ---

    def map_name(self, name: str) -> str | None:
        """The model name for checkpoint name ``name``.

        Args:
            name: a checkpoint key.

        Returns:
            The name after every stage, or ``None`` when a rule drops it.

        >>> WeightsMapper(orig_to_new_prefix={"a.": "b.", "b.": "c."}).map_name("a.x")  # chained
        'c.x'
        """
        return self.trace(name).result

    # vLLM 0.31.0 made map_name public and kept _map_name as an alias; older callers use it.
    _map_name = map_name

    def map_name_with_shard(self, name: str) -> tuple[str, ShardIds | None] | None:
        """Like ``map_name``, with the shard id (or list of ids) the last matching stacked rule
        gave (upstream's ``_map_name_with_shard``).

        Args:
            name: a checkpoint key.

        Returns:
            ``(model name, shard id or None)``, or ``None`` when a rule drops the name.

        >>> WeightsMapper(orig_to_new_stacked={"q_proj": ("qkv_proj", "q")}).map_name_with_shard(
        ...     "attn.q_proj.weight"
        ... )
        ('attn.qkv_proj.weight', 'q')
        """
        t = self.trace(name)
        return None if t.result is None else (t.result, t.shard_id)

    _map_name_with_shard = map_name_with_shard

    def apply(self, weights: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        """Lazily map a weight stream, dropping ``None`` and tagging stacked weights' shard id.

        Args:
            weights: ``(name, tensor)`` pairs; read one at a time, as the result is consumed.
                ``weights_transforms`` rewrite this stream first.

        Returns:
            An iterator of ``(model name, tensor)``; a tensor a stacked rule matched carries
            ``tensor.shard_id``. A rule with a list of shard ids yields the tensor once per
            shard, each time with that shard's id (after the first, ``tensor.detach()``: the same
            storage, its own ``shard_id``).

        >>> import torch
        >>> m = WeightsMapper(orig_to_new_stacked={"k_proj": ("qkv_proj", "k")})
        >>> [(n, t.shard_id) for n, t in m.apply([("k_proj.weight", torch.zeros(1))])]
        [('qkv_proj.weight', 'k')]
        >>> kv = WeightsMapper(orig_to_new_stacked={"kv": ("qkv_proj", ["k", "v"])})
        >>> [(n, t.shard_id) for n, t in kv.apply([("kv.weight", torch.zeros(1))])]
        [('qkv_proj.weight', 'k'), ('qkv_proj.weight', 'v')]
        """
        for transform in self.weights_transforms:
            weights = transform(weights)
        for name, tensor in weights:
            t = self.trace(name)
            if t.result is None:
                continue
            if t.shard_id is None:
                yield t.result, tensor
                continue
            shard_ids = t.shard_id if isinstance(t.shard_id, list) else [t.shard_id]
            for i, shard_id in enumerate(shard_ids):
                # Each shard carries its own id, so the extra ones are their own tensor objects.
                one = tensor if i == 0 else tensor.detach()
                one.shard_id = shard_id
                yield t.result, one

    def apply_list(self, names: Iterable[str]) -> list[str]:
        """``map_name`` over ``names``, dropped names left out.

        Args:
            names: checkpoint names.

        Returns:
            The mapped names, in order, without the ones a rule maps to ``None``.

        >>> WeightsMapper(orig_to_new_substr={"x": None}).apply_list(["a", "x.b", "c"])
        ['a', 'c']
        """
        return [m for m in map(self.map_name, names) if m is not None]

    def apply_dict(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The mapping with its keys mapped (dropped keys left out; a later key wins).

        Args:
            values: checkpoint name -> anything (a state dict, a quantisation config's entries).

        Returns:
            A new dict keyed by the mapped names; when two keys map to one name, the later wins.

        >>> WeightsMapper(orig_to_new_prefix={"m.": ""}).apply_dict({"m.a": 1, "a": 2})
        {'a': 2}
        """
        out: dict[str, Any] = {}
        for name, value in values.items():
            mapped = self.map_name(name)
            if mapped is not None:
                out[mapped] = value  # later key wins on collision
        return out

    def __or__(self, other: WeightsMapper) -> WeightsMapper:
        """Both mappers' rules, field by field; ``other`` wins on a shared key.

        Args:
            other: the mapper whose rules are added (and win where both have the same key).

        Returns:
            A new ``WeightsMapper``; renaming objects are concatenated, ``self``'s first. Its
            behaviour is that of the side(s) with stacked rules (the only stage it changes),
            ``other``'s when neither has any.

        Raises:
            MapperConfigError: both have stacked rules, under different behaviours: one merged
                table cannot be matched both ways.

        >>> a = WeightsMapper(orig_to_new_regex={"x": "y"})
        >>> (a | WeightsMapper(orig_to_new_prefix={"p.": ""})).map_name("p.x")  # regex kept
        'y'
        """
        if not isinstance(other, WeightsMapper):
            return NotImplemented
        # Every field merges; upstream once forgot the regex one and dropped its rules silently.
        behaviour = other.behaviour
        if self.orig_to_new_stacked and other.orig_to_new_stacked:
            if self.behaviour != other.behaviour:
                raise MapperConfigError(
                    f"WeightsMapper |: both mappers have stacked rules, one with behaviour "
                    f"{self.behaviour!r}, the other {other.behaviour!r}; build both alike"
                )
        elif self.orig_to_new_stacked:
            behaviour = self.behaviour
        return WeightsMapper(
            orig_to_new_renaming=[*self.orig_to_new_renaming, *other.orig_to_new_renaming],
            **{
                f"orig_to_new_{s}": {
                    **getattr(self, f"orig_to_new_{s}"),
                    **getattr(other, f"orig_to_new_{s}"),
                }
                for s in STAGES
            },
            weights_transforms=[*self.weights_transforms, *other.weights_transforms],
            behaviour=behaviour,
        )

    def get_rename_mapper(self) -> WeightsMapper:
        """This mapper with only its renames: no stacked rules, no rule that drops (``None``),
        no ``weights_transforms``.

        What a consumer that names modules rather than loads them needs (LoRA name parsing, a
        quantisation config's layer lists): ``q_proj`` stays ``q_proj``, and a "do not load"
        rule does not shrink its lists.

        >>> m = WeightsMapper(
        ...     orig_to_new_prefix={"model.": "", "mtp.": None},
        ...     orig_to_new_stacked={"q_proj": ("qkv_proj", "q")},
        ... )
        >>> r = m.get_rename_mapper()
        >>> r.map_name("model.q_proj.weight"), r.map_name("mtp.x"), m.map_name("mtp.x")
        ('q_proj.weight', 'mtp.x', None)
        """

        def kept(table: Mapping[Any, Any]) -> dict[Any, Any]:
            return {k: v for k, v in table.items() if v is not None}

        return dataclasses.replace(
            self,
            orig_to_new_regex=kept(self.orig_to_new_regex),
            orig_to_new_substr=kept(self.orig_to_new_substr),
            orig_to_new_stacked={},
            orig_to_new_prefix=kept(self.orig_to_new_prefix),
            orig_to_new_suffix=kept(self.orig_to_new_suffix),
            weights_transforms=[],
        )

    def is_empty(self) -> bool:
        """No rule and no transform: ``apply`` hands every weight on unchanged."""
        stages = any(getattr(self, f"orig_to_new_{s}") for s in ALL_STAGES)
        return not (stages or self.weights_transforms)

    def rules(self) -> Iterator[tuple[str, str, Any]]:
        """Every rule in the order it is tried: ``(stage, rule as text, target)``.

        The rule text is what ``trace`` records in its steps; the target is the replacement
        (``None``: drops), ``[new_substr, shard_id]`` for stacked rules, a renaming's first
        target pattern.

        >>> list(WeightsMapper(orig_to_new_prefix={"model.": ""}).rules())
        [('prefix', 'model.', '')]
        """
        for renaming in self.orig_to_new_renaming:
            yield "renaming", renaming_label(renaming), renaming_target(renaming)
        for stage in STAGES:
            for rule, target in getattr(self, f"orig_to_new_{stage}").items():
                text = getattr(rule, "pattern", rule)
                yield stage, text, list(target) if isinstance(target, tuple) else target

    def without(self, stage: str, rule: str) -> WeightsMapper:
        r"""This mapper less one rule (``stage`` and rule text, as ``rules`` and ``trace`` give
        them): what a name a rule dropped would have become without it.

        >>> m = WeightsMapper(orig_to_new_regex={"bias$": None, "^t\\.": "model."})
        >>> m.map_name("t.bias"), m.without("regex", "bias$").map_name("t.bias")
        (None, 'model.bias')
        """
        if stage == "renaming":
            kept = [r for r in self.orig_to_new_renaming if renaming_label(r) != rule]
            return dataclasses.replace(self, orig_to_new_renaming=kept)
        table = getattr(self, f"orig_to_new_{stage}")
        kept_rules = {k: v for k, v in table.items() if getattr(k, "pattern", k) != rule}
        changes: dict[str, Any] = {f"orig_to_new_{stage}": kept_rules}
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_json(cls, rules: Mapping[str, Mapping[str, Any]]) -> WeightsMapper:
        """Build from ``{"orig_to_new_prefix": {...}, ...}`` as read from JSON.

        JSON has no tuples: a stacked rule's ``[new_substr, shard_id]`` list becomes a tuple.
        ``"behaviour": "old" | "new"`` beside the tables chooses the stacked stage's matching.
        Renaming objects are Python objects: build those mappers in Python.

        >>> m = WeightsMapper.from_json({"orig_to_new_stacked": {"q_proj": ["qkv_proj", "q"]}})
        >>> m.map_name_with_shard("a.q_proj.w")
        ('a.qkv_proj.w', 'q')
        """
        fields = {f"orig_to_new_{s}" for s in STAGES}
        unknown = set(rules) - fields - {"behaviour"}
        if unknown:
            raise MapperConfigError(
                f"WeightsMapper: unknown field(s) {sorted(unknown)}; "
                f"expected some of {sorted(fields)} and 'behaviour'"
            )
        kwargs: dict[str, Any] = {}
        for fname, table in rules.items():
            if fname == "behaviour":
                if table not in BEHAVIOURS:
                    raise MapperConfigError(
                        f"WeightsMapper: behaviour must be 'old' or 'new', not {table!r}"
                    )
                kwargs[fname] = table
                continue
            if not isinstance(table, Mapping):
                raise MapperConfigError(f"WeightsMapper: {fname} must be an object of rules")
            if fname == "orig_to_new_stacked":
                table = {k: (tuple(v) if isinstance(v, list) else v) for k, v in table.items()}
                for key, value in table.items():
                    shard = value[1] if isinstance(value, tuple) and len(value) == 2 else 0
                    for shard_id in shard if isinstance(shard, list) else [shard]:
                        if isinstance(shard_id, bool) or not isinstance(shard_id, (int, str)):
                            raise MapperConfigError(
                                f"WeightsMapper: orig_to_new_stacked[{key!r}]: a shard id is an "
                                f"int or a str (or a list of them), not {shard_id!r}"
                            )
            kwargs[fname] = dict(table)
        return cls(**kwargs)


def stacked_rematches(trace: MapTrace) -> list[Rematch]:
    """Where a stacked rule of ``trace`` matched inside text an earlier stacked rule wrote.

    Under ``"new"`` at most one stacked rule fires, so the list is empty. Each step's match is
    found as the old stage finds it (the first occurrence of the key), and the text each rule
    wrote is followed through the later replacements.

    >>> qv = {"q_proj": ("qkv_proj", "q"), "v_proj": ("qkv_proj", "v")}
    >>> [r[:2] for r in stacked_rematches(WeightsMapper(orig_to_new_stacked=qv).trace("q_proj.w"))]
    [('q_proj', 'v_proj')]
    """
    found: list[Rematch] = []
    written: list[tuple[str, int, int]] = []  # (rule, start, end) of text a rule wrote
    for step in trace.steps:
        if step.stage != "stacked":
            continue
        start = step.before.find(step.rule)
        end = start + len(step.rule)
        if start < 0 or step.after is None:  # a drop (or a match that is not a plain substring)
            break
        for rule, a, b in written:
            if start < b and end > a and (rule, step.rule) not in [r[:2] for r in found]:
                found.append(Rematch(rule, step.rule, trace.name, trace.result))
        grown = len(step.after) - len(step.before)
        written = [
            (rule, a, b) if b <= start else (rule, a + grown, b + grown)
            for rule, a, b in written
            if b <= start or a >= end
        ]
        written.append((step.rule, start, end + grown))
    return found


def rematch_examples(mapper: WeightsMapper, names: Iterable[str] = ()) -> list[Rematch]:
    """Each pair of ``mapper``'s stacked rules where vLLM 0.34.0 (``"old"``) matches one rule
    inside another's output, once, with a name that shows it.

    The example is the first of ``names`` that shows the pair; for a pair no name shows, a name
    made of the first rule's key (``x.<key>.weight``). Whatever ``mapper.behaviour`` is, the pairs
    are the old stage's: what vLLM 0.34.0 would do with these rules.

    >>> qv = {"q_proj": ("qkv_proj", "q"), "v_proj": ("qkv_proj", "v")}
    >>> m = WeightsMapper(orig_to_new_stacked=qv, behaviour="new")
    >>> [(r.first, r.then, r.name) for r in rematch_examples(m)]
    [('q_proj', 'v_proj', 'x.q_proj.weight')]
    """
    if not mapper.orig_to_new_stacked:
        return []
    old = WeightsMapper(orig_to_new_stacked=mapper.orig_to_new_stacked, behaviour="old")
    made = [f"x.{key.strip('.')}.weight" for key in mapper.orig_to_new_stacked if key.strip(".")]
    pairs: dict[tuple[str, str], Rematch] = {}
    for name in [*names, *made]:
        for r in stacked_rematches(old.trace(name)):
            pairs.setdefault((r.first, r.then), r)
    return list(pairs.values())
