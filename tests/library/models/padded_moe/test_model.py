"""The padded mixture-of-experts model: loads fill only the checkpoint's rows, the padding stays
as it was, and the forward pass runs at the padded size (so padding that is not zero shows)."""

from __future__ import annotations

import pytest
import torch

from loadkit.errors import ShapeMismatchError
from loadkit.models.padded_moe import (
    PaddedMoeConfig,
    PaddedMoeForCausalLM,
    make_checkpoint,
    round_up,
)

PROMPT = torch.tensor([3, 14, 15, 9, 26, 5, 35, 8])


def test_the_experts_are_created_padded_and_say_what_a_checkpoint_fills():
    c = PaddedMoeConfig()
    experts = PaddedMoeForCausalLM(c).model.layers[0].experts
    assert (c.intermediate_size, c.intermediate_padded) == (12, 16)
    assert experts.w13_weight.shape == (4, 32, 16) and experts.w2_weight.shape == (4, 16, 16)
    assert experts.w13_weight.weight_loader_numel == 4 * 2 * 12 * 16
    assert experts.w2_weight.weight_loader_numel == 4 * 16 * 12
    assert experts.padding_fill_params() == ["w13_weight", "w2_weight"]
    unpadded = PaddedMoeForCausalLM(PaddedMoeConfig(pad_multiple=4)).model.layers[0].experts
    assert unpadded.padding_fill_params() == []
    assert round_up(2880, 128) == 2944  # gpt-oss's experts, rounded as FlashInfer's TRT-LLM asks


def test_a_load_writes_each_projection_into_its_rows_and_never_the_padding():
    c = PaddedMoeConfig()
    model = PaddedMoeForCausalLM(c)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(9.0)  # anything the load does not write keeps 9
    ckpt = make_checkpoint(c, seed=0)
    loaded = model.load_weights(ckpt.items())
    assert len(loaded) == 11  # 31 checkpoint tensors: the 24 expert tensors fill 4 parameters
    experts = model.model.layers[1].experts
    for e in range(c.num_experts):
        key = f"model.layers.1.mlp.experts.{e}"
        assert torch.equal(experts.w13_weight[e, :12], ckpt[f"{key}.gate_proj.weight"])
        assert torch.equal(experts.w13_weight[e, 16:28], ckpt[f"{key}.up_proj.weight"])
        assert torch.equal(experts.w2_weight[e, :, :12], ckpt[f"{key}.down_proj.weight"])
    padding = [
        experts.w13_weight[:, 12:16],
        experts.w13_weight[:, 28:],
        experts.w2_weight[..., 12:],
    ]
    assert all(bool((p == 9.0).all()) for p in padding)


def test_padding_that_is_not_zero_changes_every_logit_and_zero_padding_none():
    model = PaddedMoeForCausalLM()
    model.load_weights(make_checkpoint(seed=0).items())
    clean = model(PROMPT)
    assert clean.shape == (8, 64) and torch.isfinite(clean).all()
    experts = [layer.experts for layer in model.model.layers]
    with torch.no_grad():
        for ex in experts:  # one side of the padding alone cancels out: silu(0) * 0 = 0
            ex.w2_weight[..., 12:] = 0.5
    assert torch.equal(model(PROMPT), clean)
    with torch.no_grad():
        for ex in experts:
            ex.w13_weight[:, 12:16] = 0.5
            ex.w13_weight[:, 28:] = 0.5
    assert bool((model(PROMPT) != clean).all())


def test_a_projection_larger_than_the_padded_size_names_both_shapes():
    model = PaddedMoeForCausalLM()
    with pytest.raises(ShapeMismatchError, match=r"\[16, 16\].*\[17, 16\]"):
        model.load_weights([("model.layers.0.mlp.experts.0.gate_proj.weight", torch.zeros(17, 16))])
    # As vLLM's loader: one row too many fits the padding, and lands there unchecked.
    model.load_weights([("model.layers.0.mlp.experts.0.gate_proj.weight", torch.ones(13, 16))])
    assert float(model.model.layers[0].experts.w13_weight[0, 12].sum()) == 16
