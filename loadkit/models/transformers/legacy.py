"""``LegacyMixin``: the drop rules of encoder (embedding, classification) models (upstream's
``transformers/legacy.py``).

Heads that a pooling model does not use are dropped, and so is every name containing
``position_ids`` (older encoder checkpoints saved that buffer; it is computed, never loaded) or
``score.bias`` (a classifier bias upstream does not use). Since vLLM 0.29.0 these are rules of
the wrapper's ``hf_to_vllm_mapper`` mapping to ``None`` (before, ``skip_prefixes`` and
``skip_substrs`` of its ``AutoWeightsLoader``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loadkit.mapper import WeightsMapper

DROPPED_PREFIXES = (
    "model.lm_head.",
    "model.predictions.",
    "model.qa_outputs.",
    "model.embeddings_project.",
    "model.discriminator_predictions.",
)
DROPPED_SUBSTRS = ("position_ids", "score.bias")
ORIGIN = "LegacyMixin: a head or buffer a pooling model does not use"


if TYPE_CHECKING:
    # A mixin of Base: type-check it as one (at run time it is a plain class, mixed in first).
    from loadkit.models.transformers.base import Base as _Base
else:
    _Base = object


class LegacyMixin(_Base):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hf_to_vllm_mapper |= WeightsMapper(
            orig_to_new_prefix=dict.fromkeys(DROPPED_PREFIXES),
            orig_to_new_substr=dict.fromkeys(DROPPED_SUBSTRS),
        )
        for p in DROPPED_PREFIXES:
            self.mapper_rule_origins[("prefix", p)] = ORIGIN
        for s in DROPPED_SUBSTRS:
            self.mapper_rule_origins[("substr", s)] = ORIGIN
