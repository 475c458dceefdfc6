"""The NemotronH-like checkpoint: its key orders and seeds, the committed data files, values exact
in bfloat16, and the config read back from a header."""

import json

import pytest
import torch
import torch.nn.functional as F
from repo_paths import DATA
from safetensors import safe_open

from loadkit import open_checkpoint
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


def test_safetensors_header_is_padded_json():
    raw = (DATA / "nemotron_h" / "initial.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert n % 8 == 0
    header = json.loads(raw[8 : 8 + n])
    assert header["__metadata__"]["seed"] == "0"
