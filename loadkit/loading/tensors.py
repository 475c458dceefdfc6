"""What a load fills: a module's parameters and persistent buffers, by qualified name.

One definition for every part that asks (``AutoWeightsLoader`` per module, the ledger and the
dry load for a whole model), and the one way names are joined to their module's path.
Layerwise reload counts differently on purpose (every direct buffer, as upstream does).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn


def qualname(prefix: str, rest: str) -> str:
    """``rest`` under the module path ``prefix``.

    >>> qualname("model.layers.0", "mlp.weight"), qualname("", "lm_head.weight")
    ('model.layers.0.mlp.weight', 'lm_head.weight')
    """
    if not prefix:
        return rest
    if not rest:
        return prefix
    return f"{prefix}.{rest}"


def named_loadable(
    module: nn.Module, *, recurse: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every parameter, then every persistent buffer (BatchNorm's running stats among them), by
    qualified name; a tied tensor under each of its names. ``recurse=False``: ``module``'s own."""
    yield from module.named_parameters(recurse=recurse, remove_duplicate=False)
    for path, mod in module.named_modules() if recurse else [("", module)]:
        for name, buf in mod._buffers.items():
            if buf is not None and name not in mod._non_persistent_buffers_set:
                yield qualname(path, name), buf


def loadable_tensors(module: nn.Module, *, recurse: bool = True) -> dict[str, torch.Tensor]:
    """``named_loadable``, each tensor once under its first name (the ledger's name for it).

    >>> bn = torch.nn.BatchNorm1d(2)
    >>> list(loadable_tensors(bn))
    ['weight', 'bias', 'running_mean', 'running_var', 'num_batches_tracked']
    """
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in named_loadable(module, recurse=recurse):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            out[name] = tensor
    return out
