"""The committed checkpoints in data/ are exactly what the committed generator makes."""

import filecmp
import importlib.util
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data"


def _generator():
    spec = importlib.util.spec_from_file_location("data_generate", DATA / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generator_reproduces_every_committed_checkpoint(tmp_path):
    written = _generator().generate(tmp_path)
    assert written, "the generator wrote nothing"
    fresh = {p.relative_to(tmp_path) for p in written}
    committed = {p.relative_to(DATA) for p in DATA.rglob("*.safetensors")} | {
        p.relative_to(DATA) for p in DATA.rglob("*.index.json")
    }
    committed = {p for p in committed if p.parts[0] != "big"}  # benchmark output, git-ignored
    assert committed <= fresh, f"committed but not generated: {sorted(committed - fresh)}"
    for rel in sorted(fresh):
        assert (DATA / rel).exists(), f"generated but not committed: data/{rel}"
        assert filecmp.cmp(tmp_path / rel, DATA / rel, shallow=False), f"data/{rel} differs"
