"""The vision tower: the old stacked stage mis-packs its checkpoint, the new one loads it."""

from __future__ import annotations

import pytest
import torch
from repo_paths import DATA

from loadkit import AutoWeightsLoader, WeightsMapper, open_checkpoint
from loadkit.errors import CheckpointError, UnknownNameError
from loadkit.models import vision_tower as vt
from loadkit_inspect.models.registry import build_model

CK = open_checkpoint(DATA / "vision_tower" / "model.safetensors")
TRUTH = dict(CK.weights())
QKV = "vision_model.encoder.layers.{}.self_attn.qkv_proj.{}"


def load(behaviour: str) -> tuple[vt.VisionTower, AutoWeightsLoader]:
    model = vt.VisionTower(vt.config_from_checkpoint(CK.tensors))
    loader = AutoWeightsLoader(model)
    mapper = WeightsMapper(orig_to_new_stacked=vt.QKV_RULES, behaviour=behaviour)
    loader.load_weights(CK.weights(), mapper=mapper)
    return model, loader


def test_committed_checkpoint_layout_and_config():
    config = vt.config_from_checkpoint(CK.tensors)
    assert config == vt.VisionTowerConfig()
    assert [(n, CK.tensors[n].shape) for n in CK.tensors] == [
        (n, tuple(s)) for n, s in vt.checkpoint_layout(config)
    ]
    assert len(CK.tensors) == 37
    assert not any(".qkv_proj." in n for n in CK.tensors)


def test_committed_values_are_nonzero_and_rows_distinct():
    assert all(bool((t != 0).all()) for t in TRUTH.values())
    for i in range(2):
        rows = torch.cat([TRUTH[f"vision_model.encoder.layers.{i}.self_attn.{p}_proj.weight"]
                          for p in "qkv"])  # fmt: skip
        assert len({tuple(r.tolist()) for r in rows}) == len(rows) == 48


def test_new_loads_every_tensor_exactly():
    model, loader = load("new")
    params = dict(model.named_parameters())
    assert set(params) == {n.replace("q_proj", "qkv_proj") for n in TRUTH if "k_proj" not in n
                           and "v_proj" not in n}  # fmt: skip
    for i in range(2):
        for kind in ("weight", "bias"):
            packed = torch.cat(
                [TRUTH[f"vision_model.encoder.layers.{i}.self_attn.{p}_proj.{kind}"] for p in "qkv"]
            )
            assert torch.equal(params[QKV.format(i, kind)], packed)
    for name, tensor in TRUTH.items():
        if name in params:
            assert torch.equal(params[name], tensor), name
    counts = loader.ledger.counts()
    assert counts["model"]["never loaded"] == 0 and counts["checkpoint"]["loaded"] == 25
    assert counts["checkpoint"]["delegated"] == 12  # q, k, v: to QKVParallelLinear.load_weights
    rows = vt.qkv_rows(model, TRUTH)
    assert rows[QKV.format(0, "weight")] == [f"{s} {j}" for s in "qkv" for j in range(16)]


def test_old_fails_on_qkqkv_proj_as_vllm_0_28_0_does():
    with pytest.raises(UnknownNameError) as failure:
        load("old")
    err = failure.value
    assert err.name == "vision_model.encoder.layers.0.self_attn.qkqkv_proj"
    assert str(err).startswith(
        "There is no module or parameter named 'vision_model.encoder.layers.0.self_attn."
        "qkqkv_proj' in VisionTower."
    )
    assert "checkpoint key 'vision_model.encoder.layers.0.self_attn.k_proj.bias'" in str(err)


def test_old_leaves_every_qkv_row_unloaded():
    model = vt.VisionTower()
    with pytest.raises(UnknownNameError):
        model.load_weights(CK.weights())  # its own mapper: vLLM 0.28.0's stage
    rows = vt.qkv_rows(model, TRUTH)
    assert all(r is None for held in rows.values() for r in held)
    counts = model.ledger.counts()["checkpoint"]
    assert counts["unconsumed"] == 1 and counts["loaded"] == 11  # the load stopped at k_proj


def test_mapped_names_old_and_new():
    old = WeightsMapper(orig_to_new_stacked=vt.QKV_RULES)
    new = WeightsMapper(orig_to_new_stacked=vt.QKV_RULES, behaviour="new")
    key = "vision_model.encoder.layers.1.self_attn.{}.bias"
    assert [old.map_name_with_shard(key.format(p)) for p in ("q_proj", "k_proj", "v_proj")] == [
        (key.format("qkqkv_proj"), "v"),
        (key.format("qkqkv_proj"), "v"),
        (key.format("qkv_proj"), "v"),
    ]
    assert [new.map_name_with_shard(key.format(p)) for p in ("q_proj", "k_proj", "v_proj")] == [
        (key.format("qkv_proj"), s) for s in "qkv"
    ]
    others = [n for n in TRUTH if "_proj" not in n or "out_proj" in n]
    assert all(old.map_name(n) == new.map_name(n) == n for n in others)


def test_forward_after_the_new_load_uses_the_packed_weights():
    model, _ = load("new")
    x = torch.arange(48, dtype=torch.float32).reshape(1, 3, 4, 4) / 16
    y = model(x)
    assert y.shape == (1, 4, 16) and torch.isfinite(y).all()
    # The attention's q, k, v are the checkpoint's projections of the first layer's input.
    attn = model.vision_model.encoder.layers[0].self_attn
    h = torch.randn(1, 4, 16, generator=torch.Generator().manual_seed(0))
    q, k, v = attn.qkv_proj.split(attn.qkv_proj(h))
    p = "vision_model.encoder.layers.0.self_attn."
    for got, proj in zip((q, k, v), "qkv", strict=True):
        want = h @ TRUTH[f"{p}{proj}_proj.weight"].T + TRUTH[f"{p}{proj}_proj.bias"]
        assert torch.allclose(got, want)


def test_registry_builds_it_from_a_header():
    model, _ = build_model("vision-tower", CK.tensors)
    assert isinstance(model, vt.VisionTower)
    assert next(model.parameters()).is_meta


def test_config_from_a_bad_header_names_the_key():
    tensors = {n: t for n, t in CK.tensors.items() if "position_embedding" not in n}
    with pytest.raises(CheckpointError, match="position_embedding.weight"):
        vt.config_from_checkpoint(tensors)
