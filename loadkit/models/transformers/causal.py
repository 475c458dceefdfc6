"""``CausalMixin``: the language-model head of a generative transformers model (upstream's
``transformers/causal.py``).

The transformers base model has no head: the wrapper adds ``lm_head`` (upstream a
``ParallelLMHead``; here one ``[vocab, hidden]`` weight, as with a single rank), ties it to the
input embedding when the config says so (then a checkpoint's ``lm_head.weight`` is an alias of
the embedding, which ``AutoWeightsLoader`` skips since vLLM 0.29.0, as it would overwrite the
shared embedding), and loads an ``lm_head.bias`` when the checkpoint has one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from loadkit.loading.tensors import VocabEmbedding
from loadkit.loading.weight_loaders import default_weight_loader, loader_of, set_weight_attrs

if TYPE_CHECKING:
    # A mixin of Base: type-check it as one (at run time it is a plain class, mixed in first).
    from loadkit.models.transformers.base import Base as _Base
else:
    _Base = object


class LMHead(VocabEmbedding):
    """The output projection: ``weight [vocab, hidden]``; a bias only once a checkpoint has one.
    A vocabulary embedding, as upstream's ``ParallelLMHead`` is.

    >>> head = LMHead(64, 16, device="meta")
    >>> tuple(head.weight.shape), head.bias
    ((64, 16), None)
    """

    bias: nn.Parameter | None

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        dtype: torch.dtype | None = None,
        device: str | torch.device | None = None,
    ) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = nn.Parameter(
            torch.empty(num_embeddings, embedding_dim, dtype=dtype, device=device)
        )
        self.register_parameter("bias", None)

    def tie_weights(self, embedding: nn.Embedding) -> LMHead:
        """Share ``embedding.weight`` (upstream ``ParallelLMHead.tie_weights``)."""
        self.weight = cast(nn.Parameter, embedding.weight)  # an nn.Embedding's is a Parameter
        return self

    def _register_bias(self) -> None:
        if self.bias is None:
            w = self.weight
            self.bias = nn.Parameter(
                torch.empty(self.num_embeddings, dtype=w.dtype, device=w.device)
            )
            set_weight_attrs(self.bias, {"weight_loader": default_weight_loader})


class CausalMixin(_Base):
    """Adds ``lm_head`` (tied or not) and the ``lm_head.bias`` pass-through to ``Base``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        tie_word_embeddings = self._get_tie_word_embeddings()
        text = self.text_config
        self.lm_head = LMHead(
            text.vocab_size, text.hidden_size, dtype=self.model_dtype, device=self.device_
        )
        if tie_word_embeddings:
            for module in self.model.get_input_embeddings().modules():
                if isinstance(module, nn.Embedding):
                    self.lm_head = self.lm_head.tie_weights(module)
                    break

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """``Base.load_weights``, except that any ``...lm_head.bias`` goes straight to
        ``lm_head`` (registering its bias first), before the mapper and the skip rules."""
        lm_head_bias: set[str] = set()

        def auto_load_lm_head_bias(
            weights: Iterable[tuple[str, torch.Tensor]],
        ) -> Iterator[tuple[str, torch.Tensor]]:
            for name, weight in weights:
                if name.endswith("lm_head.bias"):
                    self.lm_head._register_bias()
                    bias = self.lm_head.bias
                    assert bias is not None  # just registered
                    loader_of(bias)(bias, weight)
                    lm_head_bias.add(name)  # the checkpoint name, as upstream returns it
                else:
                    yield name, weight

        return super().load_weights(auto_load_lm_head_bias(weights)) | lm_head_bias
