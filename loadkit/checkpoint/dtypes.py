"""The safetensors dtypes: bits per element and the torch dtype each loads as.

One table for the reader, the writer, the simulated load and the models: every conversion between
a header's spelling (``"BF16"``) and torch's (``torch.bfloat16``) goes through it. It holds every
name the safetensors library (0.8) accepts in a header; ``torch`` is ``None`` for the two whose
data ``safetensors.torch`` cannot turn into a tensor (it raises "Dtype not understood"), so loadkit
refuses them as well. Torch-free: the header-only path imports it (``torch_dtype`` imports torch
only when called).

>>> SAFETENSORS_DTYPES["BF16"]
Dtype(bits=16, torch='bfloat16')
>>> torch_shape("F4", (3, 8))  # two 4-bit values per torch element, as safetensors.torch loads it
(3, 4)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from loadkit.errors import LoadkitError

if TYPE_CHECKING:
    import torch


class Dtype(NamedTuple):
    bits: int  # bits per element
    torch: str | None  # the ``torch`` attribute it loads as; None: safetensors.torch refuses it


SAFETENSORS_DTYPES: dict[str, Dtype] = {
    "BOOL": Dtype(8, "bool"),
    "F4": Dtype(4, "float4_e2m1fn_x2"),
    "F6_E2M3": Dtype(6, None),
    "F6_E3M2": Dtype(6, None),
    "U8": Dtype(8, "uint8"),
    "I8": Dtype(8, "int8"),
    "F8_E5M2": Dtype(8, "float8_e5m2"),
    "F8_E4M3": Dtype(8, "float8_e4m3fn"),
    "F8_E8M0": Dtype(8, "float8_e8m0fnu"),
    "F8_E4M3FNUZ": Dtype(8, "float8_e4m3fnuz"),
    "F8_E5M2FNUZ": Dtype(8, "float8_e5m2fnuz"),
    "I16": Dtype(16, "int16"),
    "U16": Dtype(16, "uint16"),
    "F16": Dtype(16, "float16"),
    "BF16": Dtype(16, "bfloat16"),
    "I32": Dtype(32, "int32"),
    "U32": Dtype(32, "uint32"),
    "F32": Dtype(32, "float32"),
    "C64": Dtype(64, "complex64"),
    "F64": Dtype(64, "float64"),
    "I64": Dtype(64, "int64"),
    "U64": Dtype(64, "uint64"),
}

# safetensors name -> (torch attribute, bytes per element), for the dtypes of whole bytes that
# torch loads one element per element (every dtype but the sub-byte F4, F6_*).
DTYPES: dict[str, tuple[str, int]] = {
    name: (d.torch, d.bits // 8)
    for name, d in SAFETENSORS_DTYPES.items()
    if d.torch is not None and d.bits % 8 == 0
}


def torch_shape(dtype: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape ``safetensors.torch`` gives a tensor of this header ``dtype`` and ``shape``.

    The same, except for F4: torch packs two values per element, so the last dimension halves.
    """
    if SAFETENSORS_DTYPES[dtype].bits == 4 and shape:
        return (*shape[:-1], shape[-1] // 2)
    return shape


def torch_name(dtype: str) -> str:
    """The torch spelling of a safetensors dtype; a ``KeyError`` for one torch cannot load.

    >>> torch_name("BF16"), torch_name("F8_E4M3")
    ('bfloat16', 'float8_e4m3fn')
    """
    name = SAFETENSORS_DTYPES[dtype].torch
    if name is None:
        raise KeyError(dtype)
    return name


def torch_dtype(dtype: str) -> torch.dtype:
    """The ``torch.dtype`` a safetensors dtype loads as (imports torch)."""
    import torch

    return getattr(torch, torch_name(dtype))


def itemsize(dtype: str) -> int:
    """Bytes per element of a whole-byte safetensors dtype (``DTYPES``).

    >>> itemsize("BF16"), itemsize("F32")
    (2, 4)
    """
    return DTYPES[dtype][1]


_BY_TORCH_NAME = {name: st for st, (name, _) in DTYPES.items()}


def safetensors_dtype(dtype: torch.dtype | str) -> str:
    """The safetensors name of a torch dtype, given as a ``torch.dtype`` or its torch name.

    Args:
        dtype: ``torch.bfloat16``, or ``"bfloat16"`` (the spelling model configs store).

    Returns:
        The header's spelling, e.g. ``"BF16"``; a ``LoadkitError`` if safetensors has none.

    >>> safetensors_dtype("bfloat16")
    'BF16'
    """
    name = str(dtype).removeprefix("torch.")
    if name not in _BY_TORCH_NAME:
        raise LoadkitError(f"safetensors has no dtype for {dtype}")
    return _BY_TORCH_NAME[name]


def torch_names() -> list[str]:
    """The torch spellings of every whole-byte dtype safetensors can store, sorted."""
    return sorted(_BY_TORCH_NAME)
