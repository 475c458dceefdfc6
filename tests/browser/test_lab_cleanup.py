"""No JupyterLab server, kernel or browser outlives the test run that started it.

A pytest run is started in a real process, opens a notebook in JupyterLab in headless Chromium and
runs it; while its cell is still running, the run is killed with SIGKILL (no finaliser, no atexit,
nothing of pytest's runs). Every process it had started must be gone a few seconds later. The
inner run itself dies with this test's process (``lab_guard.dies_with_parent``): a SIGKILLed
outer run leaves no inner run behind either (``test_browser_helpers`` proves the mechanism).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from conftest import SKIP_REASON
from lab_guard import dies_with_parent

HERE = Path(__file__).resolve().parent

INNER = """
import json, os, sys, time, urllib.request
sys.path.insert(0, {here!r})
import nbformat
from lab_page import CHROMIUM_ARGS, NotebookPage
from lab_server import LabServer
from playwright.sync_api import sync_playwright


def test_a_notebook_still_running(tmp_path):
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    cell = nbformat.v4.new_code_cell("import time\\ntime.sleep(600)")
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), notebooks / "long.ipynb")
    server = LabServer(notebooks, tmp_path / "home")
    server.start()
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path="/usr/bin/chromium",
            args=CHROMIUM_ARGS, headless=True,
        )
        page = NotebookPage(context, server.url, "long.ipynb")
        page.open()
        page.run_all()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with urllib.request.urlopen(server.url + "/api/kernels", timeout=5) as r:
                if any(k["execution_state"] == "busy" for k in json.load(r)):
                    break
            time.sleep(0.2)
        else:
            raise AssertionError("the notebook's cell never started running")
        with open(os.environ["LOADKIT_PIDS"] + ".part", "w") as f:
            json.dump(server.pids(), f)
        os.replace(os.environ["LOADKIT_PIDS"] + ".part", os.environ["LOADKIT_PIDS"])
        time.sleep(600)  # killed long before
"""


def _cmdlines(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(" ".join(p.cmdline()))
        except psutil.Error:
            pass
    return out


@pytest.mark.slow  # a pytest run in a real process, JupyterLab, a kernel and Chromium
def test_a_sigkilled_test_run_leaves_no_server_kernel_or_browser(tmp_path):
    if SKIP_REASON:
        pytest.skip(f"browser tests skipped: {SKIP_REASON}")
    inner = tmp_path / "test_inner.py"
    inner.write_text(textwrap.dedent(INNER.format(here=str(HERE))))
    pids_file = tmp_path / "pids.json"
    env = dict(os.environ, LOADKIT_PIDS=str(pids_file))
    run = subprocess.Popen(  # ends with this process too, however it ends (nested runs)
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(inner)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=dies_with_parent(os.getpid()),
    )
    try:
        deadline = time.monotonic() + 180
        while not pids_file.exists():
            if run.poll() is not None or time.monotonic() > deadline:
                output = run.stdout.read().decode() if run.stdout else ""
                pytest.fail(f"the inner run never reached its running cell:\n{output}")
            time.sleep(0.2)
        started = psutil.Process(run.pid).children(recursive=True)  # Chromium and its driver too
        lab = [psutil.Process(pid) for pid in json.loads(pids_file.read_text())]
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=30)
    names = _cmdlines(lab)
    assert any("jupyter-lab" in c or "jupyter lab" in c for c in names), names
    assert any("ipykernel" in c for c in names), names  # the running notebook's kernel
    everything = {p.pid: p for p in [*started, *lab]}.values()
    _, alive = psutil.wait_procs(list(everything), timeout=20)
    left = _cmdlines(alive)
    for p in alive:  # never leave them behind, even when the assertion fails
        p.kill()
    assert not left, f"still running 20 s after the test run was killed: {left}"
