"""The tensor-parallel linear layers and their loaders, one rank at a time (no processes).

Expected rows are written out from vLLM 0.28.0's ``linear.py`` (read, not imported): column
loaders narrow ``rank * shard_size``, merged and QKV loaders place each shard at
``sum(previous sizes) / tp``, kv shards are ``rank // num_kv_head_replicas``. Checkpoint tensors
are ``arange`` so every loaded row says which checkpoint row it came from (the helpers here serve
``test_vocab_parallel_embedding.py`` too).
"""

from __future__ import annotations

import pytest
import torch

from loadkit.parallel import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    NotDivisibleError,
    QKVParallelLinear,
    RowParallelLinear,
    TensorParallelError,
    stand_in_group,
    use_group,
)
from loadkit.parallel.linear import ShardIdError


def rows_of(rows: int, cols: int) -> torch.Tensor:
    """A [rows, cols] tensor whose row i holds i everywhere (so a row names its origin)."""
    return torch.arange(rows, dtype=torch.float32)[:, None].expand(rows, cols).contiguous()


def held(param: torch.Tensor) -> list[int]:
    return [int(v) for v in param.data[:, 0]] if param.ndim == 2 else [int(v) for v in param.data]


def build(cls, rank: int, tp: int, *args, **kwargs):
    with use_group(stand_in_group(rank, tp)):
        return cls(*args, **kwargs)


def load(layer, param, weight, shard_id=None, rank=None, tp=None):
    with use_group(stand_in_group(layer.tp_rank if rank is None else rank, tp or layer.tp_size)):
        if shard_id is None:
            param.weight_loader(param, weight)
        else:
            param.weight_loader(param, weight, shard_id)


@pytest.mark.parametrize(("rank", "expected"), [(0, [0, 1, 2]), (1, [3, 4, 5])])
def test_column_parallel_takes_its_block_of_output_rows(rank, expected):
    layer = build(ColumnParallelLinear, rank, 2, 4, 6, bias=True)
    load(layer, layer.weight, rows_of(6, 4))
    load(layer, layer.bias, torch.arange(6.0))
    assert held(layer.weight) == expected
    assert held(layer.bias) == expected


def test_row_parallel_takes_its_columns_and_the_whole_bias():
    layer = build(RowParallelLinear, 1, 2, 6, 4, bias=True)
    weight = torch.arange(6.0)[None, :].expand(4, 6).contiguous()  # column j holds j
    load(layer, layer.weight, weight)
    load(layer, layer.bias, torch.arange(4.0))
    assert layer.weight[0].tolist() == [3.0, 4.0, 5.0]
    assert held(layer.bias) == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("behaviour", "gate", "up"),
    [("new", [2, 3], [102, 103]), ("old", [0, 1], [100, 101])],
)
def test_merged_column_rank1_new_takes_own_rows_old_takes_shard0(behaviour, gate, up):
    # gate_up on rank 1 of 2, intermediate 4: [gate rows 2,3 ; up rows 2,3] (new).
    layer = build(MergedColumnParallelLinear, 1, 2, 3, [4, 4], bias=False, rank_behaviour=behaviour)
    load(layer, layer.weight, rows_of(4, 3), 0)
    load(layer, layer.weight, rows_of(4, 3) + 100, 1)
    assert held(layer.weight) == gate + up


def test_merged_column_fused_on_disk_splits_into_its_shards():
    layer = build(MergedColumnParallelLinear, 1, 2, 3, [4, 4], bias=False)
    load(layer, layer.weight, rows_of(8, 3))  # [gate; up] fused, no shard id
    assert held(layer.weight) == [2, 3, 6, 7]


def test_merged_column_unknown_shard_id():
    layer = build(MergedColumnParallelLinear, 0, 2, 3, [4, 4], bias=False, prefix="mlp.gate_up")
    with pytest.raises(ShardIdError, match="mlp.gate_up: shard id 2"):
        load(layer, layer.weight, rows_of(4, 3), 2)


def qkv(rank: int, tp: int, **kw) -> QKVParallelLinear:
    # 8 query heads and 2 kv heads of size 1: a checkpoint row is a head.
    return build(QKVParallelLinear, rank, tp, 3, 1, 8, 2, bias=False, **kw)


def load_qkv(layer: QKVParallelLinear) -> list[int]:
    load(layer, layer.weight, rows_of(8, 3), "q")
    load(layer, layer.weight, rows_of(2, 3) + 100, "k")
    load(layer, layer.weight, rows_of(2, 3) + 200, "v")
    return held(layer.weight)


@pytest.mark.parametrize(
    ("rank", "expected"),
    [(0, [0, 1, 100, 200]), (1, [2, 3, 100, 200]), (2, [4, 5, 101, 201]), (3, [6, 7, 101, 201])],
)
def test_qkv_replicates_kv_heads_when_tp_exceeds_them(rank, expected):
    layer = qkv(rank, 4)
    assert (layer.num_heads, layer.num_kv_heads, layer.num_kv_head_replicas) == (2, 1, 2)
    assert load_qkv(layer) == expected


def test_qkv_splits_kv_heads_when_there_are_enough():
    layer = qkv(1, 2)
    assert (layer.num_kv_heads, layer.num_kv_head_replicas) == (1, 1)
    assert load_qkv(layer) == [4, 5, 6, 7, 101, 201]


def test_qkv_kv_old_takes_kv_shard_by_rank():
    # Before vLLM #2379: rank 1 takes kv head 1 (it shares head 0 with rank 0) ...
    assert load_qkv(qkv(1, 4, kv_behaviour="old")) == [2, 3, 101, 201]
    # ... and rank 2 asks for a third kv head the checkpoint does not have.
    with pytest.raises(TensorParallelError, match=r"rows 2\.\.2 along dim 0 do not exist"):
        load_qkv(qkv(2, 4, kv_behaviour="old"))


def test_qkv_rank_old_loads_shard0_on_every_rank():
    # vllm-gguf-plugin #103: tp_rank from kwargs.get("tp_rank", 0), so rank 3 holds rank 0's rows.
    assert load_qkv(qkv(3, 4, rank_behaviour="old")) == [0, 1, 100, 200]
    assert load_qkv(qkv(3, 4, rank_behaviour="new")) == [6, 7, 101, 201]


def test_qkv_fused_on_disk_equals_separate_tensors():
    separate = load_qkv(qkv(2, 4))
    fused_layer = qkv(2, 4)
    fused = torch.cat([rows_of(8, 3), rows_of(2, 3) + 100, rows_of(2, 3) + 200])
    load(fused_layer, fused_layer.weight, fused)
    assert held(fused_layer.weight) == separate


def test_qkv_bad_shard_id():
    layer = qkv(0, 2)
    with pytest.raises(ShardIdError, match="shard id 'x' is not one of 'q', 'k', 'v'"):
        load(layer, layer.weight, rows_of(8, 3), "x")


def test_sizes_that_do_not_split_name_what_and_tp():
    with pytest.raises(NotDivisibleError, match=r"attn.qkv: attention heads \(8\).*size \(3\)"):
        build(QKVParallelLinear, 0, 3, 3, 1, 8, 2, prefix="attn.qkv")
    with pytest.raises(NotDivisibleError, match=r"ranks per kv head"):
        build(QKVParallelLinear, 0, 4, 3, 1, 8, 3)
    with pytest.raises(NotDivisibleError, match=r"mlp: output 0 \(6\)"):
        build(MergedColumnParallelLinear, 0, 4, 3, [6, 6], prefix="mlp")


def test_outside_a_group_one_rank_and_loaders_check_the_group_size():
    assert ColumnParallelLinear(4, 6).weight.shape == (6, 4)  # no group: a single rank
    layer = build(ColumnParallelLinear, 0, 2, 4, 6)
    with pytest.raises(TensorParallelError, match="built for 2 ranks but is loaded in a group of"):
        layer.weight.weight_loader(layer.weight, rows_of(6, 4))
    with pytest.raises(TensorParallelError, match="built for 2 ranks but is loaded in a group of"):
        load(layer, layer.weight, rows_of(6, 4), rank=0, tp=4)
