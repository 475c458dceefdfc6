"""Counting copies and clones with torch dispatch modes.

A dispatch mode sees every ``aten`` call below the autograd layer on any device, meta included,
so nothing has to be monkeypatched and ``param.data.copy_`` is seen like ``param.copy_``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Literal

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from loadkit.loading.weight_loaders import default_weight_loader
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


Padding = Literal["counted", "excluded"]
PADDINGS: tuple[Padding, ...] = ("counted", "excluded")


def get_tensor_load_numel(tensor: torch.Tensor, padding: Padding = "excluded") -> int:
    """How many checkpoint elements ``tensor`` takes: its ``weight_loader_numel`` if it has one.

    A weight created larger than its checkpoint tensor (a mixture-of-experts ``w13_weight``
    padded for a kernel) says how much of it a load fills in ``weight_loader_numel`` (vLLM
    0.31.0); the loaders write only that region. ``padding="counted"`` is vLLM 0.30.0 and
    earlier, where the attribute did not exist: every element counts.

    >>> w = torch.zeros(2, 8, 4)  # 2 experts, 6 rows padded to 8
    >>> w.weight_loader_numel = 2 * 6 * 4
    >>> get_tensor_load_numel(w), get_tensor_load_numel(w, "counted")
    (48, 64)
    """
    if padding == "counted":
        return tensor.numel()
    return getattr(tensor, "weight_loader_numel", tensor.numel())


def count_copies(
    weight_loader: Callable[..., object],
    param: object,
    args: tuple[object, ...],
    kwargs: dict[str, object],
    cap: int | None,
) -> tuple[int, object]:
    """Run ``weight_loader(param, *args, **kwargs)`` under a ``CopyCounter``; the elements it
    copied (at most ``cap`` when given) and what it returned. ``get_numel_loaded`` on the
    positional form a layerwise reload already holds (no ``BoundArguments`` to build).

    ``default_weight_loader`` runs without the counter: it either raises or makes exactly one
    ``copy_`` of the whole parameter, so the counter would report ``param.numel()`` (a test holds
    the two equal), and a dispatch mode costs ten times the load on a small tensor.

    >>> from loadkit import composed_weight_loader, default_weight_loader
    >>> load = composed_weight_loader(default_weight_loader, lambda a: -a.exp())
    >>> count_copies(load, torch.zeros(4), (torch.zeros(4),), {}, None)
    (8, None)
    """
    load: Callable[..., object] = weight_loader  # (the identity test below narrows its type)
    if weight_loader is default_weight_loader:
        result = load(param, *args, **kwargs)
        numel = param.numel() if isinstance(param, torch.Tensor) else 0
    else:
        with CopyCounter() as counter:
            result = weight_loader(param, *args, **kwargs)
        numel = counter.copied_numel
    return (numel if cap is None else min(numel, cap)), result


def get_numel_loaded(
    weight_loader: Callable[..., object],
    args: inspect.BoundArguments,
    *,
    behaviour: Behaviour = "new",
    padding: Padding = "excluded",
) -> tuple[int, object]:
    """Run ``weight_loader`` and return (elements it copied, what it returned).

    ``"old"`` reports every copied element, so a loader that copies twice (the composed loader)
    counts double. ``"new"`` caps the count at what the destination takes from a checkpoint
    (``get_tensor_load_numel``): a loader fills one parameter, so it cannot have loaded more.

    Args:
        weight_loader: the loader to run.
        args: its bound arguments; ``args.arguments["param"]`` is the destination.
        behaviour: ``"old"`` (uncapped, before vLLM #44814) or ``"new"`` (capped).
        padding: ``"excluded"`` (vLLM 0.31.0 on: the cap honours ``weight_loader_numel``) or
            ``"counted"`` (vLLM 0.30.0 and earlier: the cap is the parameter's size).

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
    check_behaviour(padding, PADDINGS, what="padding")
    with CopyCounter() as counter:
        result = weight_loader(*args.args, **args.kwargs)
    numel = counter.copied_numel
    if behaviour == "new":
        param = args.arguments.get("param")
        if isinstance(param, torch.Tensor):
            numel = min(numel, get_tensor_load_numel(param, padding))
    return numel, result
