"""vLLM 0.34.0's ``GptOssForCausalLM`` (``gpt_oss.py``), its loading half, unquantized.

The layers are ``attn`` (not ``self_attn``: the root's mapper renames ``.self_attn.``): q/k/v
packed with biases, ``o_proj`` with a bias, and ``sinks`` (one per head, vLLM's
``load_attention_sink``); ``mlp.router`` (a biased gate) and the fused experts with biases
(``experts.routed_experts.w13_weight``/``w13_bias``/``w2_weight``/``w2_bias``). The embedding is
``model.embedding`` (the mapper renames ``.embed_tokens.weight``); the ``lm_head`` is never tied.

Loading is upstream's: the root's ``AutoWeightsLoader`` with the mapper (``.gate_up_proj`` ->
``.w13_weight``, ``.down_proj_bias`` -> ``.w2_bias``...), then ``GptOssModel.load_weights``
(``_load_weights_other``): the experts' fused tensors ``[experts, hidden, 2 * intermediate]``
narrowed to the rank and transposed into the parameters by a plain ``copy_``; per-expert tensors
(``experts.3.w13_weight``) through ``GptOssRoutedExperts.weight_loader``; q/k/v stacked; any
other name loaded into its parameter, and **a name the model does not have passed over without
a word** (``if name not in params_dict: continue``).

>>> import torch
>>> from transformers import GptOssConfig
>>> config = GptOssConfig(hidden_size=16, intermediate_size=8, num_hidden_layers=1,
...     num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=64,
...     num_local_experts=4, num_experts_per_tok=2)
>>> with torch.device("meta"):
...     model = GptOssForCausalLM(config)
>>> tuple(model.model.layers[0].mlp.experts.routed_experts.w13_bias.shape)
(4, 16)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from loadkit.loading.auto_loader import AutoWeightsLoader
from loadkit.loading.tensors import named_parameters
from loadkit.loading.weight_loaders import default_weight_loader, loader_of, set_weight_attrs
from loadkit.mapper import WeightsMapper
from loadkit.models._common import RMSNorm
from loadkit.models.native.common import (
    Attention,
    RotaryEmbedding,
    dtype_of,
    is_pp_missing_parameter,
    make_layers,
    maybe_prefix,
)
from loadkit.parallel.fused_moe import FusedMoE, RoutedExperts
from loadkit.parallel.linear import QKVParallelLinear, ReplicatedLinear, RowParallelLinear
from loadkit.parallel.state import get_tp_group
from loadkit.parallel.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# GptOssForCausalLM.hf_to_vllm_mapper (vLLM 0.34.0), the unquantized and quark entries.
GPT_OSS_MAPPER = WeightsMapper(
    orig_to_new_substr={".self_attn.": ".attn."},
    orig_to_new_suffix={
        ".embed_tokens.weight": ".embedding.weight",
        ".gate_up_proj_blocks": ".w13_weight",
        ".down_proj_blocks": ".w2_weight",
        ".gate_up_proj_scales": ".w13_weight_scale",
        ".down_proj_scales": ".w2_weight_scale",
        ".gate_up_proj": ".w13_weight",
        ".down_proj": ".w2_weight",
        ".gate_up_proj_bias": ".w13_bias",
        ".down_proj_bias": ".w2_bias",
        ".gate_up_proj.weight": ".w13_weight",
        ".gate_up_proj.weight_scale": ".w13_weight_scale",
        ".gate_up_proj.bias": ".w13_bias",
        ".gate_up_proj.input_scale": ".w13_input_scale",
        ".down_proj.weight": ".w2_weight",
        ".down_proj.weight_scale": ".w2_weight_scale",
        ".down_proj.bias": ".w2_bias",
        ".down_proj.input_scale": ".w2_input_scale",
    },
)
STREAMED_SHARDS = {
    "w13_weight": "gpt_oss_w13", "w2_weight": "gpt_oss_w2", "w13_bias": "gpt_oss_w13",
    "w2_bias": "gpt_oss_w2", "w13_weight_scale": "gpt_oss_w13", "w2_weight_scale": "gpt_oss_w2",
    "w13_weight_packed": "gpt_oss_w13", "w2_weight_packed": "gpt_oss_w2",
}  # fmt: skip
EXPERT_SUFFIXES = (
    "w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale", "w13_input_scale",
    "w2_input_scale", "w13_bias", "w2_bias", "w13_scale", "w2_scale", "w13_qweight",
    "w2_qweight", "w13_qzeros", "w2_qzeros", "w13_weight_shape", "w2_weight_shape",
)  # fmt: skip


def load_attention_sink(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """This rank's heads of a global sink, the padding -inf (vLLM's ``load_attention_sink``)."""
    group = get_tp_group()
    heads = loaded_weight.numel()
    if heads % group.world_size:
        raise ValueError(
            f"Attention sink heads ({heads}) must be divisible by tp_size ({group.world_size})"
        )
    local = heads // group.world_size
    default_weight_loader(param[:local], loaded_weight.narrow(0, group.rank * local, local))
    param.data[local:].fill_(-float("inf"))


class OAIAttention(nn.Module):
    def __init__(self, config: Any, *, dtype: torch.dtype | None = None, prefix: str = "") -> None:
        super().__init__()
        tp = get_tp_group().world_size
        heads, kv, head_dim = (
            config.num_attention_heads, config.num_key_value_heads, config.head_dim
        )  # fmt: skip
        self.rotary_emb = RotaryEmbedding()
        self.sinks = nn.Parameter(
            torch.full((heads // tp,), -float("inf"), dtype=dtype), requires_grad=False
        )
        set_weight_attrs(self.sinks, {"weight_loader": load_attention_sink})
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, head_dim, heads, kv, bias=True, params_dtype=dtype,
            prefix=f"{prefix}.qkv_proj",
        )  # fmt: skip
        self.o_proj = RowParallelLinear(
            heads * head_dim, config.hidden_size, bias=True, params_dtype=dtype,
            prefix=f"{prefix}.o_proj",
        )  # fmt: skip
        qkv = self.qkv_proj
        self.attn = Attention(qkv.num_heads, head_dim, qkv.num_kv_heads, f"{prefix}.attn")


class GptOssRoutedExperts(RoutedExperts):
    """The experts, one expert's tensor at a time for the ``gpt_oss_w13``/``gpt_oss_w2``
    shards (vLLM's ``GptOssRoutedExperts``), the generic loader otherwise."""

    def weight_loader(
        self,
        param: nn.Parameter,
        loaded_weight: torch.Tensor,
        weight_name: str,
        shard_id: str,
        expert_id: int,
        return_success: bool = False,
    ) -> bool | None:
        if shard_id not in ("gpt_oss_w13", "gpt_oss_w2"):
            return super().weight_loader(
                param, loaded_weight, weight_name, shard_id, expert_id, return_success
            )
        expert_id = self.expert_map_manager.map_global_to_local(expert_id)
        expert_data = param.data[expert_id]
        self._record(param, expert_id, shard_id, full=False)
        rank = self.moe_config.tp_rank
        if weight_name.endswith("_bias"):
            if shard_id == "gpt_oss_w13":
                loaded_weight = _narrow_for_rank(loaded_weight, 0, rank, expert_data.shape[0])
            elif rank != 0:
                loaded_weight = torch.zeros_like(loaded_weight)
        elif shard_id == "gpt_oss_w13":
            loaded_weight = _narrow_for_rank(loaded_weight, 1, rank, expert_data.shape[0]).t()
        else:
            loaded_weight = _narrow_for_rank(loaded_weight, 0, rank, expert_data.shape[1]).t()
        _copy_to_expert(expert_data, loaded_weight)
        return True if return_success else None

    def pop_missing_experts(self) -> list[str]:
        """One shard per parameter here (``gpt_oss_w13``, ``gpt_oss_w2``); the generic ones
        otherwise."""
        loaded = self.loaded_experts
        if not any(s.startswith("gpt_oss") for got in loaded.values() for _, s in got):
            return super().pop_missing_experts()
        self.loaded_experts = {}
        shard = {"w13_weight": "gpt_oss_w13", "w13_bias": "gpt_oss_w13"}
        return [
            f"{name}[expert {e}, {shard.get(name, 'gpt_oss_w2')}]"
            for name, got in loaded.items()
            for e in range(self.moe_config.num_local_experts)
            if (e, shard.get(name, "gpt_oss_w2")) not in got
        ]


def _narrow_for_rank(weight: torch.Tensor, dim: int, rank: int, size: int) -> torch.Tensor:
    start = rank * size
    available = weight.shape[dim] - start
    return weight.narrow(dim, start, min(size, max(available, 0)))


def _copy_to_expert(expert_data: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """Into the leading part of ``expert_data`` (vLLM's ``_copy_to_expert``)."""
    if expert_data.numel() == loaded_weight.numel() == 1:
        expert_data.copy_(loaded_weight.reshape(()))
        return
    while loaded_weight.ndim > expert_data.ndim and loaded_weight.shape[-1] == 1:
        loaded_weight = loaded_weight.squeeze(-1)
    expert_data[tuple(slice(0, n) for n in loaded_weight.shape)].copy_(loaded_weight)


class MLPBlock(nn.Module):
    def __init__(self, config: Any, *, dtype: torch.dtype | None = None, prefix: str = "") -> None:
        super().__init__()
        self.router = ReplicatedLinear(
            config.hidden_size, config.num_local_experts, bias=True, params_dtype=dtype,
            prefix=f"{prefix}.router",
        )  # fmt: skip
        self.experts = FusedMoE(
            config.num_local_experts, config.num_experts_per_tok, config.hidden_size,
            config.intermediate_size, params_dtype=dtype, prefix=f"{prefix}.experts",
            activation="swigluoai", has_bias=True, routed_experts_cls=GptOssRoutedExperts,
        )  # fmt: skip


class TransformerBlock(nn.Module):
    def __init__(self, config: Any, *, dtype: torch.dtype | None = None, prefix: str = "") -> None:
        super().__init__()
        self.attn = OAIAttention(config, dtype=dtype, prefix=f"{prefix}.attn")
        self.mlp = MLPBlock(config, dtype=dtype, prefix=f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=1e-5, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=1e-5, dtype=dtype)


class GptOssModel(nn.Module):
    def __init__(self, config: PretrainedConfig, *, prefix: str = "model") -> None:
        super().__init__()
        self.config = config
        dtype = dtype_of(config)
        self.embedding = VocabParallelEmbedding(
            config.vocab_size, config.hidden_size, params_dtype=dtype, prefix=f"{prefix}.embedding"
        )
        self.layers = make_layers(
            config.num_hidden_layers,
            lambda p: TransformerBlock(config, dtype=dtype, prefix=p),
            f"{prefix}.layers",
        )
        self.norm = RMSNorm(config.hidden_size, eps=1e-5, dtype=dtype)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Upstream's ``_load_weights_other`` (the unquantized path)."""
        params = dict(named_parameters(self))
        group = get_tp_group()
        per_rank = -(-self.config.intermediate_size // group.world_size)
        start = group.rank * per_rank
        end = min(start + per_rank, self.config.intermediate_size)
        loaded: set[str] = set()
        for name, weight in remap_moe_expert_weights(weights, params):
            if is_pp_missing_parameter(name, self) or _load_streamed(name, weight, params, loaded):
                continue
            done = _load_fused_expert(name, weight, params, (start, end, group.rank))
            if done is None:
                done = _load_stacked_or_plain(name, weight, params)
            if done:
                loaded.add(done)
        return loaded


def remap_moe_expert_weights(
    weights: Iterable[tuple[str, torch.Tensor]], params: dict[str, Any]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Expert names without ``routed_experts.`` given it where the model has that name (vLLM's
    ``maybe_remap_moe_expert_param_name``)."""
    for name, weight in weights:
        if ".experts." in name and ".experts.routed_experts." not in name:
            if any(f".{s}" in name or name.endswith(s) for s in EXPERT_SUFFIXES):
                renamed = name.replace(".experts.", ".experts.routed_experts.", 1)
                name = renamed if renamed in params else name
        yield name, weight


def _load_streamed(
    name: str, weight: torch.Tensor, params: dict[str, Any], loaded: set[str]
) -> bool:
    """One expert's tensor (``layers.0.mlp.experts.3.w13_weight``): ``True`` when it is one
    (loaded or not), as upstream's ``_try_load_streamed_expert``."""
    if ".mlp.experts." not in name:
        return False
    shard_id = STREAMED_SHARDS.get(name.rsplit(".", 1)[-1])
    if shard_id is None:
        return False
    prefix, rest = name.split(".mlp.experts.", maxsplit=1)
    expert, dot, suffix = rest.partition(".")
    if not dot or not expert.isdigit():
        return False
    fused = next(
        (f"{prefix}.mlp.experts.{b}routed_experts.{suffix}" for b in ("", "base_layer.")
         if f"{prefix}.mlp.experts.{b}routed_experts.{suffix}" in params),
        None,
    )  # fmt: skip
    if fused is None:
        return False
    param = params[fused]
    ok = loader_of(param)(
        param, weight, weight_name=fused, shard_id=shard_id, expert_id=int(expert),
        return_success=True,
    )  # fmt: skip
    if ok:
        loaded.add(fused)
    return True


def _load_fused_expert(
    name: str, weight: torch.Tensor, params: dict[str, Any], span: tuple[int, int, int]
) -> str | None:
    """All experts' tensor, narrowed to this rank and copied in (transposed); ``None`` when the
    name is none of the four."""
    start, end, rank = span
    if ".w13_weight" in name:
        part = weight[:, :, 2 * start : 2 * end].permute(0, 2, 1)
    elif ".w2_weight" in name:
        part = weight[:, start:end, :].permute(0, 2, 1)
    elif ".w13_bias" in name:
        part = weight[:, 2 * start : 2 * end]
    elif ".w2_bias" in name:
        part = weight if rank == 0 else torch.zeros_like(weight)
    else:
        return None
    params[name].data.copy_(part.contiguous())
    return name


STACKED = [
    (".qkv_proj", ".q_proj", "q"),
    (".qkv_proj", ".k_proj", "k"),
    (".qkv_proj", ".v_proj", "v"),
]


def _load_stacked_or_plain(name: str, weight: torch.Tensor, params: dict[str, Any]) -> str:
    for param_name, weight_name, shard_id in STACKED:
        if weight_name not in name:
            continue
        name = name.replace(weight_name, param_name)
        param = params[name]
        loader = loader_of(param)
        if loader is default_weight_loader:
            loader(param, weight)
        else:
            loader(param, weight, shard_id)
        return name
    if name not in params:
        return ""  # upstream passes a name the model does not have over without a word
    param = params[name]
    loader_of(param)(param, weight)
    return name


class GptOssForCausalLM(nn.Module):
    """vLLM's ``GptOssForCausalLM``: the model and an untied ``lm_head``, from the root's
    ``AutoWeightsLoader`` with the mapper."""

    hf_to_vllm_mapper = GPT_OSS_MAPPER

    def __init__(self, config: PretrainedConfig, *, prefix: str = "") -> None:
        super().__init__()
        self.config = config
        self.tp_rank, self.tp_size = get_tp_group().rank, get_tp_group().world_size
        self.model = GptOssModel(config, prefix=maybe_prefix(prefix, "model"))
        self.lm_head = ParallelLMHead(
            config.vocab_size, config.hidden_size, params_dtype=dtype_of(config),
            prefix=maybe_prefix(prefix, "lm_head"),
        )  # fmt: skip

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)
