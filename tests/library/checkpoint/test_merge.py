"""The shards' headers merged into one checkpoint: a key in two shards, a key the index puts in a
shard that lacks it, strictly and leniently."""

import json

import pytest
import torch
from safetensors.torch import save_file

from loadkit import open_checkpoint
from loadkit.errors import DuplicateKeyError, ShardIndexError


def test_duplicate_key_across_shards(tmp_path):
    save_file({"w": torch.zeros(2)}, str(tmp_path / "a.safetensors"))
    save_file({"w": torch.zeros(3)}, str(tmp_path / "b.safetensors"))
    with pytest.raises(DuplicateKeyError) as exc:
        open_checkpoint(tmp_path)
    msg = str(exc.value)
    assert "'w'" in msg and "a.safetensors" in msg and "b.safetensors" in msg
    assert "[2]" in msg and "[3]" in msg


def test_index_key_not_in_its_shard(tmp_path):
    # loaders read each listed file's own tensors, never the index's key list: it opens (as
    # `loadkit inspect` says it loads); strict_index refuses it (as --strict-index fails it)
    save_file({"w0": torch.ones(2)}, str(tmp_path / "s.safetensors"))
    idx = {"weight_map": {"w0": "s.safetensors", "w9": "s.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(idx))
    assert list(open_checkpoint(tmp_path).tensors) == ["w0"]
    with pytest.raises(ShardIndexError) as exc:
        open_checkpoint(tmp_path, strict_index=True)
    assert "'w9'" in str(exc.value) and "s.safetensors" in str(exc.value)


def test_one_key_twice_with_one_shape_keeps_the_last_copy(tmp_path):
    save_file({"w": torch.zeros(2)}, str(tmp_path / "a.safetensors"))
    save_file({"w": torch.ones(2)}, str(tmp_path / "b.safetensors"))
    ck = open_checkpoint(tmp_path)
    assert ck.tensors["w"].file.endswith("b.safetensors")  # read in order: the last copy stays
    assert [(n, t.tolist()) for n, t in ck.weights()] == [("w", [1.0, 1.0])]
    with pytest.raises(DuplicateKeyError):
        open_checkpoint(tmp_path, strict_index=True)
