"""``LegacyMixin``: the skip rules of encoder (embedding, classification) models (upstream's
``transformers/legacy.py``).

Heads that a pooling model does not use are skipped, and so is every name containing
``position_ids`` (older encoder checkpoints saved that buffer; it is computed, never loaded) or
``score.bias`` (a classifier bias upstream does not use).
"""

from __future__ import annotations

from typing import Any

SKIP_PREFIXES = (
    "model.lm_head.",
    "model.predictions.",
    "model.qa_outputs.",
    "model.embeddings_project.",
    "model.discriminator_predictions.",
)
SKIP_SUBSTRS = ("position_ids", "score.bias")


class LegacyMixin:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.skip_prefixes.extend(SKIP_PREFIXES)
        self.skip_substrs.extend(SKIP_SUBSTRS)
