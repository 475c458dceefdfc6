"""``loadkit inspect`` on what users name: a repo id in a Hugging Face cache (``HF_HUB_CACHE``,
``HF_HOME``), a ``models--org--name`` folder, and a URL served on the loopback. Each gives the
report the local folder gives, apart from the lines that name the source."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hub_cache import add_snapshot, commit_hash, folder_files, repo_dir
from loopback import serve
from repo_paths import REPO

ONE = commit_hash("one")


@pytest.fixture(scope="module")
def bert(tmp_path_factory, quiet_transformers):
    """transformers' own sharded BERT checkpoint (index, two shards, config.json), and a hub
    cache holding it as ``org/bert`` at commit ``ONE``."""
    from hf_cases import clean_checkpoints

    folder = clean_checkpoints(tmp_path_factory.mktemp("hf"))("bert")
    assert (folder / "model.safetensors.index.json").is_file()
    cache = tmp_path_factory.mktemp("hub")
    add_snapshot(cache, "org/bert", folder_files(folder), commit=ONE)
    return folder, cache


def _from_checkpoint(stdout: str) -> list[str]:
    """The report's lines from its checkpoint section on (a model with two loaders puts their
    verdicts first)."""
    lines = stdout.splitlines()
    return lines[next(i for i, line in enumerate(lines) if line.startswith("checkpoint  ")) :]


def _body(stdout: str, source_lines: int, location: object) -> list[str]:
    """The report without its checkpoint line (the checkpoint's path) and the lines after it
    that say where it came from, with the folder or URL base it came from (which the config line
    names) spelled ``<source>``; the loaders' verdicts, where they come first, kept."""
    head = stdout.splitlines()[: len(stdout.splitlines()) - len(_from_checkpoint(stdout))]
    lines = _from_checkpoint(stdout.replace(str(location), "<source>"))
    assert lines[0] == "checkpoint  <source>" or lines[0].startswith("checkpoint  <source>/")
    return head + lines[1 + source_lines :]


def _same_json(theirs: str, local: str) -> None:
    a, b = json.loads(theirs), json.loads(local)
    source = a["checkpoint"].pop("source")
    assert b["checkpoint"].pop("source") == {"kind": "path", "name": b["checkpoint"]["path"],
                                             "hub": None, "fetched": None}  # fmt: skip
    for doc in (a, b):
        doc["checkpoint"].pop("path")
        index = doc["checkpoint"]["index"]
        doc["checkpoint"]["index"] = index and index.rsplit("/", 1)[-1]
        for entry in (*doc["checkpoint"]["files"], *doc["checkpoint"]["tensors"]):
            entry["file"] = entry["file"].rsplit("/", 1)[-1]
        if doc["model"]:
            doc["model"]["backend"].pop("config", None)
    assert a == b
    return source


def test_repo_id_with_model_hf_gives_the_folders_report(bert, loadkit_cli):
    folder, cache = bert
    env = {"HF_HUB_CACHE": str(cache)}
    local = loadkit_cli("inspect", folder, "--model", "hf", "--model-impl", "transformers")
    cached = loadkit_cli(
        "inspect", "org/bert", "--model", "hf", "--model-impl", "transformers", env=env
    )
    assert (cached.returncode, cached.stderr) == (local.returncode, "")
    snapshot = repo_dir(cache, "org/bert") / "snapshots" / ONE
    assert _from_checkpoint(cached.stdout)[:3] == [
        f"checkpoint  {snapshot}",
        "  from the Hugging Face cache: org/bert, revision main",
        f"    commit {ONE}",
    ]
    assert _body(cached.stdout, 2, snapshot) == _body(local.stdout, 0, folder)
    as_json = loadkit_cli(
        "inspect", "org/bert", "--model", "hf", "--model-impl", "transformers", "--json", env=env
    )
    source = _same_json(
        as_json.stdout,
        loadkit_cli(
            "inspect", folder, "--model", "hf", "--model-impl", "transformers", "--json"
        ).stdout,
    )
    assert source["kind"] == "hub" and source["hub"]["commit"] == ONE
    assert source["hub"]["folder"] == str(snapshot) and source["hub"]["lacks"] == []


def test_hf_home_and_the_models_folder(bert, loadkit_cli, tmp_path):
    folder, cache = bert
    local = loadkit_cli("inspect", folder)
    home = tmp_path / "home"
    home.mkdir()
    (home / "hub").symlink_to(cache)  # HF_HOME/hub is the cache when HF_HUB_CACHE is unset
    by_home = loadkit_cli("inspect", "org/bert@main", env={"HF_HOME": str(home)})
    snapshot = (repo_dir(cache, "org/bert") / "snapshots" / ONE).resolve()
    expected = _body(local.stdout, 0, folder)
    assert by_home.returncode == 0, by_home.stderr
    assert by_home.stdout.splitlines()[:3] == [
        f"checkpoint  {snapshot}",
        "  from the Hugging Face cache: org/bert, revision main",
        f"    commit {ONE}",
    ]
    assert _body(by_home.stdout, 2, snapshot) == expected
    by_folder = loadkit_cli("inspect", repo_dir(cache, "org/bert"))
    assert by_folder.returncode == 0 and _body(by_folder.stdout, 2, snapshot) == expected


def test_a_repo_id_not_in_the_cache_is_one_line(loadkit_cli, tmp_path):
    got = loadkit_cli("inspect", "org/absent", env={"HF_HUB_CACHE": str(tmp_path)})
    assert got.returncode == 2 and got.stdout == ""
    assert got.stderr == (
        "loadkit inspect: error: org/absent: no such file or folder, and no such repo in the "
        f"Hugging Face cache (looked for models--org--absent in {tmp_path}; set HF_HUB_CACHE or "
        "HF_HOME for another cache)\n"
    )


def test_without_huggingface_hub_a_repo_id_says_what_to_install(tmp_path):
    """A Python where ``import huggingface_hub`` fails (``sys.modules[name] = None`` makes the
    import raise ImportError, as for a package not installed)."""
    code = (
        "import sys; sys.modules['huggingface_hub'] = None\n"
        "from loadkit_inspect.cli.main import main\n"
        "sys.exit(main(['inspect', 'org/name']))\n"
    )
    got = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert got.returncode == 2
    assert got.stderr == (
        "loadkit inspect: error: org/name: no such file or folder; to read it as a Hugging Face "
        "repo id from the local cache, loadkit needs huggingface_hub (pip install "
        "'loadkit[hf]', or huggingface_hub alone)\n"
    )
    path = subprocess.run(  # a path never needs it
        [
            sys.executable,
            "-c",
            code.replace("org/name", str(REPO / "data/plamo2/untied.safetensors")),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert path.returncode == 0, path.stderr


def test_url_of_an_index_gives_the_folders_report_from_headers_alone(bert, loadkit_cli):
    folder, _ = bert
    local = loadkit_cli("inspect", folder, "--model", "hf", "--model-impl", "transformers")
    with serve(folder) as server:
        url = server.url("model.safetensors.index.json")
        remote = loadkit_cli("inspect", url, "--model", "hf", "--model-impl", "transformers")
        as_json = loadkit_cli(
            "inspect", url, "--model", "hf", "--model-impl", "transformers", "--json"
        )
    assert (remote.returncode, remote.stderr) == (local.returncode, "")
    assert _from_checkpoint(remote.stdout)[0] == f"checkpoint  {url}"
    base = url.rsplit("/", 1)[0]
    assert _body(remote.stdout, 1, base) == _body(local.stdout, 0, folder)
    source = _same_json(
        as_json.stdout,
        loadkit_cli(
            "inspect", folder, "--model", "hf", "--model-impl", "transformers", "--json"
        ).stdout,
    )
    # what was served: the index and config.json whole, of each shard its header only
    shards = sorted(folder.glob("*.safetensors"))
    headers = sum(8 + int.from_bytes(s.read_bytes()[:8], "little") for s in shards)
    small = sum(
        (folder / n).stat().st_size for n in ("model.safetensors.index.json", "config.json")
    )
    whole = small + sum(s.stat().st_size for s in shards)
    requests = 2 + 2 * len(shards)  # the index, config.json, two ranges per shard
    assert source["fetched"] == {"requests": requests, "bytes": small + headers, "size": whole}
    assert server.sent == 2 * (small + headers)  # two runs, each the same bytes
    line = _from_checkpoint(remote.stdout)[1]
    said = f"  header-only over HTTP: {requests} requests, {small + headers} bytes fetched"
    assert line.startswith(said)


def test_a_partial_snapshot_is_read_and_says_what_it_lacks(bert, loadkit_cli, tmp_path):
    folder, _ = bert
    files = folder_files(folder)
    lost = "model-00003-of-00004.safetensors"
    kept = {name: path for name, path in files.items() if name != lost}
    add_snapshot(tmp_path, "org/bert", kept, commit=ONE, missing=(lost,))
    got = loadkit_cli("inspect", "org/bert", env={"HF_HUB_CACHE": str(tmp_path)})
    assert got.returncode == 1, got.stderr  # what the snapshot lacks fails the checkpoint
    lines = got.stdout.splitlines()
    assert lines[1:4] == [
        "  from the Hugging Face cache: org/bert, revision main",
        f"    commit {ONE}",
        f"    the snapshot lacks {lost} (an incomplete download)",
    ]
    assert (
        f"    not downloaded: the hub lists '{lost}' for commit {ONE}, but the cached snapshot "
        "lacks it (an interrupted download?)"
    ) in lines
    assert any(line.startswith("    missing shard") for line in lines)
    assert "  index problems (13): 13 stop the load (a loader raises); 1 note" in got.stdout


def test_a_repo_id_with_a_commit_names_it_once(bert, loadkit_cli):
    folder, cache = bert
    env = {"HF_HUB_CACHE": str(cache)}
    snapshot = repo_dir(cache, "org/bert") / "snapshots" / ONE
    short = loadkit_cli("inspect", f"org/bert@{ONE[:7]}", env=env)
    assert short.returncode == 0, short.stderr
    assert short.stdout.splitlines()[:4] == [
        f"checkpoint  {snapshot}",
        f"  from the Hugging Face cache: org/bert, revision {ONE[:7]}",
        f"    commit {ONE}",
        "    (a short commit hash: the one cached commit it starts)",
    ]
    full = loadkit_cli("inspect", f"org/bert@{ONE}", env=env)
    assert full.stdout.splitlines()[1] == f"  from the Hugging Face cache: org/bert, commit {ONE}"
    for out in (short.stdout, full.stdout):  # the snapshot's path, then the commit once
        assert out.count(ONE) == 2, out
    assert _body(full.stdout, 1, snapshot) == _body(
        loadkit_cli("inspect", folder).stdout, 0, folder
    )
