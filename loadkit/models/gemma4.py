"""A Gemma4-like model: the checkpoint layout the pooling probe never matched.

The checkpoint stores the text model under ``model.language_model.*``; the model holds it under
``language_model.model.*``. Names meet only through the model's ``hf_to_vllm_mapper``, which is
why the old pooling probe, checking raw names under ``""`` and ``"model."``, never hit.

As in vLLM, q/k/v and gate/up are packed into ``qkv_proj`` and ``gate_up_proj``: the checkpoint
has separate tensors, a stacked mapper rule names the packed parameter and tags the tensor with
a ``shard_id``, and the packed parameter's ``weight_loader`` reads that ``shard_id``.

Sizes are configurable (``Gemma4Config``); the defaults make the small model whose checkpoint is
committed in ``data/gemma4_like/``. ``full_scale_config()`` approximates the upstream Gemma4-E2B
layout (about 2011 tensors, 9.5 GiB in bf16) for the meta device. The committed checkpoint is
written by ``data/generate.py``, larger ones by ``benchmarks/gemma4_checkpoint.py``.
"""

from __future__ import annotations

import dataclasses
import math
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from loadkit.checkpoint.dtypes import itemsize, safetensors_dtype, torch_name, torch_names
from loadkit.checkpoint.reader import TensorInfo
from loadkit.errors import LoadkitError
from loadkit.loading.auto_loader import AutoWeightsLoader
from loadkit.loading.weight_loaders import set_weight_attrs
from loadkit.mapper import ShardId, WeightsMapper
from loadkit.models._common import DATA_DIR, HeaderShapes, packed_weight_loader, shard_rows
from loadkit.models._common import REPO_ROOT as REPO_ROOT  # the stories strip it from paths
from loadkit.models.dyadic import dyadic_uniform

DATA_DIR_NAME = "gemma4_like"
DATA_CHECKPOINT = DATA_DIR / DATA_DIR_NAME / "model.safetensors"

TEXT_CKPT = "model.language_model."
TEXT_PARAM = "language_model.model."
TOWERS = ("vision_tower", "audio_tower")

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


@dataclass(frozen=True)
class Gemma4Config:
    """Sizes of a Gemma4-like model. Towers (vision, audio) are off unless given layers."""

    num_hidden_layers: int = 4
    hidden_size: int = 32
    intermediate_size: int = 64
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 16
    vocab_size: int = 128
    hidden_size_per_layer_input: int = 8  # per-layer embeddings (PLE); 0 turns them off
    vocab_size_per_layer_input: int = 128
    double_wide_mlp_layers: int = 0  # the last n layers have twice the intermediate size
    vision_layers: int = 0
    vision_hidden_size: int = 0
    vision_intermediate_size: int = 0
    audio_layers: int = 0
    audio_hidden_size: int = 0
    audio_intermediate_size: int = 0
    packing_in_mapper: bool = False  # put the q/k/v, gate/up packing rules in hf_to_vllm_mapper
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type == "int" and (not isinstance(v, int) or v < 0):
                raise LoadkitError(f"Gemma4Config.{f.name} must be a non-negative int, not {v!r}")
        for name in ("num_hidden_layers", "hidden_size", "intermediate_size", "head_dim"):
            if getattr(self, name) == 0:
                raise LoadkitError(f"Gemma4Config.{name} must be positive")
        if self.num_attention_heads == 0 or self.num_key_value_heads == 0:
            raise LoadkitError("Gemma4Config needs at least one attention and one key/value head")
        if self.double_wide_mlp_layers > self.num_hidden_layers:
            raise LoadkitError(
                f"Gemma4Config.double_wide_mlp_layers={self.double_wide_mlp_layers} exceeds "
                f"num_hidden_layers={self.num_hidden_layers}"
            )
        for tower in ("vision", "audio"):
            if getattr(self, f"{tower}_layers") and not (
                getattr(self, f"{tower}_hidden_size")
                and getattr(self, f"{tower}_intermediate_size")
            ):
                raise LoadkitError(
                    f"Gemma4Config: a {tower} tower needs hidden and intermediate sizes"
                )
        if self.dtype not in torch_names():
            raise LoadkitError(f"Gemma4Config.dtype {self.dtype!r} is not one of {torch_names()}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def layer_intermediate_size(self, i: int) -> int:
        wide = i >= self.num_hidden_layers - self.double_wide_mlp_layers
        return self.intermediate_size * (2 if wide else 1)

    def towers(self) -> list[tuple[str, int, int, int]]:
        """(name, layers, hidden, intermediate) of each tower present."""
        out = []
        for name in TOWERS:
            kind = name.split("_")[0]
            n = getattr(self, f"{kind}_layers")
            if n:
                hid = getattr(self, f"{kind}_hidden_size")
                out.append((name, n, hid, getattr(self, f"{kind}_intermediate_size")))
        return out


def full_scale_config(num_hidden_layers: int = 35) -> Gemma4Config:
    """An approximation of the upstream Gemma4-E2B checkpoint, for the meta device.

    The text model follows E2B's published sizes (35 layers, hidden 1536, per-layer embeddings
    of 256 over a 262144 vocabulary, double-wide MLPs in the 20 KV-shared layers). The vision
    and audio towers are generic encoder blocks sized so that the totals come out near the
    upstream report (2011 tensors, 9.543 GiB): counts and bytes are close, names are not.
    """
    return Gemma4Config(
        num_hidden_layers=num_hidden_layers,
        hidden_size=1536,
        intermediate_size=6144,
        num_attention_heads=8,
        num_key_value_heads=1,
        head_dim=256,
        vocab_size=262144,
        hidden_size_per_layer_input=256,
        vocab_size_per_layer_input=262144,
        double_wide_mlp_layers=min(20, num_hidden_layers),
        vision_layers=27,
        vision_hidden_size=1152,
        vision_intermediate_size=4304,
        audio_layers=61,
        audio_hidden_size=384,
        audio_intermediate_size=1536,
    )


# --- the checkpoint side ------------------------------------------------------------------------


def checkpoint_layout(config: Gemma4Config) -> list[tuple[str, tuple[int, ...]]]:
    """Checkpoint names and shapes, in file order (sorted by name, as safetensors files are)."""
    c = config
    h, P, L = c.hidden_size, c.hidden_size_per_layer_input, c.num_hidden_layers
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    out: dict[str, tuple[int, ...]] = {
        f"{TEXT_CKPT}embed_tokens.weight": (c.vocab_size, h),
        f"{TEXT_CKPT}norm.weight": (h,),
    }
    if P:
        out[f"{TEXT_CKPT}embed_tokens_per_layer.weight"] = (c.vocab_size_per_layer_input, L * P)
        out[f"{TEXT_CKPT}per_layer_model_projection.weight"] = (L * P, h)
        out[f"{TEXT_CKPT}per_layer_projection_norm.weight"] = (P,)
    for i in range(L):
        p, inter = f"{TEXT_CKPT}layers.{i}.", c.layer_intermediate_size(i)
        out |= {
            f"{p}self_attn.q_proj.weight": (q, h),
            f"{p}self_attn.k_proj.weight": (kv, h),
            f"{p}self_attn.v_proj.weight": (kv, h),
            f"{p}self_attn.o_proj.weight": (h, q),
            f"{p}self_attn.q_norm.weight": (c.head_dim,),
            f"{p}self_attn.k_norm.weight": (c.head_dim,),
            f"{p}mlp.gate_proj.weight": (inter, h),
            f"{p}mlp.up_proj.weight": (inter, h),
            f"{p}mlp.down_proj.weight": (h, inter),
            f"{p}layer_scalar": (1,),
        }
        for norm in _LAYER_NORMS:
            out[f"{p}{norm}.weight"] = (h,)
        if P:
            out[f"{p}per_layer_input_gate.weight"] = (P, h)
            out[f"{p}per_layer_projection.weight"] = (h, P)
            out[f"{p}post_per_layer_input_norm.weight"] = (h,)
    for tower, n, hid, inter in c.towers():
        out |= _tower_layout(f"model.{tower}.", n, hid, inter)
    return sorted(out.items())


_LAYER_NORMS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)


def _tower_layout(prefix: str, n: int, hid: int, inter: int) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {
        f"{prefix}embed.weight": (hid, hid),
        f"{prefix}post_norm.weight": (hid,),
        f"{prefix}post_norm.bias": (hid,),
    }
    for j in range(n):
        b = f"{prefix}blocks.{j}."
        for name, (o, i) in {
            "attn.query": (hid, hid),
            "attn.key": (hid, hid),
            "attn.value": (hid, hid),
            "attn.out": (hid, hid),
            "mlp.fc1": (inter, hid),
            "mlp.fc2": (hid, inter),
        }.items():
            out[f"{b}{name}.weight"] = (o, i)
            out[f"{b}{name}.bias"] = (o,)
        for norm in ("norm1", "norm2"):
            out[f"{b}{norm}.weight"] = (hid,)
            out[f"{b}{norm}.bias"] = (hid,)
    return out


def make_tensor(seed: int, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The values of checkpoint tensor ``name``: seeded by the name, so a tensor's values do not
    depend on where it sits in a file (or on which other tensors a file holds). Multiples of 1/64
    in [-2, 2]: exact in bfloat16, the same bits on every machine."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return dyadic_uniform(shape, g, half_range=2.0, steps=128, dtype=dtype)


def make_checkpoint(
    config: Gemma4Config, seed: int = 0, *, device: str | torch.device | None = None
) -> dict[str, torch.Tensor]:
    """Checkpoint-side tensors in file order. ``device="meta"`` allocates nothing."""
    if device is None:
        device = torch.empty(0).device  # honours `with torch.device("meta"):`
    meta = torch.device(device).type == "meta"
    out = {}
    for name, shape in checkpoint_layout(config):
        if meta:
            out[name] = torch.empty(shape, dtype=config.torch_dtype, device="meta")
        else:
            out[name] = make_tensor(seed, name, shape, config.torch_dtype).to(device)
    return out


def config_from_checkpoint(tensors: Mapping[str, TensorInfo]) -> Gemma4Config:
    """Infer a ``Gemma4Config`` from a checkpoint header (``open_checkpoint(p).tensors``)."""
    t = HeaderShapes(tensors, "a Gemma4-like checkpoint")
    vocab, hidden = t.shape(f"{TEXT_CKPT}embed_tokens.weight", ndim=2)
    layer_ids = t.indices(re.compile(rf"{re.escape(TEXT_CKPT)}layers\.(\d+)\."))
    if not layer_ids:
        t.fail(f"{TEXT_CKPT}layers.0.self_attn.q_proj.weight", "no decoder layers found")
    if layer_ids != list(range(len(layer_ids))):
        gap = next(i for i, j in enumerate(layer_ids) if i != j)
        t.fail(f"{TEXT_CKPT}layers.{gap}.self_attn.q_proj.weight", f"layers {layer_ids} skip {gap}")
    n_layers = len(layer_ids)
    p0 = f"{TEXT_CKPT}layers.0."
    (head_dim,) = t.shape(f"{p0}self_attn.q_norm.weight", ndim=1)
    heads = t.divide(f"{p0}self_attn.q_proj.weight", head_dim)
    kv_heads = t.divide(f"{p0}self_attn.k_proj.weight", head_dim)
    inter = t.shape(f"{p0}mlp.gate_proj.weight", ndim=2)[0]
    wide = [t.shape(f"{TEXT_CKPT}layers.{i}.mlp.gate_proj.weight", ndim=2)[0] for i in layer_ids]
    double = sum(1 for w in wide if w == 2 * inter)
    if (
        any(w not in (inter, 2 * inter) for w in wide)
        or wide[n_layers - double :] != [2 * inter] * double
    ):
        t.fail(
            f"{TEXT_CKPT}layers.0.mlp.gate_proj.weight",
            f"MLP widths per layer {wide} are neither uniform nor double-wide at the end",
        )
    ple, ple_vocab = 0, vocab
    ple_key = f"{TEXT_CKPT}embed_tokens_per_layer.weight"
    if ple_key in tensors:
        ple_vocab, width = t.shape(ple_key, ndim=2)
        if width % n_layers:
            t.fail(ple_key, f"width {width} is not a multiple of {n_layers} layers")
        ple = width // n_layers
    towers: dict[str, Any] = {}
    for tower in TOWERS:
        kind, prefix = tower.split("_")[0], f"model.{tower}."
        blocks = t.indices(re.compile(rf"{prefix}blocks\.(\d+)\."))
        if blocks:
            towers[f"{kind}_layers"] = max(blocks) + 1
            towers[f"{kind}_hidden_size"] = t.shape(f"{prefix}embed.weight", ndim=2)[0]
            fc1 = f"{prefix}blocks.0.mlp.fc1.weight"
            towers[f"{kind}_intermediate_size"] = t.shape(fc1, ndim=2)[0]
    dtype = torch_name(tensors[f"{TEXT_CKPT}embed_tokens.weight"].dtype)
    try:
        return Gemma4Config(
            num_hidden_layers=n_layers,
            hidden_size=hidden,
            intermediate_size=inter,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            vocab_size=vocab,
            hidden_size_per_layer_input=ple,
            vocab_size_per_layer_input=ple_vocab,
            double_wide_mlp_layers=double,
            dtype=dtype,
            **towers,
        )
    except LoadkitError as exc:
        t.fail(f"{TEXT_CKPT}embed_tokens.weight", str(exc))


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
        for norm in _LAYER_NORMS:
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


def layout_bytes(config: Gemma4Config) -> int:
    """Bytes the checkpoint of ``config`` holds (from the layout: nothing is allocated)."""
    size = itemsize(safetensors_dtype(config.dtype))
    return sum(math.prod(s) * size for _, s in checkpoint_layout(config))


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
