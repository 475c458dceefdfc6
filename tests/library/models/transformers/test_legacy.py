"""``LegacyMixin``: the keys an encoder's old checkpoint holds, dropped by the wrapper's mapper."""

from __future__ import annotations

import pytest
import torch
from hf_cases import read_tensors, write_variant

from loadkit.models.transformers import TransformersEmbeddingModel, TransformersForCausalLM
from loadkit_inspect import inspect_checkpoint

from .test_transformers import config

# transformers quiet for every test here, not only those that save a checkpoint (conftest.py)
pytestmark = pytest.mark.usefixtures("quiet_transformers")


def test_legacy_mixin_drops_for_encoders_only():
    # vLLM 0.34.0: the drops are rules of the wrapper's mapper (0.28.0: skip lists)
    emb = TransformersEmbeddingModel(config("bert"), device="meta")
    causal = TransformersForCausalLM(config("llama"), device="meta")
    assert {"position_ids", "score.bias"} <= {
        k for k, v in emb.hf_to_vllm_mapper.orig_to_new_substr.items() if v is None
    }
    assert emb.hf_to_vllm_mapper.orig_to_new_prefix["model.predictions."] is None
    assert emb.mapper_rule_origins[("substr", "position_ids")].startswith("LegacyMixin")
    assert not causal.hf_to_vllm_mapper.orig_to_new_substr
    assert not causal.hf_to_vllm_mapper.orig_to_new_prefix


def test_legacy_position_ids_in_an_encoder_checkpoint_load_cleanly(hf_clean, tmp_path):
    """The issue's case: an old BERT checkpoint with embeddings.position_ids."""
    clean = hf_clean("bert")
    tensors = read_tensors(clean)
    tensors["embeddings.position_ids"] = torch.arange(32).unsqueeze(0)
    folder = write_variant(clean, tensors, tmp_path / "old-bert")
    # the Transformers backend's rule (vLLM 0.34.0 serves BERT natively: asked for by name)
    report = inspect_checkpoint(folder, model="hf", model_impl="transformers")
    assert report.clean, report.render()
    (key,) = [k for k in report.load.keys if k.name == "embeddings.position_ids"]
    assert (key.status, key.rule) == ("dropped by mapper", "substr 'position_ids'")
    # the same key in a generative model's checkpoint is unexpected: no legacy skip rule there
    hf_report = inspect_checkpoint(folder, model="hf-causal")
    assert "embeddings.position_ids" in {u.name for u in hf_report.load.unexpected}
