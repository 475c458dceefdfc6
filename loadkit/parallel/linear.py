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

As in vLLM 0.34.0 the packed layers (``StackedColumnParallelLinear``: merged and QKV) record which
shards each parameter received (``validate_shard_id``) and say which were never filled
(``pop_missing_shards``); every layer carries an unquantized ``quant_method``, the attribute vLLM's
``track_weights_loading`` reads (``loadkit.loading.track``).

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
from loadkit.errors import LayerAsParameterError, ShapeMismatchError, ShardIdError
from loadkit.loading.weight_loaders import loader_of, set_weight_attrs
from loadkit.parallel.quant import UnquantizedLinearMethod
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
    """What every parallel linear layer shares: its group's rank and size, sizes, a prefix, and
    the unquantized ``quant_method`` (vLLM's ``UnquantizedLinearMethod``)."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        *,
        params_dtype: torch.dtype | None = None,
        prefix: str = "",
        disable_tp: bool = False,
    ) -> None:
        super().__init__()
        group = get_tp_group()
        # disable_tp: the layer is whole on every rank (vLLM's replicated variant).
        self.tp_rank, self.tp_size = (0, 1) if disable_tp else (group.rank, group.world_size)
        self.disable_tp = disable_tp
        self.input_size, self.output_size = input_size, output_size
        self.params_dtype = params_dtype
        self.prefix = prefix
        self.quant_method = UnquantizedLinearMethod()

    def _mark_replicated(self) -> None:
        """A ``disable_tp`` layer's parameters load whole, whatever the group."""
        if self.disable_tp:
            for param in self.parameters(recurse=False):
                set_weight_attrs(param, {"replicated": True})


class ReplicatedLinear(LinearBase):
    """``y = x A^T + b`` held whole on every rank (a mixture-of-experts gate, a small projection).

    >>> layer = ReplicatedLinear(4, 2, bias=False)
    >>> tuple(layer.weight.shape)
    (2, 4)
    """

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = True,
        *,
        params_dtype: torch.dtype | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__(input_size, output_size, params_dtype=params_dtype, prefix=prefix)
        self.weight = sharded_parameter(
            (output_size, input_size), params_dtype, 1, weight_loader=self.weight_loader
        )
        if bias:
            self.bias = sharded_parameter((output_size,), params_dtype, 1)
            set_weight_attrs(self.bias, {"weight_loader": self.weight_loader})
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        # vLLM asserts the shapes, after reshaping a one-element scale to (1,).
        if loaded_weight.ndim == 0 and param.numel() == 1:
            loaded_weight = loaded_weight.reshape(1)
        if tuple(param.shape) != tuple(loaded_weight.shape):
            raise ShapeMismatchError(tuple(param.shape), tuple(loaded_weight.shape))
        param.data.copy_(loaded_weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


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
        disable_tp: bool = False,
    ) -> None:
        super().__init__(
            input_size,
            output_size,
            params_dtype=params_dtype,
            prefix=prefix,
            disable_tp=disable_tp,
        )
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
        self._mark_replicated()

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


class StackedColumnParallelLinear(ColumnParallelLinear):
    """A column-parallel weight stacked from several checkpoint tensors, each a shard id.

    As vLLM 0.34.0, each load records which shards a parameter received
    (``validate_shard_id(shard_id, param)``) and ``pop_missing_shards()`` names the shards a
    partly filled parameter never got (``"weight.k"``): vLLM's ``track_weights_loading`` refuses
    a model with one. A parameter nothing was loaded into is left to the parameter-level check.
    """

    shard_ids: tuple[ShardId, ...] = ()

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.loaded_shard_ids: dict[str, set[ShardId]] = {}

    def _shard_rows(self, shard_id: ShardId) -> int:
        """Rows of this rank's parameter that belong to ``shard_id``."""
        raise NotImplementedError

    def validate_shard_id(
        self, shard_id: ShardId | None, param: nn.Parameter | None = None
    ) -> bool:
        """``shard_id`` names shards of this layer (``None``: stacked on disk, every shard); with
        ``param``, record them as loaded into it."""
        shards = self.shard_ids if shard_id is None else (shard_id,)
        if any(shard not in self.shard_ids for shard in shards):
            raise ShardIdError(
                f"{self.prefix or type(self).__name__}: shard id {shard_id!r} is not one of "
                f"{', '.join(map(repr, self.shard_ids))}"
            )
        if param is not None:
            name = next((n for n, p in self.named_parameters() if p is param), None)
            if name is not None:
                self.loaded_shard_ids.setdefault(name, set()).update(shards)
        return True

    def pop_missing_shards(self) -> list[str]:
        """``"<param>.<shard>"`` for each shard this load never filled into a parameter that got
        another one; the record is then forgotten (the next load starts fresh)."""
        loaded, self.loaded_shard_ids = self.loaded_shard_ids, {}
        return [
            f"{name}.{shard}"
            for name, shards in loaded.items()
            for shard in self.shard_ids
            if shard not in shards and self._shard_rows(shard)
        ]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[str]:
        """Upstream's ``load_weights`` of a stacked layer: each tensor's ``shard_id`` (set by the
        stacked mapper rule) goes to its parameter's loader; a bias the layer does not have is
        passed over without a word (vLLM 0.34.0 does the same: ``param is None``)."""
        for name, loaded_weight in weights:
            shard_id = getattr(loaded_weight, "shard_id", None)
            self.validate_shard_id(shard_id)
            param = getattr(self, name, self) if "." not in name else self
            if param is None and name == "bias":
                continue
            if not isinstance(param, nn.Parameter):
                qual = f"{self.prefix}.{name}" if self.prefix else name
                raise LayerAsParameterError(qual, type(self).__name__)
            try:
                loader_of(param)(param, loaded_weight, shard_id)
            except TensorParallelError as exc:
                raise TensorParallelError(
                    f"{self.prefix}.{name} (shard {shard_id!r}, rank {self.tp_rank} of "
                    f"{self.tp_size}): {exc}"
                ) from exc
            yield name


class MergedColumnParallelLinear(StackedColumnParallelLinear):
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
        disable_tp: bool = False,
    ) -> None:
        self.output_sizes = list(output_sizes)
        self.shard_ids = tuple(range(len(self.output_sizes)))
        self.rank_behaviour = check_behaviour(rank_behaviour, BEHAVIOURS, what="rank_behaviour")
        tp = 1 if disable_tp else get_tp_group().world_size
        for i, size in enumerate(self.output_sizes):
            divide(size, tp, f"{prefix or 'MergedColumnParallelLinear'}: output {i}")
        super().__init__(
            input_size,
            sum(self.output_sizes),
            bias,
            gather_output,
            params_dtype=params_dtype,
            prefix=prefix,
            disable_tp=disable_tp,
        )

    def _shard_rows(self, shard_id: ShardId) -> int:
        return self.output_sizes[int(shard_id)] // self.tp_size

    def weight_loader(
        self,
        param: nn.Parameter,
        loaded_weight: torch.Tensor,
        loaded_shard_id: ShardId | None = None,
    ) -> None:
        self.validate_shard_id(loaded_shard_id, param)
        if loaded_shard_id is None:
            # Fused on disk (Phi-3's gate_up_proj): split into the shards and load each.
            offset = 0
            for shard_id, size in enumerate(self.output_sizes):
                self.weight_loader(param, pl.narrow_fused(loaded_weight, 0, offset, size), shard_id)
                offset += size
            return
        shard_offset = sum(self.output_sizes[: int(loaded_shard_id)]) // self.tp_size
        shard_size = self.output_sizes[int(loaded_shard_id)] // self.tp_size
        pl.load_merged_column_weight(
            param,
            loaded_weight,
            behaviour=self.rank_behaviour,
            shard_id=loaded_shard_id,
            shard_offset=shard_offset,
            shard_size=shard_size,
        )


class QKVParallelLinear(StackedColumnParallelLinear):
    """The attention's q, k and v projections packed as ``[q_r; k_r; v_r]`` on rank ``r``.

    Query heads are split across ranks. With at least as many kv heads as ranks they are split
    too; with fewer, each rank holds one kv head and ``num_kv_head_replicas`` ranks share it.
    ``v_head_size`` (vLLM's): a value head of another size than the query and key heads.
    """

    shard_ids = ("q", "k", "v")

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
        v_head_size: int | None = None,
    ) -> None:
        self.rank_behaviour = check_behaviour(rank_behaviour, BEHAVIOURS, what="rank_behaviour")
        self.kv_behaviour = check_behaviour(kv_behaviour, BEHAVIOURS, what="kv_behaviour")
        self.hidden_size, self.head_size = hidden_size, head_size
        self.v_head_size = v_head_size or head_size
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
        q, k = self.num_heads * head_size, self.num_kv_heads * head_size
        v = self.num_kv_heads * self.v_head_size
        self.output_sizes = [q * tp, k * tp, v * tp]  # per-rank sizes times tp, as upstream
        self._offsets = {"q": (0, q), "k": (q, k), "v": (q + k, v)}
        super().__init__(
            hidden_size,
            sum(self.output_sizes),
            bias,
            False,
            params_dtype=params_dtype,
            prefix=prefix,
        )

    def _shard_rows(self, shard_id: ShardId) -> int:
        return self._offsets[str(shard_id)][1]

    def weight_loader(
        self,
        param: nn.Parameter,
        loaded_weight: torch.Tensor,
        loaded_shard_id: ShardId | None = None,
    ) -> None:
        self.validate_shard_id(loaded_shard_id, param)
        if loaded_shard_id is None:
            # Fused on disk: q, k and v of all heads one after the other.
            sizes = {
                "q": self.total_num_heads * self.head_size,
                "k": self.total_num_kv_heads * self.head_size,
                "v": self.total_num_kv_heads * self.v_head_size,
            }
            offset = 0
            for shard_id, size in sizes.items():
                self.weight_loader(param, pl.narrow_fused(loaded_weight, 0, offset, size), shard_id)
                offset += size
            return
        shard_offset, shard_size = self._offsets[str(loaded_shard_id)]
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

    def split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This rank's q, k and v from the layer's output."""
        (_, q), (_, k), (_, v) = (self._offsets[s] for s in ("q", "k", "v"))
        return qkv[..., :q], qkv[..., q : q + k], qkv[..., q + k : q + k + v]


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
        disable_tp: bool = False,
    ) -> None:
        super().__init__(
            input_size,
            output_size,
            params_dtype=params_dtype,
            prefix=prefix,
            disable_tp=disable_tp,
        )
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
        self._mark_replicated()

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        pl.load_row_parallel_weight(param, loaded_weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias if self.tp_rank == 0 else None
        y = F.linear(x, self.weight, bias)
        return get_tp_group().all_reduce(y) if self.reduce_results else y
