"""transformers is the ``hf`` extra: loadkit runs without it; ``--model hf`` says what to install.

transformers is installed here (``make setup`` installs every extra), so each test makes its
import fail in a fresh process: ``sys.modules["transformers"] = None`` is how Python marks a
module that must not be imported (``import transformers`` then raises ``ImportError``), the same
error an environment without the package gives.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from repo_paths import DATA, REPO

from loadkit.models.transformers.config import INSTALL_HINT
from loadkit.terms import VLLM_VERSION

WITHOUT_TRANSFORMERS = """
import runpy, sys
sys.modules["transformers"] = None  # import transformers -> ImportError, as when not installed
"""


def run_without_transformers(body: str) -> subprocess.CompletedProcess[str]:
    code = WITHOUT_TRANSFORMERS + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO
    )


def cli_without_transformers(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m loadkit_inspect ARGS`` with transformers unimportable."""
    return run_without_transformers(
        f"""
        sys.argv = ["loadkit", *{list(args)!r}]
        runpy.run_module("loadkit_inspect", run_name="__main__", alter_sys=True)
        """
    )


@pytest.fixture
def hf_folder(tmp_path):
    """A folder as save_pretrained leaves it: a config.json beside the weights (any will do:
    the command must stop before it reads them)."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "model.safetensors").write_bytes(
        (DATA / "plamo2" / "untied.safetensors").read_bytes()
    )
    return tmp_path


def test_the_block_really_blocks():
    # The shim is what the other tests rely on: with it, importing transformers fails.
    out = run_without_transformers(
        """
        try:
            import transformers
        except ImportError as exc:
            print("ImportError", exc)
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ImportError")


@pytest.mark.slow
def test_model_hf_without_transformers_is_one_exit_2_line(hf_folder):
    out = cli_without_transformers("inspect", str(hf_folder), "--model", "hf")
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr  # one line, no traceback
    assert "--model hf needs transformers" in lines[0]
    assert lines[0].endswith(INSTALL_HINT) and INSTALL_HINT == "pip install 'loadkit[hf]'"


@pytest.mark.slow
def test_model_hf_json_without_transformers_says_it_in_the_document(hf_folder):
    out = cli_without_transformers("inspect", str(hf_folder), "--model", "hf", "--json")
    assert out.returncode == 2
    doc = json.loads(out.stdout)
    assert doc["exit_status"] == 2 and INSTALL_HINT in doc["error"]


@pytest.mark.slow
def test_a_missing_config_still_fails_first(tmp_path):
    # The checks that need no transformers come first: their message, not the install hint.
    (tmp_path / "model.safetensors").write_bytes(
        (DATA / "plamo2" / "untied.safetensors").read_bytes()
    )
    out = cli_without_transformers("inspect", str(tmp_path), "--model", "hf")
    assert out.returncode == 2
    assert "config" in out.stderr and INSTALL_HINT not in out.stderr


@pytest.mark.slow
def test_everything_else_runs_without_transformers():
    """Every loadkit module imports, and the built-in models inspect and load, with transformers
    unimportable."""
    out = run_without_transformers(
        f"""
        import importlib, json, pathlib
        import loadkit
        names = []
        root = pathlib.Path(loadkit.__file__).parent.parent
        packages = ("loadkit", "loadkit_inspect", "loadkit_notebooks")
        for path in sorted(p for part in packages for p in (root / part).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            if parts[-1] != "__main__":
                names.append(".".join(parts))
        for name in names:
            importlib.import_module(name)
        from loadkit_inspect import inspect_checkpoint
        from loadkit.models.plamo2 import Plamo2Config, Plamo2ForCausalLM, make_checkpoint
        report = inspect_checkpoint({str(DATA / "plamo2" / "untied.safetensors")!r}, model="plamo2")
        config = Plamo2Config()
        model = Plamo2ForCausalLM(config)
        loaded = model.load_weights((k, v.clone()) for k, v in make_checkpoint(config).items())
        print(json.dumps({{"modules": len(names), "clean": report.clean,
                          "loaded": len(loaded), "transformers": sys.modules["transformers"]}}))
        """
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["modules"] > 50 and result["clean"] is True and result["loaded"] > 10
    assert result["transformers"] is None  # still blocked: nothing got round the shim


@pytest.mark.slow
def test_a_built_in_model_on_the_command_line_without_transformers():
    out = cli_without_transformers(
        "inspect", str(DATA / "plamo2" / "untied.safetensors"), "--model", "plamo2"
    )
    assert out.returncode == 0, out.stderr
    assert f"verdict: vllm {VLLM_VERSION}: would load cleanly" in out.stdout
