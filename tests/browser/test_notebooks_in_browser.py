"""The notebooks in a real JupyterLab in a real browser: clicking the toggle changes the chart.

nbval proves cells run and print what they printed; these tests prove that a person who runs the
notebook in JupyterLab and clicks the main toggle sees the chart become what the library computes
for that option, that re-running the toggle's cell gives a toggle that still works, that the page
logs no error, that every chart fills its output area, and that after Run All the toggle sits
where the notebook's text says. Each bug notebook's FIRST ToggleButtons is its main toggle and
the first chart after it is the chart that toggle drives.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from lab_page import PLOT, NotebookPage
from lab_server import REPO, LabServer
from notebook_code import notebook_namespace
from toggle_check import (
    assert_toggle_drives_chart,
    describe_difference,
    expected_traces,
    page_traces,
)
from toy_story import main_records as toy_records
from toy_story import write_toy_notebook

from loadkit_notebooks.scenario import Record
from loadkit_notebooks.viz import figure

# notebook -> (story module, its function giving the records the main toggle swaps between, its
# function drawing the chart for one record). The first record is where Run All leaves the toggle.
BUG_NOTEBOOKS = {
    # The notebook makes the calls itself; tests/browser/stacked_expected.py makes them again.
    "06_stacked_mapper.ipynb": ("stacked_expected", "main_records", "rows_figure"),
}


def _reload_toggle(ns: dict[str, Any]) -> tuple[dict[str, Record], Callable[[Record], Any]]:
    from loadkit_notebooks.stories import reload as story

    run = functools.cache(ns["reload"])
    return story.main_records(run), functools.partial(story.toggle_figure, reload=run)


def _stream_toggle(ns: dict[str, Any]) -> tuple[dict[str, Record], Callable[[Record], Any]]:
    from loadkit_notebooks.stories import pooling_probe as pp

    records = {s: pp.stream_record(s, ns["runs_of"](s)) for s in ns["STREAMS"]}
    return records, pp.main_figure


def _tp_toggle(ns: dict[str, Any]) -> tuple[dict[str, Record], Callable[[Record], Any]]:
    from loadkit_notebooks.stories import tensor_parallel as story

    return story.main_records(ns["launch"]), story.rows_figure


def _padded_toggle(ns: dict[str, Any]) -> tuple[dict[str, Record], Callable[[Record], Any]]:
    from loadkit_notebooks.stories import padded_reload as story

    run = functools.cache(ns["reload"])
    records = {version: Record(version) for version in ns["VERSIONS"]}
    return records, lambda record: story.count_figure(run(record.behaviour))


# Notebooks whose experiment is a function of their own (a cell tagged "define"): notebook ->
# (records, build) from the names those cells define, computed as the notebook computes them.
DEFINED_TOGGLES: dict[str, Callable[[dict[str, Any]], tuple[dict[str, Record], Any]]] = {
    "01_pooling_probe.ipynb": _stream_toggle,
    "03_layerwise_reload.ipynb": _reload_toggle,
    "05_tensor_parallel.ipynb": _tp_toggle,
    "07_padded_reload.ipynb": _padded_toggle,
}
MIN_WIDTH_SHARE = 0.95  # of the output area, for every chart


def run_in_page_and_toggle(
    open_notebook: Callable[[str], NotebookPage],
    lab: LabServer,
    name: str,
    records: dict[str, Record],
    evidence: Path,
    build: Callable[[Record], Any] = figure,
    chart_timeout: float = 10.0,
    rerun: bool = False,
) -> list[str]:
    """Open ``name`` in JupyterLab, Run All in the page, check where the toggle stands and the
    charts' widths, click every option of the main toggle; with ``rerun``, run the toggle's cell
    again and click every option again. Any console error fails."""
    page = open_notebook(name)
    with page.evidence_on_failure(evidence, extra=f"JupyterLab log: {lab.log_path}"):
        page.open()
        page.clear_outputs()
        page.run_all()
        page.wait_run_finished()
        start = next(iter(records))
        assert page.active_label() == start, (
            f"after Run All the main toggle shows {page.active_label()!r}; the notebook's text "
            f"describes {start!r}"
        )
        narrow = [(round(w), round(a)) for w, a in page.chart_widths() if w < MIN_WIDTH_SHARE * a]
        assert not narrow, f"charts narrower than their output area (chart, area px): {narrow}"
        clicked = assert_toggle_drives_chart(page, records, build, timeout=chart_timeout)
        if rerun:
            page.rerun_cell_of_main_toggle()
            clicked += assert_toggle_drives_chart(page, records, build, timeout=chart_timeout)
        assert not page.errors, f"the page logged errors: {page.errors}"
        return clicked


def test_generated_notebook_toggle_drives_chart(open_notebook, lab, lab_root, tmp_path):
    name = write_toy_notebook(lab_root / "notebooks").name
    clicked = run_in_page_and_toggle(open_notebook, lab, name, toy_records(), tmp_path)
    assert clicked == ["new", "old", "new"]  # from "old", where Run All leaves the toggle


def test_unwired_copy_of_the_chart_fails_the_check(open_notebook, lab, lab_root, tmp_path):
    """The test can fail: a copy of the chart, not wired to the toggle, shown in its place."""
    name = write_toy_notebook(lab_root / "notebooks", "toy_chart_copy.ipynb", broken=True).name
    with pytest.raises(AssertionError, match="did not follow") as failure:
        run_in_page_and_toggle(open_notebook, lab, name, toy_records(), tmp_path, chart_timeout=3)
    message = str(failure.value)
    assert f"screenshot: {tmp_path / 'toy_chart_copy-failure.png'}" in message
    assert (tmp_path / "toy_chart_copy-failure.png").stat().st_size > 0
    assert (tmp_path / "toy_chart_copy-console.txt").read_text().startswith("console errors")


@pytest.mark.parametrize("name", sorted([*BUG_NOTEBOOKS, *DEFINED_TOGGLES]))
def test_bug_notebook_toggle_drives_chart(name, open_notebook, lab, tmp_path):
    assert (REPO / "notebooks" / name).exists(), f"notebooks/{name} is gone (renamed?)"
    if name in DEFINED_TOGGLES:
        records, build = DEFINED_TOGGLES[name](notebook_namespace(name))
    else:
        module, records_fn, build_fn = BUG_NOTEBOOKS[name]
        story = importlib.import_module(module)
        records = getattr(story, records_fn)()
        build = getattr(story, build_fn)
    clicked = run_in_page_and_toggle(open_notebook, lab, name, records, tmp_path, build, rerun=True)
    assert set(clicked) == set(records) and len(clicked) == 2 * (len(records) + 1)


def test_tensor_parallel_toggles_tp_and_bug(open_notebook, lab, tmp_path):
    """Notebook 05's other toggles: tp (second) and bug (third) rebuild what the main one swaps
    between; the row map after each pair of clicks is the story's for that bug and tp."""
    from loadkit_notebooks.stories import tensor_parallel as story

    name = "05_tensor_parallel.ipynb"
    launch = notebook_namespace(name)["launch"]
    page = open_notebook(name)
    with page.evidence_on_failure(tmp_path, extra=f"JupyterLab log: {lab.log_path}"):
        page.open()
        page.clear_outputs()
        page.run_all()
        page.wait_run_finished()
        after_run_all = [page.active_label_at(i) for i in range(3)]
        assert after_run_all == ["old", "2", "gguf-rank"], (
            f"after Run All the toggles show {after_run_all}; the notebook's text describes "
            "old, tp=2, gguf-rank"
        )
        for tp, bug in [("4", "kv-replication"), ("4", "gguf-rank"), ("1", "gguf-rank")]:
            page.click_toggle_at(1, tp)
            page.click_toggle_at(2, bug)
            records = story.records(launch, bug, int(tp))
            clicked = assert_toggle_drives_chart(page, records, story.rows_figure, timeout=15)
            assert set(clicked) == {"old", "new"}
        assert not page.errors, f"the page logged errors: {page.errors}"


def test_stacked_mapper_key_chart_shows_every_key_old_and_new(open_notebook, lab, tmp_path):
    """Notebook 06's first chart (no toggle drives it): every checkpoint key's mapped name and
    shard id, old and new side by side, as the library draws them from fresh traces."""
    import stacked_expected

    page = open_notebook("06_stacked_mapper.ipynb")
    with page.evidence_on_failure(tmp_path, extra=f"JupyterLab log: {lab.log_path}"):
        page.open()
        page.clear_outputs()
        page.run_all()
        page.wait_run_finished()
        fig = stacked_expected.mapping_figure(stacked_expected.mapping())
        state = page.chart_state_at(0)
        assert state["title"] == fig.layout.title.text
        assert page_traces(state) == expected_traces(None, lambda _: fig)  # type: ignore[arg-type]
        (trace,) = state["traces"]
        assert [row[0] for row in trace["z"]].count(2) == 8  # old: q_proj and k_proj, 2 layers
        assert not any(row[1] == 2 for row in trace["z"])  # new: none
        assert not page.errors, f"the page logged errors: {page.errors}"


def test_plamo2_map_shows_every_loader_at_once(open_notebook, lab, tmp_path):
    """Notebook 02 has no toggle: its first chart holds all four loaders. After Run All the page
    draws exactly the library's map of the notebook's own loads, a screen high."""
    from loadkit_notebooks.stories import plamo2 as story

    name = "02_plamo2_autoweightsloader.ipynb"
    ns = notebook_namespace(name)
    loads = {b: ns["load"](b) for b in ns["BEHAVIOURS"]}
    reference = story.reference_state(loads["new"].model, ns["stream"])
    record = story.deviation_map(loads, reference)
    expected = expected_traces(record, story.deviation_figure)
    page = open_notebook(name)
    with page.evidence_on_failure(tmp_path, extra=f"JupyterLab log: {lab.log_path}"):
        page.open()
        page.clear_outputs()
        page.run_all()
        page.wait_run_finished()
        shown = page_traces(page.chart_state_at(0))
        assert shown == expected, describe_difference(shown, expected)
        height = page.page.locator(PLOT).first.bounding_box()["height"]
        assert height <= 600, f"the map is {height:.0f} px high: more than a screen with its text"
        assert not page.errors, f"the page logged errors: {page.errors}"


# --- the widgets that are not a main toggle: 04's panel, 00's name dropdown, 03's dropdowns ------

TREEMAP_JS = """
(el) => ({
  title: (el.layout.title && el.layout.title.text) || '',
  traces: (el.data || []).length,
  ids: el.data && el.data.length ? Array.from(el.data[0].ids) : [],
  colours: el.data && el.data.length ? Array.from(el.data[0].marker.colors) : [],
  notes: (el.layout.annotations || []).map((a) => a.text),
})
"""
PASTE = "paste the suggested fix into the mapper box"


def _picture(fig: Any) -> dict[str, Any]:
    """What TREEMAP_JS reads, computed from the library's figure."""
    data = list(fig.data)
    return {
        "title": fig.layout.title.text or "",
        "traces": len(data),
        "ids": list(data[0].ids) if data else [],
        "colours": list(data[0].marker.colors) if data else [],
        "notes": [a.text for a in fig.layout.annotations],
    }


def _wait_for_picture(page: NotebookPage, fig: Any, after: str) -> None:
    want = _picture(fig)
    page.wait_for(
        lambda: page.chart_js_at(0, TREEMAP_JS) == want,
        f"the panel's picture after {after}: {want['title']!r}, {len(want['ids'])} boxes",
        lambda: {k: v for k, v in page.chart_js_at(0, TREEMAP_JS).items() if k != "ids"},
    )


def test_debug_panel_boxes_and_button_drive_the_picture(open_notebook, lab, tmp_path):
    """Notebook 04's panel: typing a checkpoint and a model, pasting the suggested fix with its
    button, a bad path and the header-only choice each redraw the picture as the library draws
    the notebook's own ``inspect`` of the same boxes; an error leaves no stale picture."""
    import contextlib
    import json

    from repo_paths import NOTEBOOKS

    from loadkit.errors import LoadkitError
    from loadkit_notebooks.stories import debug as story

    name = "04_debug_your_checkpoint.ipynb"
    inspect = notebook_namespace(name)["inspect"]

    def report(*boxes: str) -> Any:
        with contextlib.chdir(NOTEBOOKS):  # where the kernel runs: paths resolve and show alike
            return inspect(*boxes)

    broken = "../data/big/debug/plamo2-broken.safetensors"  # written by the notebook's Run All
    sharded = "../data/big/debug/plamo2-index"
    page = open_notebook(name)
    with page.evidence_on_failure(tmp_path, extra=f"JupyterLab log: {lab.log_path}"):
        page.open()
        page.clear_outputs()
        page.run_all()
        page.wait_run_finished()
        assert page.button_disabled(PASTE)  # the checkpoint it opened on loads cleanly
        page.type_into("model", "plamo2")
        page.type_into("checkpoint", broken)
        _wait_for_picture(page, story.treemap_figure(report(broken, "plamo2", "")), broken)
        for box in ("layers.layers", "post_ffn_norm"):  # zoom in twice: no console error
            page.zoom_treemap(box)
        assert not page.errors, f"zooming into the picture logged errors: {page.errors[:3]}"
        fix = json.dumps(report(broken, "plamo2", "").fix.mapper)
        page.wait_for(lambda: not page.button_disabled(PASTE), "the paste button enabled")
        page.click_button(PASTE)
        page.wait_for(lambda: page.text_value("mapper") == fix, f"the mapper box to read {fix}")
        _wait_for_picture(page, story.treemap_figure(report(broken, "plamo2", fix)), PASTE)
        page.type_into("checkpoint", "../data/no-such-checkpoint.safetensors")
        with pytest.raises(LoadkitError):
            report("../data/no-such-checkpoint.safetensors", "plamo2", fix)
        _wait_for_picture(page, story.error_figure(), "a path that does not exist")
        said = page.html_after("mapper")  # the error, printed once: below the picture only
        assert said.count("no such file") == 1, said
        page.type_into("mapper", "")
        page.type_into("checkpoint", sharded)
        _wait_for_picture(page, story.treemap_figure(report(sharded, "plamo2", "")), sharded)
        assert "wrong shard: 'model.norm.weight'" in page.html_after("mapper")
        page.type_into("model", story.HEADER_ONLY)
        _wait_for_picture(page, story.treemap_figure(report(sharded, "", "")), "(header only)")
        assert not page.errors, f"the page logged errors: {page.errors}"


SANKEY_JS = """
(el) => ({
  labels: Array.from(el.data[0].node.label),
  colours: Array.from(el.data[0].node.color),
  values: Array.from(el.data[0].link.value, Number),
})
"""


def test_tour_sankey_and_name_dropdown(open_notebook, lab, tmp_path):
    """Notebook 00: the Sankey is the library's picture of the notebook's own load (fates in
    the fate palette), and picking a name in the dropdown shows that name's journey."""
    import contextlib

    from repo_paths import NOTEBOOKS

    from loadkit import ledger_of, open_checkpoint
    from loadkit_notebooks.stories import tour

    name = "00_tour.ipynb"
    ns = notebook_namespace(name)
    page = open_notebook(name)
    with page.evidence_on_failure(tmp_path, extra=f"JupyterLab log: {lab.log_path}"):
        page.open()
        page.clear_outputs()
        page.run_all()
        page.wait_run_finished()
        with contextlib.chdir(NOTEBOOKS):  # the checkpoint the page's Run All wrote
            ck = open_checkpoint("../data/big/tour/tiny.safetensors")
            model = ns["TinyHybrid"]()
            model.load_weights(ck.weights())
        ledger = ledger_of(model)
        (sankey,) = tour.sankey_figure(ledger).data
        want = {
            "labels": list(sankey.node.label),
            "colours": list(sankey.node.color),
            "values": list(sankey.link.value),
        }
        assert page.chart_js_at(0, SANKEY_JS) == want
        names = list(ck.tensors)
        for pick in [names[-1], names[5], names[0]]:  # every click changes the dropdown
            page.choose("name", pick)
            journey = tour.journey(pick, ck, model, ledger)
            page.wait_for(
                lambda journey=journey: page.html_after("name").strip() == journey,
                f"the journey of {pick}",
                lambda: page.html_after("name")[:200],
            )
        assert not page.errors, f"the page logged errors: {page.errors}"


def test_reload_order_and_layer_dropdowns_drive_the_counter_chart(open_notebook, lab, tmp_path):
    """Notebook 03's order and layers dropdowns: the counter chart (old and new side by side)
    becomes the library's for the notebook's own reloads in that order, over those layers."""
    from loadkit_notebooks.stories import reload as story

    name = "03_layerwise_reload.ipynb"
    run = functools.cache(notebook_namespace(name)["reload"])
    page = open_notebook(name)
    with page.evidence_on_failure(tmp_path, extra=f"JupyterLab log: {lab.log_path}"):
        page.open()
        page.clear_outputs()
        page.run_all()
        page.wait_run_finished()
        for order, pick in [("d-first", story.MIXERS), ("d-first", "layers.2 (*)"),
                            ("shuffled", story.MIXERS), ("d-last", story.MIXERS)]:  # fmt: skip
            page.choose("order", story.ORDER_LABELS[order])
            page.choose("layers", pick)
            fig = story.counter_figure(run("old", order), run("new", order), pick)
            want = expected_traces(None, lambda _, fig=fig: fig)  # type: ignore[arg-type]
            page.wait_for(
                lambda want=want: page_traces(page.chart_state_at(0)) == want,
                f"the counter chart for order {order}, layers {pick}",
                lambda: page.chart_state_at(0)["title"],
                timeout=60,
            )
        assert not page.errors, f"the page logged errors: {page.errors}"


@pytest.mark.parametrize(
    "name", [*sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb")), "old-kernelspec"]
)
def test_notebook_opens_unmodified(name, open_notebook, lab, lab_root):
    """JupyterLab rewrites a kernel spec other than the kernel's own on open and marks the
    notebook modified. ``old-kernelspec``: a copy saved with another display name, which must be
    marked (the check can fail)."""
    import json

    if name == "old-kernelspec":
        nb = json.loads((lab_root / "notebooks" / "00_tour.ipynb").read_text())
        nb["metadata"]["kernelspec"]["display_name"] = "Python 3"
        name = "zz_old_kernelspec.ipynb"
        (lab_root / "notebooks" / name).write_text(json.dumps(nb))
    page = open_notebook(name)
    page.open()
    page.page.wait_for_timeout(2000)  # the kernel's info arrives after it is idle
    assert page.dirty() == (name == "zz_old_kernelspec.ipynb"), f"{name}: dirty={page.dirty()}"
