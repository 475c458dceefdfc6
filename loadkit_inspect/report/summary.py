"""The checkpoint section of an inspect report: its record, its JSON and its text; torch-free.

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

from loadkit.checkpoint import INDEX_NAME
from loadkit.errors import printable
from loadkit.fmt import format_bytes, plural, table
from loadkit_inspect.report.text import capped, joined_names

if TYPE_CHECKING:
    from loadkit.checkpoint import Checkpoint, IndexProblem, TensorInfo
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

    def render(self, limit: int) -> list[str]:
        """The checkpoint section's text: every file with the tensors its header holds, which
        files each loader reads, the dtypes, and the index problems, each list capped at
        ``limit`` rows."""
        n = len(self.tensors)
        held = [s for s in self.files if s.tensors is not None]
        total, size = sum(s.tensors or 0 for s in held), sum(s.nbytes for s in held)
        lines = [
            f"checkpoint  {printable(self.path)}",
            *(self.source.render() if self.source is not None else []),
            f"  {plural(len(self.files), 'file')}, {plural(total, 'tensor')}, {format_bytes(size)}",
        ]
        if (total, size) != (n, self.total_bytes):  # a key in two files, a file no loader reads
            lines.append(
                f"  vllm reads {plural(n, 'tensor')} ({format_bytes(self.total_bytes)}) of them: "
                "the files it reads, one copy of each key (the layout below)"
            )
        lines.append(
            "  dtypes  "
            + ", ".join(
                f"{d} {plural(k, 'tensor')} ({format_bytes(b)})"
                for d, (k, b) in self.dtypes.items()
            )
        )
        path = self.path
        if len(self.files) > 1 or os.path.isdir(path) or path.endswith(".json"):  # a remote index
            lines += _file_rows(self, limit)
        lines += _reads(self)
        if self.problems:
            lines += _index_problems(self, limit)
        return lines


def _file_rows(c: CheckpointSummary, limit: int) -> list[str]:
    """Every file with the tensors its header holds, and (where the loaders part ways) the
    loaders that read it."""
    split = len({s.read_by for s in c.files}) > 1 or any(not s.read_by for s in c.files)
    split = split and bool(c.loader_files)
    rows = []
    for s in c.files:
        count = (
            "cannot be read"
            if s.tensors is None
            else f"{s.tensors:>6} {'tensor' if s.tensors == 1 else 'tensors'}"
        )
        row = [printable(os.path.basename(s.file)), count, format_bytes(s.nbytes)]
        if split:
            row.append(", ".join(s.read_by) if s.read_by else "read by no loader")
        rows.append(tuple(row))
    align = "llr" + ("l" if split else "")
    shown = table(rows, align=align, indent="    ", min_widths=(0, 0, 10, 0)[: len(align)])
    head = "  files" + ("  (with the loaders that read each)" if split else "")
    return [head, *capped(shown.splitlines(), len(rows), limit)]


def _reads(c: CheckpointSummary) -> list[str]:
    """Which files each loader reads, chosen as it chooses them, or what it raises instead."""
    choices = c.loader_files
    if not choices or not any(x.how or x.raises for x in choices.values()):
        return []  # one file: what both read
    said = {}
    readable = len([s for s in c.files if s.tensors is not None])
    for loader, x in choices.items():
        if x.raises is not None:
            said[loader] = f"no file: it raises {x.raises.text()}"
            continue
        files = ", ".join(printable(f) for f in x.files[:3])
        files += f" and {len(x.files) - 3} more" if len(x.files) > 3 else ""
        if len(x.files) > 1 and len(x.files) == readable == len(c.files):
            files = "both files" if len(x.files) == 2 else f"all {len(x.files)} files"
        said[loader] = files + (f" ({x.how})" if x.how else "")
    if len(set(said.values())) == 1:
        return [f"  read by {' and '.join(said)}: {next(iter(said.values()))}"]
    return [f"  {loader} reads {what}" for loader, what in said.items()]


_SEVERITY = {"fails": 0, "inconsistent": 1, "note": 2}


def _index_problems(c: CheckpointSummary, limit: int) -> list[str]:
    """Index problems grouped by kind, shard and what they say (one missing shard of 52 keys is
    one row), those that stop the load first, at most ``limit`` rows."""
    failing, inconsistent = len(c.failing), len(c.inconsistent)
    notes = len(c.problems) - failing - inconsistent
    # a folder without an index has problems of its files (a key in two, one unreadable)
    head = f"  {'index' if c.index else 'file'} problems ({failing + inconsistent})"
    if failing:
        head += f": {failing} stop the load (a loader raises)"
        head += f", {inconsistent} inconsistent (these alone would not)" if inconsistent else ""
    elif inconsistent:
        head += f": loads; {'the index is' if c.index else 'the files are'} inconsistent"
    else:
        head += ": none"
    lines = [head + (f"; {plural(notes, 'note')}" if notes else "")]
    groups: dict[tuple[int, str, str, tuple[str, ...]], list[str | None]] = {}
    for p in c.problems:
        key = (_SEVERITY.get(p.severity, 1), p.kind, p.message, p.found_in)
        groups.setdefault(key, []).append(p.key)
    rows = []
    for (_, what_kind, message, _), keys in sorted(groups.items(), key=lambda kv: kv[0][:2]):
        named = [k for k in keys if k is not None]
        if len(keys) == 1:
            what = f"'{printable(named[0])}': " if named else ""
            rows.append(f"    {what_kind}: {what}{printable(message)}")
            continue
        shown = joined_names(named[:3]) + (f", ... ({len(named)} in all)" if len(named) > 3 else "")
        rows.append(
            f"    {what_kind}, {plural(len(keys), 'key')}, each: {printable(message)}"
            f"\n      {shown}"
        )
    return lines + capped(rows, len(rows), limit)


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
