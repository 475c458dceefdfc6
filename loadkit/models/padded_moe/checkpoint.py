"""The padded mixture-of-experts checkpoint: ``make_checkpoint`` (exactly representable values,
each expert's projections at their unpadded size)."""

from __future__ import annotations

import math

import torch

from loadkit.models.dyadic import dyadic_uniform
from loadkit.models.padded_moe.config import PaddedMoeConfig


def _pow2_near(x: float) -> float:
    return 2.0 ** round(math.log2(x))


def make_checkpoint(
    config: PaddedMoeConfig | None = None, seed: int = 0
) -> dict[str, torch.Tensor]:
    """A checkpoint with Mixtral-style names, its values fixed by ``seed``, in layer order.

    Every value lies on a dyadic grid (``loadkit.models.dyadic``): the same bits on every
    machine. Expert tensors have the checkpoint's (unpadded) intermediate size.

    >>> ckpt = make_checkpoint()
    >>> ckpt["model.layers.0.mlp.experts.0.gate_proj.weight"].shape
    torch.Size([12, 16])
    """
    c = config or PaddedMoeConfig()
    g = torch.Generator().manual_seed(seed)
    h, i = c.hidden_size, c.intermediate_size

    def spread(*shape: int, fan_in: int) -> torch.Tensor:
        return dyadic_uniform(shape, g, half_range=_pow2_near(math.sqrt(3 / fan_in)))

    def around_one(n: int) -> torch.Tensor:
        return 1 + dyadic_uniform((n,), g, half_range=0.125, steps=16)

    out = {"model.embed_tokens.weight": dyadic_uniform((c.vocab_size, h), g, half_range=1)}
    for layer in range(c.num_hidden_layers):
        prefix = f"model.layers.{layer}"
        out[f"{prefix}.input_layernorm.weight"] = around_one(h)
        out[f"{prefix}.mlp.gate.weight"] = spread(c.num_experts, h, fan_in=h)
        for e in range(c.num_experts):
            experts = f"{prefix}.mlp.experts.{e}"
            out[f"{experts}.gate_proj.weight"] = spread(i, h, fan_in=h)
            out[f"{experts}.up_proj.weight"] = spread(i, h, fan_in=h)
            out[f"{experts}.down_proj.weight"] = spread(h, i, fan_in=i)
    out["model.norm.weight"] = around_one(h)
    out["lm_head.weight"] = spread(c.vocab_size, h, fan_in=h)
    return {k: v.to(c.torch_dtype).contiguous() for k, v in out.items()}
