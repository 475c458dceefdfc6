"""What the built-in models share: the packed ``shard_id`` loader, RMSNorm, header look-ups,
and where their committed checkpoints are.

One of each, so the three models cannot disagree on what a packed parameter, a norm or a
missing header key means.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn

import torch
from torch import nn

from loadkit.errors import CheckpointError, MissingShardIdError, ShapeMismatchError
from loadkit.loading.weight_loaders import WeightLoader
from loadkit.mapper import ShardId

if TYPE_CHECKING:
    from loadkit.checkpoint.reader import TensorInfo


# --- packed parameters ---------------------------------------------------------------------------


def shard_rows(sizes: Mapping[ShardId, int]) -> dict[ShardId, tuple[int, int]]:
    """``(start, rows)`` of each shard of a packed parameter, packed in the order given.

    >>> shard_rows({"q": 4, "k": 2, "v": 2})
    {'q': (0, 4), 'k': (4, 2), 'v': (6, 2)}
    """
    out, start = {}, 0
    for shard, size in sizes.items():
        out[shard] = (start, size)
        start += size
    return out


def packed_weight_loader(name: str, shards: Mapping[ShardId, tuple[int, int]]) -> WeightLoader:
    """A ``weight_loader`` that copies a tensor into the rows of its shard.

    The shard comes from the ``shard_id`` argument (as vLLM's merged layers take it) or else
    from the tensor's ``shard_id`` attribute (which a stacked ``WeightsMapper`` rule sets).

    Args:
        name: the packed parameter's qualified name, for error messages.
        shards: shard id -> ``(first row, rows)``, e.g. from ``shard_rows``.

    Returns:
        ``load(param, loaded_weight, shard_id=None)``, raising ``MissingShardIdError`` for a
        missing or unknown shard id and ``ShapeMismatchError`` when the rows do not fit.

    >>> load = packed_weight_loader("qkv.weight", shard_rows({"q": 2, "k": 1}))
    >>> param = torch.zeros(3, 2)
    >>> load(param, torch.ones(1, 2), "k")
    >>> param.tolist()
    [[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]]
    """

    def load(
        param: torch.Tensor, loaded_weight: torch.Tensor, shard_id: ShardId | None = None
    ) -> None:
        if shard_id is None:
            shard_id = getattr(loaded_weight, "shard_id", None)
        if shard_id not in shards:
            got = "no shard_id" if shard_id is None else f"shard_id {shard_id!r}"
            raise MissingShardIdError(
                f"Packed parameter '{name}' (shape {list(param.shape)}, shards "
                f"{list(shards)}) got a weight of shape {list(loaded_weight.shape)} with {got}. "
                "A stacked mapper rule sets shard_id on the tensor it maps; a clone() made "
                "after that drops it: map names after cloning, never before."
            )
        start, size = shards[shard_id]
        target = param.data.narrow(0, start, size)
        if tuple(target.shape) != tuple(loaded_weight.shape):
            raise ShapeMismatchError(tuple(target.shape), tuple(loaded_weight.shape))
        target.copy_(loaded_weight)

    load.__qualname__ = f"packed_weight_loader({name})"
    return load


# --- RMSNorm -------------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x) * weight`` over the last dimension, as vLLM's RMSNorm computes it.

    The normalisation runs in float32 and is cast back to ``x``'s dtype before the weight is
    applied (in float32 models all of it is float32).
    """
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return normed.to(x.dtype) * weight


class RMSNorm(nn.Module):
    """RMSNorm whose weight has ``shape``: ``(dim,)``, or ``(heads, head_dim)`` for q/k norms.

    The weight starts at ones, as vLLM's does.
    """

    def __init__(self, *shape: int, eps: float = 1e-6, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(*shape, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


# --- sizes from a checkpoint header -----------------------------------------------------------


class HeaderShapes:
    """Shape look-ups in a checkpoint header that fail with the file, the key and the shapes.

    ``model`` names what the checkpoint should be, for messages (``"a Gemma4-like checkpoint"``).

    >>> from loadkit.checkpoint.reader import TensorInfo
    >>> header = HeaderShapes({"w": TensorInfo("w", "F32", (6, 4), 96, "m.safetensors", 8)}, "x")
    >>> header.shape("w", ndim=2), header.divide("w", 3)
    ((6, 4), 2)
    >>> header.shape("b")
    Traceback (most recent call last):
    ...
    loadkit.errors.CheckpointError: m.safetensors, key 'b': not x: the key is missing
    """

    def __init__(self, tensors: Mapping[str, TensorInfo], model: str) -> None:
        self.tensors = tensors
        self.model = model
        self.file = next((i.file for i in tensors.values()), "<empty checkpoint>")

    def fail(self, key: str, message: str) -> NoReturn:
        """Raise ``CheckpointError`` naming ``key`` (and its file, when it has one)."""
        info = self.tensors.get(key)
        raise CheckpointError(info.file if info else self.file, f"not {self.model}: {message}", key)

    def info(self, *keys: str) -> TensorInfo:
        """The first of ``keys`` the header has; fails naming the first key."""
        for key in keys:
            found = self.tensors.get(key)
            if found is not None:
                return found
        self.fail(keys[0], "the key is missing")

    def shape(self, *keys: str, ndim: int | None = None) -> tuple[int, ...]:
        """The shape of the first of ``keys`` present, checked to have ``ndim`` dimensions."""
        info = self.info(*keys)
        if ndim is not None and len(info.shape) != ndim:
            self.fail(info.name, f"expected a {ndim}-d tensor, found shape {list(info.shape)}")
        return tuple(info.shape)

    def divide(self, key: str, by: int) -> int:
        """Rows of the 2-d tensor ``key`` divided by ``by`` (heads from rows and a head size)."""
        rows = self.shape(key, ndim=2)[0]
        if rows % by:
            self.fail(key, f"shape {[rows, '...']} is not a multiple of head_dim {by}")
        return rows // by

    def indices(self, pattern: Any) -> list[int]:
        """The sorted numbers ``pattern`` (a compiled regex with one group) finds in the keys."""
        return sorted({int(m.group(1)) for k in self.tensors if (m := pattern.match(k))})
