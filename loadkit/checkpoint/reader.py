"""Opening safetensors checkpoints from their headers alone (SPEC 8, 9).

``open_checkpoint`` reads only the 8-byte length and the JSON header of each shard, validates
them against the file sizes and builds ``.tensors``; tensor bytes are read when ``.weights()`` is
iterated. torch is imported only there, so the header-only inspector runs without it.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from loadkit.errors import (
    CheckpointError,
    DuplicateKeyError,
    HeaderError,
    ShardIndexError,
    TruncatedCheckpointError,
)

if TYPE_CHECKING:
    import torch

INDEX_NAME = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors library's own limit

# safetensors dtype -> (torch dtype attribute, bytes per element)
DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("float64", 8),
    "F32": ("float32", 4),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
    "I64": ("int64", 8),
    "I32": ("int32", 4),
    "I16": ("int16", 2),
    "I8": ("int8", 1),
    "U64": ("uint64", 8),
    "U32": ("uint32", 4),
    "U16": ("uint16", 2),
    "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
}


class TensorInfo(NamedTuple):
    """What a header says of one tensor; ``offset`` is absolute within ``file``."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    file: str
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def read_safetensors_header(path: str | os.PathLike[str]) -> tuple[dict[str, TensorInfo], dict]:
    """Parse and validate one file's header: (tensors in data-offset order, ``__metadata__``)."""
    file = str(path)
    try:
        size = os.path.getsize(file)
        with open(file, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise TruncatedCheckpointError(
                    file, f"file is {size} bytes, too short for the 8-byte header length"
                )
            n = int.from_bytes(head, "little")
            if n > size - 8:
                raise TruncatedCheckpointError(
                    file, f"header claims {n} bytes but only {size - 8} follow the length field"
                )
            if n > MAX_HEADER_BYTES:
                raise HeaderError(file, f"header of {n} bytes exceeds {MAX_HEADER_BYTES}")
            raw = f.read(n)
    except OSError as exc:
        raise CheckpointError(file, f"cannot read: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HeaderError(file, f"header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise HeaderError(file, f"header is JSON {type(header).__name__}, not an object")
    metadata = header.pop("__metadata__", None) or {}
    base = 8 + n
    infos = [_tensor_info(file, key, spec, base, size) for key, spec in header.items()]
    infos.sort(key=lambda t: t.offset)
    for prev, cur in itertools.pairwise(infos):
        if cur.offset < prev.offset + prev.nbytes:
            raise HeaderError(
                file,
                f"data overlaps the data of '{prev.name}' (data_offsets overlap)",
                key=cur.name,
            )
    return {t.name: t for t in infos}, metadata


def _tensor_info(file: str, key: str, spec: Any, base: int, size: int) -> TensorInfo:
    if not isinstance(spec, dict) or not {"dtype", "shape", "data_offsets"} <= spec.keys():
        raise HeaderError(file, f"entry must have dtype, shape and data_offsets, got {spec!r}", key)
    dtype, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
    if dtype not in DTYPES:
        raise HeaderError(file, f"unknown dtype {dtype!r} (shape {shape})", key)
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise HeaderError(file, f"shape {shape!r} is not a list of non-negative integers", key)
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise HeaderError(file, f"data_offsets {offsets!r} are not [begin, end]", key)
    need = math.prod(shape) * DTYPES[dtype][1]
    span = offsets[1] - offsets[0]
    if need != span:
        raise HeaderError(
            file,
            f"shape {shape} of dtype {dtype} needs {need} bytes but data_offsets {offsets} "
            f"span {span}",
            key,
        )
    if base + offsets[1] > size:
        raise TruncatedCheckpointError(
            file,
            f"tensor of shape {shape} ({dtype}) ends at byte {base + offsets[1]} "
            f"but the file has {size} bytes",
            key,
        )
    return TensorInfo(key, dtype, tuple(shape), span, file, base + offsets[0])


def _index_shards(folder: Path) -> list[Path]:
    index = folder / INDEX_NAME
    try:
        data = json.loads(index.read_text())
        weight_map = data["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ShardIndexError(
            str(index), f"unreadable index ({type(exc).__name__}: {exc})"
        ) from None
    shards: dict[str, list[str]] = {}
    for key, shard in weight_map.items():
        shards.setdefault(shard, []).append(key)
    for shard, keys in shards.items():
        if not (folder / shard).is_file():
            raise ShardIndexError(
                str(index), f"names shard '{shard}', which does not exist in {folder}", keys[0]
            )
    return [folder / s for s in sorted(shards)]


class Checkpoint:
    """An opened checkpoint: ``tensors`` from headers, ``weights()`` to read the data."""

    # A plain class, not a dataclass: importing dataclasses costs the header-only inspector
    # about 20 ms (it pulls in inspect, ast, dis), as much as parsing 2000 names.
    def __init__(
        self, path: str, files: list[str], tensors: dict[str, TensorInfo], metadata: dict[str, dict]
    ) -> None:
        self.path = path
        self.files = files
        self.tensors = tensors
        self.metadata = metadata

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def __len__(self) -> int:
        return len(self.tensors)

    def weights(self, *, reuse_buffer: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(name, tensor)`` lazily: shards in file-name order, tensors in data order.

        With ``reuse_buffer=True`` every tensor is a view into one buffer that the next tensor
        overwrites, as streaming loaders do: a consumer that holds a view without cloning it sees
        later data.
        """
        import torch

        shared = None
        if reuse_buffer and self.tensors:
            shared = torch.empty(max(t.nbytes for t in self.tensors.values()), dtype=torch.uint8)
        by_file: dict[str, list[TensorInfo]] = {}
        for info in self.tensors.values():
            by_file.setdefault(info.file, []).append(info)
        for file in self.files:
            try:
                f = open(file, "rb")
            except OSError as exc:
                raise CheckpointError(file, f"cannot read: {exc.strerror or exc}") from None
            with f:
                for info in by_file.get(file, []):
                    buf = shared[: info.nbytes] if shared is not None else None
                    yield info.name, _read_tensor(f, info, buf)

    def __repr__(self) -> str:
        return (
            f"<Checkpoint {self.path}: {len(self.tensors)} tensors, {len(self.files)} file(s), "
            f"{self.total_bytes / 2**20:.1f} MiB>"
        )


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
    tensor = buf.view(getattr(torch, DTYPES[info.dtype][0])).reshape(info.shape)
    tensor.loadkit_file = info.file  # lets load errors name the file
    return tensor


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Open a ``.safetensors`` file or a folder of shards (with or without an index)."""
    p = Path(path)
    if p.is_file():
        files = [p]
    elif p.is_dir():
        if (p / INDEX_NAME).exists():
            files = _index_shards(p)
        else:
            files = sorted(p.glob("*.safetensors"))
            if not files:
                raise CheckpointError(str(p), "folder holds no *.safetensors files and no index")
    else:
        raise CheckpointError(str(p), "no such file or folder")

    tensors: dict[str, TensorInfo] = {}
    metadata: dict[str, dict] = {}
    for file in files:
        infos, meta = read_safetensors_header(file)
        metadata[str(file)] = meta
        for name, info in infos.items():
            if name in tensors:
                raise DuplicateKeyError(
                    str(file),
                    f"also stored in {tensors[name].file} (shapes {list(tensors[name].shape)} "
                    f"and {list(info.shape)})",
                    name,
                )
            tensors[name] = info
    if p.is_dir() and (p / INDEX_NAME).exists():
        weight_map = json.loads((p / INDEX_NAME).read_text())["weight_map"]
        shard_files = {shard: str(p / shard) for shard in set(weight_map.values())}
        for key, shard in weight_map.items():
            info = tensors.get(key)
            if info is None or info.file != shard_files[shard]:
                raise ShardIndexError(
                    str(p / INDEX_NAME),
                    f"says shard '{shard}' holds it, but that shard does not",
                    key,
                )
    return Checkpoint(str(p), [str(f) for f in files], tensors, metadata)
