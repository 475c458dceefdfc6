"""The browser tests' own helpers, checked without a browser (these run everywhere)."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from lab_guard import dies_with_parent
from lab_server import REPO, lab_argv, make_lab_command
from toggle_check import click_order, describe_difference, expected_traces, title_shows
from toy_story import main_records

from loadkit_notebooks.viz import figure, figure_data, record_view


def test_lab_command_is_the_makefiles():
    argv = make_lab_command()
    assert Path(argv[0]) == REPO / ".venv" / "bin" / "jupyter"
    assert argv[1] == "lab" and "--notebook-dir=notebooks" in argv
    assert ("--allow-root" in argv) == (os.geteuid() == 0)
    served = lab_argv(Path("/tmp/x"), 8899)
    assert "--notebook-dir=/tmp/x" in served and "--notebook-dir=notebooks" not in served
    assert {"--no-browser", "--port=8899", "--ip=127.0.0.1", "--IdentityProvider.token="} <= set(
        served
    )


def test_expected_traces_are_what_the_live_chart_shows_after_a_toggle():
    records = main_records()
    view = record_view(records, figure)
    view.toggle.value = "new"
    live = view.chart.spec["data"]  # what the page receives
    assert [(t["name"], t["x"], t["y"]) for t in live] == [
        (t["name"], t["x"], t["y"]) for t in expected_traces(records["new"])
    ]
    title = view.chart.fig.layout.title.text
    assert title_shows(title, "new") and not title_shows("t [new]", "old")
    assert "running count: 3 points, from 6 to 18 (min 6, max 18)" in figure_data(view.chart)


def test_the_two_behaviours_draw_different_charts():
    records = main_records()
    old, new = expected_traces(records["old"]), expected_traces(records["new"])
    assert old != new
    report = describe_difference(old, new)
    assert "'running count': y differs at 3 of 3 points" in report
    assert "traces equal" in describe_difference(old, old)


def test_click_order_reaches_every_option_by_a_change():
    assert click_order(["old", "new"]) == ["old", "new", "old"]
    assert click_order(["old", "new"], "old") == ["new", "old", "new"]  # no click without change
    order = click_order(["old", "new", "moved-verbatim", "loose-match"], "new")
    assert order == ["moved-verbatim", "loose-match", "old", "new", "moved-verbatim"]
    for active in (None, "old", "new"):
        clicks = click_order(["old", "new", "x"], active)
        assert clicks[0] != active and all(a != b for a, b in itertools.pairwise(clicks))


NO_PLAYWRIGHT = """
import sys
sys.modules["playwright"] = None  # import playwright fails, find_spec("playwright") is None
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


def test_browser_folder_collects_and_runs_without_playwright():
    """Without playwright: the helper tests run, the browser tests skip, one line says why."""
    res = subprocess.run(
        [sys.executable, "-c", NO_PLAYWRIGHT, "tests/browser", "-q",
         "-k", "not without_playwright and not nested"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=dies_with_parent(os.getpid()),  # a nested run: ends with this process
    )  # fmt: skip
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "error" not in out.lower(), out
    assert "BROWSER TESTS SKIPPED: Python playwright is not installed" in out, out
    assert re.search(r"\b4 passed\b", out), out


# A test process (the middle) starts a nested run (a long sleep, standing in for an inner pytest
# run), prints its pid, and waits; the middle is then SIGKILLed, as a test run killed by a CI's
# timeout is. ``armed``: the nested run is started with ``dies_with_parent``, as the browser
# tests start theirs.
MIDDLE = """
import os, subprocess, sys, time
sys.path.insert(0, {here!r})
from lab_guard import dies_with_parent
extra = {{"preexec_fn": dies_with_parent(os.getpid())}} if {armed} else {{}}
inner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], **extra)
print(inner.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("armed", [True, False], ids=["dies_with_parent", "unarmed"])
def test_a_nested_run_ends_with_the_sigkilled_test_that_started_it(armed):
    here = str(Path(__file__).resolve().parent)
    middle = subprocess.Popen(
        [sys.executable, "-c", MIDDLE.format(here=here, armed=armed)],
        stdout=subprocess.PIPE,
        text=True,
    )
    inner = None
    try:
        assert middle.stdout is not None
        inner = psutil.Process(int(middle.stdout.readline()))
        assert inner.is_running() and inner.ppid() == middle.pid
    finally:
        middle.kill()  # SIGKILL: no finaliser of the middle runs
        middle.wait(timeout=10)
    try:
        gone, _ = psutil.wait_procs([inner], timeout=10)
        # armed: gone within seconds; unarmed (the control): still running, re-parented
        assert bool(gone) == armed, (
            f"armed={armed}: the nested run {'outlived' if armed else 'ended with'} its parent"
        )
    finally:
        if inner.is_running():
            inner.kill()
