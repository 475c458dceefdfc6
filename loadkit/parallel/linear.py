"""vLLM's tensor-parallel linear layers and their ``weight_loader``s (docs/api.md, bug 4).

Each layer is built inside ``use_group(group)`` and sizes its parameters for that group's rank:

- ``ColumnParallelLinear``: the output dimension is split, rank ``r`` holds rows
  ``r*n/tp .. (r+1)*n/tp - 1``; ``gather_output`` all-gathers the outputs.
- ``MergedColumnParallelLinear``: several column-parallel outputs in one parameter
  (``gate_up_proj``); each ``shard_id`` 0, 1, ... is narrowed, then placed at its offset.
- ``QKVParallelLinear``: q, k and v heads in one parameter; with more ranks than kv heads each kv
  head is replicated on ``tp // num_kv_heads`` ranks and rank ``r`` takes kv head
  ``r // num_kv_head_replicas``.
- ``RowParallelLinear``: the input dimension is split; outputs are all-reduced and the bias is
  added on rank 0 only, so the sum counts it once.

Two upstream bugs can be switched on: ``rank_behaviour="old"`` (vllm-gguf-plugin #103: the
merged-column and QKV loaders read the rank from a defaulted keyword, so every rank loads shard
0) and ``kv_behaviour="old"`` (vLLM before #2379: kv shards are taken by rank, without
replication, so a rank past the last kv head has none to take).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

import loadkit.parallel.param_loaders as pl
from loadkit.errors import LoadkitError, ShardIdError
from loadkit.loading.weight_loaders import loader_of, set_weight_attrs
from loadkit.parallel.state import TensorParallelError, divide, get_tp_group
from loadkit.terms import BEHAVIOURS, Behaviour, check_behaviour

ShardId = int | str


def sharded_parameter(
    shape: tuple[int, ...], dtype: torch.dtype | None, tp_size: int, **attrs: object
) -> nn.Parameter:
    """A zero-filled parameter carrying its loading attributes (``output_dim``, ...).

    Zeros, not ``empty``: anything a buggy load leaves untouched is deterministic, and the
    parameter builds on the meta device too.
    """
    param = nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
    set_weight_attrs(param, {"tp_size": tp_size, **attrs})
    return param


class LinearBase(nn.Module):
    """What every parallel linear layer shares: its group's rank and size, sizes, a prefix."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        *,
        params_dtype: torch.dtype | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        group = get_tp_group()
        self.tp_rank, self.tp_size = group.rank, group.world_size
        self.input_size, self.output_size = input_size, output_size
        self.params_dtype = params_dtype
        self.prefix = prefix

    def _load_packed(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[str]:
        # A packed layer reached through AutoWeightsLoader receives its names here, and reads
        # each tensor's shard_id (set by the stacked mapper rule), as upstream's load_weights.
        for name, loaded_weight in weights:
            param = getattr(self, name, None)
            if not isinstance(param, nn.Parameter):
                raise LoadkitError(
                    f"{type(self).__name__} '{self.prefix}' has no parameter '{name}' "
                    f"(it holds {', '.join(n for n, _ in self.named_parameters())})"
                )
            shard_id = getattr(loaded_weight, "shard_id", None)
            try:
                loader_of(param)(param, loaded_weight, shard_id)
            except LoadkitError as exc:
                raise TensorParallelError(
                    f"{self.prefix}.{name} (shard {shard_id!r}, rank {self.tp_rank} of "
                    f"{self.tp_size}): {exc}"
                ) from exc
            yield name


class ColumnParallelLinear(LinearBase):
    """``y = x A^T + b`` with ``A``'s rows (the output features) split across ranks."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = True,
        gather_output: bool = False,
        *,
        params_dtype: torch.dtype | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__(input_size, output_size, params_dtype=params_dtype, prefix=prefix)
        self.gather_output = gather_output
        self.output_size_per_partition = divide(
            output_size, self.tp_size, f"{prefix or 'ColumnParallelLinear'}: output size"
        )
        self.weight = sharded_parameter(
            (self.output_size_per_partition, input_size),
            params_dtype,
            self.tp_size,
            output_dim=0,
            input_dim=1,
            weight_loader=self.weight_loader,
        )
        if bias:
            self.bias = sharded_parameter(
                (self.output_size_per_partition,),
                params_dtype,
                self.tp_size,
                output_dim=0,
                weight_loader=self.weight_loader,
            )
        else:
            self.register_parameter("bias", None)

    def weight_loader(
        self,
        param: nn.Parameter,
        loaded_weight: torch.Tensor,
        loaded_shard_id: ShardId | None = None,
    ) -> None:
        pl.load_column_parallel_weight(param, loaded_weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        return get_tp_group().all_gather(y, dim=-1) if self.gather_output else y


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Column-parallel outputs of sizes ``output_sizes`` packed in one parameter, each split
    across ranks on its own: rank ``r`` holds ``[gate_r; up_r]``, not a slice of ``[gate; up]``.
    """

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        bias: bool = True,
        gather_output: bool = False,
        *,
        params_dtype: torch.dtype | None = None,
        prefix: str = "",
        rank_behaviour: Behaviour = "new",
    ) -> None:
        self.output_sizes = list(output_sizes)
        self.rank_behaviour = check_behaviour(rank_behaviour, BEHAVIOURS, what="rank_behaviour")
        tp = get_tp_group().world_size
        for i, size in enumerate(self.output_sizes):
            divide(size, tp, f"{prefix or 'MergedColumnParallelLinear'}: output {i}")
        super().__init__(
            input_size,
            sum(self.output_sizes),
            bias,
            gather_output,
            params_dtype=params_dtype,
            prefix=prefix,
        )

    def weight_loader(
        self,
        param: nn.Parameter,
        loaded_weight: torch.Tensor,
        loaded_shard_id: ShardId | None = None,
    ) -> None:
        if loaded_shard_id is None:
            # Fused on disk (Phi-3's gate_up_proj): split into the shards and load each.
            offset = 0
            for shard_id, size in enumerate(self.output_sizes):
                self.weight_loader(param, loaded_weight.narrow(0, offset, size), shard_id)
                offset += size
            return
        if not isinstance(loaded_shard_id, int) or not 0 <= loaded_shard_id < len(
            self.output_sizes
        ):
            raise ShardIdError(
                f"{self.prefix or 'MergedColumnParallelLinear'}: shard id {loaded_shard_id!r} "
                f"is not one of 0..{len(self.output_sizes) - 1}"
            )
        shard_offset = sum(self.output_sizes[:loaded_shard_id]) // self.tp_size
        shard_size = self.output_sizes[loaded_shard_id] // self.tp_size
        pl.load_merged_column_weight(
            param,
            loaded_weight,
            behaviour=self.rank_behaviour,
            shard_id=loaded_shard_id,
            shard_offset=shard_offset,
            shard_size=shard_size,
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[str]:
        return self._load_packed(weights)


class QKVParallelLinear(ColumnParallelLinear):
    """The attention's q, k and v projections packed as ``[q_r; k_r; v_r]`` on rank ``r``.

    Query heads are split across ranks. With at least as many kv heads as ranks they are split
    too; with fewer, each rank holds one kv head and ``num_kv_head_replicas`` ranks share it.
    """

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        total_num_heads: int,
        total_num_kv_heads: int | None = None,
        bias: bool = True,
        *,
        params_dtype: torch.dtype | None = None,
        prefix: str = "",
        rank_behaviour: Behaviour = "new",
        kv_behaviour: Behaviour = "new",
    ) -> None:
        self.rank_behaviour = check_behaviour(rank_behaviour, BEHAVIOURS, what="rank_behaviour")
        self.kv_behaviour = check_behaviour(kv_behaviour, BEHAVIOURS, what="kv_behaviour")
        self.hidden_size, self.head_size = hidden_size, head_size
        self.total_num_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads or total_num_heads
        tp = get_tp_group().world_size
        name = prefix or "QKVParallelLinear"
        self.num_heads = divide(total_num_heads, tp, f"{name}: attention heads")
        if tp >= self.total_num_kv_heads:
            self.num_kv_heads = 1
            self.num_kv_head_replicas = divide(
                tp, self.total_num_kv_heads, f"{name}: ranks per kv head (tp / kv heads)"
            )
        else:
            self.num_kv_heads = divide(self.total_num_kv_heads, tp, f"{name}: kv heads")
            self.num_kv_head_replicas = 1
        q, kv = self.num_heads * head_size, self.num_kv_heads * head_size
        self.output_sizes = [q * tp, kv * tp, kv * tp]  # per-rank sizes times tp, as upstream
        self._offsets = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}
        super().__init__(
            hidden_size,
            sum(self.output_sizes),
            bias,
            False,
            params_dtype=params_dtype,
            prefix=prefix,
        )

    def weight_loader(
        self,
        param: nn.Parameter,
        loaded_weight: torch.Tensor,
        loaded_shard_id: ShardId | None = None,
    ) -> None:
        if loaded_shard_id is None:
            # Fused on disk: q, k and v of all heads one after the other.
            hd = self.head_size
            sizes = {
                "q": self.total_num_heads * hd,
                "k": self.total_num_kv_heads * hd,
                "v": self.total_num_kv_heads * hd,
            }
            offset = 0
            for shard_id, size in sizes.items():
                self.weight_loader(param, loaded_weight.narrow(0, offset, size), shard_id)
                offset += size
            return
        if loaded_shard_id not in self._offsets:
            raise ShardIdError(
                f"{self.prefix or 'QKVParallelLinear'}: shard id {loaded_shard_id!r} is not "
                "'q', 'k' or 'v'"
            )
        shard_offset, shard_size = self._offsets[loaded_shard_id]
        # Before vLLM #2379 nothing told the loader that kv heads are shared: kv shard = rank.
        replicas = self.num_kv_head_replicas if self.kv_behaviour == "new" else 1
        pl.load_qkv_weight(
            param,
            loaded_weight,
            behaviour=self.rank_behaviour,
            shard_id=loaded_shard_id,
            shard_offset=shard_offset,
            shard_size=shard_size,
            num_heads=replicas,
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[str]:
        return self._load_packed(weights)

    def split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This rank's q, k and v from the layer's output."""
        q, kv = self._offsets["k"][0], self._offsets["k"][1]
        return qkv[..., :q], qkv[..., q : q + kv], qkv[..., q + kv :]


class RowParallelLinear(LinearBase):
    """``y = x A^T + b`` with ``A``'s columns (the input features) split across ranks; each rank
    multiplies its slice of ``x`` and the partial results are all-reduced."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = True,
        reduce_results: bool = True,
        *,
        params_dtype: torch.dtype | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__(input_size, output_size, params_dtype=params_dtype, prefix=prefix)
        if bias and not reduce_results:
            raise TensorParallelError(
                f"{prefix or 'RowParallelLinear'}: a bias without reducing the results would be "
                "added once per rank"
            )
        self.reduce_results = reduce_results
        self.input_size_per_partition = divide(
            input_size, self.tp_size, f"{prefix or 'RowParallelLinear'}: input size"
        )
        self.weight = sharded_parameter(
            (output_size, self.input_size_per_partition),
            params_dtype,
            self.tp_size,
            output_dim=0,
            input_dim=1,
            weight_loader=self.weight_loader,
        )
        if bias:
            # Not split: every rank loads the whole bias, rank 0 adds it.
            self.bias = sharded_parameter(
                (output_size,),
                params_dtype,
                self.tp_size,
                output_dim=0,
                weight_loader=self.weight_loader,
            )
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        pl.load_row_parallel_weight(param, loaded_weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias if self.tp_rank == 0 else None
        y = F.linear(x, self.weight, bias)
        return get_tp_group().all_reduce(y) if self.reduce_results else y
