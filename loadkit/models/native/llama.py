"""vLLM 0.34.0's ``LlamaForCausalLM`` (``vllm/model_executor/models/llama.py``), its loading half.

The module tree and parameter names are vLLM's: ``model.embed_tokens`` (a
``VocabParallelEmbedding``), per layer ``self_attn.qkv_proj`` (q, k and v packed) and
``self_attn.o_proj``, ``mlp.gate_up_proj`` (gate and up packed) and ``mlp.down_proj``, two
RMSNorms; ``model.norm``, and ``lm_head`` (a ``ParallelLMHead``, tied to the embedding when
``tie_word_embeddings``). Loading is upstream's: ``LlamaForCausalLM.load_weights`` is an
``AutoWeightsLoader`` over the whole model, which hands ``model.*`` to ``LlamaModel.load_weights``,
an ``AutoWeightsLoader`` with the stacked mapper (``q_proj`` -> ``qkv_proj`` shard ``q``, ...).
A tied ``lm_head.weight`` in the checkpoint is skipped by the loader (it would overwrite the
embedding), as are the rotary buffers older checkpoints saved.

Phi-3 (``Phi3ForCausalLM``) is this class with q/k/v and gate/up already fused on disk; Mistral
and the Qwen families build on it too (``mistral``, ``qwen2``, ``qwen3``).

>>> import torch
>>> from transformers import LlamaConfig
>>> config = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
...                      num_attention_heads=2, num_key_value_heads=1, vocab_size=64)
>>> with torch.device("meta"):
...     model = LlamaForCausalLM(config)
>>> sorted(n for n, _ in model.named_parameters() if ".0." in n)[:3]
['model.layers.0.input_layernorm.weight', 'model.layers.0.mlp.down_proj.weight', \
'model.layers.0.mlp.gate_up_proj.weight']
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from loadkit.loading.auto_loader import AutoWeightsLoader
from loadkit.mapper import WeightsMapper
from loadkit.models._common import RMSNorm
from loadkit.models.native.common import (
    Attention,
    RotaryEmbedding,
    dtype_of,
    head_dim_of,
    make_layers,
    maybe_prefix,
    setting,
    text_config,
)
from loadkit.parallel.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from loadkit.parallel.state import get_tp_group
from loadkit.parallel.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# LlamaModel.hf_to_vllm_mapper (vLLM 0.34.0): q/k/v and gate/up into their packed parameters.
STACKED = WeightsMapper(
    orig_to_new_stacked={
        ".q_proj": (".qkv_proj", "q"),
        ".k_proj": (".qkv_proj", "k"),
        ".v_proj": (".qkv_proj", "v"),
        ".gate_proj": (".gate_up_proj", 0),
        ".up_proj": (".gate_up_proj", 1),
    }
)


class LlamaMLP(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        *,
        bias: bool = False,
        dtype: torch.dtype | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size,
            [intermediate_size] * 2,
            bias=bias,
            params_dtype=dtype,
            prefix=f"{prefix}.gate_up_proj",
        )
        self.down_proj = RowParallelLinear(
            intermediate_size,
            hidden_size,
            bias=bias,
            params_dtype=dtype,
            prefix=f"{prefix}.down_proj",
        )


class LlamaAttention(nn.Module):
    def __init__(
        self,
        config: Any,
        *,
        bias: bool = False,
        bias_o_proj: bool = False,
        dtype: torch.dtype | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        heads = config.num_attention_heads
        kv_heads = setting(config, "num_key_value_heads") or heads
        self.head_dim = head_dim_of(config)
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            self.head_dim,
            heads,
            kv_heads,
            bias=bias,
            params_dtype=dtype,
            prefix=f"{prefix}.qkv_proj",
        )
        self.o_proj = RowParallelLinear(
            heads * self.head_dim,
            config.hidden_size,
            bias=bias_o_proj,
            params_dtype=dtype,
            prefix=f"{prefix}.o_proj",
        )
        self.rotary_emb = RotaryEmbedding()
        qkv = self.qkv_proj
        self.attn = Attention(qkv.num_heads, self.head_dim, qkv.num_kv_heads, f"{prefix}.attn")


class LlamaDecoderLayer(nn.Module):
    """One layer; ``attention_bias`` (or ``bias``) puts biases on q/k/v and o, ``qkv_bias`` on
    q/k/v only (InternLM3), ``mlp_bias`` on the MLP, as vLLM reads them."""

    def __init__(self, config: Any, *, dtype: torch.dtype | None = None, prefix: str = "") -> None:
        super().__init__()
        bias = bool(setting(config, "attention_bias", False) or setting(config, "bias", False))
        bias_o_proj = bias
        if hasattr(config, "qkv_bias"):
            bias = config.qkv_bias
        self.self_attn = LlamaAttention(
            config, bias=bias, bias_o_proj=bias_o_proj, dtype=dtype, prefix=f"{prefix}.self_attn"
        )
        self.mlp = LlamaMLP(
            config.hidden_size,
            config.intermediate_size,
            bias=bool(setting(config, "mlp_bias", False)),
            dtype=dtype,
            prefix=f"{prefix}.mlp",
        )
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(
            config.hidden_size, eps=config.rms_norm_eps, dtype=dtype
        )


class DecoderModel(nn.Module):
    """The embedding, ``layer_type`` layers and the final norm, from the text config; no
    ``load_weights`` of its own (the root's loader walks it)."""

    layer_type: type[nn.Module] = LlamaDecoderLayer

    def __init__(self, config: PretrainedConfig, *, prefix: str = "model") -> None:
        super().__init__()
        self.config = config = text_config(config)
        dtype = dtype_of(config)
        self.vocab_size = config.vocab_size
        self.embed_tokens = VocabParallelEmbedding(
            config.vocab_size,
            config.hidden_size,
            params_dtype=dtype,
            prefix=f"{prefix}.embed_tokens",
        )
        layer = self.layer_type
        self.layers = make_layers(
            config.num_hidden_layers,
            lambda p: layer(config, dtype=dtype, prefix=p),
            f"{prefix}.layers",
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, dtype=dtype)


class LlamaModel(DecoderModel):
    """vLLM's ``LlamaModel``: its own ``load_weights``, an ``AutoWeightsLoader`` with the stacked
    mapper."""

    hf_to_vllm_mapper = STACKED

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loader = AutoWeightsLoader(self)
        return loader.load_weights(weights, mapper=self.hf_to_vllm_mapper)


class LlamaForCausalLM(nn.Module):
    """vLLM's ``LlamaForCausalLM`` on the current device and tensor-parallel group."""

    hf_to_vllm_mapper = STACKED
    model_type: type[DecoderModel] = LlamaModel
    packed_modules_mapping = {  # noqa: RUF012 (upstream's class attribute)
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    def __init__(self, config: PretrainedConfig, *, prefix: str = "") -> None:
        super().__init__()
        self.config = config = text_config(config)
        self.tp_rank, self.tp_size = get_tp_group().rank, get_tp_group().world_size
        self.model = self.model_type(config, prefix=maybe_prefix(prefix, "model"))
        self.lm_head = ParallelLMHead(
            config.vocab_size,
            config.hidden_size,
            params_dtype=dtype_of(config),
            prefix=maybe_prefix(prefix, "lm_head"),
        )
        if tied(config):
            self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights)


def tied(config: Any) -> bool:
    """``tie_word_embeddings`` as vLLM reads it from the (text) config."""
    return bool(setting(config, "tie_word_embeddings", False))


class Phi3ForCausalLM(LlamaForCausalLM):
    """vLLM's ``Phi3ForCausalLM``: Llama, with ``qkv_proj`` and ``gate_up_proj`` fused on disk
    (each loads through its layer with no shard id: split into the shards)."""

    packed_modules_mapping = {  # noqa: RUF012 (upstream's class attribute)
        "qkv_proj": ["qkv_proj"],
        "gate_up_proj": ["gate_up_proj"],
    }
