"""`loadkit.models.transformers`: vLLM's Transformers backend on transformers' own classes,
built by ``from_config``: a real load equals transformers' own ``from_pretrained``.

Its parts apart: ``test_base.py`` (the mapper), ``test_wrappers.py`` (the wrapper choice),
``test_legacy.py``, ``test_causal.py``, ``test_pooling.py``; ``--model hf`` on the command line
is the tool's (``tests/tool/models/test_hf.py``).
"""

from __future__ import annotations

import pytest
import torch
from hf_cases import ARCHS

from loadkit import open_checkpoint
from loadkit.models.transformers import from_config

# transformers quiet for every test here, not only those that save a checkpoint (conftest.py)
pytestmark = pytest.mark.usefixtures("quiet_transformers")


def config(name):
    return ARCHS[name].config()


def hf_model(name, folder):
    import transformers

    return getattr(transformers, ARCHS[name].cls).from_pretrained(folder)


def in_wrapper_names(hf, wrapper, items):
    """transformers' names as the wrapper spells them: the base model under ``model.``."""
    bmp = hf.base_model_prefix
    nested = getattr(hf, bmp, None) is not None  # GPT2LMHeadModel.transformer, not BertModel
    children = {n for n, _ in wrapper.model.named_children()}
    out = {}
    for name, tensor in items:
        if nested and name.startswith(bmp + "."):
            name = "model." + name[len(bmp) + 1 :]
        elif name.split(".", 1)[0] in children:
            name = "model." + name
        out[name] = tensor
    return out


def assert_same_as_transformers(wrapper, hf, *, not_loaded=()):
    ours = wrapper.state_dict()
    theirs = in_wrapper_names(hf, wrapper, hf.state_dict().items())
    assert set(ours) == set(theirs)
    differ = sorted(k for k in theirs if not torch.equal(ours[k], theirs[k]))
    assert differ == sorted(not_loaded)
    # Buffers too, the non-persistent ones (rotary inv_freq, position_ids) included.
    our_buffers = dict(wrapper.named_buffers())
    their_buffers = in_wrapper_names(hf, wrapper, hf.named_buffers())
    assert set(our_buffers) == set(their_buffers)
    for key, buf in their_buffers.items():
        assert torch.equal(our_buffers[key], buf), key


@pytest.mark.parametrize("name", ["llama", "bert", "bert-cls", "phi", "opt", "vit"])
def test_real_load_gives_transformers_state_dict(hf_clean, name):
    folder = hf_clean(name)
    wrapper = from_config(folder, device="cpu")
    loaded = wrapper.load_weights(open_checkpoint(folder).weights())
    assert loaded  # the qualified names the load filled
    assert_same_as_transformers(wrapper, hf_model(name, folder))


def test_real_load_of_a_head_bias(hf_clean):
    """Phi's lm_head has a bias: registered when the checkpoint has one, and loaded."""
    folder = hf_clean("phi")
    wrapper = from_config(folder, device="cpu")
    assert wrapper.lm_head.bias is None
    loaded = wrapper.load_weights(open_checkpoint(folder).weights())
    assert "lm_head.bias" in loaded
    assert torch.equal(wrapper.lm_head.bias, hf_model("phi", folder).lm_head.bias)


def test_real_load_of_gpt2_leaves_the_attention_biases_as_vllm_does(hf_clean):
    """The upstream pitfall, in a real load: c_attn.bias is dropped by the ignore regex."""
    folder = hf_clean("gpt2")  # sharded: several files and an index
    assert len(open_checkpoint(folder).files) > 1
    wrapper = from_config(folder, device="cpu")
    loaded = wrapper.load_weights(open_checkpoint(folder).weights())
    assert not any("c_attn.bias" in n for n in loaded)
    layers = ARCHS["gpt2"].config().n_layer
    assert_same_as_transformers(
        wrapper,
        hf_model("gpt2", folder),
        not_loaded=[f"model.h.{i}.attn.c_attn.bias" for i in range(layers)],
    )


def test_real_load_of_t5_leaves_its_untied_embeddings_as_vllm_0_34_does(hf_clean):
    """vLLM 0.34.0 gives each vocabulary embedding a weight of its own: T5's encoder and decoder
    embed_tokens no longer share `shared`'s, and no checkpoint key fills them."""
    folder = hf_clean("t5")
    wrapper = from_config(folder, device="cpu")
    untied = ["model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"]
    assert all(wrapper.get_parameter(n) is not wrapper.model.shared.weight for n in untied)
    loaded = wrapper.load_weights(open_checkpoint(folder).weights())
    assert "model.shared.weight" in loaded and not set(untied) & loaded
    assert_same_as_transformers(wrapper, hf_model("t5", folder), not_loaded=untied)
