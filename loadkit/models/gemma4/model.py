"""The Gemma4-like modules, their mappers (``hf_to_vllm_mapper`` and the q/k/v, gate/up packing)
and what each parameter must hold after a load (``expected_parameters``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import nn

from loadkit.loading.auto_loader import AutoWeightsLoader
from loadkit.loading.weight_loaders import set_weight_attrs
from loadkit.mapper import ShardId, WeightsMapper
from loadkit.models._common import packed_weight_loader, shard_rows
from loadkit.models.gemma4.config import LAYER_NORMS, TEXT_CKPT, TEXT_PARAM, Gemma4Config

# The only rule a text-only Gemma4-like model needs.
GEMMA4_MAPPER = WeightsMapper(orig_to_new_prefix={TEXT_CKPT: TEXT_PARAM})

# Packing q/k/v and gate/up. Substring rules run in dict order and chain, so order
# matters: "qkv_proj" contains "v_proj" and "gate_up_proj" contains "up_proj", hence v_proj and
# up_proj come first. The same fact makes these rules unsafe to apply twice: a second pass turns
# "qkv_proj" into "qkqkv_proj" (one of the two reasons the pooling probe forwards unmapped names).
PACKING_MAPPER = WeightsMapper(
    orig_to_new_stacked={
        "v_proj": ("qkv_proj", "v"),
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "up_proj": ("gate_up_proj", 1),
        "gate_proj": ("gate_up_proj", 0),
    }
)
SHARD_ORDER: dict[str, tuple[ShardId, ...]] = {
    "qkv_proj": ("q", "k", "v"),
    "gate_up_proj": (0, 1),
}


# --- the model side -----------------------------------------------------------------------------


def _param(shape: Sequence[int], dtype: torch.dtype) -> nn.Parameter:
    # Zeros (not empty): anything left unloaded is deterministic. Works under the meta device.
    return nn.Parameter(torch.zeros(tuple(shape), dtype=dtype), requires_grad=False)


class _Weight(nn.Module):
    """A module holding one ``weight`` (and optionally a ``bias``), named as upstream names it."""

    def __init__(self, shape: Sequence[int], dtype: torch.dtype, bias: bool = False) -> None:
        super().__init__()
        self.weight = _param(shape, dtype)
        if bias:
            self.bias = _param(shape[:1], dtype)


class _Packed(_Weight):
    def __init__(self, name: str, sizes: Mapping[ShardId, int], cols: int, dtype: torch.dtype):
        super().__init__((sum(sizes.values()), cols), dtype)
        loader = packed_weight_loader(f"{name}.weight", shard_rows(sizes))
        set_weight_attrs(self.weight, {"weight_loader": loader})


class Gemma4Attention(nn.Module):
    def __init__(self, config: Gemma4Config, prefix: str) -> None:
        super().__init__()
        c, dt = config, config.torch_dtype
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        self.qkv_proj = _Packed(f"{prefix}.qkv_proj", {"q": q, "k": kv, "v": kv}, c.hidden_size, dt)
        self.o_proj = _Weight((c.hidden_size, q), dt)
        self.q_norm = _Weight((c.head_dim,), dt)
        self.k_norm = _Weight((c.head_dim,), dt)


class Gemma4MLP(nn.Module):
    def __init__(self, config: Gemma4Config, inter: int, prefix: str) -> None:
        super().__init__()
        dt, h = config.torch_dtype, config.hidden_size
        self.gate_up_proj = _Packed(f"{prefix}.gate_up_proj", {0: inter, 1: inter}, h, dt)
        self.down_proj = _Weight((h, inter), dt)


class Gemma4DecoderLayer(nn.Module):
    def __init__(self, config: Gemma4Config, index: int, prefix: str) -> None:
        super().__init__()
        c, dt, h, P = (
            config,
            config.torch_dtype,
            config.hidden_size,
            config.hidden_size_per_layer_input,
        )
        self.self_attn = Gemma4Attention(c, f"{prefix}.self_attn")
        self.mlp = Gemma4MLP(c, c.layer_intermediate_size(index), f"{prefix}.mlp")
        for norm in LAYER_NORMS:
            setattr(self, norm, _Weight((h,), dt))
        if P:
            self.per_layer_input_gate = _Weight((P, h), dt)
            self.per_layer_projection = _Weight((h, P), dt)
            self.post_per_layer_input_norm = _Weight((h,), dt)
        self.register_buffer("layer_scalar", torch.zeros(1, dtype=dt))  # persistent: loaded


class Gemma4TextModel(nn.Module):
    def __init__(self, config: Gemma4Config, prefix: str = TEXT_PARAM.rstrip(".")) -> None:
        super().__init__()
        c, dt, h, P = (
            config,
            config.torch_dtype,
            config.hidden_size,
            config.hidden_size_per_layer_input,
        )
        self.embed_tokens = _Weight((c.vocab_size, h), dt)
        if P:
            L = c.num_hidden_layers
            self.embed_tokens_per_layer = _Weight((c.vocab_size_per_layer_input, L * P), dt)
            self.per_layer_model_projection = _Weight((L * P, h), dt)
            self.per_layer_projection_norm = _Weight((P,), dt)
        self.layers = nn.ModuleList(
            Gemma4DecoderLayer(c, i, f"{prefix}.layers.{i}") for i in range(c.num_hidden_layers)
        )
        self.norm = _Weight((h,), dt)


class Gemma4ForCausalLM(nn.Module):
    """The text model under ``model``; embeddings are tied, so there is no ``lm_head``."""

    def __init__(self, config: Gemma4Config) -> None:
        super().__init__()
        self.model = Gemma4TextModel(config)


class EncoderTower(nn.Module):
    """A generic encoder (the full-scale layout's vision and audio towers)."""

    def __init__(self, layers: int, hid: int, inter: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed = _Weight((hid, hid), dtype)
        self.blocks = nn.ModuleList(_EncoderBlock(hid, inter, dtype) for _ in range(layers))
        self.post_norm = _Weight((hid,), dtype, bias=True)


class _EncoderBlock(nn.Module):
    def __init__(self, hid: int, inter: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.norm1 = _Weight((hid,), dtype, bias=True)
        self.attn = nn.Module()
        for name in ("query", "key", "value", "out"):
            self.attn.add_module(name, _Weight((hid, hid), dtype, bias=True))
        self.norm2 = _Weight((hid,), dtype, bias=True)
        self.mlp = nn.Module()
        self.mlp.fc1 = _Weight((inter, hid), dtype, bias=True)
        self.mlp.fc2 = _Weight((hid, inter), dtype, bias=True)


def hf_to_vllm_mapper_for(config: Gemma4Config) -> WeightsMapper:
    """The model's ``hf_to_vllm_mapper``: the prefix rule, plus towers and packing if configured."""
    extra = {f"model.{tower}.": f"{tower}." for tower, *_ in config.towers()}
    mapper = GEMMA4_MAPPER | WeightsMapper(orig_to_new_prefix=extra) if extra else GEMMA4_MAPPER
    return mapper | PACKING_MAPPER if config.packing_in_mapper else mapper


def load_mapper(config: Gemma4Config) -> WeightsMapper:
    """Everything ``load_weights`` maps with: the hf_to_vllm_mapper and the packing rules."""
    return hf_to_vllm_mapper_for(config) | PACKING_MAPPER


class Gemma4ForConditionalGeneration(nn.Module):
    """Parameters ``language_model.model.*``; checkpoint keys ``model.language_model.*``.

    ``hf_to_vllm_mapper`` maps the one to the other (the pooling probe reads it); q/k/v and
    gate/up load into packed parameters.

    >>> from loadkit import open_checkpoint
    >>> from loadkit.models.gemma4.checkpoint import config_from_checkpoint
    >>> ck = open_checkpoint("data/gemma4_like/model.safetensors")
    >>> model = Gemma4ForConditionalGeneration(config_from_checkpoint(ck.tensors))
    >>> len(ck.tensors), len(model.load_weights(ck.weights()))  # 73 keys fill 61 tensors
    (73, 61)
    """

    hf_to_vllm_mapper = GEMMA4_MAPPER

    def __init__(self, config: Gemma4Config | None = None) -> None:
        super().__init__()
        self.config = config = config or Gemma4Config()
        self.language_model = Gemma4ForCausalLM(config)
        for tower, n, hid, inter in config.towers():
            setattr(self, tower, EncoderTower(n, hid, inter, config.torch_dtype))
        mapper = hf_to_vllm_mapper_for(config)
        if mapper != GEMMA4_MAPPER:
            self.hf_to_vllm_mapper = mapper

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        # The packing rules run here, once (with the hf_to_vllm_mapper, unless it holds them).
        return AutoWeightsLoader(self).load_weights(weights, mapper=load_mapper(self.config))


def expected_parameters(
    config: Gemma4Config, checkpoint: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """What each parameter (and buffer) must hold after loading ``checkpoint``: packed shards
    concatenated in order. The reference tests and notebooks compare a load against."""
    mapper = load_mapper(config)
    plain: dict[str, torch.Tensor] = {}
    packed: dict[str, dict[ShardId, torch.Tensor]] = {}
    for name, tensor in checkpoint.items():
        mapped = mapper.map_name_with_shard(name)
        if mapped is None:
            continue
        target, shard = mapped
        if shard is None:
            plain[target] = tensor
        else:
            packed.setdefault(target, {})[shard] = tensor
    for target, parts in packed.items():
        kind = target.rsplit(".", 2)[-2]
        plain[target] = torch.cat([parts[s] for s in SHARD_ORDER[kind]])
    return plain
