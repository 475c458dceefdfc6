"""The Llama-like model's sizes (``LlamaLikeConfig``) and what ``tp`` ranks would run into with
them (``verify_tensor_parallel``, ``TPFinding``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from loadkit.checkpoint import dtypes
from loadkit.errors import LoadkitError
from loadkit.parallel.vocab_parallel_embedding import (
    DEFAULT_VOCAB_PADDING_SIZE,
    pad_vocab_size,
    vocab_shard,
)


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
        out: list[TPFinding] = []
        if tp < 1:
            return [TPFinding("error", "tp", f"tp must be at least 1, not {tp}")]
        H, KV = self.num_attention_heads, self.num_key_value_heads
        if H % tp:
            out.append(
                TPFinding(
                    "error",
                    "attention heads",
                    f"{H} attention heads are not divisible by tp={tp}",
                )
            )
        if KV >= tp and KV % tp:
            out.append(
                TPFinding("error", "kv heads", f"{KV} kv heads are not divisible by tp={tp}")
            )
        elif KV < tp and tp % KV:
            out.append(
                TPFinding(
                    "error",
                    "kv heads",
                    f"tp={tp} is not a multiple of the {KV} kv heads: they cannot be "
                    "replicated evenly",
                )
            )
        elif KV < tp:
            out.append(
                TPFinding(
                    "note",
                    "kv replication",
                    f"{KV} kv heads < tp={tp}: each kv head is replicated on {tp // KV} ranks "
                    f"(rank r holds kv head r // {tp // KV})",
                )
            )
        if self.intermediate_size % tp:
            out.append(
                TPFinding(
                    "error",
                    "intermediate size",
                    f"intermediate size {self.intermediate_size} is not divisible by tp={tp}",
                )
            )
        padded = pad_vocab_size(self.vocab_size)
        if padded % tp:
            out.append(
                TPFinding(
                    "error",
                    "vocabulary",
                    f"padded vocabulary {padded} is not divisible by tp={tp}",
                )
            )
        elif padded != self.vocab_size:
            shards = [vocab_shard(self.vocab_size, r, tp) for r in range(tp)]
            pads = ", ".join(
                f"rank {r} {s.padding_rows}" for r, s in enumerate(shards) if s.padding_rows
            )
            out.append(
                TPFinding(
                    "note",
                    "vocab padding",
                    f"vocabulary {self.vocab_size} padded to {padded} "
                    f"(multiple of {DEFAULT_VOCAB_PADDING_SIZE}), {padded // tp} rows per rank; "
                    f"zero rows: {pads}",
                )
            )
        return out


@dataclass(frozen=True)
class TPFinding:
    """One thing ``tp`` ranks would run into: ``severity`` is ``"error"`` or ``"note"``."""

    severity: str
    subject: str
    message: str
