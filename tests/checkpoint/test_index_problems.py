"""Every index problem at once, with where the key really is (loadkit.checkpoint.index)."""

import json

import pytest
import torch
from safetensors.torch import save_file

from loadkit import open_checkpoint
from loadkit.checkpoint.index import open_lenient
from loadkit.errors import DuplicateKeyError, ShardIndexError
from loadkit.inspection.inspector import inspect_checkpoint

S1, S2, S3 = (f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3))


def shards(tmp_path, mutate=lambda index, files: None):
    torch.manual_seed(0)
    t = {f"l.{i}.w": torch.randn(2, 2) for i in range(6)}
    files = {S1: ["l.0.w", "l.1.w"], S2: ["l.2.w", "l.3.w"], S3: ["l.4.w", "l.5.w"]}
    index = {
        "metadata": {"total_size": 6 * 16},
        "weight_map": {k: f for f, ks in files.items() for k in ks},
    }
    contents = {f: {k: t[k] for k in ks} for f, ks in files.items()}
    mutate(index, contents)
    for f, tensors in contents.items():
        save_file(tensors, str(tmp_path / f))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    return tmp_path


def kinds(problems):
    return [(p.kind, p.key, p.found_in) for p in problems]


def test_a_consistent_index_has_no_problems(tmp_path):
    ck, problems = open_lenient(shards(tmp_path))
    assert problems == [] and list(ck.tensors) == [f"l.{i}.w" for i in range(6)]


def test_wrong_shard_names_where_the_key_is(tmp_path):
    def mutate(index, files):
        index["weight_map"]["l.3.w"] = S1

    folder = shards(tmp_path, mutate)
    with pytest.raises(ShardIndexError):  # the library keeps raising
        open_checkpoint(folder)
    ck, problems = open_lenient(folder)
    assert kinds(problems) == [("wrong shard", "l.3.w", (S2,))]
    assert f"it is in {S2}" in problems[0].message
    assert ck.tensors["l.3.w"].file.endswith(S2)  # still read, from where it is


def test_every_problem_is_collected_and_the_rest_read(tmp_path):
    def mutate(index, files):
        index["weight_map"]["l.3.w"] = S1  # wrong shard
        index["weight_map"]["l.5.w"] = "model-00004-of-00003.safetensors"  # missing shard
        del files[S3]["l.5.w"]
        files[S3]["l.6.w"] = torch.zeros(2)  # not in the index
        files[S2]["l.1.w"] = files[S1]["l.1.w"]  # in two shards
        index["metadata"]["total_size"] += 4  # total_size

    folder = shards(tmp_path, mutate)
    ck, problems = open_lenient(folder)
    assert kinds(problems) == [
        ("wrong shard", "l.3.w", (S2,)),
        ("missing shard", "l.5.w", ()),
        ("not in index", "l.6.w", (S3,)),
        ("in two shards", "l.1.w", (S1, S2)),
        ("total_size", None, ()),
    ]
    assert "no shard holds it" in problems[1].message
    assert sorted(ck.tensors) == ["l.0.w", "l.1.w", "l.2.w", "l.3.w", "l.4.w", "l.6.w"]
    r = inspect_checkpoint(folder)
    assert r.exit_status == 1 and len(r.checkpoint.failing) == 5
    text = r.render()
    assert "index problems (5)" in text and "layout" in text
    assert "the index disagrees with its shards: 5 index problem(s)" in text
    assert json.loads(r.to_json())["checkpoint"]["problems"][0]["kind"] == "wrong shard"


def test_a_shard_not_in_the_index_is_a_note_and_a_duplicate_without_index_a_problem(tmp_path):
    folder = shards(tmp_path)
    save_file({"x": torch.zeros(1)}, str(folder / "consolidated.safetensors"))
    ck, problems = open_lenient(folder)
    assert kinds(problems) == [("unindexed shard", None, ("consolidated.safetensors",))]
    assert not problems[0].fails and "x" not in ck.tensors
    assert inspect_checkpoint(folder).exit_status == 0

    plain = tmp_path / "plain"
    plain.mkdir()
    save_file({"a": torch.zeros(1), "b": torch.zeros(1)}, str(plain / "1.safetensors"))
    save_file({"b": torch.zeros(2)}, str(plain / "2.safetensors"))
    with pytest.raises(DuplicateKeyError):
        open_checkpoint(plain)
    ck, problems = open_lenient(plain)
    assert kinds(problems) == [("in two shards", "b", ("1.safetensors", "2.safetensors"))]
    assert "shapes differ: [1] and [2]" in problems[0].message


def test_nothing_readable_is_still_an_error(tmp_path):
    def mutate(index, files):
        index["weight_map"] = {"l.0.w": "gone.safetensors"}

    with pytest.raises(ShardIndexError, match="nothing to inspect"):
        open_lenient(shards(tmp_path, mutate))


def test_an_unreadable_shard_loses_only_its_keys(tmp_path):
    folder = shards(tmp_path)
    (folder / S2).write_bytes(b"\x01")
    ck, problems = open_lenient(folder)
    assert [p.kind for p in problems] == ["unreadable shard", "total_size"]
    assert "2 indexed keys lost: l.2.w, l.3.w" in problems[0].message
    assert sorted(ck.tensors) == ["l.0.w", "l.1.w", "l.4.w", "l.5.w"]
