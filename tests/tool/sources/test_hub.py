"""A repo id resolved offline from a Hugging Face cache laid out as huggingface_hub lays it out
(``tests/hub_cache.py``), checked against huggingface_hub and transformers reading the same cache.
"""

from __future__ import annotations

import os
from pathlib import Path

import huggingface_hub
import pytest
from hub_cache import add_snapshot, commit_hash, folder_files, repo_dir
from huggingface_hub.errors import IncompleteSnapshotError, LocalEntryNotFoundError
from repo_paths import DATA

from loadkit import open_checkpoint
from loadkit.errors import CheckpointError
from loadkit_inspect.sources.hub import parse_repo_id, repo_folder, resolve_snapshot
from loadkit_inspect.sources.resolve import open_source

SHARDED = DATA / "plamo2" / "tied-with-lm-head"  # two shards and an index
ONE = commit_hash("one")
TWO = commit_hash("two")


def _same_tensors(ck, reference):
    shapes = {n: (t.dtype, t.shape, t.nbytes) for n, t in ck.tensors.items()}
    assert shapes == {n: (t.dtype, t.shape, t.nbytes) for n, t in reference.tensors.items()}
    assert [os.path.basename(f) for f in ck.files] == [os.path.basename(f) for f in reference.files]


def test_repo_id_syntax():
    assert parse_repo_id("org/name") == ("org/name", None)
    assert parse_repo_id("org/name@v1.0") == ("org/name", "v1.0")
    assert parse_repo_id("org/name@refs/pr/1") == ("org/name", "refs/pr/1")
    for not_an_id in ("name", "a/b/c", "org/name@", "/abs/path", "org/na me"):
        assert parse_repo_id(not_an_id) is None, not_an_id


@pytest.mark.parametrize("link", [True, False], ids=["blobs-behind-symlinks", "files-copied"])
def test_refs_main_resolves_as_huggingface_hub_does(tmp_path, link):
    folder = add_snapshot(tmp_path, "org/tiny", folder_files(SHARDED), commit=ONE, link=link)
    assert (folder / "model.safetensors.index.json").is_symlink() == link
    snap = resolve_snapshot("org/tiny", cache_dir=tmp_path)
    assert (snap.repo_id, snap.revision, snap.commit) == ("org/tiny", "main", ONE)
    assert (snap.lacks, snap.note) == ((), None)
    # huggingface_hub itself, offline, finds the same folder and file
    theirs = huggingface_hub.snapshot_download(
        "org/tiny", cache_dir=tmp_path, local_files_only=True
    )
    assert Path(snap.folder) == Path(theirs) == folder.resolve()
    index = huggingface_hub.try_to_load_from_cache(
        "org/tiny", "model.safetensors.index.json", cache_dir=tmp_path
    )
    assert Path(index).parent == folder
    ck, problems, source = open_source("org/tiny", cache_dir=tmp_path)
    assert source.kind == "hub" and source.snapshot == snap and problems == []
    assert ck.path == snap.folder
    _same_tensors(ck, open_checkpoint(SHARDED))


def test_two_revisions_by_branch_tag_commit_and_short_commit(tmp_path):
    old = {"model.safetensors": DATA / "plamo2" / "untied.safetensors"}
    add_snapshot(tmp_path, "org/tiny", old, commit=ONE, refs=("v1",))
    add_snapshot(tmp_path, "org/tiny", folder_files(SHARDED), commit=TWO, refs=("main",))
    assert resolve_snapshot("org/tiny", cache_dir=tmp_path).commit == TWO
    by_tag = resolve_snapshot("org/tiny", "v1", cache_dir=tmp_path)
    assert (by_tag.revision, by_tag.commit, by_tag.note) == ("v1", ONE, None)
    assert resolve_snapshot("org/tiny", ONE, cache_dir=tmp_path).commit == ONE
    short = resolve_snapshot("org/tiny", ONE[:8], cache_dir=tmp_path)
    assert (
        short.commit == ONE and short.note == "a short commit hash: the one cached commit it starts"
    )
    # huggingface_hub agrees for what it resolves itself
    for revision, commit in (("main", TWO), ("v1", ONE), (ONE, ONE)):
        theirs = huggingface_hub.snapshot_download(
            "org/tiny", revision=revision, cache_dir=tmp_path, local_files_only=True
        )
        assert os.path.basename(theirs) == commit
    with pytest.raises(CheckpointError) as err:
        resolve_snapshot("org/tiny", "v2", cache_dir=tmp_path)
    message = str(err.value)
    assert message.startswith("org/tiny@v2: revision 'v2' is not in the cache (no refs/v2 in ")
    assert f"{TWO} (main)" in message and f"{ONE} (v1)" in message
    assert "name one as org/tiny@<commit>" in message


def test_no_refs_falls_back_to_the_revision_held(tmp_path):
    add_snapshot(tmp_path, "org/tiny", folder_files(SHARDED), commit=ONE, refs=())
    with pytest.raises(LocalEntryNotFoundError):  # huggingface_hub alone: nothing for "main"
        huggingface_hub.snapshot_download("org/tiny", cache_dir=tmp_path, local_files_only=True)
    snap = resolve_snapshot("org/tiny", cache_dir=tmp_path)
    assert (snap.revision, snap.commit) == ("main", ONE)
    assert snap.note == "no refs/main: the only revision cached"
    # a second revision: no guess, both listed
    add_snapshot(tmp_path, "org/tiny", folder_files(SHARDED), commit=TWO, refs=())
    with pytest.raises(CheckpointError, match="it holds 2 revision") as err:
        resolve_snapshot("org/tiny", cache_dir=tmp_path)
    assert ONE in str(err.value) and TWO in str(err.value) and "no refs/main" in str(err.value)


def test_incomplete_snapshot_says_what_it_lacks(tmp_path):
    files = folder_files(SHARDED)
    second = "model-00002-of-00002.safetensors"
    kept = {k: v for k, v in files.items() if k != second}
    add_snapshot(tmp_path, "org/tiny", kept, commit=ONE, missing=(second,))
    with pytest.raises(IncompleteSnapshotError):  # huggingface_hub knows it from trees/
        huggingface_hub.snapshot_download("org/tiny", cache_dir=tmp_path, local_files_only=True)
    snap = resolve_snapshot("org/tiny", cache_dir=tmp_path)
    assert snap.lacks == (second,) and snap.commit == ONE
    ck, problems, source = open_source("org/tiny", cache_dir=tmp_path)
    assert source.kind == "hub" and source.snapshot.lacks == (second,)
    assert "missing shard" in {p.kind for p in problems}  # the index names the missing shard
    assert len(ck.tensors) < len(open_checkpoint(SHARDED).tensors)


def test_incomplete_snapshot_with_nothing_readable(tmp_path):
    add_snapshot(tmp_path, "org/tiny", {}, commit=ONE, missing=("model.safetensors", "config.json"))
    with pytest.raises(CheckpointError) as err:
        open_source("org/tiny", cache_dir=tmp_path)
    assert str(err.value).startswith(
        f"org/tiny: the cached snapshot (commit {ONE}) is incomplete, it lacks config.json, "
        "model.safetensors: "
    )


def test_not_in_the_cache_says_where_it_looked(tmp_path):
    add_snapshot(tmp_path, "org/tiny", folder_files(SHARDED), commit=ONE)
    with pytest.raises(CheckpointError) as err:
        resolve_snapshot("org/other", cache_dir=tmp_path)
    assert str(err.value) == (
        "org/other: no such file or folder, and no such repo in the Hugging Face cache (looked "
        f"for models--org--other in {tmp_path}; set HF_HUB_CACHE or HF_HOME for another cache)"
    )


def test_models_folder_stands_for_its_repo(tmp_path):
    add_snapshot(tmp_path, "org/tiny", folder_files(SHARDED), commit=ONE)
    repo = repo_dir(tmp_path, "org/tiny")
    assert repo_folder(str(repo)) == ("org/tiny", str(tmp_path))
    ck, problems, source = open_source(repo)
    assert source.kind == "hub" and source.snapshot.commit == ONE and problems == []
    _same_tensors(ck, open_checkpoint(SHARDED))
    assert repo_folder(str(SHARDED)) is None


def test_an_existing_path_wins_over_a_repo_id(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    add_snapshot(cache, "org/tiny", folder_files(SHARDED), commit=ONE)
    monkeypatch.chdir(tmp_path)
    local = tmp_path / "org" / "tiny"
    local.mkdir(parents=True)
    (local / "model.safetensors").write_bytes((DATA / "plamo2" / "untied.safetensors").read_bytes())
    ck, _, source = open_source("org/tiny")
    assert source.kind == "path" and ck.files == ["org/tiny/model.safetensors"]


def test_transformers_reads_the_same_cache(tmp_path, hf_clean):
    """The layout is the real one: transformers finds the config offline, in our snapshot."""
    from transformers import AutoConfig

    add_snapshot(tmp_path, "org/bert", folder_files(hf_clean("bert")), commit=ONE)
    config = AutoConfig.from_pretrained("org/bert", cache_dir=tmp_path, local_files_only=True)
    assert config.model_type == "bert"
    snap = resolve_snapshot("org/bert", cache_dir=tmp_path)
    assert (Path(snap.folder) / "config.json").is_file()


def test_a_cache_of_one_revision_says_1_revision(tmp_path):
    add_snapshot(tmp_path, "org/tiny", folder_files(SHARDED), commit=ONE, refs=("main",))
    with pytest.raises(CheckpointError) as err:
        resolve_snapshot("org/tiny", "v2", cache_dir=tmp_path)
    assert f"; it holds 1 revision: {ONE} (main); name one as" in str(err.value)
