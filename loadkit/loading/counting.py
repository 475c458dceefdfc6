"""Counting copies and clones with torch dispatch modes (SPEC 5).

A dispatch mode sees every ``aten`` call below the autograd layer on any device, meta included,
so nothing has to be monkeypatched and ``param.data.copy_`` is seen like ``param.copy_``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Literal

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from loadkit.errors import LoadkitError

Behaviour = Literal["old", "new"]

_COPY = torch.ops.aten.copy_.default
_CLONE = torch.ops.aten.clone.default


class EagerDispatchMode(TorchDispatchMode):
    # torch wraps every mode's __torch_dispatch__ to keep Dynamo out of it, importing
    # torch._dynamo on first use (1-2 s, paid by every notebook kernel). Counting never runs
    # under torch.compile, so opt out of the wrapper.
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


class CopyCounter(EagerDispatchMode):
    """Counts ``aten.copy_`` calls and the elements they write (the destination's numel)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.copied_numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _COPY:
            self.count += 1
            self.copied_numel += args[0].numel()
        return func(*args, **(kwargs or {}))


class CloneCounter(EagerDispatchMode):
    """Counts ``aten.clone`` calls and the bytes they allocate."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.cloned_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is _CLONE:
            self.count += 1
            self.cloned_bytes += out.numel() * out.element_size()
        return out


def get_numel_loaded(
    weight_loader: Callable[..., object],
    args: inspect.BoundArguments,
    *,
    behaviour: Behaviour = "new",
) -> tuple[int, object]:
    """Run ``weight_loader`` and return (elements it copied, what it returned).

    ``"old"`` reports every copied element, so a loader that copies twice (the composed loader)
    counts double. ``"new"`` caps the count at the destination's size: a loader fills one
    parameter, so it cannot have loaded more than that parameter holds.
    """
    with CopyCounter() as counter:
        result = weight_loader(*args.args, **args.kwargs)
    numel = counter.copied_numel
    if behaviour == "new":
        param = args.arguments.get("param")
        if isinstance(param, torch.Tensor):
            numel = min(numel, param.numel())
    elif behaviour != "old":
        raise LoadkitError(f"behaviour must be 'old' or 'new', not {behaviour!r}")
    return numel, result
