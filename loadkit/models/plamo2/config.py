"""The Plamo2-like model's sizes (``Plamo2Config``) and its four loader behaviours."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from loadkit.errors import (
    LoadkitError,
)

# Plamo2 has two pitfalls besides the bug and its fix (see the module docstring).
Plamo2Behaviour = Literal["old", "new", "moved-verbatim", "loose-match"]
BEHAVIOURS: tuple[Plamo2Behaviour, ...] = get_args(Plamo2Behaviour)

# --- the config ---------------------------------------------------------------------------------


@dataclass
class Plamo2Config:
    """Sizes of the model. The defaults make a tiny model: layer 0 mamba, layer 1 attention.

    >>> Plamo2Config().layer_kinds, Plamo2Config(num_hidden_layers=4).layer_kinds
    (['mamba', 'attention'], ['mamba', 'attention', 'mamba', 'attention'])
    """

    hidden_size: int = 16
    num_hidden_layers: int = 2
    vocab_size: int = 48
    tie_word_embeddings: bool = False
    rms_norm_eps: float = 1e-6
    # attention
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    hidden_size_per_head: int = 4
    # mamba (intermediate size = mamba_num_heads * hidden_size_per_head)
    mamba_num_heads: int = 3
    mamba_d_state: int = 4
    mamba_d_conv: int = 4
    mamba_step: int = 2
    time_step_rank: int = 8  # upstream: max(64, hidden_size // 16); a field here to stay tiny
    # MLP
    intermediate_size: int = 32

    def __post_init__(self) -> None:
        sizes = {
            k: v for k, v in vars(self).items() if isinstance(v, int) and not isinstance(v, bool)
        }
        bad = {k: v for k, v in sizes.items() if v < 1}
        if bad:
            raise LoadkitError(f"Plamo2Config sizes must be positive, got {bad}")
        if self.mamba_step < 2:
            raise LoadkitError(f"Plamo2Config.mamba_step must be > 1, got {self.mamba_step}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise LoadkitError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )

    @property
    def mamba_intermediate_size(self) -> int:
        return self.mamba_num_heads * self.hidden_size_per_head

    def is_mamba(self, i: int) -> bool:
        """Whether layer ``i`` has a mamba mixer (else attention), as upstream decides."""
        if self.num_hidden_layers <= self.mamba_step // 2:
            return i != self.num_hidden_layers - 1  # few layers: only the last one attends
        return i % self.mamba_step != self.mamba_step // 2

    @property
    def layer_kinds(self) -> list[str]:
        return ["mamba" if self.is_mamba(i) else "attention" for i in range(self.num_hidden_layers)]
