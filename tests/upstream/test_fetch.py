"""The fetch step fails loudly, notices a changed cache, and keeps each version apart."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from upstream import fetch
from upstream.harness import root_of


@pytest.mark.parametrize("version", fetch.DEFAULT_VERSIONS)
def test_no_index_fails_with_a_message(version, tmp_path):
    env = {
        **os.environ,
        "LOADKIT_UPSTREAM_CACHE": str(tmp_path / "cache"),
        "PIP_NO_INDEX": "1",  # no package index at all
        "PIP_FIND_LINKS": str(tmp_path),  # and nothing to find locally
    }
    proc = subprocess.run(
        [sys.executable, fetch.__file__, "--version", version],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert f"pip download of vllm=={version} failed" in proc.stderr
    assert not list((tmp_path / "cache").glob(fetch.wheel_glob(version)))


@pytest.mark.parametrize("version", fetch.DEFAULT_VERSIONS)
def test_extracted_sources_are_checked_against_the_record(version, up_at, tmp_path):
    src = up_at(version).src
    assert src == fetch.source_dir(version)
    assert fetch._extracted_ok(src, version)
    copy = tmp_path / "src"
    for rel in [*fetch._read_marker(src)["files"], fetch.MARKER]:
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        (copy / rel).write_bytes((src / rel).read_bytes())
    assert fetch._extracted_ok(copy, version)
    edited = copy / fetch.SOURCES[0]
    edited.write_text(edited.read_text() + "\n# edited\n")
    assert not fetch._extracted_ok(copy, version)  # ensure_sources would extract again
    assert not fetch._extracted_ok(src, "0.0.1")  # another version's pin, other patterns


def test_each_pattern_takes_the_files_the_record_lists(up_at):
    # A glob takes every file it matches in the wheel: the reload package differs by version.
    old = set(fetch._read_marker(up_at(fetch.OLD).src)["files"])
    new = set(fetch._read_marker(up_at(fetch.REFERENCE).src)["files"])
    reload = "vllm/model_executor/model_loader/reload/"
    assert f"{reload}lifecycle.py" in new and f"{reload}lifecycle.py" not in old
    assert {f"{reload}layerwise.py", f"{reload}meta.py"} <= old & new


@pytest.mark.parametrize("version", fetch.DEFAULT_VERSIONS)
def test_the_harness_runs_upstream_files(version, up_at):
    # The definitions come from the extracted files, compiled with their own names and lines.
    up = up_at(version)
    assert up.version == version and up.root == root_of(version)
    assert Path(up.WeightsMapper._map_name_with_shard.__code__.co_filename).is_relative_to(up.src)
    assert up.AutoWeightsLoader.__module__ == f"{up.root}.model_executor.models.utils"
    spans = {name for x in up.extracted for name, _, _ in x.spans}
    assert {"WeightsMapper", "AutoWeightsLoader", "default_weight_loader"} <= spans


def test_two_versions_side_by_side(up_at):
    # Each version's code reads its own modules, even through an import inside a function.
    old, new = up_at(fetch.OLD), up_at(fetch.REFERENCE)
    assert old.WeightsMapper is not new.WeightsMapper
    assert hasattr(new.WeightsMapper, "map_name") and not hasattr(old.WeightsMapper, "map_name")
    assert "skip_prefixes" in old.AutoWeightsLoader.__init__.__code__.co_varnames
    assert "skip_prefixes" not in new.AutoWeightsLoader.__init__.__code__.co_varnames
    assert old.reload.__name__ == f"{old.root}.model_executor.model_loader.reload"
    assert new.reload.weight_update_active.__module__.startswith(new.root + ".")
