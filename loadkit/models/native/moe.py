"""vLLM 0.34.0's mixture-of-experts decoders with Llama's layout (``mixtral.py``,
``qwen2_moe.py``, ``qwen3_moe.py``), their loading half.

Attention is Qwen2's (``loadkit.models.native.qwen2``: packed ``qkv_proj``); the MLP of an
expert layer is a block holding the router ``gate`` and the fused experts ``experts`` (a
``MoERunner``: ``experts.routed_experts.w13_weight`` and ``w2_weight``, ``loadkit.parallel
.fused_moe``), and for Qwen2-MoE (and a Qwen3-MoE with ``shared_expert_intermediate_size``) a
shared expert and its gate. Every key under ``experts.`` reaches the runner's own
``load_weights``, which finds its expert and shard through the expert mapping: per-expert
tensors (``experts.3.gate_proj.weight``, Mixtral's ``experts.3.w1.weight``) or all experts at
once (``experts.gate_up_proj``, 3-d).

- Mixtral: ``block_sparse_moe`` (gate, experts named ``w1``/``w2``/``w3``); its model's mapper
  also renames ``gate_proj``/``up_proj``/``down_proj`` to them (compressed-tensors exports).
- Qwen2-MoE: ``mlp`` every ``decoder_sparse_step`` layers (not in ``mlp_only_layers``), else a
  dense ``mlp``; a shared expert gated by ``shared_expert_gate``; loads from the root with the
  stacked mapper.
- Qwen3-MoE: as Qwen2-MoE with Qwen3's attention; its model loads with the stacked mapper and
  ignores unexpected ``.bias``, ``_bias`` and scale suffixes.

>>> import torch
>>> from transformers import Qwen3MoeConfig
>>> config = Qwen3MoeConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
...     num_key_value_heads=1, head_dim=8, num_experts=4, num_experts_per_tok=2,
...     moe_intermediate_size=8, vocab_size=64)
>>> with torch.device("meta"):
...     model = Qwen3MoeForCausalLM(config)
>>> tuple(model.model.layers[0].mlp.experts.routed_experts.w13_weight.shape)
(4, 16, 16)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from loadkit.loading.auto_loader import AutoWeightsLoader
from loadkit.mapper import WeightsMapper
from loadkit.models._common import RMSNorm
from loadkit.models.native.common import extract_layer_index, head_dim_of, setting
from loadkit.models.native.llama import DecoderModel, LlamaForCausalLM, LlamaMLP, LlamaModel
from loadkit.models.native.qwen2 import Qwen2Attention
from loadkit.parallel.fused_moe import FusedMoE
from loadkit.parallel.linear import ReplicatedLinear

QKV = {
    ".q_proj": (".qkv_proj", "q"),
    ".k_proj": (".qkv_proj", "k"),
    ".v_proj": (".qkv_proj", "v"),
}
# Mixtral: q/k/v stacked; experts named as Mixtral names them (no-op for a native checkpoint)
MIXTRAL_MAPPER = WeightsMapper(
    orig_to_new_stacked=QKV,
    orig_to_new_substr={".gate_proj.": ".w1.", ".up_proj.": ".w3.", ".down_proj.": ".w2."},
)
# Qwen2-MoE / Qwen3-MoE: dense and shared-expert MLPs stacked too (the experts' gate_up_proj is
# the runner's business)
QWEN_MOE_MAPPER = WeightsMapper(
    orig_to_new_stacked={
        **QKV,
        ".mlp.gate_proj": (".mlp.gate_up_proj", 0),
        ".mlp.up_proj": (".mlp.gate_up_proj", 1),
        ".shared_expert.gate_proj": (".shared_expert.gate_up_proj", 0),
        ".shared_expert.up_proj": (".shared_expert.gate_up_proj", 1),
    }
)


def _gate(config: Any, experts: int, dtype: torch.dtype | None, prefix: str) -> ReplicatedLinear:
    """vLLM's ``GateLinear``: the router, whole on every rank."""
    return ReplicatedLinear(
        config.hidden_size, experts, bias=False, params_dtype=dtype, prefix=f"{prefix}.gate"
    )


class MixtralMoE(nn.Module):
    def __init__(self, config: Any, *, dtype: torch.dtype | None = None, prefix: str = "") -> None:
        super().__init__()
        self.gate = _gate(config, config.num_local_experts, dtype, prefix)
        self.experts = FusedMoE(
            config.num_local_experts,
            config.num_experts_per_tok,
            config.hidden_size,
            config.intermediate_size,
            params_dtype=dtype,
            prefix=f"{prefix}.experts",
            ckpt_names=("w1", "w2", "w3"),
        )


class QwenMoeSparseMoeBlock(nn.Module):
    """Qwen2-MoE's and Qwen3-MoE's expert block: ``gate``, the shared expert and its gate (when
    ``shared_expert_intermediate_size``; Qwen2-MoE always has the gate), ``experts``."""

    always_shared_gate = False  # Qwen2-MoE builds shared_expert_gate even without one
    runner_holds_gate = True  # Qwen3-MoE hands its gate to the runner, Qwen2-MoE does not

    def __init__(self, config: Any, *, dtype: torch.dtype | None = None, prefix: str = "") -> None:
        super().__init__()
        from loadkit.errors import TensorParallelError
        from loadkit.parallel.state import get_tp_group

        tp = get_tp_group().world_size
        if tp > config.num_experts:  # vLLM's own check, in these words
            raise TensorParallelError(
                f"Tensor parallel size {tp} is greater than the number of experts "
                f"{config.num_experts}."
            )
        self.gate = _gate(config, config.num_experts, dtype, prefix)
        shared = setting(config, "shared_expert_intermediate_size", 0) or 0
        if shared > 0 or self.always_shared_gate:
            self.shared_expert_gate = ReplicatedLinear(
                config.hidden_size, 1, bias=False, params_dtype=dtype,
                prefix=f"{prefix}.shared_expert_gate",
            )  # fmt: skip
        self.shared_expert = (
            LlamaMLP(config.hidden_size, shared, dtype=dtype, prefix=f"{prefix}.shared_expert")
            if shared > 0
            else None
        )
        self.experts = FusedMoE(
            config.num_experts,
            config.num_experts_per_tok,
            config.hidden_size,
            config.moe_intermediate_size,
            params_dtype=dtype,
            prefix=f"{prefix}.experts",
            gate=self.gate if self.runner_holds_gate else None,
            shared_experts=self.shared_expert,
        )


class Qwen2MoeSparseMoeBlock(QwenMoeSparseMoeBlock):
    always_shared_gate = True
    runner_holds_gate = False


class MoeDecoderLayer(nn.Module):
    """One layer: Qwen2's attention (with the family's choices) and an expert block or, in a
    dense layer, a plain ``mlp``."""

    attention: dict[str, Any] = {}  # noqa: RUF012 (set per family)
    block: type[nn.Module] = QwenMoeSparseMoeBlock
    mlp_name = "mlp"

    def __init__(self, config: Any, *, dtype: torch.dtype | None = None, prefix: str = "") -> None:
        super().__init__()
        self.self_attn = Qwen2Attention(
            config, dtype=dtype, prefix=f"{prefix}.self_attn", **self.attention_of(config)
        )
        mlp_prefix = f"{prefix}.{self.mlp_name}"
        if self.is_moe_layer(config, extract_layer_index(prefix)):
            mlp: nn.Module = self.block(config, dtype=dtype, prefix=mlp_prefix)
        else:
            mlp = LlamaMLP(
                config.hidden_size, config.intermediate_size, dtype=dtype, prefix=mlp_prefix
            )
        self.add_module(self.mlp_name, mlp)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(
            config.hidden_size, eps=config.rms_norm_eps, dtype=dtype
        )

    @staticmethod
    def attention_of(config: Any) -> dict[str, Any]:
        raise NotImplementedError

    @staticmethod
    def is_moe_layer(config: Any, index: int) -> bool:
        """vLLM's rule: not in ``mlp_only_layers``, experts, every ``decoder_sparse_step``."""
        only = setting(config, "mlp_only_layers", None) or []
        step = setting(config, "decoder_sparse_step", 1) or 1
        return index not in only and config.num_experts > 0 and (index + 1) % step == 0


class MixtralDecoderLayer(MoeDecoderLayer):
    block = MixtralMoE
    mlp_name = "block_sparse_moe"

    @staticmethod
    def attention_of(config: Any) -> dict[str, Any]:
        return {"head_dim": head_dim_of(config), "qkv_bias": False, "qk_norm": False}

    @staticmethod
    def is_moe_layer(config: Any, index: int) -> bool:
        return True


class Qwen2MoeDecoderLayer(MoeDecoderLayer):
    block = Qwen2MoeSparseMoeBlock

    @staticmethod
    def attention_of(config: Any) -> dict[str, Any]:
        head_dim = config.hidden_size // config.num_attention_heads
        return {"head_dim": head_dim, "qkv_bias": True, "qk_norm": False}


class Qwen3MoeDecoderLayer(MoeDecoderLayer):
    @staticmethod
    def attention_of(config: Any) -> dict[str, Any]:
        return {
            "head_dim": head_dim_of(config),
            "qkv_bias": bool(setting(config, "attention_bias", False)),
            "qk_norm": True,
        }


class MixtralModel(LlamaModel):
    hf_to_vllm_mapper = MIXTRAL_MAPPER
    layer_type = MixtralDecoderLayer


class MixtralForCausalLM(LlamaForCausalLM):
    """vLLM's ``MixtralForCausalLM``."""

    hf_to_vllm_mapper = MIXTRAL_MAPPER
    model_type = MixtralModel


class Qwen2MoeModel(DecoderModel):
    """vLLM's ``Qwen2MoeModel`` has no ``load_weights``: the root loads it."""

    layer_type = Qwen2MoeDecoderLayer


class Qwen2MoeForCausalLM(LlamaForCausalLM):
    """vLLM's ``Qwen2MoeForCausalLM``: the whole model through the root's ``AutoWeightsLoader``
    with the stacked mapper (a GGUF-style 1-d ``shared_expert_gate`` reshaped first)."""

    hf_to_vllm_mapper = QWEN_MOE_MAPPER
    model_type = Qwen2MoeModel

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loader = AutoWeightsLoader(self)
        return loader.load_weights(_maybe_reshape(weights), mapper=self.hf_to_vllm_mapper)


def _maybe_reshape(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    for name, weight in weights:
        if "mlp.shared_expert_gate" in name and weight.dim() == 1:
            weight = weight[None, :]
        yield name, weight


IGNORED_QWEN3_MOE_SUFFIXES = [
    ".bias", "_bias", ".weight_scale", "_weight_scale", ".input_scale", "_input_scale",
]  # fmt: skip


class Qwen3MoeModel(LlamaModel):
    hf_to_vllm_mapper = QWEN_MOE_MAPPER
    layer_type = Qwen3MoeDecoderLayer

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loader = AutoWeightsLoader(
            self, ignore_unexpected_suffixes=list(IGNORED_QWEN3_MOE_SUFFIXES)
        )
        return loader.load_weights(weights, mapper=self.hf_to_vllm_mapper)


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    """vLLM's ``Qwen3MoeForCausalLM``."""

    hf_to_vllm_mapper = QWEN_MOE_MAPPER
    model_type = Qwen3MoeModel
