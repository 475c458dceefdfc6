"""The checkpoint as meta tensors that know their key: what the dry load streams into the model.

Each key becomes a plain meta tensor with two attributes, ``loadkit_key`` and ``loadkit_file``.
The dry load's dispatch mode (``recording.WriteWatcher``), which sees every aten call of the
load, hands them on with ``carry_key`` to each tensor computed from a keyed one (``clone``,
``t()``, ``reshape``, ``-exp()``, ``cat``): a weight loader that transforms a weight, or a
pooling probe that clones it, still loads it under its own key. A tensor subclass would carry
the key too, but then every attribute read (``.shape``) runs Python code: the dry load of
200,000 names paid seconds for that.

What makes no aten call passes no key: ``nn.Parameter(w)`` (a new tensor object over the same
data, made in C++) and work done in another thread (a dispatch mode is the thread's own). A
loader that wraps each weight in a parameter, or transforms weights in a thread pool, and loads
them after the stream has moved on, gets its loads credited to the key last fed
(``Recorder.call``); the subclass carried the key through both. Neither loadkit's models nor
the loaders it re-implements do that; ``test_what_makes_no_aten_call_passes_no_key`` pins it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from loadkit.checkpoint import TensorInfo
from loadkit.loading import meta_tensor

_CARRIED = ("loadkit_key", "loadkit_file")


def meta_weight(info: TensorInfo) -> torch.Tensor:
    """A meta tensor standing in for one checkpoint tensor; it carries its key and file.

    Example:
        >>> from loadkit.checkpoint.reader import TensorInfo
        >>> w = meta_weight(TensorInfo("a.weight", "BF16", (2, 3), 12, "m.safetensors", 8))
        >>> w.dtype, w.shape, w.is_meta, w.loadkit_key
        (torch.bfloat16, torch.Size([2, 3]), True, 'a.weight')
    """
    t = meta_tensor(info)
    t.__dict__["loadkit_file"] = info.file  # load errors name the file, as for real tensors
    t.__dict__["loadkit_key"] = info.name  # names the key through delegation and renaming
    return t


def _first_keyed(values: Iterable[Any]) -> torch.Tensor | None:
    for v in values:
        if isinstance(v, torch.Tensor):
            if "loadkit_key" in v.__dict__:
                return v
        elif isinstance(v, (list, tuple)):
            found = _first_keyed(v)
            if found is not None:
                return found
    return None


def carry_key(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
    """Give each new tensor in ``out`` (an aten call's result) the key and file of the first
    keyed tensor among its inputs. A result that is one of the inputs (an in-place op, such as
    ``copy_`` into a parameter, or an ``out=`` argument) keeps what it has.

    Example:
        >>> w = meta_weight(TensorInfo("k", "F32", (2, 3), 24, "f.safetensors", 8))
        >>> t = torch.empty(3, 2, device="meta")  # as if computed from w
        >>> carry_key((w,), {}, t)
        >>> t.loadkit_key, t.loadkit_file
        ('k', 'f.safetensors')
    """
    src = _first_keyed(args)
    if src is None and kwargs:
        src = _first_keyed(kwargs.values())
    if src is None:
        return
    for t in out if isinstance(out, (list, tuple)) else (out,):
        if (
            isinstance(t, torch.Tensor)
            and "loadkit_key" not in t.__dict__
            and not any(t is a for a in (*args, *kwargs.values()))
        ):
            for attr in _CARRIED:
                if attr in src.__dict__:
                    t.__dict__[attr] = src.__dict__[attr]
