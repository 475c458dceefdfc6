"""The pooling wrappers: sequence classification takes transformers' own classifier."""

from __future__ import annotations

import pytest
import torch

from loadkit.models.transformers import TransformersForSequenceClassification

from .test_transformers import config

# transformers quiet for every test here, not only those that save a checkpoint (conftest.py)
pytestmark = pytest.mark.usefixtures("quiet_transformers")


def test_sequence_classification_takes_transformers_classifier():
    m = TransformersForSequenceClassification(config("bert-cls"), device="meta")
    assert isinstance(m.classifier, torch.nn.Linear)
    assert tuple(m.classifier.weight.shape) == (3, 16)
    assert m.model.pooler is not None  # BERT classifies its pooled output
