"""The Gemma4-like model, its checkpoint layout, generator and header inference."""

import dataclasses
import math

import pytest
import torch
from repo_paths import DATA
from safetensors.torch import load_file

from loadkit import WeightsMapper, ledger_of, open_checkpoint
from loadkit.checkpoint import dtypes
from loadkit.checkpoint.reader import TensorInfo
from loadkit.errors import CheckpointError, LoadkitError, MissingShardIdError, ShapeMismatchError
from loadkit.models import gemma4 as g4

GEMMA4_DATA = DATA / "gemma4_like" / "model.safetensors"

G4 = g4.Gemma4ForConditionalGeneration
# benchmarks/gemma4_checkpoint.py's presets (small, bench, full), and one more odd shape.
OWN_CONFIGS = {
    "no-ple-double-wide": g4.Gemma4Config(
        num_hidden_layers=3, hidden_size_per_layer_input=0, double_wide_mlp_layers=2
    ),
}
CONFIG_NAMES = ["small", "bench", "full", *OWN_CONFIGS]


@pytest.fixture(scope="module")
def configs(gemma4_bench):
    return {**gemma4_bench.PRESETS, **OWN_CONFIGS}


def test_every_config_is_tested(configs):
    assert sorted(CONFIG_NAMES) == sorted(configs)
    assert configs["small"] == g4.Gemma4Config()
    assert configs["full"] == g4.full_scale_config()


def test_bench_preset_is_what_the_memory_benchmark_needs(configs):
    # benchmarks/probe_memory.py: at least 500 tensors and 1 GiB, and the largest tensor a small
    # part of the whole (one clone against every clone).
    config = configs["bench"]
    layout = g4.checkpoint_layout(config)
    itemsize = dtypes.itemsize(dtypes.safetensors_dtype(config.dtype))
    largest = max(math.prod(shape) for _, shape in layout) * itemsize
    assert len(layout) >= 500 and g4.layout_bytes(config) >= 2**30
    assert largest * 60 <= g4.layout_bytes(config)


def header_of(config):
    """``open_checkpoint(...).tensors`` of a checkpoint never written: header facts only."""
    out, offset = {}, 0
    for name, shape in g4.checkpoint_layout(config):
        n = 2 * torch.Size(shape).numel()
        out[name] = TensorInfo(name, "BF16", shape, n, "virtual.safetensors", offset)
        offset += n
    return out


def test_spec_mapper_and_names():
    assert G4.hf_to_vllm_mapper == WeightsMapper(
        orig_to_new_prefix={"model.language_model.": "language_model.model."}
    )
    with torch.device("meta"):
        model = G4()
    assert model.hf_to_vllm_mapper is G4.hf_to_vllm_mapper  # no towers, no packing: the one rule
    names = [n for n, _ in model.named_parameters()]
    assert all(n.startswith("language_model.model.") for n in names)
    assert all(p.device.type == "meta" for p in model.parameters())
    keys = [n for n, _ in g4.checkpoint_layout(model.config)]
    assert all(k.startswith("model.language_model.") for k in keys)
    assert keys == sorted(keys) and len(keys) == 17 * 4 + 5


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_layout_covers_every_parameter_exactly(name, configs):
    config = configs[name]
    with torch.device("meta"):
        model = G4(config)
    mapper = g4.load_mapper(config)
    targets = {mapper.map_name(k) for k, _ in g4.checkpoint_layout(config)}
    tensors = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    assert targets == tensors


def test_full_scale_is_near_upstream():
    config = g4.full_scale_config()
    n = len(g4.checkpoint_layout(config))
    assert abs(n - 2011) <= 5
    assert abs(g4.layout_bytes(config) / 2**30 - 9.543) < 0.05
    with torch.device("meta"):
        model = G4(config)
    assert set(model.hf_to_vllm_mapper.orig_to_new_prefix) == {
        "model.language_model.",
        "model.vision_tower.",
        "model.audio_tower.",
    }


@pytest.mark.parametrize("name", ["small", "no-ple-double-wide"])
def test_loads_make_checkpoint_exactly(name, configs):
    config = configs[name]
    ckpt = g4.make_checkpoint(config, seed=3)
    model = G4(config)
    model.load_weights({k: v.clone() for k, v in ckpt.items()}.items())
    expected = g4.expected_parameters(config, ckpt)
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    assert [n for n, t in expected.items() if not torch.equal(state[n], t)] == []
    ledger = ledger_of(model)
    assert ledger.never_loaded == [] and ledger.entries_with("unconsumed") == []


def test_packed_rows_come_from_their_shards():
    config = g4.Gemma4Config()
    ckpt = g4.make_checkpoint(config)
    model = G4(config)
    model.load_weights(ckpt.items())
    p = "model.language_model.layers.1."
    qkv = model.get_parameter("language_model.model.layers.1.self_attn.qkv_proj.weight")
    q = ckpt[f"{p}self_attn.q_proj.weight"]
    k = ckpt[f"{p}self_attn.k_proj.weight"]
    assert torch.equal(qkv[: q.shape[0]], q)
    assert torch.equal(qkv[q.shape[0] : q.shape[0] + k.shape[0]], k)
    gate_up = model.get_parameter("language_model.model.layers.1.mlp.gate_up_proj.weight")
    assert torch.equal(gate_up[config.intermediate_size :], ckpt[f"{p}mlp.up_proj.weight"])


def test_packed_loader_needs_shard_id_and_shape():
    model = G4()
    name = "language_model.model.layers.0.self_attn.qkv_proj.weight"
    param = model.get_parameter(name)
    w = torch.ones(32, 32, dtype=torch.bfloat16)
    with pytest.raises(MissingShardIdError, match=rf"'{name}'.*\[64, 32\].*\[32, 32\].*clone"):
        param.weight_loader(param, w)
    w.shard_id = "x"
    with pytest.raises(MissingShardIdError, match="shard_id 'x'"):
        param.weight_loader(param, w)
    bad = torch.ones(16, 32, dtype=torch.bfloat16)
    bad.shard_id = "q"
    with pytest.raises(ShapeMismatchError, match=r"\[32, 32\].*\[16, 32\]"):
        param.weight_loader(param, bad)
    # Through the loader, a shape error names the parameter and the checkpoint key.
    ckpt = g4.make_checkpoint(g4.Gemma4Config())
    ckpt["model.language_model.layers.0.self_attn.q_proj.weight"] = bad
    with pytest.raises(ShapeMismatchError, match="qkv_proj.*q_proj"):
        model.load_weights(ckpt.items())


def test_packing_rules_chain_in_order_and_are_not_idempotent():
    m = g4.PACKING_MAPPER
    for src, (dst, shard) in {
        "a.v_proj.weight": ("a.qkv_proj.weight", "v"),
        "a.q_proj.weight": ("a.qkv_proj.weight", "q"),
        "a.up_proj.weight": ("a.gate_up_proj.weight", 1),
        "a.gate_proj.weight": ("a.gate_up_proj.weight", 0),
        "a.per_layer_projection.weight": ("a.per_layer_projection.weight", None),
    }.items():
        assert m.map_name_with_shard(src) == (dst, shard)
    assert m.map_name("a.qkv_proj.weight") == "a.qkqkv_proj.weight"  # why mapping twice is a bug


def test_data_checkpoint_is_small_and_where_the_generator_writes_it(tmp_path, data_generator):
    # That the committed bytes are a fresh generation's is tests/test_data.py's one check.
    [path] = data_generator.gemma4_like(tmp_path)
    assert path == tmp_path / "gemma4_like" / "model.safetensors"
    assert GEMMA4_DATA == DATA / path.relative_to(tmp_path)
    assert GEMMA4_DATA.stat().st_size < 300_000


def test_written_file_is_standard_safetensors_in_the_requested_order(tmp_path, gemma4_bench):
    config = g4.Gemma4Config(num_hidden_layers=2)
    order = [n for n, _ in g4.checkpoint_layout(config)][::-1]
    path = gemma4_bench.write_checkpoint(tmp_path / "r.safetensors", config, seed=5, order=order)
    ref = g4.make_checkpoint(config, seed=5)
    got = load_file(str(path))  # the safetensors library reads it
    assert got.keys() == ref.keys()
    assert all(torch.equal(got[k], ref[k]) for k in ref)  # values do not depend on order
    ck = open_checkpoint(path)
    assert [n for n, _ in ck.weights()] == order
    with pytest.raises(LoadkitError, match="order must name every tensor"):
        gemma4_bench.write_checkpoint(tmp_path / "x.safetensors", config, order=order[1:])


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_config_from_checkpoint_header(name, configs):
    assert g4.config_from_checkpoint(header_of(configs[name])) == configs[name]


def test_config_from_committed_checkpoint():
    ck = open_checkpoint(GEMMA4_DATA)
    config = g4.config_from_checkpoint(ck.tensors)
    assert config == g4.Gemma4Config()
    with torch.device("meta"):
        G4(config)


def test_config_from_checkpoint_errors_name_file_key_and_shapes():
    tensors = header_of(g4.Gemma4Config())
    embed = "model.language_model.embed_tokens.weight"
    missing = {k: v for k, v in tensors.items() if k != embed}
    with pytest.raises(CheckpointError, match=rf"virtual.safetensors, key '{embed}'.*missing"):
        g4.config_from_checkpoint(missing)
    q = "model.language_model.layers.0.self_attn.q_proj.weight"
    odd = dict(tensors)
    odd[q] = tensors[q]._replace(shape=(33, 32))
    with pytest.raises(CheckpointError, match=rf"key '{q}'.*33.*head_dim 16"):
        g4.config_from_checkpoint(odd)
    gap = {k: v for k, v in tensors.items() if ".layers.1." not in k}
    with pytest.raises(CheckpointError, match=r"layers \[0, 2, 3\] skip 1"):
        g4.config_from_checkpoint(gap)
    flat = dict(tensors)
    flat[embed] = tensors[embed]._replace(shape=(4096,))
    with pytest.raises(CheckpointError, match=r"2-d tensor, found shape \[4096\]"):
        g4.config_from_checkpoint(flat)
    with pytest.raises(CheckpointError, match="missing"):
        g4.config_from_checkpoint({})


def test_config_validation():
    with pytest.raises(LoadkitError, match="num_hidden_layers"):
        g4.Gemma4Config(num_hidden_layers=0)
    with pytest.raises(LoadkitError, match="double_wide"):
        g4.Gemma4Config(num_hidden_layers=2, double_wide_mlp_layers=3)
    with pytest.raises(LoadkitError, match="vision tower"):
        g4.Gemma4Config(vision_layers=2)
    with pytest.raises(LoadkitError, match="dtype"):
        g4.Gemma4Config(dtype="float7")
    with pytest.raises(LoadkitError, match="hidden_size must be a non-negative int"):
        g4.Gemma4Config(hidden_size=-1)


def test_packing_in_mapper_moves_the_rules_not_the_result():
    config = dataclasses.replace(g4.Gemma4Config(), packing_in_mapper=True)
    model = G4(config)
    assert model.hf_to_vllm_mapper.orig_to_new_stacked == g4.PACKING_MAPPER.orig_to_new_stacked
    ckpt = g4.make_checkpoint(config)
    model.load_weights(ckpt.items())
    expected = g4.expected_parameters(config, ckpt)
    qkv = "language_model.model.layers.0.self_attn.qkv_proj.weight"
    assert torch.equal(model.get_parameter(qkv), expected[qkv])


def test_cli_writes_a_checkpoint_with_progress(tmp_path, capsys, gemma4_bench):
    out = tmp_path / "big" / "g.safetensors"
    argv = [str(out), "--preset", "small", "--layers", "2", "--hidden", "16"]
    assert gemma4_bench.main(argv) == 0
    assert "tensors" in capsys.readouterr().out
    config = g4.config_from_checkpoint(open_checkpoint(out).tensors)
    assert (config.num_hidden_layers, config.hidden_size) == (2, 16)
