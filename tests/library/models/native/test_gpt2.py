"""vLLM 0.34.0's GPT2LMHeadModel as loadkit re-implements it (loadkit.models.native.gpt2): the
old causal-mask buffers dropped and the attention bias kept, a checkpoint saved from the base
model found under ``transformer.``, and the settings vLLM cannot build refused."""

from __future__ import annotations

import pytest
import torch
from native_cases import ARCHS, read_config, read_tensors

from loadkit.errors import ModelSpecError
from loadkit.loading.track import track_weights_loading
from loadkit.models.native.gpt2 import GPT2LMHeadModel


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory, quiet_transformers):
    from native_cases import save_clean

    return save_clean(ARCHS["gpt2"], tmp_path_factory.mktemp("gpt2"))


def build(folder):
    from loadkit.models.transformers.config import load_config

    config, _ = load_config(folder)
    return GPT2LMHeadModel(config)


def test_mask_buffers_are_dropped_and_the_attention_bias_is_kept(gpt2):
    t = read_tensors(gpt2)
    old = {**t, "transformer.h.0.attn.bias": torch.ones(1, 1, 4, 4)}  # GPT-2's causal mask
    old["transformer.h.1.attn.masked_bias"] = torch.tensor(-1e4)
    model = build(gpt2)
    loaded = model.load_weights(old.items())
    assert track_weights_loading(model, loaded) == ([], [])
    assert "transformer.h.0.attn.c_attn.bias" in loaded
    assert torch.equal(
        model.transformer.h[0].attn.c_attn.bias, t["transformer.h.0.attn.c_attn.bias"]
    )


def test_a_checkpoint_saved_from_the_base_model_loads_under_transformer(gpt2):
    t = read_tensors(gpt2)
    bare = {k.removeprefix("transformer."): v for k, v in t.items()}  # GPT2Model.save_pretrained
    model = build(gpt2)
    loaded = model.load_weights(bare.items())
    assert track_weights_loading(model, loaded) == ([], [])
    assert torch.equal(model.transformer.wpe.weight, t["transformer.wpe.weight"])


def test_settings_vllm_cannot_build_are_refused(gpt2):
    from transformers import GPT2Config

    config = GPT2Config(**{**read_config(gpt2), "scale_attn_by_inverse_layer_idx": True})
    with torch.device("meta"), pytest.raises(ModelSpecError, match="scale_attn_by_inverse"):
        GPT2LMHeadModel(config)
