"""The checkpoint section of an inspect report, torch-free.

Built by ``loadkit_inspect.inspector`` from the safetensors headers alone; the mapper's trace
is in ``loadkit_inspect.mapper_trace``, the model sections (filled in by the dry load) in
``loadkit_inspect.report.records``.
"""

from __future__ import annotations

from collections import Counter
from itertools import compress, groupby
from operator import attrgetter
from typing import TYPE_CHECKING, Any, NamedTuple

from loadkit.checkpoint.shards import INDEX_NAME

if TYPE_CHECKING:
    from loadkit.checkpoint import IndexProblem
    from loadkit.checkpoint.reader import Checkpoint, TensorInfo
    from loadkit_inspect.sources.resolve import Source


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
    index: str | None = None  # the index file (or URL) read; None: a lone file, no index

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
            "index": self.index,
            "problems": [p.as_dict() for p in self.problems],
            "source": self.source.as_dict() if self.source else None,
        }


def summarize_checkpoint(
    ck: Checkpoint, problems: list[IndexProblem] | None = None, source: Source | None = None
) -> CheckpointSummary:
    """The checkpoint section of a report: tensors and bytes per file and per dtype.

    >>> from loadkit.checkpoint.reader import open_checkpoint
    >>> s = summarize_checkpoint(open_checkpoint("data/plamo2/tied-with-lm-head"))
    >>> [(f.file.rsplit("/", 1)[1], f.tensors) for f in s.files], list(s.dtypes)
    ([('model-00001-of-00002.safetensors', 29), ('model-00002-of-00002.safetensors', 1)], ['F32'])
    """
    tensors = list(ck.tensors.values())
    # Whole columns, summed at C speed (a checkpoint of 100,000 tensors has a few dtypes and
    # comes shard by shard) rather than a loop over the tensors.
    nbytes = list(map(_NBYTES, tensors))
    per_file = _per_file(ck.files, list(map(_FILE, tensors)), nbytes)
    return CheckpointSummary(
        ck.path,
        [ShardSummary(f, n, b) for f, (n, b) in per_file.items()],
        tensors,
        sum(nbytes),
        _per_dtype(list(map(_DTYPE, tensors)), nbytes),
        list(problems or []),
        source,
        _index(ck.path),
    )


def _index(path: str) -> str | None:
    """The index a checkpoint path was read through: a remote index's URL, a folder's
    ``model.safetensors.index.json`` (also a dangling link: an index that cannot be read)."""
    import os

    if path.endswith(".json"):
        return path
    index = os.path.join(path, INDEX_NAME)
    return index if os.path.lexists(index) else None


_FILE, _DTYPE, _NBYTES = attrgetter("file"), attrgetter("dtype"), attrgetter("nbytes")


def _per_file(files: list[str], of: list[str], nbytes: list[int]) -> dict[str, tuple[int, int]]:
    """(tensors, bytes) per file: each of ``files`` in order, then any other file a tensor is
    ``of``, in order of appearance; each run of tensors of one file is summed at once."""
    totals = dict.fromkeys(files, (0, 0))
    start = 0
    for file, run in groupby(of):
        n = len(list(run))
        tensors, size = totals.get(file, (0, 0))
        totals[file] = (tensors + n, size + sum(nbytes[start : start + n]))
        start += n
    return totals


def _per_dtype(dtypes: list[str], nbytes: list[int]) -> dict[str, tuple[int, int]]:
    """(tensors, bytes) per dtype, by dtype name; one pass over the columns per dtype."""
    return {
        d: (n, sum(compress(nbytes, map(d.__eq__, dtypes))))
        for d, n in sorted(Counter(dtypes).items())
    }
