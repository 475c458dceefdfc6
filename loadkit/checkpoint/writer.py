"""Writing safetensors files whose data lies in the order given.

``safetensors.torch.save_file`` sorts tensors by name, but the bugs this kit shows depend on the
order a stream delivers weights in (which key the probe meets first, whether ``mixer.D`` arrives
last). These writers keep the caller's order, byte for byte reproducible. ``write_safetensors``
produces one tensor at a time, so a checkpoint larger than memory can be written.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from loadkit.checkpoint.dtypes import DTYPES
from loadkit.checkpoint.header import I64_MAX, MAX_HEADER_BYTES
from loadkit.errors import LoadkitError, printable

if TYPE_CHECKING:
    import torch

TensorSpec = tuple[str, str, tuple[int, ...]]  # name, safetensors dtype, shape


def safetensors_dtype(dtype: torch.dtype) -> str:
    """The safetensors name of a torch dtype (``torch.bfloat16`` -> ``"BF16"``)."""
    for st, (torch_name, _) in DTYPES.items():
        if str(dtype) == f"torch.{torch_name}":
            return st
    raise LoadkitError(f"safetensors has no dtype for {dtype}")


def write_safetensors(
    path: str | os.PathLike[str],
    specs: Sequence[TensorSpec],
    produce: Callable[[str], torch.Tensor],
    *,
    metadata: Mapping[str, str] | None = None,
    progress: bool = False,
) -> Path:
    """Write ``specs`` in order, calling ``produce(name)`` for each tensor's data.

    Only one produced tensor is held at a time. The file appears atomically (written to
    ``*.part``, then renamed); on any error the ``.part`` is removed, so an interrupted run never
    leaves a truncated file behind. What the safetensors library would refuse to read is refused
    before anything is written: a repeated name, a tensor named ``__metadata__``, metadata that
    is not str -> str, a name or string that is not valid UTF-8 (a lone surrogate), a negative or
    beyond-int64 dimension, a header over the library's 100,000,000-byte limit.

    >>> import tempfile, torch
    >>> path = write_safetensors(tempfile.mkdtemp() + "/w.safetensors",
    ...                          [("w", "F32", (2,))], lambda name: torch.ones(2))
    >>> path.name
    'w.safetensors'
    """
    import torch
    from tqdm import tqdm

    path = Path(path)
    blob, total = _header(path, specs, metadata)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    try:
        with (
            open(tmp, "wb") as f,
            tqdm(
                total=total, unit="B", unit_scale=True, disable=not progress, desc=path.name
            ) as bar,
        ):
            f.write(len(blob).to_bytes(8, "little"))
            f.write(blob)
            for name, dtype, shape in specs:
                t = produce(name)
                got = (
                    safetensors_dtype(t.dtype) if isinstance(t, torch.Tensor) else type(t).__name__
                )
                if got != dtype or tuple(t.shape) != tuple(shape):
                    shown = f"{got} {list(t.shape)}" if isinstance(t, torch.Tensor) else got
                    raise LoadkitError(
                        f"{path}: key '{printable(name)}': produced {shown}, the header says "
                        f"{dtype} {list(shape)}"
                    )
                data = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
                f.write(data.tobytes())
                bar.update(data.nbytes)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _header(
    path: Path, specs: Sequence[TensorSpec], metadata: Mapping[str, str] | None
) -> tuple[bytes, int]:
    """The padded JSON header for ``specs`` and the data size, or a ``LoadkitError`` for
    anything the safetensors library would refuse to read back."""

    def fail(message: str, name: str | None = None) -> LoadkitError:
        where = f"{path}: key '{printable(name)}'" if name is not None else str(path)
        return LoadkitError(f"{where}: {message}")

    meta = {"format": "pt", **(metadata or {})}
    for k, v in meta.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise fail(f"metadata must map str to str (safetensors refuses {k!r}: {v!r})")
        if not _utf8(k) or not _utf8(v):
            raise fail(f"metadata {k!r} is not valid UTF-8 (a lone surrogate)")
    header: dict[str, object] = {"__metadata__": meta}
    offset = 0
    for spec in specs:
        name, dtype, shape = spec
        if not isinstance(name, str) or not _utf8(name):
            raise fail(f"a tensor name must be a valid UTF-8 str, not {name!r}")
        if name in header:
            what = "is reserved for metadata" if name == "__metadata__" else "appears twice"
            raise fail(f"the name {what}; safetensors cannot read such a file", name)
        if dtype not in DTYPES:
            raise fail(f"unknown safetensors dtype {dtype!r}", name)
        if not all(type(d) is int and 0 <= d <= I64_MAX for d in shape):
            raise fail(f"shape {list(shape)} is not a list of int64 sizes", name)
        n = math.prod(shape) * DTYPES[dtype][1]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # data starts 8-byte aligned, as safetensors writes it
    if len(blob) > MAX_HEADER_BYTES:
        raise fail(f"header of {len(blob)} bytes exceeds the safetensors limit {MAX_HEADER_BYTES}")
    return blob, offset


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def save_in_order(
    path: str | os.PathLike[str],
    tensors: Mapping[str, torch.Tensor],
    *,
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Write ``tensors`` with their data in the mapping's order (``save_file`` sorts by name)."""
    specs = [(n, safetensors_dtype(t.dtype), tuple(t.shape)) for n, t in tensors.items()]
    return write_safetensors(path, specs, tensors.__getitem__, metadata=metadata)
