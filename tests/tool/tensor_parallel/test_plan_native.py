"""``--tp N`` on vLLM 0.34.0's native classes: the config checked first as vLLM checks it (the
heads, in ``ModelConfig.verify_with_parallel_config``), then each rank built and loaded on the
meta device with vLLM's parallel layers (kv heads split or replicated, the packed shards and the
vocabulary placed per rank), header-only."""

from __future__ import annotations

import pytest
from native_cases import ARCHS

from loadkit_inspect import inspect_checkpoint


@pytest.fixture(scope="module")
def llama(tmp_path_factory, quiet_transformers):
    from native_cases import save_clean

    return save_clean(ARCHS["llama"], tmp_path_factory.mktemp("llama"))  # 4 heads, 2 kv heads


def test_each_rank_is_simulated_and_the_kv_heads_are_replicated(llama):
    r = inspect_checkpoint(llama, model="hf", tp=4, loader="vllm")
    tp = r.tensor_parallel
    assert r.exit_status == 0 and tp.simulated and len(tp.ranks) == 4
    assert [(f.severity, f.subject) for f in tp.findings] == [("note", "kv replication")]
    assert all(rank.error is None for rank in tp.ranks)
    # rank r holds kv head r // 2: the k rows of layer 0's qkv_proj, rank by rank
    k = next(e for e in tp.entries if e.key == "model.layers.0.self_attn.k_proj.weight")
    assert k.spans == [[(0, 4)], [(0, 4)], [(4, 8)], [(4, 8)]]
    assert r.render().splitlines()[-1].endswith("on each of 4 ranks (exit 0)")


def test_heads_not_divisible_are_refused_before_any_rank_is_built(llama):
    r = inspect_checkpoint(llama, model="hf", tp=3, loader="vllm")
    assert r.exit_status == 1 and r.tensor_parallel.ranks == []
    assert r.loaders["vllm"].problems == [
        "tp=3 refused: Total number of attention heads (4) must be divisible by tensor parallel "
        "size (3)"
    ]
