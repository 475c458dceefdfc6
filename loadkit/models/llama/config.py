"""The Llama-like model's sizes (``LlamaLikeConfig``) and what ``tp`` ranks would run into with
them (``verify_tensor_parallel``, ``TPFinding``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from loadkit.checkpoint import dtypes
from loadkit.errors import LoadkitError
from loadkit.parallel.checks import TPFinding, size_findings


@dataclass(frozen=True)
class LlamaLikeConfig:
    """Sizes of the model. The defaults make the tiny test model: 8 query heads over 2 kv heads,
    a vocabulary of 100 (padded to 128), so ``tp=4`` shows both kv replication and padding."""

    vocab_size: int = 100
    hidden_size: int = 32
    intermediate_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    head_dim: int = 8
    attention_bias: bool = True
    tie_word_embeddings: bool = False
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type == "int" and (not isinstance(v, int) or v <= 0):
                raise LoadkitError(f"LlamaLikeConfig.{f.name} must be a positive int, not {v!r}")
        if self.dtype not in dtypes.torch_names():
            raise LoadkitError(f"LlamaLikeConfig.dtype {self.dtype!r} is not a torch dtype name")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def verify_tensor_parallel(self, tp: int) -> list[TPFinding]:
        """What ``tp`` ranks would make of this model, before building anything.

        ``error`` findings cannot work (upstream refuses them too); ``note`` findings work but
        cost something (replicated kv heads, padded vocabulary rows).
        """
        return size_findings(
            tp,
            heads=self.num_attention_heads,
            kv_heads=self.num_key_value_heads,
            vocab_size=self.vocab_size,
            intermediate_size=self.intermediate_size,
        )
