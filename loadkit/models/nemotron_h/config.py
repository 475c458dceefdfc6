"""The NemotronH-like model's sizes (``NemotronHConfig``) and its layer kinds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from loadkit.errors import LoadkitError

if TYPE_CHECKING:
    pass

LAYER_KINDS = {"M": "mamba", "-": "mlp", "*": "attention"}


@dataclass
class NemotronHConfig:
    """Sizes of the model; the defaults make a tiny hybrid with 4 heads per mamba mixer."""

    vocab_size: int = 64
    hidden_size: int = 16
    hybrid_override_pattern: str = "MM*-M-M"  # M mamba, - MLP, * attention
    mamba_num_heads: int = 4
    mamba_head_dim: int = 4
    n_groups: int = 1
    ssm_state_size: int = 4
    conv_kernel: int = 4
    use_conv_bias: bool = True
    intermediate_size: int = 32
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 8
    layer_norm_epsilon: float = 1e-5
    dtype: str = "float32"

    def __post_init__(self) -> None:
        bad = sorted(set(self.hybrid_override_pattern) - set(LAYER_KINDS))
        if bad:
            raise LoadkitError(f"hybrid_override_pattern has unknown layer kinds {bad}")
        if self.mamba_num_heads % self.n_groups:
            raise LoadkitError("mamba_num_heads must be a multiple of n_groups")

    @property
    def num_hidden_layers(self) -> int:
        return len(self.hybrid_override_pattern)

    @property
    def mamba_intermediate(self) -> int:
        return self.mamba_num_heads * self.mamba_head_dim

    @property
    def conv_dim(self) -> int:
        return self.mamba_intermediate + 2 * self.n_groups * self.ssm_state_size

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)
