"""The Gemma4-like checkpoint side: the layout, ``make_checkpoint`` (exactly representable
values) and ``config_from_checkpoint`` (the sizes read back from a header)."""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Mapping
from typing import Any

import torch

from loadkit.checkpoint.dtypes import itemsize, safetensors_dtype, torch_name
from loadkit.checkpoint.reader import TensorInfo
from loadkit.errors import LoadkitError
from loadkit.models._common import HeaderShapes
from loadkit.models.dyadic import dyadic_uniform
from loadkit.models.gemma4.config import LAYER_NORMS, TEXT_CKPT, TOWERS, Gemma4Config

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
        for norm in LAYER_NORMS:
            out[f"{p}{norm}.weight"] = (h,)
        if P:
            out[f"{p}per_layer_input_gate.weight"] = (P, h)
            out[f"{p}per_layer_projection.weight"] = (h, P)
            out[f"{p}post_per_layer_input_norm.weight"] = (h,)
    for tower, n, hid, inter in c.towers():
        out |= _tower_layout(f"model.{tower}.", n, hid, inter)
    return sorted(out.items())


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


def layout_bytes(config: Gemma4Config) -> int:
    """Bytes the checkpoint of ``config`` holds (from the layout: nothing is allocated)."""
    size = itemsize(safetensors_dtype(config.dtype))
    return sum(math.prod(s) * size for _, s in checkpoint_layout(config))
