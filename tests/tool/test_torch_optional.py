"""torch is the ``torch`` extra: ``pip install loadkit`` gives the header-only inspect and the
library's torch-free parts; whatever needs torch says, in one line, which extra to install.

torch is installed here (``make setup`` installs every extra), so each test makes its import
fail in a fresh process: ``sys.modules["torch"] = None`` is how Python marks a module that must
not be imported (``import torch`` then raises ``ImportError``), as an environment without the
package does (``tests/tool/test_transformers_optional.py`` does the same for transformers).
``.ci/run`` also installs the package into a fresh virtual environment without torch.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib

import pytest
from repo_paths import DATA, REPO

from loadkit.errors import TORCH_HINT

WITHOUT_TORCH = """
import runpy, sys
sys.modules["torch"] = None  # import torch -> ImportError, as when not installed
"""


def run_without_torch(body: str) -> subprocess.CompletedProcess[str]:
    code = WITHOUT_TORCH + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO
    )


def cli_without_torch(*args: str) -> subprocess.CompletedProcess[str]:
    """``loadkit ARGS`` (the console script's entry) with torch unimportable."""
    return run_without_torch(
        f"""
        sys.argv = ["loadkit", *{list(args)!r}]
        runpy.run_module("loadkit_inspect", run_name="__main__", alter_sys=True)
        """
    )


def test_the_block_really_blocks():
    out = run_without_torch("import torch")
    assert out.returncode == 1 and "ModuleNotFoundError: import of torch halted" in out.stderr


@pytest.mark.parametrize(
    "checkpoint", ["plamo2/untied.safetensors", "plamo2/tied-with-lm-head", "gemma4_like"]
)
def test_header_only_inspect_runs_without_torch(checkpoint):
    out = cli_without_torch("inspect", str(DATA / checkpoint))
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip().endswith(
        "verdict: headers valid; no model given, so names were not matched (exit 0)"
    )
    assert out.stderr == ""


def test_header_only_python_api_runs_without_torch():
    out = run_without_torch(
        f"""
        from loadkit import WeightsMapper, open_checkpoint, predict_probe
        from loadkit_inspect import inspect_checkpoint

        ck = open_checkpoint({str(DATA / "plamo2" / "untied.safetensors")!r})
        print(len(ck), WeightsMapper(orig_to_new_prefix={{"model.": ""}}).map_name("model.x"))
        print(inspect_checkpoint(ck.files[0]).exit_status)
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["30", "x", "0"]


@pytest.mark.parametrize(
    "args",
    [
        ["--model", "plamo2"],
        ["--model", "llama-like", "--tp", "2"],
        ["--model", "hf"],
        ["--model", "plamo2", "--json"],
    ],
    ids=lambda a: " ".join(a),
)
def test_inspect_with_a_model_says_which_extra_in_one_line(args):
    out = cli_without_torch("inspect", str(DATA / "plamo2" / "untied.safetensors"), *args)
    assert out.returncode == 2
    (line,) = out.stderr.splitlines()
    assert line.startswith("loadkit inspect: error: --model ") and "needs torch" in line
    assert line.endswith(TORCH_HINT)
    assert "Traceback" not in out.stdout + out.stderr


@pytest.mark.parametrize(
    "statement",
    [
        "from loadkit import AutoWeightsLoader",
        "from loadkit import as_pooling_model",
        "import loadkit.loading.weight_loaders",
        "import loadkit.models.plamo2",
        "import loadkit.models.gemma4",
        "import loadkit.parallel",
        "import loadkit.reload.layerwise",
        "import loadkit.executor.launcher",
        "import loadkit_inspect.simulate",
        "from loadkit import open_checkpoint; "
        f"next(open_checkpoint({str(DATA / 'gemma4_like')!r}).weights())",
    ],
)
def test_torch_parts_fail_with_one_line_naming_the_extra(statement):
    out = run_without_torch(
        f"""
        from loadkit.errors import MissingExtraError
        try:
            {statement}
        except MissingExtraError as exc:  # an ImportError too
            assert isinstance(exc, ImportError)
            print(exc)
        """
    )
    assert out.returncode == 0, out.stderr
    (line,) = out.stdout.splitlines()
    assert line.endswith(f" needs torch, which is not installed: {TORCH_HINT}")


def test_torch_is_an_extra_and_make_setup_installs_it():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("torch")]
    assert project["optional-dependencies"]["torch"] == ["torch>=2.4"]
    assert "-e '.[torch,hf,notebooks,dev]'" in (REPO / "Makefile").read_text()
    assert "-e .[torch,hf,notebooks,dev]" in (REPO / "environment.yml").read_text()
