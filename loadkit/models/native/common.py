"""What the native classes share: reading the Hugging Face config as vLLM does, the attention
placeholder, the layer list, and the loading helpers vLLM's hand-written loaders call
(``maybe_remap_kv_scale_name``, ``is_pp_missing_parameter``).

Every native class is built from a transformers ``PretrainedConfig`` (vLLM's
``vllm_config.model_config.hf_config``) on the current device and tensor-parallel group:

>>> import torch
>>> from transformers import LlamaConfig
>>> config = LlamaConfig(hidden_size=16, num_attention_heads=2, num_hidden_layers=1)
>>> dtype_of(config)
torch.float32
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def dtype_of(config: PretrainedConfig) -> torch.dtype:
    """The dtype the checkpoint was saved in (``config.dtype``), float32 when it names none.

    vLLM's ``dtype="auto"`` takes the same, except that it serves a float32 config in the
    platform's preferred half dtype: only the dtype casts the report lists differ.
    """
    # transformers 5 names it ``dtype`` (reading ``torch_dtype`` there warns it is deprecated)
    dtype = getattr(config, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def text_config(config: PretrainedConfig) -> PretrainedConfig:
    """The language model's config (the config itself for a text-only model)."""
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def setting(config: Any, name: str, default: Any = None) -> Any:
    """``getattr(config, name, default)``, as vLLM reads optional settings."""
    return getattr(config, name, default)


def head_dim_of(config: Any) -> int:
    """``config.head_dim``, else ``hidden_size // num_attention_heads`` (vLLM's rule)."""
    return setting(config, "head_dim") or config.hidden_size // config.num_attention_heads


class Attention(nn.Module):
    """Where vLLM's ``Attention`` layer sits (``self_attn.attn``): it holds the kv cache, not a
    weight. vLLM registers default scales on it as buffers (``_k_scale``...); loadkit leaves
    them out, as no Hugging Face checkpoint carries them (docs/fidelity.md)."""

    def __init__(self, num_heads: int, head_dim: int, num_kv_heads: int, prefix: str = "") -> None:
        super().__init__()
        self.num_heads, self.head_size, self.num_kv_heads = num_heads, head_dim, num_kv_heads
        self.layer_name = prefix


class RotaryEmbedding(nn.Module):
    """Where vLLM's rotary embedding sits (``self_attn.rotary_emb``): its cos/sin cache is a
    non-persistent buffer, so nothing of it is loaded (loadkit computes none)."""


def make_layers(
    num_hidden_layers: int, layer_fn: Callable[[str], nn.Module], prefix: str
) -> nn.ModuleList:
    """``num_hidden_layers`` layers, layer ``i`` built by ``layer_fn(f"{prefix}.{i}")`` (vLLM's
    ``make_layers`` on one pipeline stage)."""
    return nn.ModuleList(layer_fn(f"{prefix}.{i}") for i in range(num_hidden_layers))


def maybe_prefix(prefix: str, name: str) -> str:
    """``prefix.name``, or ``name`` without a prefix (vLLM's ``maybe_prefix``)."""
    return f"{prefix}.{name}" if prefix else name


def extract_layer_index(name: str) -> int:
    """The one layer number in a dotted name (vLLM's ``extract_layer_index``).

    >>> extract_layer_index("model.layers.3.self_attn")
    3
    """
    numbers = [int(p) for p in name.split(".") if p.isdigit()]
    if len(numbers) != 1:
        raise ValueError(f"layer_name {name} should only contain one integer")
    return numbers[0]


def is_pp_missing_parameter(name: str, model: nn.Module) -> bool:
    """Whether ``name`` lives on another pipeline stage: never, on loadkit's single stage."""
    return False


_SCALE_PATTERNS = (
    (r"\.self_attn\.([kv])_proj\.([kv])_scale$", r".self_attn.{attn}.\2_scale"),
    (r"\.self_attn\.qkv_proj\.([kv])_scale$", r".self_attn.attn.\1_scale"),
    (r"\.self_attn\.qkqkv_proj\.([kv])_scale$", r".self_attn.attn.\1_scale"),
    (r"\.mixer\.[kv]_proj\.([kv])_scale$", r".mixer.attn.\1_scale"),
    (r"\.self_attn\.q\.scale$", r".self_attn.attn.q_scale"),
    (r"\.self_attn\.([kv])_cache\.scale$", r".self_attn.attn.\1_scale"),
    (r"\.([qkv])_scale$", r".attn.\1_scale"),
    (r"\.([qkv])_zero_point$", r".attn.\1_zero_point"),
)
_SCALE_SUFFIXES = (
    ".k_scale", ".v_scale", ".q_scale", ".k_zero_point", ".v_zero_point", ".q_zero_point",
    ".q.scale", ".k_cache.scale", ".v_cache.scale",
)  # fmt: skip


def maybe_remap_kv_scale_name(name: str, params_dict: dict[str, Any]) -> str | None:
    """The model's name for an FP8 kv-cache scale key (``...self_attn.k_proj.k_scale`` ->
    ``...self_attn.attn.k_scale``), ``name`` itself when it is no such key, or ``None`` when the
    model has no place for it: vLLM's hand-written loaders then skip the key without a word.

    >>> maybe_remap_kv_scale_name("model.layers.0.self_attn.k_proj.k_scale", {})
    >>> maybe_remap_kv_scale_name("model.norm.weight", {})
    'model.norm.weight'
    """
    if name in params_dict:
        return name
    if name.endswith(".kv_scale"):
        remapped = name.replace(".kv_scale", ".attn.k_scale")
        return remapped if remapped in params_dict else None
    attn = "mla_attn.mla_attn" if any("mla_attn" in k for k in params_dict) else "attn"
    if not name.endswith(_SCALE_SUFFIXES):
        return name
    for pattern, target in _SCALE_PATTERNS:
        if re.search(pattern, name):
            remapped = re.sub(pattern, target.replace("{attn}", attn), name)
            return remapped if remapped in params_dict else None
    return name
