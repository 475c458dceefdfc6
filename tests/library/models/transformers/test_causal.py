"""The causal-LM wrapper's head: tied to the embedding where the config ties it."""

from __future__ import annotations

import pytest

from loadkit.models.transformers import TransformersForCausalLM

from .test_transformers import config

# transformers quiet for every test here, not only those that save a checkpoint (conftest.py)
pytestmark = pytest.mark.usefixtures("quiet_transformers")


def test_tied_head_is_the_embedding_and_lm_head_is_an_alias():
    from loadkit.loading.tensors import tied_embedding_aliases

    m = TransformersForCausalLM(config("gemma"), device="meta")
    assert m.lm_head.weight is m.model.embed_tokens.weight
    assert tied_embedding_aliases(m) == {"lm_head.weight": "model.embed_tokens.weight"}
    untied = TransformersForCausalLM(config("llama"), device="meta")
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight
    assert tied_embedding_aliases(untied) == {}
