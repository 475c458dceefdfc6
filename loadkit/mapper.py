"""``WeightsMapper``: rewrites checkpoint names into model names (SPEC 1).

Five stages run in a fixed order (regex, substr, stacked, prefix, suffix). Within a stage every
rule is tried in dict order against the name as the earlier rules left it, so rules chain. A rule
whose value is ``None`` drops the weight. This module does not import torch: the header-only
inspector maps names without it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from loadkit.errors import MapperConfigError

STAGES = ("regex", "substr", "stacked", "prefix", "suffix")

ShardId = Any  # upstream uses ints and strings ("q", "k", "v", 0, 1, ...)


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
    orig_to_new_regex: Mapping[str | re.Pattern[str], str | None] = field(default_factory=dict)
    orig_to_new_substr: Mapping[str, str | None] = field(default_factory=dict)
    orig_to_new_stacked: Mapping[str, tuple[str, ShardId] | None] = field(default_factory=dict)
    orig_to_new_prefix: Mapping[str, str | None] = field(default_factory=dict)
    orig_to_new_suffix: Mapping[str, str | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Validate at build time: upstream only fails (or silently misbehaves) at use.
        compiled = []
        for pattern, repl in self.orig_to_new_regex.items():
            if not isinstance(pattern, (str, re.Pattern)) or not (
                repl is None or isinstance(repl, str)
            ):
                raise MapperConfigError(
                    f"WeightsMapper: orig_to_new_regex rules map a pattern to a str or None, "
                    f"not {pattern!r}: {repl!r}"
                )
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
            if not isinstance(key, str) or (
                value is not None
                and not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str))
            ):
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
        return WeightsMapper(
            **{
                f"orig_to_new_{s}": {
                    **getattr(self, f"orig_to_new_{s}"),
                    **getattr(other, f"orig_to_new_{s}"),
                }
                for s in STAGES
            }
        )

    def is_empty(self) -> bool:
        return not any(getattr(self, f"orig_to_new_{s}") for s in STAGES)

    @classmethod
    def from_json(cls, rules: Mapping[str, Mapping[str, Any]]) -> WeightsMapper:
        """Build from ``{"orig_to_new_prefix": {...}, ...}`` as read from JSON.

        JSON has no tuples: a stacked rule's ``[new_substr, shard_id]`` list becomes a tuple.
        """
        fields = {f"orig_to_new_{s}" for s in STAGES}
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
                for key, value in table.items():
                    shard_id = value[1] if isinstance(value, tuple) and len(value) == 2 else 0
                    if isinstance(shard_id, bool) or not isinstance(shard_id, (int, str)):
                        raise MapperConfigError(
                            f"WeightsMapper: orig_to_new_stacked[{key!r}]: a shard id is an "
                            f"int or a str, not {shard_id!r}"
                        )
            kwargs[fname] = dict(table)
        return cls(**kwargs)
