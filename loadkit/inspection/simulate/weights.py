"""The checkpoint as meta tensors that know their key: what the dry load streams into the model."""

from __future__ import annotations

from typing import Any

import torch

from loadkit.checkpoint.reader import TensorInfo
from loadkit.loading.meta import meta_tensor

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
    t = meta_tensor(info).as_subclass(KeyedMeta)
    t.__dict__["loadkit_file"] = info.file  # load errors name the file, as for real tensors
    t.__dict__["loadkit_key"] = info.name  # names the key through delegation and renaming
    return t
