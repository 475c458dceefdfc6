"""vLLM 0.34.0's ``Qwen2ForCausalLM`` and ``Qwen3ForCausalLM`` (``qwen2.py``, ``qwen3.py``), their
loading half.

The Llama layout (``loadkit.models.native.llama``) with Qwen's choices, as vLLM makes them:
Qwen2's q/k/v always carry a bias and o does not, its head size is ``hidden_size //
num_attention_heads`` whatever ``head_dim`` says, and ``qk_norm`` (BAGEL) adds ``q_norm`` and
``k_norm``; Qwen3 takes ``head_dim`` from the config, a q/k/v bias only with ``attention_bias``,
and always has ``q_norm`` and ``k_norm``. Both load as Llama does: an ``AutoWeightsLoader`` over
the model and the stacked mapper in ``Qwen2Model.load_weights``.

>>> import torch
>>> from transformers import Qwen3Config
>>> config = Qwen3Config(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
...                      num_attention_heads=2, num_key_value_heads=1, head_dim=4, vocab_size=64)
>>> with torch.device("meta"):
...     model = Qwen3ForCausalLM(config)
>>> tuple(model.model.layers[0].self_attn.qkv_proj.weight.shape)
(16, 16)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from loadkit.models._common import RMSNorm
from loadkit.models.native.common import Attention, RotaryEmbedding, head_dim_of, setting
from loadkit.models.native.llama import LlamaForCausalLM, LlamaMLP, LlamaModel
from loadkit.parallel.linear import QKVParallelLinear, RowParallelLinear


class Qwen2Attention(nn.Module):
    def __init__(
        self,
        config: Any,
        *,
        head_dim: int,
        qkv_bias: bool,
        qk_norm: bool,
        o_bias: bool = False,
        dtype: torch.dtype | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = head_dim
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            head_dim,
            heads,
            kv_heads,
            bias=qkv_bias,
            params_dtype=dtype,
            prefix=f"{prefix}.qkv_proj",
        )
        self.o_proj = RowParallelLinear(
            heads * head_dim,
            config.hidden_size,
            bias=o_bias,
            params_dtype=dtype,
            prefix=f"{prefix}.o_proj",
        )
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps=config.rms_norm_eps, dtype=dtype)
            self.k_norm = RMSNorm(head_dim, eps=config.rms_norm_eps, dtype=dtype)
        self.rotary_emb = RotaryEmbedding()
        qkv = self.qkv_proj
        self.attn = Attention(qkv.num_heads, head_dim, qkv.num_kv_heads, f"{prefix}.attn")


class Qwen2DecoderLayer(nn.Module):
    def __init__(self, config: Any, *, dtype: torch.dtype | None = None, prefix: str = "") -> None:
        super().__init__()
        self.self_attn = Qwen2Attention(
            config, dtype=dtype, prefix=f"{prefix}.self_attn", **self.attention(config)
        )
        self.mlp = LlamaMLP(
            config.hidden_size, config.intermediate_size, dtype=dtype, prefix=f"{prefix}.mlp"
        )
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(
            config.hidden_size, eps=config.rms_norm_eps, dtype=dtype
        )

    @staticmethod
    def attention(config: Any) -> dict[str, Any]:
        """Qwen2's attention: the head size from the hidden size, q/k/v biased, ``qk_norm``."""
        return {
            "head_dim": config.hidden_size // config.num_attention_heads,
            "qkv_bias": True,
            "qk_norm": bool(setting(config, "qk_norm", False)),
        }


class Qwen2Model(LlamaModel):
    layer_type = Qwen2DecoderLayer


class Qwen2ForCausalLM(LlamaForCausalLM):
    """vLLM's ``Qwen2ForCausalLM``, built from the text config."""

    model_type = Qwen2Model


class Qwen3DecoderLayer(Qwen2DecoderLayer):
    @staticmethod
    def attention(config: Any) -> dict[str, Any]:
        """Qwen3's attention: ``head_dim`` from the config, a bias with ``attention_bias``."""
        return {
            "head_dim": head_dim_of(config),
            "qkv_bias": bool(setting(config, "attention_bias", False)),
            "qk_norm": True,
        }


class Qwen3Model(Qwen2Model):
    layer_type = Qwen3DecoderLayer


class Qwen3ForCausalLM(LlamaForCausalLM):
    """vLLM's ``Qwen3ForCausalLM``."""

    model_type = Qwen3Model
