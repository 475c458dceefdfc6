"""The model and the checkpoint as meta tensors: shapes, dtypes and attributes, no data."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from loadkit.checkpoint.dtypes import torch_dtype, torch_shape
from loadkit.checkpoint.reader import TensorInfo
from loadkit.inspection.records import ModelSummary
from loadkit.loading.ledger import model_tensors


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``'float32'``."""
    return str(dtype).removeprefix("torch.")


def loadable_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and persistent buffers by qualified name, each tied tensor once (under the
    name ``LoadLedger`` gives it): what a load must fill. Computed once per dry load."""
    by_name = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    return {name: by_name[name] for name in model_tensors(model)}


def model_summary(model: nn.Module, spec: str) -> ModelSummary:
    tensors = loadable_tensors(model)
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    describe = getattr(model, "backend_info", None)  # a model built from a config says how
    return ModelSummary(
        spec,
        type(model).__name__,
        len(tensors),
        nbytes,
        callable(getattr(model, "load_weights", None)),
        pooling=bool(getattr(model, "is_pooling_model", False)),
        backend=describe() if callable(describe) else None,
    )


_CARRIED = ("loadkit_key", "loadkit_file")


def _first_keyed(values: Any) -> KeyedMeta | None:
    for v in values:
        if isinstance(v, KeyedMeta) and "loadkit_key" in v.__dict__:
            return v
        if isinstance(v, (list, tuple)):
            found = _first_keyed(v)
            if found is not None:
                return found
    return None


class KeyedMeta(torch.Tensor):
    """A meta tensor that knows its checkpoint key, and passes it on to every tensor computed
    from it (``clone``, ``t()``, ``reshape``, ``-exp()``, ``cat``): a loader that transforms a
    weight, or a pooling probe that clones it, still loads it under its own key."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        src = _first_keyed([*args, *(kwargs or {}).values()])
        if src is not None:
            for t in out if isinstance(out, (list, tuple)) else (out,):
                if isinstance(t, KeyedMeta) and "loadkit_key" not in t.__dict__:
                    for attr in _CARRIED:
                        if attr in src.__dict__:
                            t.__dict__[attr] = src.__dict__[attr]
        return out


def meta_weight(info: TensorInfo) -> torch.Tensor:
    """A meta tensor standing in for one checkpoint tensor; it carries its key and file.

    Example:
        >>> from loadkit.checkpoint.reader import TensorInfo
        >>> w = meta_weight(TensorInfo("a.weight", "BF16", (2, 3), 12, "m.safetensors", 8))
        >>> w.dtype, w.clone().t().loadkit_key
        (torch.bfloat16, 'a.weight')
    """
    dtype = torch_dtype(info.dtype)
    shape = torch_shape(info.dtype, info.shape)  # F4: two values per torch element
    t = torch.empty(shape, dtype=dtype, device="meta").as_subclass(KeyedMeta)
    t.__dict__["loadkit_file"] = info.file  # load errors name the file, as for real tensors
    t.__dict__["loadkit_key"] = info.name  # names the key through delegation and renaming
    return t
