"""Header-only means size-independent: 64 GiB on paper and 2000+ names report in well under 1 s."""

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "inspect_speed.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("inspect_speed", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed(*args):
    start = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "loadkit", "inspect", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return time.perf_counter() - start, res


def test_64_sparse_gib_tensors_open_without_reading_them(tmp_path, bench):
    path = bench.make_sparse64(tmp_path)
    assert path.stat().st_size > 64 * 2**30
    assert path.stat().st_blocks * 512 < 2**20  # a hole: the tensor bytes are not even on disk
    timed(path)  # warm-up
    seconds, res = timed(path, "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["checkpoint"]["tensor_count"] == 64
    assert doc["checkpoint"]["bytes"] == 64 * 2**30
    assert seconds < 1.0, seconds


def test_an_index_of_2000_names_reports_fast(tmp_path, bench):
    folder = bench.make_index2k(tmp_path)
    timed(folder)
    seconds, res = timed(folder)
    assert res.returncode == 0, res.stderr
    assert "8 file(s), 2051 tensors" in res.stdout
    assert "layers.{0-63}" in res.stdout and "experts.{0-7}" in res.stdout
    assert seconds < 1.0, seconds


def test_benchmark_prints_its_json_line(tmp_path, bench, monkeypatch, capsys):
    monkeypatch.setattr(bench, "OUT", tmp_path)
    monkeypatch.setattr(sys, "argv", ["inspect_speed.py", "--runs", "1"])
    assert bench.main() == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(last) == {"tensors", "inspect_s", "raw_parse_s", "ratio"}
    assert last["tensors"] == 64 + 2051
    assert last["ratio"] == pytest.approx(last["inspect_s"] / last["raw_parse_s"], rel=0.01)
