"""The Gemma4-like model: its mapper and names, loads that fill every parameter, the packed
loaders and the packing rules."""

import dataclasses

import pytest
import torch

from loadkit import WeightsMapper, ledger_of
from loadkit.errors import MissingShardIdError, ShapeMismatchError
from loadkit.models import gemma4 as g4

from .cases import G4


def test_spec_mapper_and_names():
    assert G4.hf_to_vllm_mapper == WeightsMapper(
        orig_to_new_prefix={"model.language_model.": "language_model.model."}
    )
    with torch.device("meta"):
        model = G4()
    assert model.hf_to_vllm_mapper is G4.hf_to_vllm_mapper  # no towers, no packing: the one rule
    names = [n for n, _ in model.named_parameters()]
    assert all(n.startswith("language_model.model.") for n in names)
    assert all(p.device.type == "meta" for p in model.parameters())
    keys = [n for n, _ in g4.checkpoint_layout(model.config)]
    assert all(k.startswith("model.language_model.") for k in keys)
    assert keys == sorted(keys) and len(keys) == 17 * 4 + 5


@pytest.mark.parametrize("name", ["small", "no-ple-double-wide"])
def test_loads_make_checkpoint_exactly(name, configs):
    config = configs[name]
    ckpt = g4.make_checkpoint(config, seed=3)
    model = G4(config)
    model.load_weights({k: v.clone() for k, v in ckpt.items()}.items())
    expected = g4.expected_parameters(config, ckpt)
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    assert [n for n, t in expected.items() if not torch.equal(state[n], t)] == []
    ledger = ledger_of(model)
    assert ledger.never_loaded == [] and ledger.entries_with("unconsumed") == []


def test_packed_rows_come_from_their_shards():
    config = g4.Gemma4Config()
    ckpt = g4.make_checkpoint(config)
    model = G4(config)
    model.load_weights(ckpt.items())
    p = "model.language_model.layers.1."
    qkv = model.get_parameter("language_model.model.layers.1.self_attn.qkv_proj.weight")
    q = ckpt[f"{p}self_attn.q_proj.weight"]
    k = ckpt[f"{p}self_attn.k_proj.weight"]
    assert torch.equal(qkv[: q.shape[0]], q)
    assert torch.equal(qkv[q.shape[0] : q.shape[0] + k.shape[0]], k)
    gate_up = model.get_parameter("language_model.model.layers.1.mlp.gate_up_proj.weight")
    assert torch.equal(gate_up[config.intermediate_size :], ckpt[f"{p}mlp.up_proj.weight"])


def test_packed_loader_needs_shard_id_and_shape():
    model = G4()
    name = "language_model.model.layers.0.self_attn.qkv_proj.weight"
    param = model.get_parameter(name)
    w = torch.ones(32, 32, dtype=torch.bfloat16)
    with pytest.raises(MissingShardIdError, match=rf"'{name}'.*\[64, 32\].*\[32, 32\].*clone"):
        param.weight_loader(param, w)
    w.shard_id = "x"
    with pytest.raises(MissingShardIdError, match="shard_id 'x'"):
        param.weight_loader(param, w)
    bad = torch.ones(16, 32, dtype=torch.bfloat16)
    bad.shard_id = "q"
    with pytest.raises(ShapeMismatchError, match=r"\[32, 32\].*\[16, 32\]"):
        param.weight_loader(param, bad)
    # Through the loader, a shape error names the parameter and the checkpoint key.
    ckpt = g4.make_checkpoint(g4.Gemma4Config())
    ckpt["model.language_model.layers.0.self_attn.q_proj.weight"] = bad
    with pytest.raises(ShapeMismatchError, match="qkv_proj.*q_proj"):
        model.load_weights(ckpt.items())


def test_packing_rules_chain_in_order_and_are_not_idempotent():
    m = g4.PACKING_MAPPER
    for src, (dst, shard) in {
        "a.v_proj.weight": ("a.qkv_proj.weight", "v"),
        "a.q_proj.weight": ("a.qkv_proj.weight", "q"),
        "a.up_proj.weight": ("a.gate_up_proj.weight", 1),
        "a.gate_proj.weight": ("a.gate_up_proj.weight", 0),
        "a.per_layer_projection.weight": ("a.per_layer_projection.weight", None),
    }.items():
        assert m.map_name_with_shard(src) == (dst, shard)
    assert m.map_name("a.qkv_proj.weight") == "a.qkqkv_proj.weight"  # why mapping twice is a bug


def test_packing_in_mapper_moves_the_rules_not_the_result():
    config = dataclasses.replace(g4.Gemma4Config(), packing_in_mapper=True)
    model = G4(config)
    assert model.hf_to_vllm_mapper.orig_to_new_stacked == g4.PACKING_MAPPER.orig_to_new_stacked
    ckpt = g4.make_checkpoint(config)
    model.load_weights(ckpt.items())
    expected = g4.expected_parameters(config, ckpt)
    qkv = "language_model.model.layers.0.self_attn.qkv_proj.weight"
    assert torch.equal(model.get_parameter(qkv), expected[qkv])
