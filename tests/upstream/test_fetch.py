"""The fetch step fails loudly, and notices a changed cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from upstream import fetch


def test_no_index_fails_with_a_message(tmp_path):
    env = {
        **os.environ,
        "LOADKIT_UPSTREAM_CACHE": str(tmp_path / "cache"),
        "PIP_NO_INDEX": "1",  # no package index at all
        "PIP_FIND_LINKS": str(tmp_path),  # and nothing to find locally
    }
    proc = subprocess.run(
        [sys.executable, fetch.__file__], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    assert "pip download of vllm==0.28.0 failed" in proc.stderr
    assert not (tmp_path / "cache" / fetch.WHEEL).exists()


def test_extracted_sources_are_checked_against_the_record(up, tmp_path):
    src = fetch.source_dir()
    assert fetch._extracted_ok(src)
    copy = tmp_path / "src"
    for rel in [*fetch.SOURCES, fetch.MARKER]:
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        (copy / rel).write_bytes((src / rel).read_bytes())
    assert fetch._extracted_ok(copy)
    edited = copy / fetch.SOURCES[0]
    edited.write_text(edited.read_text() + "\n# edited\n")
    assert not fetch._extracted_ok(copy)  # ensure_sources would extract again


def test_the_harness_runs_upstream_files(up):
    # The definitions come from the extracted files, compiled with their own names and lines.
    src = fetch.source_dir()
    assert Path(up.WeightsMapper._map_name_with_shard.__code__.co_filename).is_relative_to(src)
    assert up.AutoWeightsLoader.__module__ == "vllm.model_executor.models.utils"
    spans = {name for x in up.extracted for name, _, _ in x.spans}
    assert {"WeightsMapper", "AutoWeightsLoader", "default_weight_loader"} <= spans
