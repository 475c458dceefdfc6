"""Hypothesis profiles for the property tests (the tests using ``@given``).

- ``loadkit`` (loaded by default; ``make test`` and CI): derandomized, the same examples on every
  run, so a failure in CI reproduces anywhere.
- ``deep`` (``make test-deep``, i.e. ``pytest --hypothesis-profile=deep -m hypothesis tests``):
  random seeds and ten times the examples. A failure prints the falsifying example and a
  ``@reproduce_failure`` blob; ``--hypothesis-seed=N`` replays a whole run.

A test that sets its own ``max_examples`` scales it from ``settings().max_examples`` (the loaded
profile's), so the deep profile multiplies it too.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings
from repo_paths import DATA

REPO = Path(__file__).resolve().parent.parent

EXAMPLES = 100
DEEP_FACTOR = 10

settings.register_profile("loadkit", derandomize=True, deadline=None, max_examples=EXAMPLES)
settings.register_profile(
    "deep",
    derandomize=False,
    deadline=None,
    max_examples=DEEP_FACTOR * EXAMPLES,
    print_blob=True,
)
settings.load_profile("loadkit")  # hypothesis' --hypothesis-profile option loads after this

PASTE_TEST = "test_fix_pasted.py"


def pytest_collection_modifyitems(config, items):
    """The paste test runs after every other test: it pastes what they produced."""
    items.sort(key=lambda item: item.path.name == PASTE_TEST)


# Every `loadkit inspect` run of ``loadkit_cli`` that printed a suggested --mapper (in
# its text or its --json), for the paste test too: (arguments, working folder, environment added,
# what it printed).
CLI_SUGGESTIONS: list[tuple[list[str], str | None, dict[str, str], str]] = []


def _printed_a_fix(args: list[str], stdout: str) -> bool:
    if not args or args[0] != "inspect":
        return False
    return '"flag": "--mapper ' in stdout or "\n  --mapper '" in stdout


@pytest.fixture
def cli_suggestions_seen():
    """The CLI runs so far in this process that printed a suggested fix."""
    return list(CLI_SUGGESTIONS)


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
def large_layout_bench():
    """``benchmarks/large_layout.py``: the DeepSeek-V3-sized layout and its sparse writer."""
    return _script(REPO / "benchmarks" / "large_layout.py", "large_layout")


@pytest.fixture(scope="session")
def gemma4_bench():
    """``benchmarks/gemma4_checkpoint.py``: presets and the streaming checkpoint writer."""
    return _script(REPO / "benchmarks" / "gemma4_checkpoint.py", "gemma4_checkpoint")


@pytest.fixture(scope="session")
def llama_bench():
    """``benchmarks/llama_checkpoint.py``: presets and the command line."""
    return _script(REPO / "benchmarks" / "llama_checkpoint.py", "llama_checkpoint")


@pytest.fixture(scope="session")
def quiet_transformers():
    """transformers' warnings and progress bars off (``hf_cases``), for the whole session."""
    from hf_cases import quiet_transformers

    quiet_transformers()


@pytest.fixture(scope="session")
def plamo2_broken(tmp_path_factory):
    """data/plamo2/untied.safetensors with notebook 04's three export mistakes, written by the
    notebook's own ``broken_copy`` into a temporary folder: the notebook's copy under data/big/
    exists only once it has run."""
    from notebook_code import notebook_namespace

    broken_copy = notebook_namespace("04_debug_your_checkpoint.ipynb")["broken_copy"]
    path = tmp_path_factory.mktemp("debug") / "plamo2-broken.safetensors"
    return Path(broken_copy(str(DATA / "plamo2" / "untied.safetensors"), str(path)))


@pytest.fixture(scope="session")
def hf_clean(tmp_path_factory, quiet_transformers):
    """Architecture name -> its clean checkpoint, written by transformers (``hf_cases``) once per
    session, on first use."""
    from hf_cases import clean_checkpoints

    return clean_checkpoints(tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="session")
def loadkit_cli():
    """Runs ``python -m loadkit_inspect ARGS`` in a fresh process and returns the
    ``CompletedProcess`` (text output). ``COLUMNS`` is removed from the environment, so help and
    usage text has one width on every terminal; ``env`` adds or overrides variables."""

    def run(*args, cwd=None, timeout=120, env=None):
        environ = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
        environ.update(env or {})
        argv = [str(a) for a in args]
        res = subprocess.run(
            [sys.executable, "-m", "loadkit_inspect", *argv],
            capture_output=True,
            text=True,
            cwd=cwd,
            env=environ,
            timeout=timeout,
        )
        if _printed_a_fix(argv, res.stdout):
            folder = None if cwd is None else str(cwd)
            CLI_SUGGESTIONS.append((argv, folder, dict(env or {}), res.stdout))
        return res

    return run
