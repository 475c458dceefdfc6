"""The NemotronH/Mamba2-like hybrid model: its Mamba2 layer, built on meta, a load that fills every
parameter, and its small forward (finite, causal, NaN through D)."""

import pytest
import torch

from loadkit import ledger_of
from loadkit.errors import LoadkitError
from loadkit.models.nemotron_h import NemotronHConfig, NemotronHForCausalLM, make_checkpoint


def loaded_model(config=None, seed=0, order="d-last"):
    m = NemotronHForCausalLM(config)
    m.load_weights(make_checkpoint(m.config, seed=seed, order=order).items())
    return m


def test_mamba_mixer_layer_holds_exactly_a_d_dt_bias():
    m = NemotronHForCausalLM()
    mixer = m.model.layers[0].mixer
    assert list(mixer._parameters) == ["A", "D", "dt_bias"]
    assert {p.numel() for p in mixer._parameters.values()} == {4}
    assert set(dict(mixer.named_children())) == {"in_proj", "conv1d", "norm", "out_proj"}
    assert mixer.A.weight_loader.__qualname__.startswith("composed_weight_loader")
    assert m.config.hybrid_override_pattern.count("M") >= 2
    kinds = {type(b.mixer).__name__ for b in m.model.layers}
    assert kinds == {"MambaMixer2", "NemotronHMLP", "NemotronHAttention"}


def test_constructible_on_meta():
    with torch.device("meta"):
        m = NemotronHForCausalLM(NemotronHConfig(hidden_size=4096, vocab_size=100_000))
    assert all(p.is_meta for p in m.parameters())
    assert m.lm_head.weight.shape == (100_000, 4096)


def test_to_empty_keeps_the_custom_loaders():
    with torch.device("meta"):
        m = NemotronHForCausalLM()
    m.to_empty(device="cpu")  # makes new Parameter objects
    assert m.model.layers[0].mixer.A.weight_loader.__qualname__.startswith("composed")
    qkv = m.model.layers[2].mixer.qkv_proj.weight.weight_loader
    assert qkv.__qualname__ == "packed_weight_loader(model.layers.2.mixer.qkv_proj.weight)"
    m.load_weights(make_checkpoint().items())
    assert torch.isfinite(m(torch.arange(4))).all()


def test_load_fills_every_parameter_and_a_is_minus_exp_a_log():
    ck = make_checkpoint(seed=3)
    m = NemotronHForCausalLM()
    loaded = m.load_weights({k: v.clone() for k, v in ck.items()}.items())
    assert loaded == set(dict(m.named_parameters()))
    assert ledger_of(m).never_loaded == []
    assert torch.equal(m.model.layers[0].mixer.A, -torch.exp(ck["backbone.layers.0.mixer.A_log"]))
    qkv = m.model.layers[2].mixer.qkv_proj.weight
    q, k, v = (ck[f"backbone.layers.2.mixer.{n}_proj.weight"] for n in "qkv")
    assert torch.equal(qkv, torch.cat([q, k, v]))


def test_forward_is_finite_causal_and_nan_through_d():
    m = loaded_model()
    ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    out = m(ids)
    assert out.shape == (8, m.config.vocab_size) and torch.isfinite(out).all()
    changed = ids.clone()
    changed[5] = 7
    out2 = m(changed)
    assert torch.equal(out[:5], out2[:5]) and not torch.equal(out[5:], out2[5:])  # causal
    with torch.no_grad():
        m.model.layers[4].mixer.D.fill_(float("nan"))
    assert torch.isnan(m(ids)).all()


def test_d_skip_term_enters_the_output():
    m = loaded_model()
    ids = torch.arange(6)
    before = m(ids)
    with torch.no_grad():
        m.model.layers[0].mixer.D.add_(0.5)
    assert not torch.allclose(before, m(ids))


def test_bad_shard_id_and_shape_are_clear_errors():
    m = NemotronHForCausalLM()
    w = m.model.layers[2].mixer.qkv_proj.weight
    with pytest.raises(LoadkitError, match="no shard_id"):
        w.weight_loader(w, torch.zeros(16, 16))
    with pytest.raises(LoadkitError, match=r"\[8, 16\].*\[9, 16\]"):
        w.weight_loader(w, torch.zeros(9, 16), "k")
