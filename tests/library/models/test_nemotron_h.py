import json

import pytest
import torch
import torch.nn.functional as F
from repo_paths import DATA
from safetensors import safe_open

from loadkit import ledger_of, open_checkpoint
from loadkit.errors import CheckpointError, LoadkitError
from loadkit.models.nemotron_h import (
    A_RANGE,
    DT_GRID,
    DT_STEPS,
    ORDERS,
    NemotronHConfig,
    NemotronHForCausalLM,
    config_from_checkpoint,
    make_checkpoint,
)


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


def test_orders_change_key_order_only():
    base = make_checkpoint(seed=1)
    heads = lambda ck: [k.rsplit(".", 1)[1] for k in ck if k.startswith("backbone.layers.0.mixer.")]  # noqa: E731
    for order in ORDERS:
        ck = make_checkpoint(seed=1, order=order)
        assert set(ck) == set(base)
        assert all(torch.equal(ck[k], base[k]) for k in base)
    d_last = [h for h in heads(make_checkpoint(order="d-last")) if h in ("A_log", "dt_bias", "D")]
    d_first = [h for h in heads(make_checkpoint(order="d-first")) if h in ("A_log", "dt_bias", "D")]
    assert d_last == ["A_log", "dt_bias", "D"] and d_first == ["D", "A_log", "dt_bias"]
    assert list(make_checkpoint(order="shuffled")) != list(base)
    assert list(make_checkpoint(order="shuffled")) == list(make_checkpoint(order="shuffled"))
    with pytest.raises(LoadkitError, match="order must be one of"):
        make_checkpoint(order="random")


def test_seeds_differ_and_repeat():
    a, b = make_checkpoint(seed=0), make_checkpoint(seed=1)
    assert not torch.equal(a["backbone.layers.0.mixer.D"], b["backbone.layers.0.mixer.D"])
    assert all(torch.equal(v, make_checkpoint(seed=0)[k]) for k, v in a.items())


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


@pytest.mark.parametrize("order", ORDERS)
def test_data_files_stream_in_their_order_and_read_with_safetensors(order):
    # Bytes against a fresh generation: tests/test_data.py. Here: the order each file streams in,
    # and the same values in every order, read by safetensors and by loadkit alike.
    path = DATA / "nemotron_h" / f"update-{order}.safetensors"
    names = [n for n, _ in open_checkpoint(path).weights()]
    assert names == list(make_checkpoint(seed=1, order=order))  # names only: values not compared
    reference = dict(open_checkpoint(DATA / "nemotron_h" / "update-d-last.safetensors").weights())
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"format": "pt", "seed": "1", "order": order}
        assert sorted(f.keys()) == sorted(reference)
        for k in f.keys():
            assert torch.equal(f.get_tensor(k), reference[k]), k


@pytest.mark.parametrize("file", ["initial", "update-d-last"])
def test_data_per_head_values_mean_a_and_dt(file):
    """-exp(A_log) is an integer in A_RANGE and softplus(dt_bias) a multiple of 1/DT_GRID."""
    ck = dict(open_checkpoint(DATA / "nemotron_h" / f"{file}.safetensors").weights())
    mixers = [k.removesuffix(".A_log") for k in ck if k.endswith(".A_log")]
    assert len(mixers) == NemotronHConfig().hybrid_override_pattern.count("M")
    seen_a, seen_dt = set(), set()
    for m in mixers:
        assert ck[f"{m}.A_log"].dtype == torch.float32
        a = torch.exp(ck[f"{m}.A_log"].double())
        assert torch.allclose(a, a.round(), rtol=0, atol=1e-5), (m, a)
        dt = F.softplus(ck[f"{m}.dt_bias"].double()) * DT_GRID
        assert torch.allclose(dt, dt.round(), rtol=0, atol=1e-4), (m, dt)
        seen_a |= set(a.round().int().tolist())
        seen_dt |= set(dt.round().int().tolist())
    assert A_RANGE[0] <= min(seen_a) and max(seen_a) <= A_RANGE[1] and len(seen_a) > 3
    assert DT_STEPS[0] <= min(seen_dt) and max(seen_dt) <= DT_STEPS[1] and len(seen_dt) > 3


def test_values_are_exact_in_bfloat16():
    f32 = make_checkpoint(seed=2)
    bf16 = make_checkpoint(NemotronHConfig(dtype="bfloat16"), seed=2)
    rounded = {"A_log", "dt_bias"}  # functions of grid values, rounded once to their dtype
    for k, v in f32.items():
        if k.rsplit(".", 1)[1] not in rounded:
            assert bf16[k].dtype == torch.bfloat16 and torch.equal(bf16[k].float(), v), k
    assert bf16["backbone.layers.0.mixer.A_log"].dtype == torch.float32  # upstream keeps A f32


def test_config_from_checkpoint_round_trips_default_data():
    cfg = config_from_checkpoint(
        open_checkpoint(DATA / "nemotron_h" / "initial.safetensors").tensors
    )
    assert cfg == NemotronHConfig()


def shapes(model):
    return {n: tuple(p.shape) for n, p in model.named_parameters()}


@pytest.mark.parametrize(
    "cfg",
    [
        NemotronHConfig(
            hidden_size=24,
            hybrid_override_pattern="M*M-",
            mamba_num_heads=6,
            mamba_head_dim=2,
            n_groups=2,
            ssm_state_size=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=6,
            use_conv_bias=False,
            dtype="bfloat16",
        ),
        NemotronHConfig(hybrid_override_pattern="-*"),
    ],
)
def test_config_from_checkpoint_reproduces_every_shape(tmp_path, cfg):
    from loadkit.checkpoint.writer import save_in_order

    path = save_in_order(tmp_path / "m.safetensors", make_checkpoint(cfg))
    inferred = config_from_checkpoint(open_checkpoint(path).tensors)
    assert (
        inferred.dtype == cfg.dtype
        and inferred.hybrid_override_pattern == cfg.hybrid_override_pattern
    )
    with torch.device("meta"):
        assert shapes(NemotronHForCausalLM(inferred)) == shapes(NemotronHForCausalLM(cfg))
    # model-side names (after the mapper) infer the same shapes
    m = NemotronHForCausalLM(cfg)
    m.load_weights(make_checkpoint(cfg).items())
    model_side = save_in_order(
        tmp_path / "v.safetensors", {n: p.detach() for n, p in m.named_parameters()}
    )
    again = config_from_checkpoint(open_checkpoint(model_side).tensors)
    with torch.device("meta"):
        assert shapes(NemotronHForCausalLM(again)) == shapes(m)


def test_config_from_checkpoint_errors_name_file_and_key(tmp_path):
    from loadkit.checkpoint.writer import save_in_order

    ck = make_checkpoint()
    no_embed = {k: v for k, v in ck.items() if "embeddings" not in k}
    path = save_in_order(tmp_path / "a.safetensors", no_embed)
    with pytest.raises(CheckpointError, match=r"a\.safetensors.*embeddings\.weight"):
        config_from_checkpoint(open_checkpoint(path).tensors)
    gap = {k: v for k, v in ck.items() if ".layers.1." not in k}
    path = save_in_order(tmp_path / "b.safetensors", gap)
    with pytest.raises(LoadkitError, match=r"not 0\.\.n-1"):
        config_from_checkpoint(open_checkpoint(path).tensors)
    bad = dict(ck)
    bad["backbone.layers.0.mixer.in_proj.weight"] = torch.zeros(5, 16)
    path = save_in_order(tmp_path / "c.safetensors", bad)
    with pytest.raises(LoadkitError, match=r"layers\.0.*in_proj rows 5"):
        config_from_checkpoint(open_checkpoint(path).tensors)
    no_norm = {k: v for k, v in ck.items() if k != "backbone.layers.0.mixer.norm.weight"}
    path = save_in_order(tmp_path / "d.safetensors", no_norm)
    with pytest.raises(LoadkitError, match=r"layers\.0\.mixer\.norm\.weight"):
        config_from_checkpoint(open_checkpoint(path).tensors)


def test_bad_shard_id_and_shape_are_clear_errors():
    m = NemotronHForCausalLM()
    w = m.model.layers[2].mixer.qkv_proj.weight
    with pytest.raises(LoadkitError, match="no shard_id"):
        w.weight_loader(w, torch.zeros(16, 16))
    with pytest.raises(LoadkitError, match=r"\[8, 16\].*\[9, 16\]"):
        w.weight_loader(w, torch.zeros(9, 16), "k")


def test_safetensors_header_is_padded_json():
    raw = (DATA / "nemotron_h" / "initial.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert n % 8 == 0
    header = json.loads(raw[8 : 8 + n])
    assert header["__metadata__"]["seed"] == "0"
