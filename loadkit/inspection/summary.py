"""The header sections of an inspect report: the checkpoint and the mapper's trace, torch-free.

Built by ``loadkit.inspection.inspector`` from the safetensors headers alone; the model sections
(filled in by the dry load) are in ``loadkit.inspection.records``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from loadkit.checkpoint.index import IndexProblem
    from loadkit.checkpoint.reader import Checkpoint, TensorInfo
    from loadkit.checkpoint.sources import Source


class ShardSummary(NamedTuple):
    file: str
    tensors: int
    nbytes: int


class CheckpointSummary(NamedTuple):
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


def summarize_checkpoint(
    ck: Checkpoint, problems: list[IndexProblem] | None = None, source: Source | None = None
) -> CheckpointSummary:
    per_file: dict[str, list[int]] = {f: [0, 0] for f in ck.files}
    dtypes: dict[str, list[int]] = {}
    for t in ck.tensors.values():
        s = per_file.setdefault(t.file, [0, 0])
        s[0] += 1
        s[1] += t.nbytes
        d = dtypes.setdefault(t.dtype, [0, 0])
        d[0] += 1
        d[1] += t.nbytes
    return CheckpointSummary(
        ck.path,
        [ShardSummary(f, n, b) for f, (n, b) in per_file.items()],
        list(ck.tensors.values()),
        ck.total_bytes,
        {k: (n, b) for k, (n, b) in sorted(dtypes.items())},
        list(problems or []),
        source,
    )
