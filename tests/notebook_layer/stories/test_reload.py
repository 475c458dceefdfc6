"""Notebook 03's reload (its own ``reload`` function) and what ``loadkit_notebooks.stories.reload``
draws of it."""

import functools

import pytest
from notebook_code import notebook_namespace

from loadkit.models.nemotron_h import ORDERS
from loadkit_notebooks.stories import reload as story

MIXERS = ["layers.0.mixer", "layers.1.mixer", "layers.4.mixer", "layers.6.mixer"]


@functools.cache
def run_reload(behaviour, order="d-last"):
    """The notebook's ``reload``, once per behaviour and order."""
    return notebook_namespace("03_layerwise_reload.ipynb")["reload"](behaviour, order)


def test_main_records_show_the_upstream_case():
    recs = story.main_records(run_reload)
    assert list(recs) == ["old", "new"]
    old, new = recs["old"], recs["new"]
    for layer in MIXERS:
        assert old.series[layer].y == [8, 12, 12]
        assert new.series[layer].y == [4, 8, 12]
        assert old.series[layer].text == ["A +8", "dt_bias +4", "D dropped"]
    assert len(old.series["dropped (excessive)"].x) == 4
    assert old.series["dropped (excessive)"].text == [f"{m}.D" for m in MIXERS]
    assert new.series["dropped (excessive)"].x == []
    # finalised one step earlier under old: after dt_bias, not after D
    assert [x + 1 for x in old.series["finalised"].x] == new.series["finalised"].x
    assert old.outcome["NaN logits"] == "512/512" and new.outcome["NaN logits"] == "0/512"
    assert old.outcome["live storage kept"] and new.outcome["live storage kept"]
    assert old.outcome["ledger: never loaded"] == 0  # the drop is invisible to the ledger


@pytest.mark.parametrize("order", ORDERS)
def test_new_matches_a_fresh_load_in_every_order(order):
    run = run_reload("new", order)
    assert set(run.status.values()) == {story.LOADED}
    assert run.logits_nan == 0 and run.max_error == 0.0
    assert run.pointers_kept and run.warnings == []


def test_old_victims_per_order():
    def victims(order):
        run = run_reload("old", order)
        return sorted(n for n, s in run.status.items() if s == story.DROPPED)

    assert victims("d-last") == [f"{m}.D" for m in MIXERS]
    assert victims("d-first") == [f"{m}.dt_bias" for m in MIXERS]
    assert victims("shuffled") == [
        "layers.0.mixer.D",
        "layers.4.mixer.dt_bias",
        "layers.6.mixer.dt_bias",
    ]  # layers.1 has A last: its count overshoots to 16 and nothing is dropped
    assert "16" in story.layer_steps(run_reload("old", "shuffled"), "layers.1.mixer")
    for order in ORDERS:
        run = run_reload("old", order)
        assert run.logits_nan == run.logits_total
        assert all("ExcessiveLoadWarning" in w for w in run.warnings)


def test_status_grid_marks_dropped_cells():
    rows, cols, codes, _ = story.status_grid(run_reload("old", "d-first"))
    assert rows[0] == "layers.0" and "mixer.dt_bias" in cols
    col = cols.index("mixer.dt_bias")
    assert [r[col] for r in codes] == [1, 1, -1, -1, 1, -1, 1]
    assert "mixer.dt_bias: dropped → NaN" in story.grid_text(run_reload("old", "d-first"))
    fig = story.grid_figure(run_reload("old", "d-first"))
    assert {t for row in fig.data[0].text for t in row} == {"", "NaN"}  # short enough for a cell


def test_counter_view_legend_entries_have_distinct_colours():
    fig = story.counter_figure(run_reload("old"), run_reload("new"), "layers.2 (*)")
    colours = {t.name: t.marker.color for t in fig.data}
    assert {"weight", "weight #1", "weight #2", "weight #3"} <= set(colours)
    assert len(set(colours.values())) == len(colours), colours
    [line] = fig.layout.shapes
    assert line.y0 == 100 and line.layer == "below"  # never across a segment's label


def test_layer_picker_shows_packed_qkv_counting_three_shards():
    rec = story.counter_record(run_reload("new"), "layers.2 (*)")
    assert rec.series["layers.2.mixer.qkv_proj"].y[-1] == 512
    assert len(rec.series["layers.2.mixer.qkv_proj"].y) == 3


def test_counter_view_shows_old_and_new_shares_per_layer():
    old, new = run_reload("old"), run_reload("new")
    text = story.counter_text(old, new)
    assert "layers.0.mixer           old: A 67% + dt_bias 33% = 100%; D dropped → NaN" in text
    assert "layers.0.mixer           new: A 33% + dt_bias 33% + D 33% = 100%" in text
    fig = story.counter_figure(old, new)
    dropped = next(t for t in fig.data if t.name == "dropped → NaN")
    assert list(dropped.text) == ["D dropped → NaN"] * 4
    assert [round(b) for b in dropped.base] == [100] * 4  # stacked on top of the layer total
    a = next(t for t in fig.data if t.name == "A")
    assert [round(y) for y in a.y] == [67] * 4 + [33] * 4  # old (first) counts A twice
    assert list(fig.layout.yaxis.range) == story.Y_RANGE
    block = story.counter_text(old, new, "layers.2 (*)")
    assert (
        "layers.2.mixer.qkv_proj  old: weight #1 50% + weight #2 25% + weight #3 25% = 100%"
        in block
    )


def test_explorer_widgets_drive_the_charts_and_return_to_main_records():
    ex = story.explorer(run_reload)
    assert ex.toggle.value == "old" and ex.order.value == "d-last"
    start = ex.state()
    assert "[old, d-last] forward on 8 tokens: NaN logits (all 512)" in start
    ex.toggle.value = "new"
    assert ex.grid.fig.layout.title.text.endswith("[new]")
    assert "finite logits" in ex.logits.fig.layout.title.text
    assert list(ex.logits.fig.data[1].y) == [0] * 8  # no NaN at any position
    new_record = story.main_records(run_reload)["new"]
    assert ex.grid.fig.to_dict() == story.toggle_figure(new_record, run_reload).to_dict()
    ex.order.value = "shuffled"
    ex.toggle.value = "old"
    assert "NaN logits" in ex.logits.fig.layout.title.text
    assert "[shuffled by layer; mamba mixers]" in ex.counter.fig.layout.title.text
    ex.picker.value = "layers.2 (*)"
    assert "layers.2.mixer.qkv_proj" in ex.state()
    ex.order.value, ex.picker.value = "d-last", story.MIXERS
    assert ex.state() == start


@functools.cache
def run_fill(behaviour, fill):
    return notebook_namespace("03_layerwise_reload.ipynb")["reload"](behaviour, "d-last", fill)


def test_each_fill_shows_in_what_the_dropped_d_reads():
    stale, zero = run_fill("old", "stale"), run_fill("old", "zero")
    nan = run_reload("old")
    assert zero.dropped_values[f"{MIXERS[0]}.D"] == [0.0] * 4  # vLLM 0.34.0: zeros, silently
    assert stale.dropped_values[f"{MIXERS[0]}.D"] == [-1.75, -1.25, -0.75, -0.25]
    for run in (stale, zero):
        assert run.logits_nan == 0 and run.logits_differ == run.logits_total  # finite, all wrong
    assert nan.logits_nan == nan.logits_total
    assert run_fill("new", "zero").logits_differ == 0  # the fix needs no fill
    text = story.fill_text({"stale": stale, "nan": nan, "zero": zero})
    assert "fill zero] layers.0.mixer.D = [0, 0, 0, 0]" in text
    assert "512/512 logits NaN" in text and text.count("512/512 differ") == 2
    fig = story.fill_figure({"stale": stale, "nan": nan, "zero": zero})
    assert [list(t.y) for t in fig.data] == [[64] * 8] * 3
    assert story.grid_text(zero).splitlines()[1] == "  layers.0: mixer.D: dropped → zeros"
