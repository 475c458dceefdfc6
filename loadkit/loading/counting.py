"""Counting copies and clones with torch dispatch modes.

A dispatch mode sees every ``aten`` call below the autograd layer on any device, meta included,
so nothing has to be monkeypatched and ``param.data.copy_`` is seen like ``param.copy_``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from loadkit.terms import Behaviour, check_behaviour

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
    """Counts ``aten.copy_`` calls and the elements they write (the destination's numel).

    >>> with CopyCounter() as c:
    ...     _ = torch.zeros(3).copy_(torch.ones(3))
    >>> c.count, c.copied_numel
    (1, 3)
    """

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
    """Counts ``aten.clone`` calls and the bytes they allocate.

    >>> with CloneCounter() as c:
    ...     _ = torch.zeros(4, dtype=torch.bfloat16).clone()
    >>> c.count, c.cloned_bytes
    (1, 8)
    """

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

    Args:
        weight_loader: the loader to run.
        args: its bound arguments; ``args.arguments["param"]`` is the destination.
        behaviour: ``"old"`` (uncapped) or ``"new"`` (capped).

    Returns:
        ``(elements counted, the loader's return value)``.

    >>> import inspect
    >>> from loadkit import composed_weight_loader, default_weight_loader
    >>> load = composed_weight_loader(default_weight_loader, lambda a: -a.exp())
    >>> bound = inspect.signature(load).bind(torch.zeros(4), torch.zeros(4))
    >>> get_numel_loaded(load, bound, behaviour="old")[0], get_numel_loaded(load, bound)[0]
    (8, 4)
    """
    check_behaviour(behaviour)
    with CopyCounter() as counter:
        result = weight_loader(*args.args, **args.kwargs)
    numel = counter.copied_numel
    if behaviour == "new":
        param = args.arguments.get("param")
        if isinstance(param, torch.Tensor):
            numel = min(numel, param.numel())
    return numel, result
