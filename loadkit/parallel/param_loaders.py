"""Parameter-level loaders: narrow a full checkpoint tensor to this rank's share and copy it.

The layers of ``loadkit.parallel.linear`` work out *where* in the parameter a shard goes
(``shard_offset``, ``shard_size``); these functions pick *which* rows of the checkpoint tensor
this rank takes, the way vLLM's parameter classes (``load_merged_column_weight``,
``load_qkv_weight``, ...) do. They read the rank from the process group.

The bug of vllm-gguf-plugin #103 (fixed by #106) lived exactly here: the merged-column and QKV
loaders read the rank as ``kwargs.get("tp_rank", 0)``, a keyword no caller passes, so every rank
narrowed shard 0. Each parameter still had its per-rank shape and nothing raised. ``"old"``
reproduces that line; ``"new"`` asks the group, as the column and row loaders always did.
"""

from __future__ import annotations

from typing import Any

import torch

from loadkit.errors import ShapeMismatchError
from loadkit.parallel.state import TensorParallelError, get_tp_group
from loadkit.terms import Behaviour, check_behaviour


def _dim(param: torch.Tensor, name: str) -> int:
    """A sharded parameter's ``output_dim`` or ``input_dim`` (set by ``sharded_parameter``)."""
    return int(getattr(param, name))


def _check_group(param: torch.Tensor) -> int:
    """The group's rank, after checking the parameter was built for a group of this size (0
    for a parameter of a layer built whole on every rank, vLLM's ``disable_tp``)."""
    if getattr(param, "replicated", False):
        return 0
    group = get_tp_group()
    built = getattr(param, "tp_size", group.world_size)
    if built != group.world_size:
        raise TensorParallelError(
            f"parameter of shape {list(param.shape)} was built for {built} ranks but is loaded "
            f"in a group of {group.world_size}"
        )
    return group.rank


def _rank(param: torch.Tensor, kwargs: dict[str, Any], behaviour: Behaviour) -> int:
    rank = _check_group(param)
    if check_behaviour(behaviour) == "old":
        return kwargs.get("tp_rank", 0)  # the bug: callers never pass tp_rank
    return rank


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    if src.ndim == 0:
        src = src.reshape(1)  # scales saved as () load into (1,), as upstream allows
    if tuple(dst.shape) != tuple(src.shape):
        raise ShapeMismatchError(tuple(dst.shape), tuple(src.shape))
    dst.copy_(src)


def narrow_fused(weight: torch.Tensor, dim: int, start: int, size: int) -> torch.Tensor:
    """Rows ``start .. start+size-1`` of a tensor stacked on disk (q, k and v one after the
    other), or an error naming the rows that are not there (vLLM's ``narrow`` raises)."""
    return _narrow(weight, dim, start, size)


def _narrow(weight: torch.Tensor, dim: int, start: int, size: int) -> torch.Tensor:
    if start + size > weight.shape[dim]:
        raise TensorParallelError(
            f"rows {start}..{start + size - 1} along dim {dim} do not exist in a checkpoint "
            f"tensor of shape {list(weight.shape)}"
        )
    return weight.narrow(dim, start, size)


def load_column_parallel_weight(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """Rows ``rank*n .. rank*n+n-1`` of the output dimension, ``n`` the parameter's rows."""
    rank = _check_group(param)
    dim = _dim(param, "output_dim")
    size = param.shape[dim]
    _copy(param.data, _narrow(loaded_weight, dim, rank * size, size))


def load_row_parallel_weight(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """Columns ``rank*n ..`` of the input dimension; a parameter without one is replicated."""
    rank = _check_group(param)
    dim = getattr(param, "input_dim", None)
    if dim is not None:
        size = param.shape[dim]
        loaded_weight = _narrow(loaded_weight, dim, rank * size, size)
    _copy(param.data, loaded_weight)


def load_merged_column_weight(
    param: torch.Tensor, loaded_weight: torch.Tensor, *, behaviour: Behaviour = "new", **kwargs: Any
) -> None:
    """One of several column-parallel outputs packed in one parameter (``gate_up_proj``).

    ``kwargs``: ``shard_offset`` and ``shard_size`` (rows of this rank's parameter).
    """
    rank = _rank(param, kwargs, behaviour)
    dim, offset, size = _dim(param, "output_dim"), kwargs["shard_offset"], kwargs["shard_size"]
    dst = param.data.narrow(dim, offset, size)
    _copy(dst, _narrow(loaded_weight, dim, rank * size, size))


def load_qkv_weight(
    param: torch.Tensor, loaded_weight: torch.Tensor, *, behaviour: Behaviour = "new", **kwargs: Any
) -> None:
    """A q, k or v block of ``qkv_proj``.

    ``kwargs``: ``shard_id`` (``"q"``, ``"k"``, ``"v"``), ``shard_offset``, ``shard_size`` and
    ``num_heads``: the number of ranks sharing one kv head. Rank ``r`` takes q shard ``r`` and
    kv shard ``r // num_heads``.
    """
    rank = _rank(param, kwargs, behaviour)
    dim, offset, size = _dim(param, "output_dim"), kwargs["shard_offset"], kwargs["shard_size"]
    shard_index = rank if kwargs["shard_id"] == "q" else rank // kwargs["num_heads"]
    dst = param.data.narrow(dim, offset, size)
    _copy(dst, _narrow(loaded_weight, dim, shard_index * size, size))
