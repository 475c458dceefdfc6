"""vLLM 0.34.0's ``Gemma2ForCausalLM`` and ``Gemma3ForCausalLM`` (``gemma2.py``, ``gemma3.py``),
their loading half.

Llama's packed ``qkv_proj`` and ``gate_up_proj`` with Gemma's choices: four norms per layer
(``input_layernorm``, ``post_attention_layernorm``, ``pre_feedforward_layernorm``,
``post_feedforward_layernorm``, each a ``GemmaRMSNorm``: one ``weight``), the head size from
``head_dim``, biases on q/k/v and o with ``attention_bias``; Gemma 3 adds ``q_norm`` and
``k_norm``. The embedding's scale (``normalizer``) is a non-persistent buffer: nothing to load.

- Gemma 2 has **no** ``lm_head``: vLLM computes the logits with the embedding, so a checkpoint's
  ``lm_head.weight`` has no place (unexpected); the whole model loads from the root's
  ``AutoWeightsLoader`` with the stacked mapper.
- Gemma 3 has an ``lm_head`` (tied when the config says so); the root loads with the stacked
  mapper and ``Gemma3Model.load_weights`` maps again (the names are already vLLM's).

>>> import torch
>>> from transformers import Gemma2Config
>>> config = Gemma2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
...     num_attention_heads=2, num_key_value_heads=1, head_dim=8, vocab_size=64)
>>> with torch.device("meta"):
...     model = Gemma2ForCausalLM(config)
>>> hasattr(model, "lm_head"), len(list(model.model.layers[0].children()))
(False, 6)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from loadkit.loading.auto_loader import AutoWeightsLoader
from loadkit.models._common import RMSNorm
from loadkit.models.native.common import dtype_of, setting, text_config
from loadkit.models.native.llama import STACKED, DecoderModel, LlamaForCausalLM, LlamaMLP
from loadkit.models.native.qwen2 import Qwen2Attention

if TYPE_CHECKING:
    from transformers import PretrainedConfig


class Gemma2DecoderLayer(nn.Module):
    qk_norm = False

    def __init__(self, config: Any, *, dtype: torch.dtype | None = None, prefix: str = "") -> None:
        super().__init__()
        bias = bool(setting(config, "attention_bias", False))  # q/k/v and o alike
        self.self_attn = Qwen2Attention(
            config, head_dim=config.head_dim, qkv_bias=bias, qk_norm=self.qk_norm, o_bias=bias,
            dtype=dtype, prefix=f"{prefix}.self_attn",
        )  # fmt: skip
        self.mlp = LlamaMLP(
            config.hidden_size, config.intermediate_size, dtype=dtype, prefix=f"{prefix}.mlp"
        )
        for norm in (
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ):
            self.add_module(norm, RMSNorm(config.hidden_size, eps=config.rms_norm_eps, dtype=dtype))


class Gemma3DecoderLayer(Gemma2DecoderLayer):
    qk_norm = True


class Gemma2Model(DecoderModel):
    layer_type = Gemma2DecoderLayer


class Gemma2ForCausalLM(nn.Module):
    """vLLM's ``Gemma2ForCausalLM``: the model alone (the embedding makes the logits)."""

    hf_to_vllm_mapper = STACKED

    def __init__(self, config: PretrainedConfig, *, prefix: str = "") -> None:
        super().__init__()
        self.config = text_config(config)
        self.model = Gemma2Model(self.config, prefix="model")
        self.params_dtype = dtype_of(self.config)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)


class Gemma3Model(DecoderModel):
    hf_to_vllm_mapper = STACKED
    layer_type = Gemma3DecoderLayer

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)


class Gemma3ForCausalLM(LlamaForCausalLM):
    """vLLM's ``Gemma3ForCausalLM`` (the text model): an ``lm_head``, loaded from the root with
    the stacked mapper."""

    model_type = Gemma3Model

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)
