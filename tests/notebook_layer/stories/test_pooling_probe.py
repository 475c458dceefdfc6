"""Notebook 01's loads (its own functions) and what ``loadkit_notebooks.stories.pooling_probe``
draws of them."""

import functools

import pytest
from notebook_code import notebook_namespace

from loadkit_notebooks.stories import pooling_probe as pp
from loadkit_notebooks.viz import figure_data

N_KEYS = 73


@pytest.fixture(scope="module")
def nb():
    return notebook_namespace("01_pooling_probe.ipynb")


@pytest.fixture(scope="module")
def runs(nb):
    return functools.cache(nb["runs_of"])


def test_file_order_old_clones_everything_new_one(runs):
    old, new = runs("file order")["old"], runs("file order")["new"]
    assert (old.clones, new.clones) == (N_KEYS, 1)
    assert old.cloned_bytes == old.total_bytes and pp.outcome(new)["bytes cloned"] == "8 KiB"
    assert old.probe.prefix is None and new.probe.prefix == ""
    assert pp.hit(new.probe) == "#0 model.language_model.embed_tokens.weight"  # as inspect
    assert old.exact() == new.exact() == "61 of 61"
    assert [e["clones"] for e in old.events] == list(range(1, N_KEYS + 1))
    rec = pp.stream_record("file order", runs("file order"))
    assert rec.series["old"].y[-1] == 100.0 and set(rec.series["new"].y) == {8.37}


def test_q_k_v_first_new_holds_three_and_hits_the_fourth(runs):
    new = runs("q, k, v first")["new"]
    assert pp.hit(new.probe) == "#3 model.language_model.layers.0.self_attn.o_proj.weight"
    held = [n.rsplit(".", 2)[-2] for n in new.probe.walked_names[:-1]]
    assert held == ["q_proj", "k_proj", "v_proj"] and new.exact() == "61 of 61"
    assert runs("q, k, v first")["old"].clones == N_KEYS


def test_the_toggle_switches_streams_and_both_behaviours_stay_in_view(nb, runs):
    view = pp.main_view(runs, nb["STREAMS"])
    assert view.toggle.options == ("file order", "q, k, v first")
    fig = view.chart.fig
    assert [t.name for t in fig.data] == ["old", "new"]  # one view: the contrast
    assert fig.layout.title.text.endswith("[file order]")
    view.toggle.value = "q, k, v first"
    text = figure_data(view.chart)
    assert "[q, k, v first]" in text and "new: 73 points, from 2.09 to 6.28" in text
    assert view.chart.spec["data"][1]["y"] == list(view.chart.fig.data[1].y)  # page's copy
    assert [a.text.split(":")[0] for a in view.chart.fig.layout.annotations] == [
        "<b>old</b>",
        "<b>new</b>",
    ]


def test_outcome_table_has_both_columns(runs):
    table = pp.outcome_table(runs("file order")).splitlines()
    assert table[0].split() == ["old", "new"]
    assert any(
        line.startswith("clone() calls") and line.split()[-2:] == ["73", "1"] for line in table
    )
    assert any(line.startswith("keys held") and line.split()[-2:] == ["73", "1"] for line in table)


def test_owned_tensors_are_held_without_a_clone(nb):
    # vLLM 0.34.0: "auto" holds as they are; a reusing stream declared owned is corrupted
    load, setups = nb["probe_load"], nb["SETUPS"]
    runs = {
        (b, label): load(b, load_format=fmt, reuse=reuse)
        for b in ("old", "new")
        for label, (fmt, reuse) in setups.items()
    }
    fig = pp.clone_figure(runs, setups)
    assert [list(r) for r in fig.data[0].z] == [[0, 0, 60], [0, 0, 0]]  # rows old, new
    assert [list(r) for r in fig.data[0].text] == [
        ["all 61 exact<br>73 clones", "all 61 exact<br>0 clones", "60 of 61 corrupted<br>0 clones"],
        ["all 61 exact<br>1 clone", "all 61 exact<br>0 clones", "all 61 exact<br>0 clones"],
    ]
    auto = runs[("old", "owned, auto (0.34.0)")]
    assert (auto.probe.walked, auto.probe.cloned, auto.clones) == (73, False, 0)


def test_full_scale_and_slider(nb):
    full = {b: nb["full_scale"](b) for b in ("old", "new")}
    (old, old_agrees), (new, new_agrees) = full["old"], full["new"]
    assert old.tensors == old.clones == old.probe.walked == 2014
    assert pp.outcome(old)["bytes cloned"] == "9.54 GiB" and old.cloned_bytes == old.total_bytes
    assert (new.clones, new.probe.walked, new.probe.prefix) == (1, 1, "")
    assert old_agrees and new_agrees
    view = pp.full_scale_view(nb["full_scale_runs"])
    fig = view.chart.fig
    assert fig.layout.yaxis.type == "log"  # new's 768 B is a line of its own, not the x axis
    new_line = next(t for t in fig.data if t.name == "new: held as clones")
    assert min(new_line.y) > 10 ** fig.layout.yaxis.range[0]  # inside the plot, above its floor
    axes = (list(fig.layout.xaxis.range), list(fig.layout.yaxis.range))
    view.slider.value = 10
    ends = pp.chart_endpoints(view.chart)
    n10 = 2014 - 17 * 25
    assert ends.startswith("title: Full scale on paper (meta device) [10 text layers]")
    assert f"new: held as clones: {n10} keys read, ends at 768 B" in ends
    fig = view.chart.fig
    assert (list(fig.layout.xaxis.range), list(fig.layout.yaxis.range)) == axes


def test_layouts_table_shows_why_the_probe_exists(nb):
    layouts = pp.layouts_table(nb["predicted"])
    assert layouts.column("first key")[2] == "model.language_model.embed_tokens.weight"
    assert layouts.column("old: prefix, keys walked") == [
        "'', 1 of 73", "'model.', 1 of 73", "none (no hit), 73 of 73"
    ]  # fmt: skip
    assert layouts.column("new: prefix, keys walked") == [
        "'', 1 of 73", "'model.', 1 of 73", "'', 1 of 73"
    ]  # fmt: skip
