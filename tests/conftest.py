import importlib.util
import sys
from pathlib import Path

import pytest
from hypothesis import settings

REPO = Path(__file__).resolve().parent.parent

# Same examples on every run: CI failures must reproduce.
settings.register_profile("loadkit", derandomize=True, deadline=None)
settings.load_profile("loadkit")


def _script(path: Path, name: str):
    """A script beside the library (data/, benchmarks/) imported as a module, as run."""
    sys.path.insert(0, str(path.parent))  # its own folder first, as when it is run
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


@pytest.fixture(scope="session")
def data_generator():
    """``data/generate.py``: the writers of the committed checkpoints."""
    return _script(REPO / "data" / "generate.py", "data_generate")


@pytest.fixture(scope="session")
def gemma4_bench():
    """``benchmarks/gemma4_checkpoint.py``: presets and the streaming checkpoint writer."""
    return _script(REPO / "benchmarks" / "gemma4_checkpoint.py", "gemma4_checkpoint")
