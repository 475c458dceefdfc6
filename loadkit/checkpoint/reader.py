"""Opening safetensors checkpoints from their headers alone (docs/hostile-input.md).

``open_checkpoint`` reads only the 8-byte length and the JSON header of each shard, validates
them exactly as strictly as the safetensors library does (``loadkit.checkpoint.header``) and
builds ``.tensors``; tensor bytes are read when ``.weights()`` is iterated. torch is imported only
there, so the header-only inspector runs without it. Which files a path stands for, and opening
them safely, is ``loadkit.checkpoint.shards``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from itertools import groupby, repeat
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from loadkit.checkpoint.dtypes import DTYPES, torch_name, torch_shape
from loadkit.checkpoint.header import (
    LFS_POINTER_MAX,
    MAX_HEADER_BYTES,
    HeaderProblem,
    TensorInfo,
    TruncatedData,
    oversized_length,
    parse_metadata,
    read_header,
)
from loadkit.checkpoint.merge import read_layout
from loadkit.checkpoint.shards import INDEX_NAME, local_layout, open_regular
from loadkit.errors import HeaderError, TruncatedCheckpointError, require_torch

if TYPE_CHECKING:
    import torch

__all__ = [
    "DTYPES",
    "INDEX_NAME",
    "MAX_HEADER_BYTES",
    "Checkpoint",
    "TensorInfo",
    "check_header_start",
    "decode_header",
    "open_checkpoint",
    "read_header_ranges",
    "read_safetensors_header",
]


# How a header's bytes are read: ``(start, length, check_start)`` -> (the bytes, at most
# ``length``; the file's size). ``check_start`` sees the first bytes as soon as they are in (a
# header that is not an object is refused before 100 MB are read).
ReadRange = Callable[[int, int, "Callable[[bytearray], None] | None"], tuple[bytearray, int]]
_START = 4096  # the header's first bytes, checked before the rest is read


def read_safetensors_header(
    path: str | os.PathLike[str],
) -> tuple[dict[str, TensorInfo], str | None]:
    """Parse and validate one file's header: (tensors in data-offset order, the ``__metadata__``
    JSON text or ``None``). Refuses what the safetensors library refuses, with a
    ``loadkit.errors.CheckpointError`` naming the file and the key."""
    file = os.fspath(path)
    with os.fdopen(open_regular(file), "rb") as f:
        size = os.fstat(f.fileno()).st_size

        def read_range(
            start: int, length: int, check_start: Callable[[bytearray], None] | None
        ) -> tuple[bytearray, int]:
            f.seek(start)
            raw = bytearray(length)
            view = memoryview(raw)
            got = f.readinto(view[: min(length, _START)]) or 0
            if check_start is not None:
                check_start(raw[:got])
            if got < length:
                got += f.readinto(view[got:]) or 0
            view.release()
            return (raw if got == length else raw[:got]), size

        return read_header_ranges(file, read_range)


def read_header_ranges(
    file: str, read_range: ReadRange
) -> tuple[dict[str, TensorInfo], str | None]:
    """A header read from wherever its bytes are (``read_range``: a local file's, a server's
    HTTP Range requests), checked as strictly as ``read_safetensors_header`` checks a file's;
    errors name ``file`` (a path or a URL). Only the 8-byte length and the header are read.

    >>> data = open("data/plamo2/untied.safetensors", "rb").read()
    >>> def read_range(at, n, check_start):
    ...     return bytearray(data[at : at + n]), len(data)
    >>> tensors, _ = read_header_ranges("x", read_range)
    >>> tensors["lm_head.weight"].shape
    (48, 16)
    """
    head, size = read_range(0, 8, None)
    if len(head) < 8:
        raise TruncatedCheckpointError(
            file, f"file is {size} bytes, too short for the 8-byte header length"
        )
    n = int.from_bytes(head, "little")
    if n > MAX_HEADER_BYTES:  # a small file's start may be a Git LFS pointer: read it
        if size <= LFS_POINTER_MAX and head == b"version ":
            head, _ = read_range(0, size, None)
        raise HeaderError(file, oversized_length(bytes(head), n, size))
    if n > size - 8:
        raise TruncatedCheckpointError(
            file, f"header claims {n} bytes but only {size - 8} follow the length field"
        )
    raw = bytearray()
    if n:
        raw, _ = read_range(8, n, lambda start: check_header_start(file, start))
    if len(raw) != n:
        raise TruncatedCheckpointError(file, f"read {len(raw)} of the header's {n} bytes")
    return decode_header(file, raw, size - 8 - n)


def check_header_start(file: str, start: bytes | bytearray) -> None:
    """Refuse a header whose first bytes show it is not a JSON object (before the rest of a
    100 MB header is read)."""
    first = start.lstrip(b" \t\n\r")[:1]
    if first and first != b"{":
        raise HeaderError(file, f"the header is not an object (it starts {bytes(first)!r})")


def decode_header(
    file: str, raw: bytearray, data_size: int
) -> tuple[dict[str, TensorInfo], str | None]:
    """The tensors (data-offset order) and ``__metadata__`` text of a header's ``raw`` bytes,
    from a file holding ``data_size`` bytes after it; problems raise errors naming ``file``
    (a path or a URL). ``raw`` is emptied: a 100 MB header is held once, as text."""
    n = len(raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HeaderError(
            file, f"header is not valid UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None
    del raw[:]  # the text replaces it: a 100 MB header is held once
    try:
        table = read_header(text, data_size)
    except TruncatedData as exc:
        raise TruncatedCheckpointError(file, exc.message, exc.key) from None
    except HeaderProblem as exc:
        raise HeaderError(file, exc.message, exc.key) from None
    del text
    base = 8 + n
    # Each TensorInfo built at C speed, from the table's columns: tuple.__new__ skips the
    # NamedTuple's Python-level __new__, map and zip the per-tensor Python loop.
    fields = zip(
        table.names,
        table.dtypes,
        table.shapes,
        table.nbytes,
        repeat(file),
        map(base.__add__, table.begins),
    )
    infos = map(tuple.__new__, repeat(TensorInfo), fields)
    return dict(zip(table.names, infos, strict=True)), table.metadata


class Checkpoint:
    """An opened checkpoint: ``tensors`` from headers, ``weights()`` to read the data."""

    def __init__(
        self,
        path: str,
        files: list[str],
        tensors: dict[str, TensorInfo],
        metadata_text: dict[str, str | None],
        held: dict[str, tuple[int, int]] | None = None,
    ) -> None:
        self.path = path
        self.files = files
        self.tensors = tensors
        self._metadata_text = metadata_text
        self._metadata: dict[str, dict[str, str]] | None = None
        self._held = held

    @property
    def held(self) -> dict[str, tuple[int, int]]:
        """Every file read -> ``(tensors, bytes)`` its header holds, in reading order: a key
        stored in two files counts in each, a file beside the index that it does not name is
        counted too (``tensors`` keeps one copy of each key, from the files a loader reads)."""
        if self._held is None:  # one copy of each key: what ``tensors`` holds, per file
            totals = dict.fromkeys(self.files, (0, 0))
            infos = list(self.tensors.values())
            start = 0
            for file, run in groupby(map(_FILE, infos)):  # each run of one file summed at once
                n = len(list(run))
                tensors, size = totals.get(file, (0, 0))
                totals[file] = (tensors + n, size + sum(map(_NBYTES, infos[start : start + n])))
                start += n
            self._held = totals
        return self._held

    @property
    def metadata(self) -> dict[str, dict[str, str]]:
        """File -> its ``__metadata__`` (``{}`` without one); decoded on first use, so a header
        whose metadata is huge costs nothing until it is asked for."""
        if self._metadata is None:
            self._metadata = {f: parse_metadata(t) for f, t in self._metadata_text.items()}
        return self._metadata

    @property
    def total_bytes(self) -> int:
        return sum(map(_NBYTES, self.tensors.values()))

    def __len__(self) -> int:
        return len(self.tensors)

    def weights(self, *, reuse_buffer: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(name, tensor)`` lazily: shards in file-name order, tensors in data order.

        Each tensor has the dtype and shape ``safetensors.torch.load_file`` gives it, and the
        same bytes. With ``reuse_buffer=True`` every tensor is a view into one buffer that the
        next tensor overwrites, as streaming loaders do: a consumer that holds a view without
        cloning it sees later data.
        """
        require_torch("Checkpoint.weights (reading tensors)")
        import torch

        shared = None
        if reuse_buffer and self.tensors:
            shared = torch.empty(max(t.nbytes for t in self.tensors.values()), dtype=torch.uint8)
        by_file: dict[str, list[TensorInfo]] = {}
        for info in self.tensors.values():
            by_file.setdefault(info.file, []).append(info)
        for file in self.files:
            with os.fdopen(open_regular(file), "rb") as f:
                for info in by_file.get(file, []):
                    buf = shared[: info.nbytes] if shared is not None else None
                    yield info.name, _read_tensor(f, info, buf)

    def __repr__(self) -> str:
        return (
            f"<Checkpoint {self.path}: {len(self.tensors)} tensors, {len(self.files)} file(s), "
            f"{self.total_bytes / 2**20:.1f} MiB>"
        )


_NBYTES, _FILE = attrgetter("nbytes"), attrgetter("file")


def _read_tensor(f: Any, info: TensorInfo, buf: torch.Tensor | None) -> torch.Tensor:
    import torch

    if buf is None:
        buf = torch.empty(info.nbytes, dtype=torch.uint8)
    f.seek(info.offset)
    got = f.readinto(buf.numpy()) if info.nbytes else 0
    if got != info.nbytes:
        raise TruncatedCheckpointError(
            info.file,
            f"read {got} of {info.nbytes} bytes for shape {list(info.shape)} (file changed?)",
            info.name,
        )
    dtype = getattr(torch, torch_name(info.dtype))
    tensor = buf.view(dtype).reshape(torch_shape(info.dtype, info.shape))
    tensor.loadkit_file = info.file  # type: ignore[attr-defined]  # load errors name the file
    return tensor


def open_checkpoint(
    path: str | os.PathLike[str],
    *,
    strict_index: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> Checkpoint:
    """Open a ``.safetensors`` file or a folder of shards (with or without an index).

    Only the headers are read, as strictly as the safetensors library reads them, and checked
    against the file sizes (and the index against the shards): a 100 GB checkpoint opens as fast
    as a small one. It opens exactly the folders ``loadkit inspect`` says load: what stops
    vLLM's and transformers' loaders raises (a shard the index names that is missing or
    unreadable, a key stored twice with two shapes), what they read without complaint does not
    (a key in another listed shard than the index says, a listed key no shard holds, a key
    stored twice with one shape: the last copy, as both loaders keep it).

    Args:
        path: a ``.safetensors`` file, a folder of ``*.safetensors`` shards, or a folder with
            ``model.safetensors.index.json``.
        strict_index: also raise at the first inconsistency between the index and its shards
            (``loadkit inspect --strict-index`` fails the same folders).
        progress: called with (shards read, shards in all) before each shard and at the end.

    Returns:
        A ``Checkpoint``: ``.tensors`` (name -> ``TensorInfo``) and ``.weights()``. Bad input
        raises a ``CheckpointError`` naming the file, key and shapes.

    >>> ck = open_checkpoint("data/plamo2/tied-with-lm-head")
    >>> len(ck.files), ck.tensors["lm_head.weight"].shape, ck.tensors["lm_head.weight"].dtype
    (2, (48, 16), 'F32')
    >>> [name for name, _ in ck.weights()][-1]  # shards in file-name order
    'lm_head.weight'
    """
    layout = local_layout(path)
    merged = read_layout(
        layout, read_safetensors_header, strict_index=strict_index, progress=progress
    )
    return Checkpoint(layout.path, merged.files, merged.tensors, merged.metadata_text, merged.held)
