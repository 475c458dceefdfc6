"""vLLM 0.34.0's native model classes, their loading half, re-implemented.

vLLM serves an architecture it implements with its own class (``model_impl="auto"``), each with
its own ``load_weights``. These classes build vLLM's module tree and parameter names from a
transformers config (``vllm_config.model_config.hf_config``) on the current device and
tensor-parallel group, with loadkit's parallel layers, and load as vLLM 0.34.0 loads; they have
no forward. ``CLASSES`` maps each vLLM class name to its re-implementation (imported on first
use); which class vLLM would pick for a config is the inspect tool's question
(``loadkit_inspect.models.vllm``).

>>> import torch
>>> from transformers import Qwen2Config
>>> cls = native_class("Qwen2ForCausalLM")
>>> config = Qwen2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
...                      num_attention_heads=2, num_key_value_heads=1, vocab_size=64)
>>> with torch.device("meta"):
...     model = cls(config)
>>> type(model).__name__, tuple(model.lm_head.weight.shape)
('Qwen2ForCausalLM', (64, 16))
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["CLASSES", "native_class"]

# vLLM class name -> "module:attr" of loadkit's re-implementation.
CLASSES: dict[str, str] = {
    "LlamaForCausalLM": "loadkit.models.native.llama:LlamaForCausalLM",
    "Phi3ForCausalLM": "loadkit.models.native.llama:Phi3ForCausalLM",
    "MistralForCausalLM": "loadkit.models.native.mistral:MistralForCausalLM",
    "Qwen2ForCausalLM": "loadkit.models.native.qwen2:Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "loadkit.models.native.qwen2:Qwen3ForCausalLM",
    "GPT2LMHeadModel": "loadkit.models.native.gpt2:GPT2LMHeadModel",
    "Gemma2ForCausalLM": "loadkit.models.native.gemma:Gemma2ForCausalLM",
    "Gemma3ForCausalLM": "loadkit.models.native.gemma:Gemma3ForCausalLM",
    "DeepseekV2ForCausalLM": "loadkit.models.native.deepseek:DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM": "loadkit.models.native.deepseek:DeepseekV3ForCausalLM",
    "GptOssForCausalLM": "loadkit.models.native.gpt_oss:GptOssForCausalLM",
    "Qwen2_5_VLForConditionalGeneration": (
        "loadkit.models.native.qwen2_5_vl:Qwen2_5_VLForConditionalGeneration"
    ),
    "MixtralForCausalLM": "loadkit.models.native.moe:MixtralForCausalLM",
    "Qwen2MoeForCausalLM": "loadkit.models.native.moe:Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM": "loadkit.models.native.moe:Qwen3MoeForCausalLM",
}


def native_class(name: str) -> Any:
    """loadkit's re-implementation of vLLM's class ``name`` (a ``KeyError`` when there is none)."""
    module, _, attr = CLASSES[name].partition(":")
    return getattr(importlib.import_module(module), attr)
