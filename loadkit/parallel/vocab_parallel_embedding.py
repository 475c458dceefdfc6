"""``VocabParallelEmbedding`` and ``ParallelLMHead``: the vocabulary split across ranks.

As in vLLM, the vocabulary is first padded to a multiple of 64 (``pad_vocab_size``), then split
into equal contiguous slices. Rank ``r`` holds padded rows ``r*p .. (r+1)*p - 1`` (``p`` =
padded vocab / tp); the checkpoint rows among them are loaded, the rows past the real vocabulary
are zero. The embedding looks up the tokens of its slice and all-reduces; the LM head computes
its slice of the logits, all-gathers them and drops the padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from loadkit.errors import ShapeMismatchError
from loadkit.loading.tensors import VocabEmbedding
from loadkit.parallel.linear import sharded_parameter
from loadkit.parallel.quant import UnquantizedEmbeddingMethod
from loadkit.parallel.state import divide, get_tp_group

DEFAULT_VOCAB_PADDING_SIZE = 64


def pad_vocab_size(vocab_size: int, pad_to: int = DEFAULT_VOCAB_PADDING_SIZE) -> int:
    """The vocabulary size rounded up to a multiple of ``pad_to``.

    >>> pad_vocab_size(100)
    128
    """
    return -(-vocab_size // pad_to) * pad_to


@dataclass(frozen=True)
class VocabShard:
    """One rank's slice: padded rows ``[padded_start, padded_end)``, of which the checkpoint rows
    ``[start, end)`` are real and the rest padding."""

    padded_start: int
    padded_end: int
    start: int
    end: int

    @property
    def real_rows(self) -> int:
        return self.end - self.start

    @property
    def padding_rows(self) -> int:
        return (self.padded_end - self.padded_start) - self.real_rows


def vocab_shard(vocab_size: int, rank: int, tp: int, pad_to: int = DEFAULT_VOCAB_PADDING_SIZE):
    """Rank ``rank``'s ``VocabShard`` of a vocabulary of ``vocab_size`` over ``tp`` ranks.

    >>> vocab_shard(100, 3, 4)
    VocabShard(padded_start=96, padded_end=128, start=96, end=100)
    """
    per_rank = divide(pad_vocab_size(vocab_size, pad_to), tp, "padded vocabulary")
    lo, hi = rank * per_rank, (rank + 1) * per_rank
    return VocabShard(lo, hi, min(lo, vocab_size), min(hi, vocab_size))


class VocabParallelEmbedding(VocabEmbedding):
    """An embedding table whose rows (tokens) are split across ranks (a word embedding:
    ``AutoWeightsLoader`` skips a tied alias of its weight)."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        params_dtype: torch.dtype | None = None,
        padding_size: int = DEFAULT_VOCAB_PADDING_SIZE,
        prefix: str = "",
    ) -> None:
        super().__init__()
        group = get_tp_group()
        self.tp_rank, self.tp_size = group.rank, group.world_size
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.num_embeddings_padded = pad_vocab_size(num_embeddings, padding_size)
        self.shard = vocab_shard(num_embeddings, self.tp_rank, self.tp_size, padding_size)
        self.num_embeddings_per_partition = self.shard.padded_end - self.shard.padded_start
        self.prefix = prefix
        self.quant_method = UnquantizedEmbeddingMethod()
        self.weight = sharded_parameter(
            (self.num_embeddings_per_partition, embedding_dim),
            params_dtype,
            self.tp_size,
            output_dim=0,
            input_dim=1,
            weight_loader=self.weight_loader,
        )

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        dim = int(getattr(param, "output_dim"))  # noqa: B009 (set by sharded_parameter)
        if loaded_weight.shape[dim] != self.num_embeddings or (
            loaded_weight.ndim > 1 and tuple(loaded_weight.shape[1:]) != tuple(param.shape[1:])
        ):
            expected = (self.num_embeddings, *param.shape[1:])
            raise ShapeMismatchError(expected, tuple(loaded_weight.shape))
        # The rank's rows come from its shard, fixed at construction from the group's rank.
        rows = loaded_weight.narrow(dim, self.shard.start, self.shard.real_rows)
        param.data.narrow(dim, 0, self.shard.real_rows).copy_(rows)
        param.data.narrow(dim, self.shard.real_rows, self.shard.padding_rows).fill_(0)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        mine = (input_ids >= self.shard.start) & (input_ids < self.shard.end)
        local = torch.where(mine, input_ids - self.shard.start, 0)
        out = F.embedding(local, self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
        return get_tp_group().all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection, split like the embedding: each rank scores its slice of tokens."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        bias: bool = False,
        *,
        params_dtype: torch.dtype | None = None,
        padding_size: int = DEFAULT_VOCAB_PADDING_SIZE,
        prefix: str = "",
    ) -> None:
        super().__init__(
            num_embeddings,
            embedding_dim,
            params_dtype=params_dtype,
            padding_size=padding_size,
            prefix=prefix,
        )
        if bias:
            self.bias = sharded_parameter(
                (self.num_embeddings_per_partition,),
                params_dtype,
                self.tp_size,
                output_dim=0,
                weight_loader=self.weight_loader,
            )
        else:
            self.register_parameter("bias", None)

    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> ParallelLMHead:
        """Share ``embed_tokens``' weight (vLLM's ``ParallelLMHead.tie_weights``)."""
        self.weight = embed_tokens.weight
        return self

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits: this rank's slice, all-gathered, padding dropped."""
        local = F.linear(hidden, self.weight, self.bias)
        return get_tp_group().all_gather(local, dim=-1)[..., : self.num_embeddings]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits(hidden)
