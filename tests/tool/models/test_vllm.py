"""Which class vLLM 0.34.0 would serve a config with (``model_impl`` ``auto``, ``vllm``,
``transformers``), each case read off the wheel's ``ModelRegistry.resolve_model_cls`` and
``_try_resolve_transformers`` (vllm/model_executor/models/registry.py); the registry's table
itself is checked entry by entry against the wheel by
tests/upstream/test_vllm_registry_upstream.py."""

from __future__ import annotations

import pytest

from loadkit_inspect.models.vllm import resolve
from loadkit_inspect.models.vllm_registry import MODELS, OUT_OF_TREE, PREVIOUSLY_SUPPORTED


def config_of(architecture: str, config: str = "LlamaConfig", **kw):
    import transformers

    return getattr(transformers, config)(architectures=[architecture], **kw)


@pytest.mark.parametrize(
    ("architecture", "config", "kw", "label", "why"),
    [
        ("LlamaForCausalLM", "LlamaConfig", {}, "native LlamaForCausalLM", "models/llama.py"),
        ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", {}, "native Qwen3MoeForCausalLM", "qwen3_moe"),
        # registered, but for the Transformers backend
        ("GemmaForCausalLM", "GemmaConfig", {}, "TransformersForCausalLM", "Transformers backend"),
        ("OlmoeForCausalLM", "OlmoeConfig", {}, "TransformersMoEForCausalLM", "Transformers"),
        # not registered (vLLM served it until 0.25.0): transformers has it, so the backend
        ("PersimmonForCausalLM", "PersimmonConfig", {}, "TransformersForCausalLM", "falls back"),
        # refused out-of-tree, but transformers has it and the fallback comes first
        ("BartForConditionalGeneration", "BartConfig", {}, "TransformersForCausalLM", "falls"),
        # a pooling suffix: the generative class behind vLLM's pooling adapter
        (
            "LlamaForSequenceClassification",
            "LlamaConfig",
            {},
            "native LlamaForCausalLM as classify (pooling adapter)",
            "LlamaForCausalLM' is",
        ),
        ("ElectraModel", "ElectraConfig", {}, "TransformersEmbeddingModel", "falls back"),
    ],
)
def test_auto_picks_the_class_vllm_picks(architecture, config, kw, label, why):
    choice = resolve(config_of(architecture, config, **kw))
    assert choice.label == f"vllm 0.34.0, {label}"
    assert why in choice.why and choice.refusal is None
    assert choice.architecture == architecture


def test_the_fallback_needs_an_architecture_absent_from_the_registry():
    assert "PersimmonForCausalLM" not in MODELS and "BartForConditionalGeneration" not in MODELS
    assert "PersimmonForCausalLM" in PREVIOUSLY_SUPPORTED
    assert "BartForConditionalGeneration" in OUT_OF_TREE
    # GPT-Neo can neither run vLLM's attention nor set another: no fallback, a refusal
    neo = resolve(config_of("GPTNeoForCausalLM", "GPTNeoConfig"))
    assert neo.refusal == "Model architectures ['GPTNeoForCausalLM'] are not supported for now"


def test_a_refusal_is_vllms_own_sentence():
    arch = "PrithviGeoSpatialMAE"  # vLLM served it until 0.28.0; transformers has no such class
    assert arch in PREVIOUSLY_SUPPORTED
    choice = resolve(config_of(arch))
    assert choice.name is None and choice.label == "vllm 0.34.0"
    assert choice.refusal == (
        "Model architecture PrithviGeoSpatialMAE was supported in vLLM until v0.28.0, and is not "
        "supported anymore"
    )
    unknown = resolve(config_of("NoSuchForCausalLM"))
    assert unknown.refusal == "Model architectures ['NoSuchForCausalLM'] are not supported for now"


def test_a_model_that_cannot_run_vllms_attention_is_not_a_fallback():
    # DeBERTa-v2 can neither run vLLM's attention nor set another (transformers says so)
    choice = resolve(config_of("DebertaV2Model", "DebertaV2Config"))
    assert choice.refusal == "Model architectures ['DebertaV2Model'] are not supported for now"
    forced = resolve(config_of("DebertaV2Model", "DebertaV2Config"), "transformers")
    assert forced.name is None and "Transformers backend can run" in (forced.refusal or "")


def test_model_impl_transformers_and_vllm():
    llama = config_of("LlamaForCausalLM")
    assert resolve(llama, "transformers").label == "vllm 0.34.0, TransformersForCausalLM"
    assert resolve(llama, "vllm").label == "vllm 0.34.0, native LlamaForCausalLM"
    # "vllm" takes the registry's entry as it is, a backend class included; no fallback
    gemma = config_of("GemmaForCausalLM", "GemmaConfig")
    assert resolve(gemma, "vllm").label == "vllm 0.34.0, TransformersForCausalLM"
    persimmon = resolve(config_of("PersimmonForCausalLM", "PersimmonConfig"), "vllm")
    assert persimmon.refusal == (
        "Model architecture PersimmonForCausalLM was supported in vLLM until v0.25.0, and is not "
        "supported anymore"
    )


def test_the_backend_class_follows_the_config():
    import transformers

    vl = transformers.Qwen2_5_VLConfig(architectures=["Qwen2_5_VLForConditionalGeneration"])
    assert resolve(vl, "transformers").name == "TransformersMultiModalForCausalLM"
    moe = config_of("MixtralForCausalLM", "MixtralConfig")
    assert resolve(moe, "transformers").name == "TransformersMoEForCausalLM"
    with pytest.raises(ValueError, match="--model-impl 'native'"):
        resolve(moe, "native")
