"""The per-parameter loaders.

Every loader takes the parameter first, named ``param``, and the checkpoint tensor second: the
layerwise reload finds the destination by that name when it counts and replays loads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from loadkit.errors import LoadkitError, ShapeMismatchError, WeightLoadError

WeightLoader = Callable[..., object]


def default_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """Copy ``loaded_weight`` into ``param``; dtypes are cast as ``copy_`` casts them.

    Args:
        param: the parameter (or buffer) to fill.
        loaded_weight: the checkpoint tensor, of ``param``'s shape (one-element tensors of shapes
            ``()`` and ``(1,)`` mix).

    Returns:
        ``None``; a shape that does not fit raises ``ShapeMismatchError`` naming both shapes.

    >>> p = torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16), requires_grad=False)
    >>> default_weight_loader(p, torch.tensor([1.5, -2.0]))
    >>> p.tolist()
    [1.5, -2.0]
    >>> default_weight_loader(p, torch.zeros(3))
    Traceback (most recent call last):
    ...
    loadkit.errors.ShapeMismatchError: Shape mismatch loading parameter: parameter has shape [2], \
checkpoint weight has shape [3].
    """
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

    Args:
        loader: the first loader (usually ``default_weight_loader``).
        fn: computes the stored value from the loaded parameter (Mamba's ``-exp(A_log)``).

    Returns:
        A weight loader ``(param, loaded_weight) -> None``.

    >>> load_a = composed_weight_loader(default_weight_loader, lambda a: -a.exp())
    >>> a = torch.zeros(2)
    >>> load_a(a, torch.zeros(2))
    >>> a.tolist()
    [-1.0, -1.0]
    """

    def composed_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
        loader(param, loaded_weight)
        param.data.copy_(fn(param))

    composed_loader.__qualname__ = f"composed_weight_loader({getattr(loader, '__name__', loader)})"
    return composed_loader


def set_weight_attrs(weight: torch.Tensor, attrs: Mapping[str, Any]) -> None:
    """Attach attributes to a tensor: its ``weight_loader``, a stacked weight's ``shard_id``.

    vLLM's name for it. Loading code reads such attributes with ``getattr``; setting them here
    (and not by assignment) keeps every tensor attribute loadkit relies on in one grep.

    Args:
        weight: the parameter or checkpoint tensor.
        attrs: attribute name -> value; existing attributes are replaced.

    >>> w = torch.zeros(2)
    >>> set_weight_attrs(w, {"shard_id": "q"})
    >>> w.shard_id
    'q'
    """
    for key, value in attrs.items():
        setattr(weight, key, value)


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
