"""The header sections of an inspect report: the checkpoint and the mapper's trace, torch-free.

Built by ``loadkit.inspection.inspector`` from the safetensors headers alone; the model sections
(filled in by the dry load) are in ``loadkit.inspection.records``. These are NamedTuples and
slotted classes, not dataclasses: ``dataclasses`` imports ``inspect`` (and ast, dis, tokenize),
about a sixth of a header-only ``loadkit inspect`` run (``tests/test_architecture.py`` checks).
"""

from __future__ import annotations

from loadkit.checkpoint.record import Record

TYPE_CHECKING = False  # typing's, without importing typing (see loadkit.checkpoint.record)
if TYPE_CHECKING:
    from typing import Any

    from loadkit.checkpoint.index import IndexProblem
    from loadkit.checkpoint.reader import TensorInfo
    from loadkit.checkpoint.sources import Source


class ShardSummary(Record):
    file: str
    tensors: int
    nbytes: int


class CheckpointSummary(Record):
    path: str
    files: list[ShardSummary]
    tensors: list[TensorInfo]
    total_bytes: int
    dtypes: dict[str, tuple[int, int]]  # dtype -> (tensors, bytes)
    problems: list[IndexProblem] = []  # noqa: RUF012 (a NamedTuple default, never mutated)
    source: Source | None = None  # what the argument named: a path, a repo id, a URL

    @property
    def failing(self) -> list[IndexProblem]:
        """The index problems a loader following the index fails on (a tensor cannot be read)."""
        return [p for p in self.problems if p.fails]

    @property
    def inconsistent(self) -> list[IndexProblem]:
        """The index problems every tensor still loads with (``--strict-index`` fails them)."""
        return [p for p in self.problems if p.severity == "inconsistent"]

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "files": [
                {"file": s.file, "tensors": s.tensors, "bytes": s.nbytes} for s in self.files
            ],
            "tensor_count": len(self.tensors),
            "bytes": self.total_bytes,
            "dtypes": {d: {"tensors": n, "bytes": b} for d, (n, b) in self.dtypes.items()},
            "tensors": [
                {
                    "name": t.name,
                    "dtype": t.dtype,
                    "shape": list(t.shape),
                    "bytes": t.nbytes,
                    "file": t.file,
                }
                for t in self.tensors
            ],
            "problems": [p.as_dict() for p in self.problems],
            "source": self.source.as_dict() if self.source else None,
        }


class RuleUse:
    """One mapper rule and the keys it fired for (in checkpoint order)."""

    __slots__ = ("example", "fired", "origin", "rule", "stage", "target")

    def __init__(self, stage: str, rule: str, target: Any, origin: str | None = None) -> None:
        self.stage = stage
        self.rule = rule
        self.target = target  # the replacement; None for a dropping rule; [new, shard_id]
        self.origin = origin  # where the rule comes from, when the model says (--model hf)
        self.fired = 0
        self.example: tuple[str, str | None] | None = None  # (before, after), first firing

    def __repr__(self) -> str:
        return f"RuleUse({self.stage} {self.rule!r}, fired={self.fired})"


class MapperReport:
    """Which rule fired for which key, and which keys the mapper drops."""

    def __init__(
        self,
        source: str,  # "--mapper", "given mapper", or "<Model>.hf_to_vllm_mapper"
        rules: list[RuleUse],
        traces: list[dict[str, Any]],  # keys a rule fired for: name, mapped, shard_id, steps
        dropped: list[tuple[str, str]],  # (key, "stage 'rule'")
        unchanged: int,
        note: str | None = None,
        rematches: list[Any] | None = None,  # loadkit.mapper.Rematch: what vLLM 0.28.0 re-matches
        behaviour: str = "old",  # the mapper's stacked stage
    ) -> None:
        self.rematches = rematches or []
        self.behaviour = behaviour
        self.source = source
        self.rules = rules
        self.traces = traces
        self.dropped = dropped
        self.unchanged = unchanged
        self.note = note

    def __repr__(self) -> str:
        return f"<MapperReport {self.source}: {len(self.traces)} keys mapped>"

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
