"""The committed checkpoints in data/ are exactly what the committed generator makes.

This is the one byte-for-byte check of data/ (the model tests check what the values mean).
`.ci/run` runs this file a second time under ATEN_CPU_CAPABILITY=default, torch's plain kernels:
bytes that only one CPU family reproduces fail there.
"""

import filecmp
import importlib.util
from pathlib import Path

import torch

from loadkit import open_checkpoint

DATA = Path(__file__).resolve().parent.parent / "data"
# Values that are functions of grid values (loadkit.models.dyadic.round_once), not grid values.
ROUNDED_ONCE = ("mixer.A_log", "mixer.dt_bias")
FINEST_GRID = 2**-10


def _generator():
    spec = importlib.util.spec_from_file_location("data_generate", DATA / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def committed_files():
    files = {p.relative_to(DATA) for p in DATA.rglob("*.safetensors")} | {
        p.relative_to(DATA) for p in DATA.rglob("*.index.json")
    }
    return {p for p in files if p.parts[0] != "big"}  # benchmark output, git-ignored


def test_generator_reproduces_every_committed_checkpoint(tmp_path):
    written = _generator().generate(tmp_path)
    assert written, "the generator wrote nothing"
    fresh = {p.relative_to(tmp_path) for p in written}
    committed = committed_files()
    assert committed <= fresh, f"committed but not generated: {sorted(committed - fresh)}"
    for rel in sorted(fresh):
        assert (DATA / rel).exists(), f"generated but not committed: data/{rel}"
        assert filecmp.cmp(tmp_path / rel, DATA / rel, shallow=False), f"data/{rel} differs"


def test_committed_values_lie_on_dyadic_grids():
    """Integers scaled by powers of two: exact in any float dtype, no float kernel involved."""
    checked = 0
    for rel in sorted(p for p in committed_files() if p.suffix == ".safetensors"):
        for name, tensor in open_checkpoint(DATA / rel).weights():
            if name.endswith(ROUNDED_ONCE):
                continue
            scaled = tensor.double() / FINEST_GRID
            assert torch.equal(scaled, scaled.round()), f"data/{rel}: {name} is off the grid"
            checked += 1
    assert checked > 200, checked
