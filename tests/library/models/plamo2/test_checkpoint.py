"""Plamo2's checkpoint: the generator, the config read back from a header, the committed data."""

import math
import re

import pytest
import torch

from loadkit import open_checkpoint
from loadkit.errors import CheckpointError
from loadkit.models.plamo2 import (
    Plamo2Config,
    Plamo2ForCausalLM,
    config_from_checkpoint,
    make_checkpoint,
)

from .test_model import CONFIGS


@pytest.mark.parametrize("config", CONFIGS, ids=range(len(CONFIGS)))
def test_config_from_checkpoint_roundtrip(tmp_path, config):
    from safetensors.torch import save_file

    save_file(make_checkpoint(config), tmp_path / "m.safetensors")
    got = config_from_checkpoint(open_checkpoint(tmp_path / "m.safetensors").tensors)
    assert got == config
    with torch.device("meta"):
        model = Plamo2ForCausalLM(got)
    shapes = {k: tuple(p.shape) for k, p in model.named_parameters()}
    assert shapes["model.embed_tokens.weight"] == (config.vocab_size, config.hidden_size)


def test_config_from_checkpoint_errors(tmp_path):
    from safetensors.torch import save_file

    ckpt = make_checkpoint(Plamo2Config())
    del ckpt["model.embed_tokens.weight"]
    save_file(ckpt, tmp_path / "a.safetensors")
    with pytest.raises(CheckpointError, match=r"a\.safetensors.*model\.embed_tokens\.weight"):
        config_from_checkpoint(open_checkpoint(tmp_path / "a.safetensors").tensors)
    # Attention first, then mamba: no mamba_step yields that pattern.
    ckpt = make_checkpoint(Plamo2Config())
    swap = {"0": "1", "1": "0"}
    ckpt = {
        re.sub(r"layers\.(\d)\.", lambda m: f"layers.{swap[m[1]]}.", k): v for k, v in ckpt.items()
    }
    save_file(ckpt, tmp_path / "b.safetensors")
    with pytest.raises(CheckpointError, match=r"\['attention', 'mamba'\] fits no mamba_step"):
        config_from_checkpoint(open_checkpoint(tmp_path / "b.safetensors").tensors)


def test_committed_data_is_where_the_notebook_reads_it_and_loadable(tmp_path, data_generator):
    # That the committed bytes are a fresh generation's is tests/test_data.py's one check.
    # Notebook 02 reads ../data/plamo2/ from notebooks/: the repository's data folder.
    from repo_paths import DATA as DATA_DIR

    written = data_generator.plamo2(tmp_path)
    assert len(written) == 5
    assert all((DATA_DIR / p.relative_to(tmp_path)).is_file() for p in written)
    tied = open_checkpoint(DATA_DIR / "plamo2" / "tied.safetensors")
    assert "lm_head.weight" not in tied.tensors
    assert config_from_checkpoint(tied.tensors) == Plamo2Config(tie_word_embeddings=True)
    sharded = open_checkpoint(DATA_DIR / "plamo2" / "tied-with-lm-head")
    assert [n for n, _ in sharded.weights()][-1] == "lm_head.weight"  # streams last
    assert math.prod(sharded.tensors["lm_head.weight"].shape) == 48 * 16
