"""The Gemma4-like model's checkpoint: its layout, generator, written file and header inference."""

import pytest
import torch
from repo_paths import DATA
from safetensors.torch import load_file

from loadkit import open_checkpoint
from loadkit.errors import CheckpointError, LoadkitError
from loadkit.models import gemma4 as g4

from .cases import CONFIG_NAMES, G4, GEMMA4_DATA, header_of


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_layout_covers_every_parameter_exactly(name, configs):
    config = configs[name]
    with torch.device("meta"):
        model = G4(config)
    mapper = g4.load_mapper(config)
    targets = {mapper.map_name(k) for k, _ in g4.checkpoint_layout(config)}
    tensors = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    assert targets == tensors


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


def test_cli_writes_a_checkpoint_with_progress(tmp_path, capsys, gemma4_bench):
    out = tmp_path / "big" / "g.safetensors"
    argv = [str(out), "--preset", "small", "--layers", "2", "--hidden", "16"]
    assert gemma4_bench.main(argv) == 0
    assert "tensors" in capsys.readouterr().out
    config = g4.config_from_checkpoint(open_checkpoint(out).tensors)
    assert (config.num_hidden_layers, config.hidden_size) == (2, 16)
