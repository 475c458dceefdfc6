"""``benchmarks/large_layout.py``'s DeepSeek-V3-like layout: real safetensors shards (the library
reads every one), an index that names every key, and loadkit's header-only inspect agreeing."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import safe_open

from loadkit import open_checkpoint

TINY = {"num_hidden_layers": 3, "first_k_dense_replace": 1, "n_routed_experts": 4}


def test_the_layout_has_deepseek_v3s_parts(large_layout_bench):
    names = [n for n, _, _ in large_layout_bench.layout(large_layout_bench.CONFIG)]
    assert len(names) == len(set(names)) == 91_991
    assert "model.layers.3.mlp.experts.255.down_proj.weight_scale_inv" in names
    assert "model.layers.61.shared_head.head.weight" in names  # the multi-token-prediction layer
    assert not any(n.startswith("model.layers.2.mlp.experts.") for n in names)  # dense layers


def test_shards_are_real_safetensors_and_loadkit_reads_what_safetensors_reads(
    large_layout_bench, tmp_path
):
    config = dict(large_layout_bench.CONFIG, **TINY)
    n, nbytes = large_layout_bench.write_layout(tmp_path, config, shards=5)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(index["weight_map"]) == n and index["metadata"]["total_size"] == nbytes
    seen = {}
    for file in sorted(set(index["weight_map"].values())):
        with safe_open(str(tmp_path / file), framework="numpy") as f:
            seen.update({k: (file, list(f.get_slice(k).get_shape())) for k in f.keys()})
    assert {k: f for k, (f, _) in seen.items()} == index["weight_map"]
    ck = open_checkpoint(tmp_path)
    read = {k: (Path(t.file).name, list(t.shape)) for k, t in ck.tensors.items()}
    assert read == seen
    scale = ck.tensors["model.layers.1.mlp.experts.3.up_proj.weight_scale_inv"]
    assert (scale.dtype, list(scale.shape)) == ("F32", [16, 56])  # 2048 x 7168 in 128-blocks
