"""Notebook 07's reloads (its own ``reload`` and ``without_d``) and what
``loadkit_notebooks.stories.padded_reload`` draws of them."""

import functools

import pytest
from notebook_code import notebook_namespace

from loadkit_notebooks.stories import padded_reload as story

VERSIONS = ("0.30.0", "0.31.0", "0.34.0")


@functools.cache
def namespace():
    return notebook_namespace("07_padded_reload.ipynb")


@functools.cache
def run(version):
    return namespace()["reload"](version)


def test_each_release_counts_and_fills_the_padding_as_its_code_does():
    old, counted, zeroed = (run(v) for v in VERSIONS)
    experts = {
        r.version: [c for c in r.layers if c.layer.endswith("experts")]
        for r in (old, counted, zeroed)
    }
    # 0.30.0: the padding counted, never reached: finalised late, by finalize_layerwise_reload
    assert [(c.counted, c.total, c.finalised_by) for c in experts["0.30.0"]] == [
        (2304, 3072, "finalize_layerwise_reload")
    ] * 2
    assert old.partly_loaded == ["layers.0.experts", "layers.1.experts"]
    for version in ("0.31.0", "0.34.0"):  # weight_loader_numel: finalised by its count
        assert [(c.counted, c.total, c.finalised_by) for c in experts[version]] == [
            (2304, 2304, "count reached total")
        ] * 2
    stale = sorted({-1.75, -1.25, -0.75, -0.25, 0.25, 0.75, 1.25, 1.75})
    assert sorted(set(old.pad_values())) == stale and sorted(set(counted.pad_values())) == stale
    assert set(zeroed.pad_values()) == {0.0}
    assert old.logits_differ == counted.logits_differ == old.logits_total  # the same checkpoint!
    assert zeroed.logits_differ == 0 and zeroed.max_error == 0.0
    every_other_layer = [c for c in old.layers if not c.layer.endswith("experts")]
    assert all(c.counted == c.total for c in every_other_layer)


def test_the_versions_table_and_the_figures_read_the_runs():
    runs = {v: run(v) for v in VERSIONS}
    text = story.versions_text(runs)
    assert "2304/3072, 2304/3072" in text and text.count("stale (-1.75 to 1.75)") == 2
    assert "0/512 (identical)" in text
    counts = story.count_figure(runs["0.30.0"]).data[0]
    assert [round(y) for y in counts.y].count(75) == 2
    pad = story.pad_figure(runs["0.34.0"])
    assert "padding rows 12-15 and 28-31" in pad.layout.title.text
    assert len(pad.layout.shapes) == 2
    assert list(story.forward_figure(runs["0.31.0"]).data[0].y) == [64] * 8


def test_the_toggle_redraws_every_chart():
    ex = story.explorer(run, list(VERSIONS))
    assert ex.counts.fig.layout.title.text.endswith(" [0.30.0]")
    ex.toggle.value = "0.34.0"
    for chart in (ex.counts, ex.pad, ex.logits):
        assert chart.fig.layout.title.text.endswith(" [0.34.0]")
    assert "padding reads zeros" in ex.state()


def test_without_d_layerwise_zero_fills_and_direct_keeps_the_stale_value():
    without_d = namespace()["without_d"]
    layerwise, direct = without_d("layerwise"), without_d("direct")
    for name, values in layerwise.values.items():
        assert values == [0.0] * 4 and values != layerwise.before[name]
    assert direct.values == direct.before  # the previous weights' D, silently
    assert layerwise.warnings == ["PartialLayerWarning", "WeightsNotLoadedWarning"]
    assert direct.warnings == ["WeightsNotLoadedWarning"]
    text = story.modes_text([layerwise, direct])
    assert text.count("(kept its old value)") == 2 and text.count("(overwritten)") == 2


@pytest.mark.parametrize("name", ["padded MoE", "NemotronH"])
def test_the_plan_cell_matches_a_fresh_load(name):
    ns = namespace()
    make, folder, update = {
        "padded MoE": (lambda: ns["PaddedMoeForCausalLM"](ns["config"]), ns["MOE"], "update"),
        "NemotronH": (
            lambda: ns["NemotronHForCausalLM"](ns["nemotron_config"]),
            ns["NEMOTRON"],
            "update-d-last",
        ),
    }[name]
    plan, same = ns["planned"](
        make, folder / "initial.safetensors", folder / f"{update}.safetensors"
    )
    assert same
    text = story.plan_text(plan)
    assert text.startswith("direct: ")
    assert ("fallback" in text) == (name == "NemotronH")
