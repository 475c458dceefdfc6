"""Where the stories find data/: told by $LOADKIT_DATA, else found from the current folder; the
library itself never looks for it (an installed copy has no repository beside it)."""

import os
import shutil
import subprocess
import sys

import pytest
from repo_paths import DATA, NOTEBOOKS, REPO

from loadkit.errors import LoadkitError
from loadkit_notebooks.stories import find_data


def test_found_from_the_notebooks_folder_and_from_the_repository(monkeypatch):
    monkeypatch.delenv("LOADKIT_DATA", raising=False)
    assert find_data(NOTEBOOKS) == find_data(REPO) == DATA


def test_told_by_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LOADKIT_DATA", str(tmp_path))
    assert find_data(NOTEBOOKS) == tmp_path


def test_a_folder_outside_any_repository_is_an_error_that_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.delenv("LOADKIT_DATA", raising=False)
    (tmp_path / "data").mkdir()  # a data/ folder that is not loadkit's (no generate.py)
    with pytest.raises(LoadkitError, match="LOADKIT_DATA"):
        find_data(tmp_path)


@pytest.mark.slow  # a fresh interpreter importing torch
def test_an_installed_copy_finds_the_repository_data_from_the_notebooks(tmp_path):
    """loadkit copied elsewhere (as an install puts it in site-packages), run in notebooks/:
    the stories still load the repository's checkpoints, and no model module names a path."""
    site = tmp_path / "site"
    shutil.copytree(REPO / "loadkit", site / "loadkit")
    code = (
        "import loadkit_notebooks.stories as st, loadkit.models.gemma4 as g4\n"
        "ck = st.DATA_DIR / 'llama_like' / 'model.safetensors'\n"
        "print(g4.__file__); print(ck); print(ck.is_file())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LOADKIT_DATA"}
    env["PYTHONPATH"] = str(site)
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=NOTEBOOKS,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    module, checkpoint, exists = out.stdout.split()
    assert module.startswith(str(site)) and exists == "True"
    assert checkpoint == str(DATA / "llama_like" / "model.safetensors")
