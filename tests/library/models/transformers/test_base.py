"""The mapper ``Base`` derives from transformers' own class, as upstream's
``_create_hf_to_vllm_mapper`` does."""

from __future__ import annotations

import pytest
import torch

from loadkit.models.transformers import TransformersForCausalLM

from .test_transformers import config

# transformers quiet for every test here, not only those that save a checkpoint (conftest.py)
pytestmark = pytest.mark.usefixtures("quiet_transformers")


def test_mapper_for_a_base_model_prefix_other_than_model():
    m = TransformersForCausalLM(config("gpt2"), device="meta")
    rules = [(stage, rule, target) for stage, rule, target in m.hf_to_vllm_mapper.rules()]
    regex = [(rule, target) for stage, rule, target in rules if stage == "regex"]
    assert regex == [
        ("attn.bias", None),  # GPT2Model._keys_to_ignore_on_load_unexpected, sorted
        ("crossattention.bias", None),
        (r"^transformer\.(.+)", r"model.\1"),
        (r"^(?!model\.)((wte|wpe|drop|h|ln_f).*)", r"model.\1"),
        (r"^(model\.)((?!wte|wpe|drop|h|ln_f).+)", r"\2"),
        (r"^model\.(.+\.)*(lm_head.+)", r"\2"),
    ]
    # transformers' own renamings come first: the legacy LayerNorm.gamma/beta ones among them
    renames = [rule for stage, rule, _ in rules if stage == "renaming"]
    assert "LayerNorm.gamma -> LayerNorm.weight" in renames
    mapper = m.hf_to_vllm_mapper
    assert mapper.map_name("transformer.h.0.mlp.c_fc.weight") == "model.h.0.mlp.c_fc.weight"
    assert mapper.map_name("h.0.mlp.c_fc.weight") == "model.h.0.mlp.c_fc.weight"  # no prefix
    assert mapper.map_name("model.lm_head.weight") == "lm_head.weight"  # nested head
    assert mapper.map_name("transformer.h.0.attn.bias") is None  # the old causal-mask buffer
    # the upstream pitfall the oracle tests pin: the ignore regex is searched anywhere
    assert mapper.map_name("transformer.h.0.attn.c_attn.bias") is None
    origins = m.mapper_rule_origins
    assert origins[("regex", "attn.bias")] == (
        "from transformers: GPT2Model._keys_to_ignore_on_load_unexpected"
    )
    assert "base_model_prefix 'transformer'" in origins[("regex", r"^transformer\.(.+)")]
    assert "legacy renamings" in origins[("renaming", "LayerNorm.gamma -> LayerNorm.weight")]


def test_mapper_when_the_base_model_prefix_is_model():
    m = TransformersForCausalLM(config("llama"), device="meta")
    regex = [rule for stage, rule, _ in m.hf_to_vllm_mapper.rules() if stage == "regex"]
    assert regex == [
        r"^(?!model\.)((embed_tokens|layers|norm|rotary_emb).*)",
        r"^(model\.)((?!embed_tokens|layers|norm|rotary_emb).+)",
        r"^model\.(.+\.)*(lm_head.+)",
    ]
    mapper = m.hf_to_vllm_mapper
    key = "model.layers.0.mlp.up_proj.weight"
    assert mapper.map_name(key) == key
    assert mapper.map_name("norm.weight") == "model.norm.weight"
    assert mapper.map_name("model.score.weight") == "score.weight"  # model. on a non-child


def test_the_callers_config_is_left_alone():
    cfg = config("llama")
    before = cfg.to_dict()
    TransformersForCausalLM(cfg, device="meta", dtype=torch.bfloat16)
    assert cfg.to_dict() == before
