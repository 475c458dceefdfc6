"""Every index problem at once, with where the key really is (loadkit_inspect.sources.index)."""

import json

import pytest
import torch
from safetensors.torch import save_file

from loadkit import open_checkpoint
from loadkit.errors import DuplicateKeyError, ShardIndexError
from loadkit_inspect.inspector import inspect_checkpoint
from loadkit_inspect.sources.index import open_lenient

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
    assert open_checkpoint(folder).tensors["l.3.w"].file.endswith(S2)  # loaders read it
    with pytest.raises(ShardIndexError):  # unless every index entry must hold
        open_checkpoint(folder, strict_index=True)
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
    # Only the missing shard stops a load: every other tensor is still read.
    # total_size: with a listed shard missing its bytes cannot be counted, a consequence (a note)
    assert [p.severity for p in problems] == ["inconsistent", "fails"] + ["inconsistent"] * 2 + [
        "note"
    ]
    r = inspect_checkpoint(folder)
    assert r.exit_status == 1 and kinds(r.checkpoint.failing) == [("missing shard", "l.5.w", ())]
    text = r.render()
    assert "index problems (4): 1 stop the load (a loader raises), 3 inconsistent" in text
    assert "the index disagrees with its shards: 1 index problem that stop" in text
    assert json.loads(r.to_json())["checkpoint"]["problems"][0]["kind"] == "wrong shard"


@pytest.mark.parametrize(
    "mutate",
    [
        lambda index, files: index["weight_map"].update({"l.3.w": S1}),  # in S2, listed in S1
        lambda index, files: index["weight_map"].pop("l.3.w"),  # not listed at all
        lambda index, files: index["metadata"].update(total_size=1),
        lambda index, files: files[S2].update({"l.1.w": files[S1]["l.1.w"]}),  # a second copy
    ],
    ids=["wrong shard", "not in index", "total_size", "in two shards"],
)
def test_an_index_every_tensor_still_loads_with_is_inconsistent_not_failing(tmp_path, mutate):
    folder = shards(tmp_path, mutate)
    (problem,) = open_lenient(folder)[1]
    assert problem.severity == "inconsistent" and not problem.fails
    r = inspect_checkpoint(folder)
    assert r.exit_status == 0
    assert "index problems (1): loads; the index is inconsistent" in r.render()
    assert "; the index is inconsistent (1 problem above" in r.render().splitlines()[-1]
    strict = inspect_checkpoint(folder, strict_index=True)
    assert strict.exit_status == 1 and "under --strict-index" in strict.render().splitlines()[-1]


def test_a_listed_key_no_listed_shard_holds_is_inconsistent(tmp_path):
    # Loaders read each listed shard's own tensors (vLLM: weight_utils.py:598 filters files, the
    # iterator yields each file's keys): a key only in a file the index does not name, or in no
    # file at all, is not read, and nothing raises
    def mutate(index, files):
        files["extra.safetensors"] = {"l.3.w": files[S2].pop("l.3.w")}
        index["weight_map"]["ghost.w"] = S1

    folder = shards(tmp_path, mutate)
    problems = open_lenient(folder)[1]
    assert [(p.kind, p.key, p.severity) for p in problems] == [
        ("wrong shard", "l.3.w", "inconsistent"),
        ("in no shard", "ghost.w", "inconsistent"),  # no "wrong shard": no shard holds it
        ("total_size", None, "inconsistent"),  # the bytes of l.3.w are not read
        ("unindexed shard", None, "note"),
    ]
    assert "which loaders never read (the index does not name it)" in problems[0].message
    assert "but no shard does: there is no such tensor to read" in problems[1].message
    report = inspect_checkpoint(folder)
    assert report.exit_status == 0
    text = report.render()  # no words that contradict each other
    assert "every tensor still loads" not in text and "nothing reads the key" not in text
    assert text.splitlines()[-1] == (
        "verdict: headers valid; the index is inconsistent (3 problems above; loaders read the "
        "files it names, not its list of keys); no model given, so names were not matched (exit 0)"
    )
    assert list(open_checkpoint(folder).tensors) == [t.name for t in report.checkpoint.tensors]
    assert inspect_checkpoint(folder, strict_index=True).exit_status == 1


def test_two_copies_of_two_shapes_fail(tmp_path):
    def twice(index, files):
        files[S2]["l.1.w"] = torch.zeros(3)

    (p,) = open_lenient(shards(tmp_path, twice))[1]
    assert (p.kind, p.severity) == ("in two shards", "fails")


def test_one_missing_shard_is_one_row_and_rows_are_capped_by_limit(tmp_path):
    def mutate(index, files):
        for i in range(40):
            index["weight_map"][f"x.{i}.w"] = "gone.safetensors"
        for i in range(5):
            files[S1][f"y.{i}.w"] = torch.zeros(1)  # five unlisted keys of one shard: one row

    r = inspect_checkpoint(shards(tmp_path, mutate))
    text = r.render(limit=1)
    rows = [line for line in text.splitlines() if line.startswith("    ") and "shard" in line]
    assert rows == [
        "    missing shard, 40 keys, each: the index names shard 'gone.safetensors', which does "
        "not exist; no shard holds it"
    ]
    assert "      x.0.w, x.1.w, x.2.w, ... (40 in all)" in text
    assert "    ... 2 more (--json lists them all)" in text  # not in index (S1), total_size
    assert r.exit_status == 1


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
