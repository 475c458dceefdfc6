"""Notebook 06's drawing functions, on what the real calls return."""

from __future__ import annotations

import pytest
from repo_paths import DATA

from loadkit import AutoWeightsLoader, WeightsMapper, open_checkpoint
from loadkit.errors import UnknownNameError
from loadkit.models import vision_tower as vt
from loadkit_notebooks.stories import stacked_mapper as story

CK = open_checkpoint(DATA / "vision_tower" / "model.safetensors")


def traces():
    mappers = {
        b: WeightsMapper(orig_to_new_stacked=vt.QKV_RULES, behaviour=b) for b in ("old", "new")
    }
    return {b: {n: m.trace(n) for n in CK.tensors} for b, m in mappers.items()}


def test_mapping_figure_shows_the_mapped_keys_and_one_row_for_the_rest():
    fig = story.mapping_figure(traces())
    (heat,) = fig.data
    assert list(heat.x) == ["old", "new"] and len(heat.y) == 13 and len(CK.tensors) == 37
    assert heat.y[-1] == "25 other keys" and list(heat.z[-1]) == [story.UNCHANGED] * 2
    assert fig.layout.height <= 500  # within a screen (issue 39: it was 897 px, 25 rows grey)
    z = [list(row) for row in heat.z]
    rematched = [y for y, row in zip(heat.y, z, strict=True) if row[0] == story.REMATCHED]
    assert rematched == [f"layers.{i}.self_attn.{p}_proj.{k}" for i in (0, 1) for p in "kq"
                         for k in ("bias", "weight")]  # fmt: skip
    assert all(row[1] != story.REMATCHED for row in z)
    assert sum(row[1] == story.MAPPED for row in z) == 12  # q, k, v weight and bias, 2 layers
    i = list(heat.y).index("layers.0.self_attn.q_proj.weight")
    assert list(heat.text[i]) == [
        "layers.0.self_attn.qkqkv_proj.weight  shard v",
        "layers.0.self_attn.qkv_proj.weight  shard q",
    ]
    assert "(old: 8, new: 0)" in fig.layout.title.text


def test_mapping_table_lists_only_touched_keys():
    t = story.mapping_table(traces())
    assert len(t.rows) == 12
    assert t.row("layers.1.self_attn.k_proj.bias") == [
        "layers.1.self_attn.k_proj.bias",
        "qkqkv_proj.bias, v",
        "qkv_proj.bias, k",
        "v_proj after k_proj",
    ]
    assert t.notes == ["25 other keys: no stacked rule fires, the same name both ways"]


def load(behaviour):
    model = vt.VisionTower(vt.config_from_checkpoint(CK.tensors))
    mapper = WeightsMapper(orig_to_new_stacked=vt.QKV_RULES, behaviour=behaviour)
    try:
        loaded, error = AutoWeightsLoader(model).load_weights(CK.weights(), mapper=mapper), None
    except UnknownNameError as exc:
        loaded, error = None, exc
    return story.load_record(behaviour, vt.qkv_rows(model, dict(CK.weights())), error, loaded)


def test_load_records_and_rows_figure():
    old, new = load("old"), load("new")
    assert old.outcome["qkv_proj rows not loaded"] == 96 and "qkqkv_proj" in old.outcome["error"]
    assert new.outcome["qkv_proj rows holding q / k / v"] == "32 / 32 / 32"
    assert new.outcome["every row in its place"] is True and "error" not in new.outcome
    fig = story.rows_figure(new)
    assert fig.layout.title.text.endswith("32 / 32 / 32 [new]")
    labels = [a.text for a in fig.layout.annotations]
    assert labels == ["q_proj rows 0-15", "k_proj rows 0-15", "v_proj rows 0-15"] * 2
    assert [a.text for a in story.rows_figure(old).layout.annotations] == ["not loaded"] * 2


def test_a_load_with_the_broken_names_set_aside_is_refused_naming_the_missing_shards():
    """Old's names ignored (as notebook 06 does): only v arrives; vLLM 0.34.0's check refuses."""
    from loadkit.loading.track import track_weights_loading

    model = vt.VisionTower(vt.config_from_checkpoint(CK.tensors))
    loader = AutoWeightsLoader(model, ignore_unexpected_suffixes=["qkqkv_proj"])
    mapper = WeightsMapper(orig_to_new_stacked=vt.QKV_RULES, behaviour="old")
    loaded = loader.load_weights(CK.weights(), mapper=mapper)
    refused = track_weights_loading(model, loaded).refused
    assert sorted(story.short(r) for r in refused) == sorted(
        f"layers.{i}.self_attn.qkv_proj.{p}.{s}"
        for i in (0, 1)
        for p in ("weight", "bias")
        for s in "qk"
    )
    rows = vt.qkv_rows(model, dict(CK.weights()))
    record = story.load_record("old", rows, None, loaded, refused=refused)
    assert record.outcome["qkv_proj rows holding q / k / v"] == "0 / 0 / 32"
    assert record.outcome["vLLM 0.34.0's check after the load"].startswith("refuses it: missing ")
    labels = [a.text for a in story.rows_figure(record).layout.annotations]
    assert labels == ["q_proj and k_proj rows: never filled", "v_proj rows 0-15"] * 2


@pytest.mark.parametrize(
    "labels,expected",
    [
        (["q 0", "q 1", "q 3"], [(0, 1, "q 0-1"), (2, 2, "q 3")]),
        (
            ["k 0", "q 1", "not loaded", "not loaded"],
            [(0, 0, "k 0"), (1, 1, "q 1"), (2, 3, "not loaded")],
        ),
        (["v 4", "v 5", "v 6"], [(0, 2, "v 4-6")]),
    ],
)
def test_runs(labels, expected):
    assert story.runs(labels) == expected


def test_wrapped_writes_the_data_folder_relative():
    assert story.wrapped(f"x {story.CHECKPOINT}") == "x data/vision_tower/model.safetensors"
