"""The notebooks in a real JupyterLab in a real browser: clicking the toggle changes the chart.

nbval proves cells run and print what they printed; these tests prove that a person who runs the
notebook in JupyterLab and clicks the main toggle sees the chart become what the library computes
for that behaviour. Each bug notebook's FIRST ToggleButtons is its main old/new toggle and its FIRST
plotly figure is the chart that toggle drives; its story module's ``main_records()`` are the
records the toggle swaps between.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

import pytest
from lab_page import NotebookPage
from lab_server import REPO, LabServer
from toggle_check import assert_toggle_drives_chart
from toy_story import main_records as toy_records
from toy_story import write_toy_notebook

from loadkit.demo.scenario import Record

# notebook -> the story module whose main_records() its main toggle swaps between.
BUG_NOTEBOOKS = {
    "01_pooling_probe.ipynb": "loadkit.demo.stories.pooling_probe",
    "02_plamo2_autoweightsloader.ipynb": "loadkit.demo.stories.plamo2",
    "03_layerwise_reload.ipynb": "loadkit.demo.stories.reload",
    "05_tensor_parallel.ipynb": "loadkit.demo.stories.tensor_parallel",
}


def run_in_page_and_toggle(
    open_notebook: Callable[[str], NotebookPage],
    lab: LabServer,
    name: str,
    records: dict[str, Record],
    evidence: Path,
    chart_timeout: float = 10.0,
) -> list[str]:
    """Open ``name`` in JupyterLab, Run All in the page, click every option of the main toggle."""
    page = open_notebook(name)
    with page.evidence_on_failure(evidence, extra=f"JupyterLab log: {lab.log_path}"):
        page.open()
        page.clear_outputs()
        page.run_all()
        page.wait_run_finished()
        return assert_toggle_drives_chart(page, records, timeout=chart_timeout)


def test_generated_notebook_toggle_drives_chart(open_notebook, lab, lab_root, tmp_path):
    name = write_toy_notebook(lab_root / "notebooks").name
    clicked = run_in_page_and_toggle(open_notebook, lab, name, toy_records(), tmp_path)
    assert clicked == ["old", "new", "old"]


def test_static_copy_of_the_figure_fails_the_check(open_notebook, lab, lab_root, tmp_path):
    """The test can fail: a static copy displayed in place of the live widget is caught."""
    name = write_toy_notebook(lab_root / "notebooks", "toy_static_copy.ipynb", broken=True).name
    with pytest.raises(AssertionError, match="did not follow") as failure:
        run_in_page_and_toggle(open_notebook, lab, name, toy_records(), tmp_path, chart_timeout=3)
    message = str(failure.value)
    assert f"screenshot: {tmp_path / 'toy_static_copy-failure.png'}" in message
    assert (tmp_path / "toy_static_copy-failure.png").stat().st_size > 0
    assert (tmp_path / "toy_static_copy-console.txt").read_text().startswith("console errors")


@pytest.mark.parametrize("name", list(BUG_NOTEBOOKS))
def test_bug_notebook_toggle_drives_chart(name, open_notebook, lab, tmp_path):
    assert (REPO / "notebooks" / name).exists(), f"notebooks/{name} is gone (renamed?)"
    records = importlib.import_module(BUG_NOTEBOOKS[name]).main_records()
    clicked = run_in_page_and_toggle(open_notebook, lab, name, records, tmp_path)
    assert set(clicked) == set(records)


def test_tensor_parallel_toggles_tp_and_bug(open_notebook, lab, tmp_path):
    """Notebook 05's other toggles: tp (second) and bug (third) rebuild what the main one shows."""
    name = "05_tensor_parallel.ipynb"
    story = importlib.import_module(BUG_NOTEBOOKS[name])
    page = open_notebook(name)
    with page.evidence_on_failure(tmp_path, extra=f"JupyterLab log: {lab.log_path}"):
        page.open()
        page.clear_outputs()
        page.run_all()
        page.wait_run_finished()
        for tp, bug in [("4", "kv-replication"), ("4", "gguf-rank"), ("1", "gguf-rank")]:
            page.click_toggle_at(1, tp)
            page.click_toggle_at(2, bug)
            clicked = assert_toggle_drives_chart(page, story.records(bug, int(tp)), timeout=15)
            assert set(clicked) == {"old", "new"}
