"""The scenarios behind notebooks/01_pooling_probe.ipynb, and the widgets they drive."""

import pytest
from repo_paths import REPO

from loadkit.demo.scenario import outcome_table
from loadkit.demo.stories import pooling_probe as pp
from loadkit.demo.viz import figure_data

N_KEYS = 73


@pytest.fixture(scope="module")
def records():
    return pp.main_records()


def test_main_records_old_clones_everything_new_one(records):
    assert list(records) == ["old", "new"]
    old, new = records["old"], records["new"]
    for rec in (old, new):
        assert [len(s.x) for s in rec.series.values()] == [N_KEYS, N_KEYS]
        assert rec.series["tensors cloned (% of checkpoint)"].x == list(range(1, N_KEYS + 1))
    assert old.series["tensors cloned (% of checkpoint)"].y[-1] == 100.0
    assert old.series["bytes cloned (% of checkpoint)"].y[-1] == 100.0
    assert set(new.series["tensors cloned (% of checkpoint)"].y) == {round(100 / N_KEYS, 2)}
    assert (old.outcome["clones"], new.outcome["clones"]) == (N_KEYS, 1)
    assert old.outcome["prefix found"] == "none (no hit)" and new.outcome["prefix found"] == "''"
    assert old.outcome["values exact"] == new.outcome["values exact"] == "61 of 61"
    assert new.outcome["cloned"] == "8 KiB" and old.outcome["cloned"] == "95.6 KiB"
    assert [e["clones"] for e in old.events] == list(range(1, N_KEYS + 1))


def test_toggle_drives_the_main_chart_on_fixed_axes(records):
    view = pp.main_view(records)
    fig = view.chart.fig
    assert view.toggle.value == "old" and list(fig.data[0].y)[-1] == 100.0
    view.toggle.value = "new"
    fig = view.chart.fig
    assert fig.layout.title.text.endswith("[new]")
    assert list(fig.data[0].y) == records["new"].series["tensors cloned (% of checkpoint)"].y
    assert view.chart.spec["data"][0]["y"] == list(fig.data[0].y)  # what the page receives
    assert "tensors cloned (% of checkpoint): 73 points, all 1.37" in figure_data(view.chart)
    assert list(fig.layout.yaxis.range) == [0, 105] and list(fig.layout.xaxis.range) == [0.5, 73.5]


def test_outcome_table_has_both_columns(records):
    table = outcome_table(records).splitlines()
    assert table[0].split() == ["old", "new"]
    assert any(line.startswith("clones") and line.split()[-2:] == ["73", "1"] for line in table)


def test_clone_protection_records():
    recs = pp.clone_protection_records()
    assert list(recs) == ["clone on", "clone off"]
    on, off = recs["clone on"].outcome, recs["clone off"].outcome
    assert on["old: parameters corrupted"] == on["new: parameters corrupted"] == "0 of 61"
    assert off["old: parameters corrupted"] == "60 of 61"
    assert off["old: intact"] == ["per_layer_projection_norm.weight"]
    assert off["new: parameters corrupted"] == "0 of 61"
    fig = pp.clone_figure(recs)
    assert [list(r) for r in fig.data[0].z] == [[0, 60], [0, 0]]  # rows old, new
    assert [list(r) for r in fig.data[0].text] == [
        ["all 61 exact", "60 of 61 corrupted"],
        ["all 61 exact", "all 61 exact"],
    ]
    assert pp.clone_table(recs).splitlines()[1].split() == [
        "old",
        "0",
        "of",
        "61",
        "60",
        "of",
        "61",
    ]


def test_full_scale_records_and_slider():
    full = pp.full_scale_records()
    old, new = full["old"].outcome, full["new"].outcome
    assert old["checkpoint tensors"] == old["clones"] == old["keys walked by the probe"] == 2014
    assert old["cloned"] == old["checkpoint size"] == "9.54 GiB"
    assert (new["clones"], new["keys walked by the probe"], new["prefix found"]) == (1, 1, "''")
    assert old["header-only verdict agrees"] and new["header-only verdict agrees"]
    view = pp.full_scale_view(full)
    axes = (list(view.chart.fig.layout.xaxis.range), list(view.chart.fig.layout.yaxis.range))
    view.slider.value = 10
    ends = pp.chart_endpoints(view.chart)
    assert ends.startswith("title: Full scale on paper (meta device) [10 text layers]")
    n10 = 2014 - 17 * 25
    assert f"old: held as clones: {n10} keys read" in ends
    assert f"new: held as clones: {n10} keys read, ends at 0.000 GiB" in ends
    # the axes stay those of the full layout: smaller layouts compare by eye
    assert (
        list(view.chart.fig.layout.xaxis.range),
        list(view.chart.fig.layout.yaxis.range),
    ) == axes


def test_layouts_table_shows_why_the_probe_exists():
    layouts = pp.layouts_table()
    assert layouts.column("first key")[2] == "model.language_model.embed_tokens.weight"
    assert layouts.column("old: prefix, keys walked") == [
        "'', 1 of 73", "'model.', 1 of 73", "none (no hit), 73 of 73"
    ]  # fmt: skip
    assert layouts.column("new: prefix, keys walked") == [
        "'', 1 of 73", "'model.', 1 of 73", "'', 1 of 73"
    ]  # fmt: skip


def test_buffer_reuse_demo():
    out = pp.buffer_reuse_demo().outcome
    assert out["held views share one buffer"] is True
    views = [v for k, v in out.items() if k.startswith("view ")]
    clones = [v for k, v in out.items() if k.startswith("clone ")]
    assert views == [False] * 3 and clones == [True] * 3


def test_held_packed_run():
    new = pp.held_packed_run("new").outcome
    assert new["held before the hit"] == [f"layers.0.self_attn.{p}_proj.weight" for p in "qkv"]
    assert new["hit at key"].startswith("#3 ") and new["layer 0 qkv_proj exact"]
    assert new["values exact"] == "61 of 61"
    assert pp.held_packed_run("old").outcome["values exact"] == "61 of 61"


def test_traps():
    twice = pp.trap_mapping_twice().outcome
    assert twice["mapped twice"].endswith("gate_gate_up_proj.weight")
    assert twice["prefix-only mapper (Gemma4), mapped names forwarded"] == "loaded 61 parameters"
    err = twice["packing mapper, mapped names forwarded"]
    assert err.startswith("UnknownNameError") and "data/gemma4_like/model.safetensors" in err
    assert str(REPO) not in err  # outputs do not depend on where the repo lies
    shard = pp.trap_clone_drops_shard_id().outcome
    assert (shard["shard_id after apply()"], shard["shard_id of its clone()"]) == ("q", None)
    assert shard["loading the clone"].startswith("MissingShardIdError")
    assert shard["loading the tagged tensor"] == "ok: 32 of 64 rows of qkv_proj filled"
