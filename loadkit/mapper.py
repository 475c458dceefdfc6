"""``WeightsMapper``: rewrites checkpoint names into model names (SPEC 1, 10).

Six stages run in a fixed order (renaming, regex, substr, stacked, prefix, suffix). Within a stage
every rule is tried in order against the name as the earlier rules left it, so rules chain. A rule
whose value is ``None`` drops the weight. The first stage, as upstream's, is a list of renaming
objects (transformers' ``WeightRenaming``) with ``rename_source_key(key) -> (new_key, matched)``.
This module does not import torch: the header-only inspector maps names without it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from loadkit.errors import MapperConfigError

STAGES = ("renaming", "regex", "substr", "stacked", "prefix", "suffix")
DICT_STAGES = STAGES[1:]  # the stages whose rules are a mapping (and can come from JSON)

ShardId = Any  # upstream uses ints and strings ("q", "k", "v", 0, 1, ...)


class Renaming(Protocol):
    """A rule of the renaming stage: transformers' ``WeightRenaming`` is one.

    ``rename_source_key(key)`` returns ``(new_key, matched)``; ``matched`` is the source pattern
    that matched (``None`` when the rule did not apply).
    """

    def rename_source_key(self, source_key: str) -> tuple[str, Any]: ...


def renaming_label(rule: Any) -> str:
    """A renaming rule as one line of text: ``'LayerNorm.gamma -> LayerNorm.weight'``.

    >>> class R:
    ...     source_patterns, target_patterns, scope_prefix = ["a"], ["b"], None
    >>> renaming_label(R())
    'a -> b'
    """
    sources = getattr(rule, "source_patterns", None)
    targets = getattr(rule, "target_patterns", None)
    if not sources or not targets:
        return repr(rule)
    text = f"{' | '.join(sources)} -> {' | '.join(targets)}"
    scope = getattr(rule, "scope_prefix", None)
    return f"{text} (under {scope!r})" if scope else text


def renaming_target(rule: Any) -> str | None:
    """What a renaming rule writes (its first target pattern), for reports."""
    targets = getattr(rule, "target_patterns", None)
    return targets[0] if targets else None


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
    shard_id: ShardId | None
    steps: tuple[MapStep, ...]

    @property
    def dropped_by(self) -> MapStep | None:
        return self.steps[-1] if self.result is None and self.steps else None


def _compile(pattern: str | re.Pattern[str]) -> re.Pattern[str]:
    if isinstance(pattern, re.Pattern):
        return pattern
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise MapperConfigError(f"WeightsMapper: invalid regex {pattern!r}: {exc}") from None


@dataclass(frozen=True)
class WeightsMapper:
    orig_to_new_renaming: Sequence[Renaming] = ()
    orig_to_new_regex: Mapping[str | re.Pattern[str], str | None] = field(default_factory=dict)
    orig_to_new_substr: Mapping[str, str | None] = field(default_factory=dict)
    orig_to_new_stacked: Mapping[str, tuple[str, ShardId] | None] = field(default_factory=dict)
    orig_to_new_prefix: Mapping[str, str | None] = field(default_factory=dict)
    orig_to_new_suffix: Mapping[str, str | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Validate at build time: upstream only fails (or silently misbehaves) at use.
        renamings = tuple(self.orig_to_new_renaming)
        for rule in renamings:
            if not callable(getattr(rule, "rename_source_key", None)):
                raise MapperConfigError(
                    "WeightsMapper: orig_to_new_renaming holds objects with "
                    f"rename_source_key(key) (transformers' WeightRenaming), not {rule!r}"
                )
        object.__setattr__(self, "orig_to_new_renaming", renamings)  # frozen: a tuple
        compiled = []
        for pattern, repl in self.orig_to_new_regex.items():
            rx = _compile(pattern)
            if repl is not None:
                try:
                    rx.sub(repl, "")  # compiles the template: a bad back-reference fails now
                except (re.error, IndexError) as exc:
                    raise MapperConfigError(
                        f"WeightsMapper: regex {rx.pattern!r} has an invalid replacement "
                        f"{repl!r}: {exc}"
                    ) from None
            compiled.append((rx, repl))
        object.__setattr__(self, "_regex", tuple(compiled))
        for suffix in self.orig_to_new_suffix:
            if suffix == "":
                raise MapperConfigError(
                    "WeightsMapper: an empty suffix in orig_to_new_suffix would match every name; "
                    "use orig_to_new_prefix={'': ...} to prepend, or a regex"
                )
        for key, value in self.orig_to_new_stacked.items():
            if value is not None and not (isinstance(value, tuple) and len(value) == 2):
                raise MapperConfigError(
                    f"WeightsMapper: orig_to_new_stacked[{key!r}] must be (new_substr, shard_id) "
                    f"or None, not {value!r}"
                )
        for fname in ("orig_to_new_substr", "orig_to_new_prefix", "orig_to_new_suffix"):
            for key, value in getattr(self, fname).items():
                if not isinstance(key, str) or not (value is None or isinstance(value, str)):
                    raise MapperConfigError(
                        f"WeightsMapper: {fname} rules map str to str or None, "
                        f"not {key!r}: {value!r}"
                    )

    # --- the one walk every public method uses ---

    def trace(self, name: str) -> MapTrace:
        """Map ``name`` and record every rule that fired (for ledgers and the inspector)."""
        steps: list[MapStep] = []
        shard_id: ShardId | None = None
        key = name

        def fire(stage: str, rule: str, after: str | None) -> None:
            steps.append(MapStep(stage, rule, key, after))

        for renaming in self.orig_to_new_renaming:
            new, matched = renaming.rename_source_key(key)
            if not isinstance(new, str):
                raise MapperConfigError(
                    f"WeightsMapper: renaming {renaming_label(renaming)!r} turned {key!r} into "
                    f"{new!r}, not a name"
                )
            if matched is not None or new != key:
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
        for sub, target in self.orig_to_new_stacked.items():
            if sub in key:
                new = None if target is None else key.replace(sub, target[0], 1)
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

    # --- the upstream surface ---

    def map_name(self, name: str) -> str | None:
        return self.trace(name).result

    # Upstream callers (the pooling probe among them) use the private spelling.
    _map_name = map_name

    def map_name_with_shard(self, name: str) -> tuple[str, ShardId | None] | None:
        t = self.trace(name)
        return None if t.result is None else (t.result, t.shard_id)

    def apply(self, weights: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        """Lazily map a weight stream, dropping ``None`` and tagging stacked weights' shard id."""
        for name, tensor in weights:
            t = self.trace(name)
            if t.result is None:
                continue
            if t.shard_id is not None:
                tensor.shard_id = t.shard_id
            yield t.result, tensor

    def apply_list(self, names: Iterable[str]) -> list[str]:
        return [m for m in map(self.map_name, names) if m is not None]

    def apply_dict(self, values: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in values.items():
            mapped = self.map_name(name)
            if mapped is not None:
                out[mapped] = value  # later key wins on collision
        return out

    def __or__(self, other: WeightsMapper) -> WeightsMapper:
        if not isinstance(other, WeightsMapper):
            return NotImplemented
        # Every field merges; upstream once forgot the regex one and dropped its rules silently.
        # Renamings are a list: concatenated, as upstream.
        return WeightsMapper(
            orig_to_new_renaming=(*self.orig_to_new_renaming, *other.orig_to_new_renaming),
            **{
                f"orig_to_new_{s}": {
                    **getattr(self, f"orig_to_new_{s}"),
                    **getattr(other, f"orig_to_new_{s}"),
                }
                for s in DICT_STAGES
            },
        )

    def is_empty(self) -> bool:
        return not any(getattr(self, f"orig_to_new_{s}") for s in STAGES)

    def rules(self) -> Iterator[tuple[str, str, Any]]:
        """Every rule in the order it is tried: ``(stage, rule as text, target)``.

        The rule text is what ``trace`` records in its steps; the target is the replacement
        (``None``: drops), ``[new_substr, shard_id]`` for stacked rules.

        >>> list(WeightsMapper(orig_to_new_prefix={"model.": ""}).rules())
        [('prefix', 'model.', '')]
        """
        for rule in self.orig_to_new_renaming:
            yield "renaming", renaming_label(rule), renaming_target(rule)
        for stage in DICT_STAGES:
            for rule, target in getattr(self, f"orig_to_new_{stage}").items():
                text = getattr(rule, "pattern", rule)
                yield stage, text, list(target) if isinstance(target, tuple) else target

    @classmethod
    def from_json(cls, rules: Mapping[str, Mapping[str, Any]]) -> WeightsMapper:
        """Build from ``{"orig_to_new_prefix": {...}, ...}`` as read from JSON.

        JSON has no tuples: a stacked rule's ``[new_substr, shard_id]`` list becomes a tuple.
        Renamings are objects, not JSON: the renaming stage cannot be given this way.
        """
        if "orig_to_new_renaming" in rules:
            raise MapperConfigError(
                "WeightsMapper: orig_to_new_renaming holds objects (transformers' WeightRenaming), "
                "which JSON cannot express; use orig_to_new_regex rules instead"
            )
        fields = {f"orig_to_new_{s}" for s in DICT_STAGES}
        unknown = set(rules) - fields
        if unknown:
            raise MapperConfigError(
                f"WeightsMapper: unknown field(s) {sorted(unknown)}; "
                f"expected some of {sorted(fields)}"
            )
        kwargs: dict[str, Any] = {}
        for fname, table in rules.items():
            if not isinstance(table, Mapping):
                raise MapperConfigError(f"WeightsMapper: {fname} must be an object of rules")
            if fname == "orig_to_new_stacked":
                table = {k: (tuple(v) if isinstance(v, list) else v) for k, v in table.items()}
            kwargs[fname] = dict(table)
        return cls(**kwargs)
