"""Which files a folder stands for: its shards in sorted order without an index, the index's files
with one, a shard the index names that is not there."""

import json

import pytest
import torch
from safetensors.torch import save_file

from loadkit import open_checkpoint
from loadkit.errors import ShardIndexError


def test_folder_without_index_globs_shards_sorted(tmp_path):
    save_file({"z": torch.zeros(1)}, str(tmp_path / "a.safetensors"))
    save_file({"y": torch.ones(1)}, str(tmp_path / "b.safetensors"))
    ck = open_checkpoint(tmp_path)
    assert [n for n, _ in ck.weights()] == ["z", "y"]


def test_index_names_shards(tmp_path):
    save_file({"w1": torch.zeros(2)}, str(tmp_path / "s-2.safetensors"))
    save_file({"w0": torch.ones(2)}, str(tmp_path / "s-1.safetensors"))
    save_file({"stray": torch.ones(2)}, str(tmp_path / "unrelated.safetensors"))
    idx = {"weight_map": {"w0": "s-1.safetensors", "w1": "s-2.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(idx))
    ck = open_checkpoint(tmp_path)
    assert list(ck.tensors) == ["w0", "w1"]  # the unrelated file is not a shard


def test_index_missing_shard(tmp_path):
    idx = {"weight_map": {"w0": "gone.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(ShardIndexError, match=r"gone\.safetensors.*|'w0'") as exc:
        open_checkpoint(tmp_path)
    assert "gone.safetensors" in str(exc.value) and "'w0'" in str(exc.value)
