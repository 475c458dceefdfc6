"""The one dtype table: every safetensors dtype, its size and the torch dtype it loads as."""

import torch

from loadkit.checkpoint.dtypes import (
    DTYPES,
    itemsize,
    safetensors_dtype,
    torch_dtype,
    torch_name,
    torch_names,
)
from loadkit.errors import LoadkitError


def test_one_dtype_table_agrees_with_torch():
    for st, (name, size) in DTYPES.items():
        dtype = torch_dtype(st)
        assert (torch_name(st), itemsize(st)) == (name, size)
        assert torch.empty(0, dtype=dtype).element_size() == size, st
        assert safetensors_dtype(dtype) == safetensors_dtype(name) == st
    assert torch_names() == sorted(name for name, _ in DTYPES.values())
    try:
        safetensors_dtype(torch.complex128)
    except LoadkitError as exc:
        assert "complex128" in str(exc)
    else:
        raise AssertionError("complex128 has no safetensors dtype")
