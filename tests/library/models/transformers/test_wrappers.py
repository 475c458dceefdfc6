"""Which wrapper serves a config: by the architecture's suffix, or asked for by name."""

from __future__ import annotations

import pytest
from hf_cases import ARCHS

from loadkit.models.transformers import (
    TransformersEmbeddingModel,
    TransformersForCausalLM,
    TransformersForSequenceClassification,
    choose_wrapper,
    from_config,
)
from loadkit_inspect.models.registry import ModelSpecError

# transformers quiet for every test here, not only those that save a checkpoint (conftest.py)
pytestmark = pytest.mark.usefixtures("quiet_transformers")


@pytest.mark.parametrize(
    ("arch", "wrapper"),
    [
        ("bert", TransformersEmbeddingModel),  # BertModel: '...Model' -> pooling, embed
        ("vit", TransformersEmbeddingModel),
        ("bert-cls", TransformersForSequenceClassification),
        ("llama", TransformersForCausalLM),
        ("gpt2", TransformersForCausalLM),  # '...LMHeadModel' wins over '...Model'
        ("t5", TransformersForCausalLM),  # '...ForConditionalGeneration'
    ],
)
def test_wrapper_chosen_by_architecture_suffix(hf_clean, arch, wrapper):
    folder = hf_clean(arch)  # save_pretrained records the architecture in config.json
    m = from_config(folder, device="meta")
    assert type(m) is wrapper
    assert ARCHS[arch].cls in m.wrapper_reason


def test_wrapper_without_architecture_override_and_refusals():
    import transformers

    bare = transformers.BertConfig()
    assert bare.architectures is None
    assert choose_wrapper(bare).wrapper is TransformersForCausalLM  # upstream's default
    assert choose_wrapper(bare, "embed").wrapper is TransformersEmbeddingModel
    with pytest.raises(ModelSpecError, match="unknown wrapper 'pool'"):
        choose_wrapper(bare, "pool")
    moe = transformers.MixtralConfig(architectures=["MixtralForCausalLM"])
    with pytest.raises(ModelSpecError, match="mixture of experts.*TransformersMoE"):
        choose_wrapper(moe)
    assert choose_wrapper(moe, "causal").wrapper is TransformersForCausalLM
    vlm = transformers.LlavaConfig(architectures=["LlavaForConditionalGeneration"])
    with pytest.raises(ModelSpecError, match="multimodal"):
        choose_wrapper(vlm)
