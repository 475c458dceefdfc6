"""The checkpoint section of an inspect report, torch-free.

Built by ``loadkit_inspect.inspector`` from the safetensors headers alone; the mapper's trace
is in ``loadkit_inspect.mapper_trace``, the model sections (filled in by the dry load) in
``loadkit_inspect.report.records``.
"""

from __future__ import annotations

import os
from collections import Counter
from itertools import compress
from operator import attrgetter
from typing import TYPE_CHECKING, Any, NamedTuple

from loadkit.checkpoint.shards import INDEX_NAME

if TYPE_CHECKING:
    from loadkit.checkpoint import IndexProblem
    from loadkit.checkpoint.reader import Checkpoint, TensorInfo
    from loadkit_inspect.sources.files import FileChoice
    from loadkit_inspect.sources.resolve import Source


class ShardSummary(NamedTuple):
    """One file of the checkpoint: the tensors and bytes its header holds (``None``: it cannot
    be read), and the loaders that read it."""

    file: str
    tensors: int | None
    nbytes: int
    read_by: tuple[str, ...] = ()


class CheckpointSummary(NamedTuple):
    path: str
    files: list[ShardSummary]
    tensors: list[TensorInfo]
    total_bytes: int
    dtypes: dict[str, tuple[int, int]]  # dtype -> (tensors, bytes)
    problems: list[IndexProblem] = []  # noqa: RUF012 (a NamedTuple default, never mutated)
    source: Source | None = None  # what the argument named: a path, a repo id, a URL
    # the index file (or URL) read; None: a lone file, no index
    index: str | None = None  # type: ignore[assignment]  # a field named like tuple.index
    # each loader -> the files it reads (a folder, a URL); {}: an opened Checkpoint
    loader_files: dict[str, FileChoice] = {}  # noqa: RUF012 (a NamedTuple default)

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
                {
                    "file": s.file,
                    "tensors": s.tensors,
                    "bytes": s.nbytes,
                    "read_by": list(s.read_by),
                }
                for s in self.files
            ],
            "loader_files": {n: c.as_dict() for n, c in self.loader_files.items()},
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
    ck: Checkpoint,
    problems: list[IndexProblem] | None = None,
    source: Source | None = None,
    loader_files: dict[str, FileChoice] | None = None,
    held: dict[str, tuple[int, int]] | None = None,
) -> CheckpointSummary:
    """The checkpoint section of a report: every file with the tensors its header holds and the
    loaders that read it (``held``: each file read -> (tensors, bytes), by default the
    checkpoint's; a file that cannot be read is listed too), and the tensors ``ck`` keeps, per
    dtype.

    >>> from loadkit.checkpoint.reader import open_checkpoint
    >>> s = summarize_checkpoint(open_checkpoint("data/plamo2/tied-with-lm-head"))
    >>> [(f.file.rsplit("/", 1)[1], f.tensors) for f in s.files], list(s.dtypes)
    ([('model-00001-of-00002.safetensors', 29), ('model-00002-of-00002.safetensors', 1)], ['F32'])
    """
    tensors = list(ck.tensors.values())
    # Whole columns, summed at C speed (a checkpoint of 100,000 tensors has a few dtypes and
    # comes shard by shard) rather than a loop over the tensors.
    nbytes = list(map(_NBYTES, tensors))
    choices = loader_files or {}
    rows = [
        ShardSummary(f, n, b, _read_by(ck.path, f, choices))
        for f, (n, b) in (ck.held if held is None else held).items()
    ]
    listed = {r.file for r in rows}
    for p in problems or []:  # a file that cannot be read: counted, with no tensors
        file = os.path.join(ck.path, p.found_in[0]) if p.found_in else ""
        if p.kind == "unreadable shard" and file not in listed:
            rows.append(ShardSummary(file, None, 0, _read_by(ck.path, file, choices)))
            listed.add(file)
    return CheckpointSummary(
        ck.path,
        rows,
        tensors,
        sum(nbytes),
        _per_dtype(list(map(_DTYPE, tensors)), nbytes),
        list(problems or []),
        source,
        _index(ck.path),
        choices,
    )


def _read_by(root: str, file: str, choices: dict[str, FileChoice]) -> tuple[str, ...]:
    """The loaders whose chosen files include ``file`` (named relative to the checkpoint's
    folder, or by its last component for a URL)."""
    name = os.path.relpath(file, root) if os.path.isdir(root) else file.rsplit("/", 1)[-1]
    return tuple(loader for loader, c in choices.items() if name in c.files)


def _index(path: str) -> str | None:
    """The index a checkpoint path was read through: a remote index's URL, a folder's
    ``model.safetensors.index.json`` (also a dangling link: an index that cannot be read)."""
    if path.endswith(".json"):
        return path
    index = os.path.join(path, INDEX_NAME)
    return index if os.path.lexists(index) else None


_DTYPE, _NBYTES = attrgetter("dtype"), attrgetter("nbytes")


def _per_dtype(dtypes: list[str], nbytes: list[int]) -> dict[str, tuple[int, int]]:
    """(tensors, bytes) per dtype, by dtype name; one pass over the columns per dtype."""
    return {
        d: (n, sum(compress(nbytes, map(d.__eq__, dtypes))))
        for d, n in sorted(Counter(dtypes).items())
    }
