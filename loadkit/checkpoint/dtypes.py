"""The one table of safetensors dtypes: their torch names and their sizes.

Headers name dtypes the safetensors way (``"BF16"``), torch the torch way (``torch.bfloat16``).
Every conversion between the two goes through ``DTYPES``. Torch-free: ``torch_dtype`` imports
torch only when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loadkit.errors import LoadkitError

if TYPE_CHECKING:
    import torch

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
_BY_TORCH_NAME = {name: st for st, (name, _) in DTYPES.items()}


def itemsize(dtype: str) -> int:
    """Bytes per element of a safetensors dtype.

    >>> itemsize("BF16"), itemsize("F32")
    (2, 4)
    """
    return DTYPES[dtype][1]


def torch_name(dtype: str) -> str:
    """The torch spelling of a safetensors dtype (``"BF16"`` -> ``"bfloat16"``).

    >>> torch_name("F8_E4M3")
    'float8_e4m3fn'
    """
    return DTYPES[dtype][0]


def torch_dtype(dtype: str) -> torch.dtype:
    """The ``torch.dtype`` of a safetensors dtype (imports torch)."""
    import torch

    return getattr(torch, torch_name(dtype))


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
    """The torch spellings of every dtype safetensors can store, sorted."""
    return sorted(_BY_TORCH_NAME)
