"""The mapper section: ``--mapper`` rules parsed, and every checkpoint name traced through a mapper
(``MapperReport``: which rule fired for which key).

Torch-free, and imported only where a mapper is involved (``loadkit.mapper`` where one is
parsed), not for a plain layout report.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadkit.errors import MapperConfigError, printable
from loadkit.fmt import plural
from loadkit_inspect.report.text import capped

if TYPE_CHECKING:
    from loadkit.mapper import WeightsMapper

MAX_MAPPER_BYTES = 10_000_000  # a --mapper file (rules, not data)


@dataclass(eq=False)
class RuleUse:
    """One mapper rule and the keys it fired for (in checkpoint order)."""

    stage: str
    rule: str
    target: Any  # the replacement; None for a dropping rule; [new, shard_id]
    origin: str | None = None  # where the rule comes from, when the model says (--model hf)
    fired: int = 0
    example: tuple[str, str | None] | None = None  # (before, after), first firing

    def __repr__(self) -> str:
        return f"RuleUse({self.stage} {self.rule!r}, fired={self.fired})"


@dataclass(eq=False)
class MapperReport:
    """Which rule fired for which key, and which keys the mapper drops."""

    source: str  # "--mapper", "given mapper", or "<Model>.hf_to_vllm_mapper"
    rules: list[RuleUse]
    traces: list[dict[str, Any]]  # keys a rule fired for: name, mapped, shard_id, steps
    dropped: list[tuple[str, str]]  # (key, "stage 'rule'")
    unchanged: int
    note: str | None = None
    rematches: list[Any] = field(default_factory=list)  # loadkit.mapper.Rematch: vLLM 0.28.0's
    behaviour: str = "old"  # the mapper's stacked stage

    def __repr__(self) -> str:
        return f"<MapperReport {self.source}: {len(self.traces)} keys mapped>"

    def render(self, limit: int) -> list[str]:
        """The mapper section's text: each rule once, as written, with the keys it fired for;
        the dropped keys capped at ``limit`` rows."""
        renamed = len(self.traces) - len(self.dropped)
        lines = [
            f"mapper  ({self.source}): {plural(renamed, 'key')} renamed, "
            f"{len(self.dropped)} dropped, {self.unchanged} unchanged"
        ]
        if self.note:
            lines.append(f"  note: {printable(self.note)}")
        for again in self.rematches:
            lines += _rematch_lines(again, self.behaviour)
        for use in self.rules:
            lines += _rule_lines(use)
        if self.dropped:
            lines.append(f"  dropped keys ({len(self.dropped)})")
            rows = [f"    {printable(k)}  ({printable(rule)})" for k, rule in self.dropped]
            lines += capped(rows, len(rows), limit)
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "rules": [
                {
                    "stage": r.stage,
                    "rule": r.rule,
                    "target": r.target,
                    "fired": r.fired,
                    "example": list(r.example) if r.example else None,
                    "origin": r.origin,
                }
                for r in self.rules
            ],
            "keys": self.traces,
            "dropped": [{"name": k, "rule": rule} for k, rule in self.dropped],
            "unchanged": self.unchanged,
            "note": self.note,
            "behaviour": self.behaviour,
            "rematches": [
                {"first": r.first, "then": r.then, "example": r.name, "vllm_0_28_0": r.result}
                for r in self.rematches
            ],
        }


def _rematch_lines(again: Any, behaviour: str) -> list[str]:
    """A stacked rule matching inside another's output (``loadkit.mapper.Rematch``)."""
    return [
        f"  warning: stacked rule {again.then!r} matches inside the output of stacked rule "
        f"{again.first!r} (vLLM 0.28.0 tries every stacked rule in turn): "
        f"{printable(again.name)} -> {printable(str(again.result))}",
        "           this mapper maps it once (behaviour='new')"
        if behaviour == "new"
        else f"           try {again.then!r} before {again.first!r}, or WeightsMapper(..., "
        "behaviour='new')",
    ]


def _rule_lines(use: RuleUse) -> list[str]:
    """One rule: as written (a renaming's label already says what it writes), how many keys it
    fired for, where it comes from, and its first firing."""
    rule = f"{use.stage:<8} '{printable(use.rule)}'"
    if use.stage != "renaming":
        target = use.target if not isinstance(use.target, str) else f"'{use.target}'"
        rule += f" -> {'drop' if use.target is None else printable(str(target))}"
    lines = [f"  {rule}: fired for {plural(use.fired, 'key')}"]
    if use.origin:
        lines.append(f"           {printable(use.origin)}")
    if use.example:
        before, after = use.example
        shown = "dropped" if after is None else printable(after)
        lines.append(f"           e.g. {printable(before)} -> {shown}")
    return lines


def parse_mapper(
    rules: WeightsMapper | Mapping[str, Any] | str | os.PathLike[str],
) -> WeightsMapper:
    """A mapper from a ``WeightsMapper``, a dict of its fields, JSON text, or a JSON file's path."""
    from loadkit.mapper import WeightsMapper

    if isinstance(rules, WeightsMapper):
        return rules
    if isinstance(rules, Mapping):
        return WeightsMapper.from_json(rules)
    text = str(rules)
    source = "--mapper"
    if not text.lstrip().startswith(("{", "[")):
        from loadkit.checkpoint import open_regular

        path = Path(text)
        try:
            exists = path.exists()
        except (OSError, ValueError):  # a name too long, or with a NUL byte
            exists = False
        if not exists:
            shown = text if len(text) <= 80 else text[:77] + "..."
            raise MapperConfigError(
                f"--mapper {shown!r}: neither JSON rules (an object such as "
                '{"orig_to_new_prefix": {"model.": ""}}) nor a readable JSON file'
            )
        source = str(path)
        fd = open_regular(source, lambda m: MapperConfigError(f"{printable(source)}: {m}"))
        with os.fdopen(fd, "rb") as f:
            raw = f.read(MAX_MAPPER_BYTES + 1)
        if len(raw) > MAX_MAPPER_BYTES:
            raise MapperConfigError(f"{printable(source)}: larger than {MAX_MAPPER_BYTES} bytes")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MapperConfigError(f"{printable(source)}: not UTF-8 ({exc.reason})") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise MapperConfigError(f"{source}: mapper rules nest too deeply") from None
    except ValueError as exc:  # JSONDecodeError, or an integer of more than 4300 digits
        raise MapperConfigError(f"{source}: mapper rules are not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise MapperConfigError(
            f"{source}: mapper rules must be a JSON object of WeightsMapper fields, "
            f"not {type(data).__name__}"
        )
    return WeightsMapper.from_json(data)


def mapper_report(
    mapper: WeightsMapper,
    names: list[str],
    source: str,
    origins: Mapping[tuple[str, str], str] | None = None,
) -> MapperReport:
    """Trace every name through ``mapper``: rule use counts, per-key steps, dropped keys.

    ``origins`` says where rules come from, by ``(stage, rule text)`` (a model's
    ``mapper_rule_origins``: which rules transformers supplied)."""
    from loadkit.mapper import rule_text  # the mapper's module: loaded, as it made ``mapper``

    origins = origins or {}
    rules: dict[tuple[str, str], RuleUse] = {}
    for stage, text, target in mapper.rules():
        rules.setdefault((stage, text), RuleUse(stage, text, target, origins.get((stage, text))))
    traces: list[dict[str, Any]] = []
    dropped: list[tuple[str, str]] = []
    unchanged = 0
    for name in names:
        t = mapper.trace(name)
        if not t.steps:
            unchanged += 1
            continue
        for step in t.steps:
            use = rules[(step.stage, step.rule)]
            use.fired += 1
            if use.example is None:
                use.example = (step.before, step.after)
        if t.result is None and t.dropped_by is not None:
            dropped.append((name, rule_text(t.dropped_by.stage, t.dropped_by.rule)))
        traces.append(
            {
                "name": name,
                "mapped": t.result,
                "shard_id": t.shard_id,
                "steps": [
                    {"stage": s.stage, "rule": s.rule, "before": s.before, "after": s.after}
                    for s in t.steps
                ],
            }
        )
    from loadkit.mapper import rematch_examples

    report = MapperReport(source, list(rules.values()), traces, dropped, unchanged)
    # Stacked rules vLLM 0.28.0 applies one inside the other's output, whatever this mapper's
    # behaviour: the warning is about what vLLM does with these rules.
    report.rematches = rematch_examples(mapper, names)
    report.behaviour = mapper.behaviour
    return report
