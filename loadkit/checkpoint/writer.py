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

from loadkit.checkpoint.reader import DTYPES
from loadkit.errors import LoadkitError

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
    ``*.part``, then renamed), so an interrupted run never leaves a truncated checkpoint behind.
    """
    import torch
    from tqdm import tqdm

    header: dict[str, object] = {"__metadata__": {"format": "pt", **(metadata or {})}}
    offset = 0
    for name, dtype, shape in specs:
        if dtype not in DTYPES:
            raise LoadkitError(f"{path}: key '{name}': unknown safetensors dtype {dtype!r}")
        n = math.prod(shape) * DTYPES[dtype][1]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # data starts 8-byte aligned, as safetensors writes it
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    with (
        open(tmp, "wb") as f,
        tqdm(total=offset, unit="B", unit_scale=True, disable=not progress, desc=path.name) as bar,
    ):
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for name, dtype, shape in specs:
            t = produce(name)
            if safetensors_dtype(t.dtype) != dtype or tuple(t.shape) != tuple(shape):
                raise LoadkitError(
                    f"{path}: key '{name}': produced {safetensors_dtype(t.dtype)} "
                    f"{list(t.shape)}, the header says {dtype} {list(shape)}"
                )
            data = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
            f.write(data.tobytes())
            bar.update(data.nbytes)
    os.replace(tmp, path)
    return path


def save_in_order(
    path: str | os.PathLike[str],
    tensors: Mapping[str, torch.Tensor],
    *,
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Write ``tensors`` with their data in the mapping's order (``save_file`` sorts by name)."""
    specs = [(n, safetensors_dtype(t.dtype), tuple(t.shape)) for n, t in tensors.items()]
    return write_safetensors(path, specs, tensors.__getitem__, metadata=metadata)
