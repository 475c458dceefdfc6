"""Pooling wrappers' mixins (upstream's ``transformers/pooling.py``): embedding models load the
base model alone; sequence classification adds the classifier of transformers'
``AutoModelForSequenceClassification`` (built on meta to find it) as ``self.classifier``."""

from __future__ import annotations

from typing import Any

import torch

from loadkit.models.registry import ModelSpecError


class EmbeddingMixin:
    """The base model, pooled: nothing to add for loading (upstream adds a pooler, no weights)."""

    default_seq_pooling_type = "CLS"


class SequenceClassificationMixin:
    default_seq_pooling_type = "CLS"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from transformers import AutoModelForSequenceClassification

        # Only transformers' sequence-classification class knows its head: build it on meta.
        with torch.device("meta"):
            seq_cls_model = AutoModelForSequenceClassification.from_config(
                self.config, dtype=self.model_dtype, trust_remote_code=False
            )
        # Some models drop their pooling layer when used for classification: so does the wrapper.
        for module in seq_cls_model.modules():
            if hasattr(module, "pooler") and module.pooler is None:
                self.model.pooler = None
                break
        classifier = next(
            (
                getattr(seq_cls_model, n)
                for n in ("classifier", "score")
                if getattr(seq_cls_model, n, None) is not None
            ),
            None,
        )
        if classifier is None:
            raise ModelSpecError(
                f"{type(seq_cls_model).__name__} has no 'classifier' or 'score' layer: the "
                "sequence-classification wrapper cannot find its head"
            )
        self.classifier = classifier
        self.init_parameters(self.classifier)
