"""The meta device: tensor stand-ins (shape, dtype, class and attributes, no data) and models
built there.

Layerwise reload records a model's parameters this way, and the inspector's dry load runs a
model's loaders on such stand-ins; both need the attributes (``weight_loader`` above all) kept.
``meta_copy`` moves a whole built model there; ``on_meta()`` builds a model on meta without
running its random initialisers.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from loadkit.checkpoint.dtypes import torch_dtype, torch_shape
from loadkit.checkpoint.reader import TensorInfo

T = TypeVar("T", bound=torch.Tensor)


def meta_tensor(info: TensorInfo) -> torch.Tensor:
    """An empty meta tensor of a checkpoint tensor's dtype and shape: nothing is read.

    >>> meta_tensor(TensorInfo("w", "F4", (2, 8), 8, "m.safetensors", 0)).shape  # 2 per byte
    torch.Size([2, 4])
    """
    shape = torch_shape(info.dtype, info.shape)
    return torch.empty(shape, dtype=torch_dtype(info.dtype), device="meta")


def to_meta(tensor: T) -> T:
    """A meta copy of ``tensor`` keeping its class, ``requires_grad`` and attributes."""
    meta = tensor.data.to("meta")
    if isinstance(tensor, nn.Parameter):
        meta = nn.Parameter(meta, requires_grad=tensor.requires_grad)
    meta.__class__ = tensor.__class__
    meta.__dict__.update(tensor.__dict__)
    return cast(T, meta)  # its class is now tensor's


def meta_copy(model: nn.Module, *, always: bool = False) -> nn.Module:
    """``model`` itself when it is all on ``meta`` (a copy if ``always``), else a copy on meta.

    The caller's model is never changed, and its data is never copied: each tensor is replaced
    by a meta tensor of its shape and dtype (keeping attributes such as ``weight_loader``) before
    the module tree is deep-copied around it.

    Example:
        >>> live = torch.nn.Linear(2, 2)
        >>> meta_copy(live).weight.is_meta, live.weight.is_meta
        (True, False)
    """
    tensors = [*model.parameters(), *model.buffers()]
    if all(t.is_meta for t in tensors) and not always:
        return model
    memo: dict[int, Any] = {id(t): to_meta(t) for t in tensors}  # tied tensors stay tied
    return copy.deepcopy(model, memo)


# The random fills a module's initialisers end in (``nn.init.normal_`` and friends, which torch
# hands to a function mode as themselves, and the tensor methods they call).
_RANDOM_FILLS: frozenset[Callable[..., Any]] = frozenset(
    {
        torch.nn.init.normal_,
        torch.nn.init.uniform_,
        torch.nn.init.kaiming_uniform_,
        torch.Tensor.normal_,
        torch.Tensor.uniform_,
        torch.Tensor.bernoulli_,
        torch.Tensor.cauchy_,
        torch.Tensor.exponential_,
        torch.Tensor.geometric_,
        torch.Tensor.log_normal_,
        torch.Tensor.random_,
    }
)


class SkipRandomInitOnMeta(TorchFunctionMode):
    """A function mode that leaves meta tensors unfilled by random initialisers.

    On meta there are no values to fill, yet torch computes some fills (``normal_``, which
    ``nn.Embedding`` and every ``*_normal_`` initialiser use) through Python meta kernels that
    import ``torch._dynamo``: seconds for nothing. Only the thread and the block that entered the
    mode see it; tensors on other devices are filled as usual, and no function is replaced.
    """

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in _RANDOM_FILLS:
            # nn.init functions pass their tensor by keyword; tensor methods positionally.
            tensor = args[0] if args else kwargs.get("tensor")
            if isinstance(tensor, torch.Tensor) and tensor.is_meta:
                return tensor
        return func(*args, **kwargs)


@contextmanager
def on_meta() -> Iterator[None]:
    """Build modules on the meta device (no memory, any size) without random initialisation.

    >>> with on_meta():
    ...     embed = torch.nn.Embedding(262144, 1536)  # 1.5 GiB in float32, on paper
    >>> embed.weight.device.type, tuple(embed.weight.shape)
    ('meta', (262144, 1536))
    """
    with torch.device("meta"), SkipRandomInitOnMeta():
        yield
