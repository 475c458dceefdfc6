"""The per-parameter loaders (SPEC 2).

Every loader takes the parameter first, named ``param``, and the checkpoint tensor second: the
layerwise reload finds the destination by that name when it counts and replays loads.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from loadkit.errors import LoadkitError, ShapeMismatchError, WeightLoadError

WeightLoader = Callable[..., object]


def default_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """Copy ``loaded_weight`` into ``param``; dtypes are cast as ``copy_`` casts them."""
    if param.numel() == 1 and loaded_weight.numel() == 1:
        # Scalars saved as () and as (1,) are the same value: let them mix. A copy (not a fill)
        # keeps the load visible to copy counting.
        param.data.copy_(loaded_weight.reshape(param.shape))
        return
    if tuple(param.shape) != tuple(loaded_weight.shape):
        raise ShapeMismatchError(tuple(param.shape), tuple(loaded_weight.shape))
    param.data.copy_(loaded_weight)


def composed_weight_loader(
    loader: WeightLoader, fn: Callable[[torch.Tensor], torch.Tensor]
) -> WeightLoader:
    """A loader that runs ``loader`` and then replaces the parameter by ``fn(param)``.

    That is two copies into the same parameter: the reason layerwise reload once over-counted.
    """

    def composed_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
        loader(param, loaded_weight)
        param.data.copy_(fn(param))

    composed_loader.__qualname__ = f"composed_weight_loader({getattr(loader, '__name__', loader)})"
    return composed_loader


def loader_of(param: torch.Tensor) -> WeightLoader:
    """The loader a parameter asks for, or the default one."""
    return getattr(param, "weight_loader", default_weight_loader)


def weight_source(name: str, tensor: object) -> str:
    """Where a weight came from, for error messages: its checkpoint key and file when known."""
    file = getattr(tensor, "loadkit_file", None)
    return f"checkpoint key '{name}'" + (f" in {file}" if file else "")


def load_param(param: torch.Tensor, weight: torch.Tensor, *, name: str, source: str) -> object:
    """Load ``weight`` with ``param``'s own loader; any failure names the parameter and key.

    Every loading path (``AutoWeightsLoader``, a model's hand-written loop) goes through here, so
    a custom loader's bare error never reaches the user without its context.
    """
    try:
        return loader_of(param)(param, weight)
    except ShapeMismatchError as exc:
        raise exc.with_name(name, source) from None
    except LoadkitError:
        raise
    except Exception as exc:
        raise WeightLoadError(name, tuple(param.shape), tuple(weight.shape), source, exc) from exc
