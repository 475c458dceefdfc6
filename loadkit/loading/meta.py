"""Meta-device stand-ins for tensors: shape, dtype, class and attributes, no data.

Layerwise reload records a model's parameters this way, and the inspector's dry load runs a
model's loaders on such stand-ins; both need the attributes (``weight_loader`` above all) kept.
"""

from __future__ import annotations

import torch
from torch import nn


def to_meta(tensor: torch.Tensor) -> torch.Tensor:
    """A meta copy of ``tensor`` keeping its class, ``requires_grad`` and attributes."""
    meta = tensor.data.to("meta")
    if isinstance(tensor, nn.Parameter):
        meta = nn.Parameter(meta, requires_grad=tensor.requires_grad)
    meta.__class__ = tensor.__class__
    meta.__dict__.update(tensor.__dict__)
    return meta
