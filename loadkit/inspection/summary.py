"""The checkpoint section of an inspect report, torch-free.

Built by ``loadkit.inspection.inspector`` from the safetensors headers alone; the mapper's trace
is in ``loadkit.inspection.mapper_trace``, the model sections (filled in by the dry load) in
``loadkit.inspection.records``.
"""

from __future__ import annotations

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
        """The index problems a loader following the index raises for (a shard it cannot read)."""
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
