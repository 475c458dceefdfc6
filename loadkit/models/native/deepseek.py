"""vLLM 0.34.0's ``DeepseekV2ForCausalLM`` and ``DeepseekV3ForCausalLM`` (``deepseek_v2.py``),
their loading half: multi-head latent attention and fused experts, loaded by a hand-written
``load_weights``.

Per layer, the MLA attention (vLLM's ``DeepseekV2MLAAttention``): with ``q_lora_rank``,
``fused_qkv_a_proj`` (``q_a_proj`` and ``kv_a_proj_with_mqa`` packed, whole on every rank),
``q_a_layernorm`` and ``q_b_proj``; without, ``q_proj`` and ``kv_a_proj_with_mqa``; then
``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``. A config without the MLA head sizes gets plain
attention (``qkv_proj``). The first ``first_k_dense_replace`` layers have a dense ``mlp``; the
others an expert block: the router ``gate`` (with ``e_score_correction_bias`` when
``topk_method`` is ``noaux_tc``), ``shared_experts``, and the fused experts.

``DeepseekV2Model.load_weights`` is upstream's loop, re-stated: rotary buffers and multi-token
prediction layers skipped; the stacked names (``gate_proj``/``up_proj``, ``q_a_proj``/
``kv_a_proj_with_mqa``) to their packed parameters; expert tensors through
``make_expert_params_mapping`` (per expert only: a checkpoint with every expert in one tensor
is not understood); an extra ``.bias``, an FP8 kv-cache scale the model has no place for and an
indexer's keys (DeepSeek-V3.2's, which this model has none of) passed over without a word; any
other name looked up in the parameters, a ``KeyError`` when it is not there.

>>> import torch
>>> from transformers import DeepseekV3Config
>>> config = DeepseekV3Config(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
...     num_attention_heads=2, vocab_size=64, n_routed_experts=4, num_experts_per_tok=2,
...     moe_intermediate_size=8, n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=8,
...     kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=4, n_group=1,
...     topk_group=1)
>>> with torch.device("meta"):
...     model = DeepseekV3ForCausalLM(config)
>>> tuple(model.model.layers[1].self_attn.fused_qkv_a_proj.weight.shape)
(20, 16)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from loadkit.loading.auto_loader import AutoWeightsLoader
from loadkit.loading.tensors import named_parameters
from loadkit.loading.weight_loaders import default_weight_loader, loader_of
from loadkit.models._common import RMSNorm
from loadkit.models.native.common import (
    RotaryEmbedding,
    dtype_of,
    is_pp_missing_parameter,
    make_layers,
    maybe_prefix,
    maybe_remap_kv_scale_name,
    setting,
)
from loadkit.models.native.llama import LlamaMLP
from loadkit.parallel.fused_moe import ExpertLookup, FusedMoE, make_expert_params_mapping
from loadkit.parallel.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from loadkit.parallel.state import get_tp_group
from loadkit.parallel.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def uses_mha(config: Any) -> bool:
    """vLLM's test: plain attention for ``model_type`` ``deepseek`` or no MLA head sizes."""
    dims = (setting(config, "qk_nope_head_dim", 0), setting(config, "qk_rope_head_dim", 0))
    return config.model_type == "deepseek" or all(d == 0 for d in dims)


class DeepseekV2MLAAttention(nn.Module):
    def __init__(self, config: Any, *, dtype: torch.dtype | None = None, prefix: str = "") -> None:
        super().__init__()
        hidden, heads = config.hidden_size, config.num_attention_heads
        nope, rope, v = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        kv_rank, q_rank = config.kv_lora_rank, setting(config, "q_lora_rank", None)
        if q_rank is not None:
            self.fused_qkv_a_proj = MergedColumnParallelLinear(
                hidden, [q_rank, kv_rank + rope], bias=False, params_dtype=dtype,
                prefix=f"{prefix}.fused_qkv_a_proj", disable_tp=True,
            )  # fmt: skip
            self.q_a_layernorm = RMSNorm(q_rank, eps=config.rms_norm_eps, dtype=dtype)
            self.q_b_proj = ColumnParallelLinear(
                q_rank, heads * (nope + rope), bias=False, params_dtype=dtype,
                prefix=f"{prefix}.q_b_proj",
            )  # fmt: skip
        else:
            self.kv_a_proj_with_mqa = ReplicatedLinear(
                hidden, kv_rank + rope, bias=False, params_dtype=dtype,
                prefix=f"{prefix}.kv_a_proj_with_mqa",
            )  # fmt: skip
            self.q_proj = ColumnParallelLinear(
                hidden, heads * (nope + rope), bias=False, params_dtype=dtype,
                prefix=f"{prefix}.q_proj",
            )  # fmt: skip
        self.kv_a_layernorm = RMSNorm(kv_rank, eps=config.rms_norm_eps, dtype=dtype)
        self.kv_b_proj = ColumnParallelLinear(
            kv_rank, heads * (nope + v), bias=False, params_dtype=dtype,
            prefix=f"{prefix}.kv_b_proj",
        )  # fmt: skip
        self.o_proj = RowParallelLinear(
            heads * v, hidden, bias=False, params_dtype=dtype, prefix=f"{prefix}.o_proj"
        )
        self.rotary_emb = RotaryEmbedding()


class DeepseekAttention(nn.Module):
    """Plain multi-head attention (a config without MLA head sizes)."""

    def __init__(self, config: Any, *, dtype: torch.dtype | None = None, prefix: str = "") -> None:
        super().__init__()
        heads = config.num_attention_heads
        head_dim = config.hidden_size // heads
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, head_dim, heads, config.num_key_value_heads, bias=False,
            params_dtype=dtype, prefix=f"{prefix}.qkv_proj",
        )  # fmt: skip
        self.o_proj = RowParallelLinear(
            heads * head_dim, config.hidden_size, bias=False, params_dtype=dtype,
            prefix=f"{prefix}.o_proj",
        )  # fmt: skip
        self.rotary_emb = RotaryEmbedding()


class DeepseekV2MoE(nn.Module):
    def __init__(self, config: Any, *, dtype: torch.dtype | None = None, prefix: str = "") -> None:
        super().__init__()
        experts = config.n_routed_experts
        self.gate = ReplicatedLinear(
            config.hidden_size, experts, bias=False, params_dtype=dtype, prefix=f"{prefix}.gate"
        )
        if setting(config, "topk_method", None) == "noaux_tc":
            bias = nn.Parameter(torch.zeros(experts, dtype=torch.float32), requires_grad=False)
            self.gate.e_score_correction_bias = bias
        shared = setting(config, "n_shared_experts", None)
        self.shared_experts = (
            LlamaMLP(
                config.hidden_size,
                config.moe_intermediate_size * shared,
                dtype=dtype,
                prefix=f"{prefix}.shared_experts",
            )
            if shared is not None
            else None
        )
        self.experts = FusedMoE(
            experts, config.num_experts_per_tok, config.hidden_size,
            config.moe_intermediate_size, params_dtype=dtype, prefix=f"{prefix}.experts",
            gate=self.gate, shared_experts=self.shared_experts,
        )  # fmt: skip


def is_moe_layer(config: Any, index: int) -> bool:
    """vLLM's rule: experts from ``first_k_dense_replace`` on, every ``moe_layer_freq``."""
    freq = setting(config, "moe_layer_freq", 1) or 1
    return (
        config.n_routed_experts is not None
        and index >= config.first_k_dense_replace
        and index % freq == 0
    )


class DeepseekV2DecoderLayer(nn.Module):
    def __init__(self, config: Any, *, dtype: torch.dtype | None = None, prefix: str = "") -> None:
        super().__init__()
        attention = DeepseekAttention if uses_mha(config) else DeepseekV2MLAAttention
        self.self_attn = attention(config, dtype=dtype, prefix=f"{prefix}.self_attn")
        index = int(prefix.split(".")[-1])
        if is_moe_layer(config, index):
            self.mlp: nn.Module = DeepseekV2MoE(config, dtype=dtype, prefix=f"{prefix}.mlp")
        else:
            self.mlp = LlamaMLP(
                config.hidden_size, config.intermediate_size, dtype=dtype, prefix=f"{prefix}.mlp"
            )
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(
            config.hidden_size, eps=config.rms_norm_eps, dtype=dtype
        )


STACKED: list[tuple[str, str, Any]] = [
    ("gate_up_proj", "gate_proj", 0),
    ("gate_up_proj", "up_proj", 1),
]
MLA_STACKED = [("fused_qkv_a_proj", "q_a_proj", 0), ("fused_qkv_a_proj", "kv_a_proj_with_mqa", 1)]
MHA_STACKED = [
    ("qkv_proj", "q_proj", "q"),
    ("qkv_proj", "k_proj", "k"),
    ("qkv_proj", "v_proj", "v"),
]
INDEXER_STACKED = [("wk_weights_proj", "wk", 0), ("wk_weights_proj", "weights_proj", 1)]


def spec_layer_index(config: Any, name: str) -> int | None:
    """The multi-token prediction layer a key belongs to, or ``None`` (vLLM's
    ``get_spec_layer_idx_from_weight_name``): those layers are not the main model's."""
    base = config.num_hidden_layers
    for i in range(setting(config, "num_nextn_predict_layers", 0) or 0):
        layer = f"layers.{base + i}."
        if name.startswith((f"model.{layer}", layer, f"model.language_model.{layer}")):
            return base + i
    return None


class DeepseekV2Model(nn.Module):
    def __init__(self, config: PretrainedConfig, *, prefix: str = "model") -> None:
        super().__init__()
        self.config = config
        dtype = dtype_of(config)
        self.use_mha = uses_mha(config)
        self.embed_tokens = VocabParallelEmbedding(
            config.vocab_size,
            config.hidden_size,
            params_dtype=dtype,
            prefix=f"{prefix}.embed_tokens",
        )
        self.layers = make_layers(
            config.num_hidden_layers,
            lambda p: DeepseekV2DecoderLayer(config, dtype=dtype, prefix=p),
            f"{prefix}.layers",
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, dtype=dtype)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Upstream's loop: each key to a stacked parameter, an expert slice, or itself."""
        attention = MHA_STACKED if self.use_mha else MLA_STACKED
        stacked = [*STACKED, *INDEXER_STACKED, *attention]
        experts = ExpertLookup(
            make_expert_params_mapping(
                self, "gate_proj", "down_proj", "up_proj", num_experts=self.config.n_routed_experts
            )
        )
        params = dict(named_parameters(self))
        loaded: set[str] = set()
        # vLLM builds an indexer only for DeepSeek-V3.2 (and loadkit none): its keys are dropped.
        for name, weight in weights:
            if "rotary_emb.inv_freq" in name or spec_layer_index(self.config, name) is not None:
                continue
            if ".indexer." in name:
                continue
            done = _load_stacked(name, weight, stacked, params, self)
            if done is None:
                done = _load_expert_or_plain(name, weight, experts, params, self)
            if done:
                loaded.add(done)
        return loaded


def _load_stacked(
    name: str,
    weight: torch.Tensor,
    stacked: list[tuple[str, str, Any]],
    params: dict[str, nn.Parameter],
    model: nn.Module,
) -> str | None:
    """A stacked key loaded into its packed parameter: its name; ``""`` when it is passed
    over; ``None`` when no stacked entry takes it (upstream's ``for ... else``)."""
    for param_name, weight_name, shard_id in stacked:
        if weight_name not in name:
            continue
        if "mlp.experts." in name and name not in params:
            continue  # an expert's gate/up: the expert mapping's, below
        mapped = name.replace(weight_name, param_name)
        if param_name == "fused_qkv_a_proj" and mapped not in params:
            continue
        if mapped.endswith(".bias") and mapped not in params:
            return ""  # an extra bias (GPTQ exports): passed over
        if is_pp_missing_parameter(mapped, model):
            return ""
        param = params[mapped]
        loader_of(param)(param, weight, shard_id)
        return mapped
    return None


def _load_expert_or_plain(
    name: str,
    weight: torch.Tensor,
    experts: ExpertLookup,
    params: dict[str, nn.Parameter],
    model: nn.Module,
) -> str:
    """An expert's slice through the expert mapping (upstream's loop over every entry, skipping
    those whose name the key lacks: ``experts.matching``), else the key into its own parameter
    (a ``KeyError`` when the model has none); ``""`` when upstream passes it over."""
    is_expert = False
    for param_name, weight_name, expert_id, shard_id in experts.matching(name):
        is_expert = True
        mapped = name.replace(weight_name, param_name)
        if is_pp_missing_parameter(mapped, model):
            continue
        param = params[mapped]
        ok = loader_of(param)(
            param, weight, mapped, shard_id=shard_id, expert_id=expert_id, return_success=True
        )
        if ok:
            return mapped
    if is_expert:
        return ""  # an expert weight not held on this rank
    if name.endswith(".bias") and name not in params:
        return ""
    remapped = maybe_remap_kv_scale_name(name, params)
    if remapped is None or is_pp_missing_parameter(remapped, model):
        return ""
    param = params[remapped]
    getattr(param, "weight_loader", default_weight_loader)(param, weight)
    return remapped


class DeepseekV2ForCausalLM(nn.Module):
    """vLLM's ``DeepseekV2ForCausalLM`` (and ``DeepseekV3ForCausalLM``, the same class): the
    model and an untied ``lm_head``, from the root's ``AutoWeightsLoader``."""

    def __init__(self, config: PretrainedConfig, *, prefix: str = "") -> None:
        super().__init__()
        self.config = config
        self.tp_rank, self.tp_size = get_tp_group().rank, get_tp_group().world_size
        self.model = DeepseekV2Model(config, prefix=maybe_prefix(prefix, "model"))
        self.lm_head = ParallelLMHead(
            config.vocab_size, config.hidden_size, params_dtype=dtype_of(config),
            prefix=maybe_prefix(prefix, "lm_head"),
        )  # fmt: skip

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights)

    def passed_over(self, key: str) -> str | None:
        """Why upstream's ``load_weights`` passes ``key`` over by design, or ``None``: the
        multi-token-prediction layers, which vLLM loads only into a speculative-decoding draft
        model (DeepSeek-V3's ``model.layers.61.*``).

        >>> from transformers import DeepseekV3Config
        >>> with torch.device("meta"):
        ...     m = DeepseekV3ForCausalLM(DeepseekV3Config(num_hidden_layers=1, n_routed_experts=2,
        ...         num_nextn_predict_layers=1, hidden_size=64, intermediate_size=64,
        ...         moe_intermediate_size=16, vocab_size=32, num_attention_heads=2,
        ...         q_lora_rank=16, kv_lora_rank=16))
        >>> print(m.passed_over("model.layers.1.enorm.weight"))
        the multi-token-prediction layer 1 (vLLM loads it only into a speculative-decoding draft)
        >>> m.passed_over("model.norm.weight") is None
        True
        """
        layer = spec_layer_index(self.config, key)
        if layer is None:
            return None
        return (
            f"the multi-token-prediction layer {layer} (vLLM loads it only into a "
            "speculative-decoding draft)"
        )


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    """vLLM's ``DeepseekV3ForCausalLM``: ``DeepseekV2ForCausalLM`` itself."""
