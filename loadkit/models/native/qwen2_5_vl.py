"""vLLM 0.34.0's ``Qwen2_5_VLForConditionalGeneration`` (``qwen2_5_vl.py``), its loading half:
a vision tower and a language model, joined through the model's mapper.

- ``visual`` (``Qwen2_5_VisionTransformer``): ``patch_embed.proj`` (a 3-d convolution, no
  bias), ``blocks.N`` each with ``norm1``/``norm2`` (RMSNorms), ``attn.qkv`` (q/k/v packed, a
  bias) and ``attn.proj``, ``mlp.gate_up_proj`` (gate and up packed, biased) and
  ``mlp.down_proj``; ``merger`` with ``ln_q`` and ``mlp.0``/``mlp.2`` (column- then row-parallel,
  biased). It loads through its own ``AutoWeightsLoader`` with its mapper: a checkpoint's
  separate ``attn.q``/``k``/``v`` and ``mlp.gate_proj``/``up_proj`` are stacked.
- ``language_model``: vLLM builds the registry's ``Qwen2ForCausalLM`` for it
  (``loadkit.models.native.qwen2``), from the text config.

The root loads with ``AutoWeightsLoader`` and the model's mapper, prefixes only:
``model.language_model.`` -> ``language_model.model.``, ``model.visual.`` -> ``visual.`` (the
names transformers 4.52 and later save), ``lm_head.`` -> ``language_model.lm_head.``,
``model.`` -> ``language_model.model.`` (the original names).

>>> import torch
>>> from transformers import Qwen2_5_VLConfig
>>> config = Qwen2_5_VLConfig(
...     text_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
...                      num_attention_heads=2, num_key_value_heads=1, vocab_size=64),
...     vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2,
...                        out_hidden_size=16, patch_size=2, temporal_patch_size=2))
>>> with torch.device("meta"):
...     model = Qwen2_5_VLForConditionalGeneration(config)
>>> tuple(model.visual.patch_embed.proj.weight.shape)
(16, 3, 2, 2, 2)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from loadkit.loading.auto_loader import AutoWeightsLoader
from loadkit.mapper import WeightsMapper
from loadkit.models._common import RMSNorm
from loadkit.models.native.common import dtype_of, setting
from loadkit.models.native.qwen2 import Qwen2ForCausalLM
from loadkit.parallel.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)

if TYPE_CHECKING:
    from transformers import PretrainedConfig

VISION_MAPPER = WeightsMapper(
    orig_to_new_stacked={
        ".attn.q.": (".attn.qkv.", "q"),
        ".attn.k.": (".attn.qkv.", "k"),
        ".attn.v.": (".attn.qkv.", "v"),
        ".mlp.gate_proj.": (".mlp.gate_up_proj.", 0),
        ".mlp.up_proj.": (".mlp.gate_up_proj.", 1),
    }
)
QWEN2_5_VL_MAPPER = WeightsMapper(
    orig_to_new_prefix={
        "model.language_model.": "language_model.model.",
        "model.visual.": "visual.",
        "lm_head.": "language_model.lm_head.",
        "model.": "language_model.model.",
    }
)


class Conv3dLayer(nn.Module):
    """vLLM's ``Conv3dLayer``: its ``weight [out, in, *kernel]`` (loaded whole)."""

    def __init__(self, in_channels: int, out_channels: int, kernel: tuple[int, int, int],
                 *, dtype: torch.dtype | None = None) -> None:  # fmt: skip
        super().__init__()
        shape = (out_channels, in_channels, *kernel)
        self.weight = nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)


class Qwen2_5_VisionPatchEmbed(nn.Module):
    def __init__(self, vision: Any, *, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        patch, temporal = vision.patch_size, vision.temporal_patch_size
        self.proj = Conv3dLayer(
            vision.in_channels, vision.hidden_size, (temporal, patch, patch), dtype=dtype
        )


class Qwen2_5_VisionAttention(nn.Module):
    def __init__(self, vision: Any, *, dtype: torch.dtype | None = None, prefix: str = "") -> None:
        super().__init__()
        dim, heads = vision.hidden_size, vision.num_heads
        self.qkv = QKVParallelLinear(
            dim, dim // heads, heads, heads, bias=True, params_dtype=dtype, prefix=f"{prefix}.qkv"
        )
        self.proj = RowParallelLinear(
            dim, dim, bias=True, params_dtype=dtype, prefix=f"{prefix}.proj"
        )


class Qwen2_5_VisionMLP(nn.Module):
    def __init__(self, vision: Any, *, dtype: torch.dtype | None = None, prefix: str = "") -> None:
        super().__init__()
        dim, hidden = vision.hidden_size, vision.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(
            dim, [hidden] * 2, bias=True, params_dtype=dtype, prefix=f"{prefix}.gate_up_proj"
        )
        self.down_proj = RowParallelLinear(
            hidden, dim, bias=True, params_dtype=dtype, prefix=f"{prefix}.down_proj"
        )


class Qwen2_5_VisionBlock(nn.Module):
    def __init__(self, vision: Any, eps: float, *, dtype: torch.dtype | None = None,
                 prefix: str = "") -> None:  # fmt: skip
        super().__init__()
        self.norm1 = RMSNorm(vision.hidden_size, eps=eps, dtype=dtype)
        self.norm2 = RMSNorm(vision.hidden_size, eps=eps, dtype=dtype)
        self.attn = Qwen2_5_VisionAttention(vision, dtype=dtype, prefix=f"{prefix}.attn")
        self.mlp = Qwen2_5_VisionMLP(vision, dtype=dtype, prefix=f"{prefix}.mlp")


class Qwen2_5_VisionPatchMerger(nn.Module):
    def __init__(self, vision: Any, eps: float, *, dtype: torch.dtype | None = None,
                 prefix: str = "") -> None:  # fmt: skip
        super().__init__()
        context = vision.hidden_size
        hidden = context * vision.spatial_merge_size**2
        self.ln_q = RMSNorm(context, eps=eps, dtype=dtype)
        self.mlp = nn.Sequential(
            ColumnParallelLinear(hidden, hidden, bias=True, params_dtype=dtype,
                                 prefix=f"{prefix}.mlp.0"),
            nn.GELU(),
            RowParallelLinear(hidden, vision.out_hidden_size, bias=True, params_dtype=dtype,
                              prefix=f"{prefix}.mlp.2"),
        )  # fmt: skip


class Qwen2_5_VisionTransformer(nn.Module):
    hf_to_vllm_mapper = VISION_MAPPER

    def __init__(self, vision: Any, eps: float, *, dtype: torch.dtype | None = None,
                 prefix: str = "visual") -> None:  # fmt: skip
        super().__init__()
        self.patch_embed = Qwen2_5_VisionPatchEmbed(vision, dtype=dtype)
        self.blocks = nn.ModuleList(
            Qwen2_5_VisionBlock(vision, eps, dtype=dtype, prefix=f"{prefix}.blocks.{i}")
            for i in range(vision.depth)
        )
        self.merger = Qwen2_5_VisionPatchMerger(vision, eps, dtype=dtype, prefix=f"{prefix}.merger")

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)


class Qwen2_5_VLForConditionalGeneration(nn.Module):
    """vLLM's ``Qwen2_5_VLForConditionalGeneration``: ``visual`` and ``language_model``."""

    hf_to_vllm_mapper = QWEN2_5_VL_MAPPER

    def __init__(self, config: PretrainedConfig, *, prefix: str = "") -> None:
        super().__init__()
        self.config = config
        dtype = dtype_of(config.get_text_config())
        eps = setting(config, "rms_norm_eps", 1e-6)
        self.visual = Qwen2_5_VisionTransformer(config.vision_config, eps, dtype=dtype)
        self.language_model = Qwen2ForCausalLM(config, prefix="language_model")

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)
