"""The Llama-like checkpoint side: the layout (Qwen3's names), ``make_checkpoint`` and
``write_checkpoint`` (exactly representable values), ``config_from_checkpoint`` (sizes from a
header)."""

from __future__ import annotations

import math
import os
import re
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NoReturn

import torch

from loadkit.checkpoint import dtypes
from loadkit.checkpoint.reader import TensorInfo
from loadkit.checkpoint.writer import write_safetensors
from loadkit.errors import CheckpointError, LoadkitError
from loadkit.models.llama.config import LlamaLikeConfig

# --- the checkpoint side -------------------------------------------------------------------------


def checkpoint_layout(config: LlamaLikeConfig) -> list[tuple[str, tuple[int, ...]]]:
    """Checkpoint names and shapes, sorted by name (as safetensors files are)."""
    c = config
    h, q, kv = c.hidden_size, c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    out: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (c.vocab_size, h),
        "model.norm.weight": (h,),
    }
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = (c.vocab_size, h)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        out |= {
            f"{p}input_layernorm.weight": (h,),
            f"{p}post_attention_layernorm.weight": (h,),
            f"{p}self_attn.q_proj.weight": (q, h),
            f"{p}self_attn.k_proj.weight": (kv, h),
            f"{p}self_attn.v_proj.weight": (kv, h),
            f"{p}self_attn.o_proj.weight": (h, q),
            f"{p}self_attn.q_norm.weight": (c.head_dim,),
            f"{p}self_attn.k_norm.weight": (c.head_dim,),
            f"{p}mlp.gate_proj.weight": (c.intermediate_size, h),
            f"{p}mlp.up_proj.weight": (c.intermediate_size, h),
            f"{p}mlp.down_proj.weight": (h, c.intermediate_size),
        }
        if c.attention_bias:
            out |= {
                f"{p}self_attn.q_proj.bias": (q,),
                f"{p}self_attn.k_proj.bias": (kv,),
                f"{p}self_attn.v_proj.bias": (kv,),
                f"{p}self_attn.o_proj.bias": (h,),
            }
    return sorted(out.items())


def tensor_values(seed: int, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Seeded, exactly representable values: small integers over a power of two.

    Norm weights sit around 1 (``1 + k/8``), everything else in ``[-4/32, 4/32]``; seeded by
    name, so a tensor does not depend on its place in the file.
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    ints = torch.randint(-4, 5, shape, generator=g, dtype=torch.int32)
    if "norm" in name:
        return (1 + ints.to(torch.float32) / 8).to(dtype)
    return (ints.to(torch.float32) / 32).to(dtype)


def make_checkpoint(config: LlamaLikeConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Checkpoint-side tensors (names as on disk), in file order."""
    return {
        name: tensor_values(seed, name, shape, config.torch_dtype)
        for name, shape in checkpoint_layout(config)
    }


def write_checkpoint(
    path: str | os.PathLike[str],
    config: LlamaLikeConfig,
    *,
    seed: int = 0,
    progress: bool = False,
    drop: Iterable[str] = (),
) -> Path:
    """Write a safetensors file tensor by tensor (memory stays at one tensor).

    ``drop`` leaves keys out (a broken checkpoint for error tests).
    """
    dropped = set(drop)
    layout = {n: s for n, s in checkpoint_layout(config) if n not in dropped}
    dtype = dtypes.safetensors_dtype(config.dtype)
    return write_safetensors(
        path,
        [(name, dtype, shape) for name, shape in layout.items()],
        lambda name: tensor_values(seed, name, layout[name], config.torch_dtype),
        metadata={"loadkit": "llama-like"},
        progress=progress,
    )


def layout_bytes(config: LlamaLikeConfig) -> int:
    itemsize = dtypes.itemsize(dtypes.safetensors_dtype(config.dtype))
    return sum(math.prod(s) * itemsize for _, s in checkpoint_layout(config))


def config_from_checkpoint(tensors: Mapping[str, TensorInfo]) -> LlamaLikeConfig:
    """Infer the config from a header (``open_checkpoint(p).tensors``): the q norm gives the head
    size, q/k rows the head counts, a missing ``lm_head.weight`` tied embeddings."""

    def info(key: str, ndim: int) -> tuple[int, ...]:
        t = tensors.get(key)
        if t is None:
            fail(key, "the key is missing")
        if len(t.shape) != ndim:
            fail(key, f"expected a {ndim}-d tensor, found shape {list(t.shape)}")
        return t.shape

    file = next((t.file for t in tensors.values()), "<empty checkpoint>")

    def fail(key: str, message: str) -> NoReturn:
        t = tensors.get(key)
        raise CheckpointError(t.file if t else file, f"not a Llama-like checkpoint: {message}", key)

    vocab, hidden = info("model.embed_tokens.weight", 2)
    layers = sorted({int(m[1]) for k in tensors if (m := re.match(r"model\.layers\.(\d+)\.", k))})
    if not layers:
        fail("model.layers.0.self_attn.q_proj.weight", "no decoder layers found")
    if layers != list(range(len(layers))):
        gap = next(i for i, j in enumerate(layers) if i != j)
        fail(f"model.layers.{gap}.self_attn.q_proj.weight", f"layers {layers} skip {gap}")
    p = "model.layers.0.self_attn."
    (head_dim,) = info(f"{p}q_norm.weight", 1)
    heads = {}
    for proj in ("q", "k"):
        rows, _ = info(f"{p}{proj}_proj.weight", 2)
        if rows % head_dim:
            fail(f"{p}{proj}_proj.weight", f"{rows} rows are not a multiple of head_dim {head_dim}")
        heads[proj] = rows // head_dim
    inter, _ = info("model.layers.0.mlp.gate_proj.weight", 2)
    dtype = dtypes.torch_name(tensors["model.embed_tokens.weight"].dtype)
    try:
        return LlamaLikeConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=inter,
            num_hidden_layers=len(layers),
            num_attention_heads=heads["q"],
            num_key_value_heads=heads["k"],
            head_dim=head_dim,
            attention_bias=f"{p}q_proj.bias" in tensors,
            tie_word_embeddings="lm_head.weight" not in tensors,
            dtype=dtype,
        )
    except LoadkitError as exc:
        fail("model.embed_tokens.weight", str(exc))
