"""The notebook's scenarios (loadkit.demo.stories.plamo2) over data/plamo2's checkpoints."""

import pytest
import torch
from safetensors.torch import load_file

from loadkit import open_checkpoint
from loadkit.demo.stories import plamo2 as story
from loadkit.demo.viz import figure_data
from loadkit.models.plamo2 import BEHAVIOURS, Plamo2Config, Plamo2ForCausalLM, rename

FIVE = ("B_norm.weight", "C_norm.weight", "dt_norm.weight", "q_norm.weight", "k_norm.weight")


@pytest.fixture(scope="module")
def records():
    return {tied: story.main_records(tied) for tied in (False, True)}


def test_reference_state_is_what_old_and_new_load():
    for kind in ("untied", "tied"):
        config, weights = story.config_of(kind), story.read_weights(kind)
        ref = story.reference_state(config, weights)
        for behaviour in ("old", "new"):
            model = story.load(behaviour, config, weights)
            got = dict(model.named_parameters())
            assert got.keys() == ref.keys()
            assert all(torch.equal(got[k], ref[k]) for k in ref), (kind, behaviour)


def test_in_proj_source_rows_by_hand():
    # heads 3, head_dim 4: checkpoint rows per head are [gate 0..3, x 0..3].
    rows = story.in_proj_source_rows(Plamo2Config())
    assert rows[:8] == [0, 1, 2, 3, 8, 9, 10, 11]  # gates of heads 0 and 1
    assert rows[12:16] == [4, 5, 6, 7]  # hidden states of head 0
    assert sorted(rows) == list(range(24))
    before, after = story.in_proj_labels(Plamo2Config())
    assert after == [before[r] for r in rows]
    assert after[4] == "h1 gate0" and after[12] == "h0 x0"


@pytest.mark.parametrize("tied", [False, True])
def test_main_records(records, tied):
    recs = records[tied]
    assert list(recs) == list(BEHAVIOURS)
    n = 29 if tied else 30
    for behaviour, rec in recs.items():
        s = rec.series[story.DEVIATION]
        assert len(s.x) == n and rec.outcome["parameters"] == n
        wrong = {x: y for x, y in zip(s.x, s.y, strict=True) if y}
        assert set(wrong) == set(rec.outcome["wrong"])
        if behaviour in ("old", "new"):
            assert wrong == {}
        elif behaviour == "moved-verbatim":
            assert wrong == {"model.norm.weight": 1.0}
            assert rec.outcome["wrong"] == {"model.norm.weight": -1.0}
        else:
            assert set(wrong) == {x for x in s.x if x.endswith(FIVE)} and len(wrong) == 5
            assert set(wrong.values()) == {1.0} and set(rec.outcome["wrong"].values()) == {1.0}
        assert rec.outcome["ledger never loaded"] == 0  # the ledger cannot see a wrong value
    assert recs["old"].outcome["load_weights returned"] == "None"
    assert recs["new"].outcome["load_weights returned"] == f"set of {n} names"


def test_forward_record_changes_exactly_the_wrong_norms():
    rec = story.forward_record()
    assert list(rec.series) == list(BEHAVIOURS)
    nonzero = {b: {x for x, y in zip(s.x, s.y, strict=True) if y} for b, s in rec.series.items()}
    assert nonzero["old"] == nonzero["new"] == set()
    assert nonzero["moved-verbatim"] == {"model.norm"}
    assert nonzero["loose-match"] == {x for x in rec.series["new"].x if x.endswith(
        ("B_norm", "C_norm", "dt_norm", "q_norm", "k_norm"))}  # fmt: skip
    # Final norm weight w vs w + 1 on a normalised input: the output shifts by x / rms(x).
    assert rec.series["moved-verbatim"].y[-1] > 1.0


def test_lm_head_overwrite():
    rec = story.lm_head_overwrite()
    by_case = {e["case"]: e for e in rec.events}
    assert list(by_case) == list(story.LM_HEAD_CASES)
    overwritten = by_case["new, skip_prefixes removed"]
    assert overwritten["embedding == checkpoint lm_head.weight"] is True
    assert overwritten["embed_tokens sources"] == ["lm_head.weight"]
    for case, ev in by_case.items():
        assert ev["lm_head is embed_tokens"] is True
        if case != "new, skip_prefixes removed":
            assert ev["embedding == checkpoint embed_tokens"] is True, case
    ys = dict(zip(*[rec.series["max |embedding - checkpoint embedding|"].__dict__[k]
                    for k in ("x", "y")], strict=True))  # fmt: skip
    assert (
        ys["new, skip_prefixes removed"] > 0
        and sum(ys.values()) == ys["new, skip_prefixes removed"]
    )


def test_tables():
    table = story.delegation_table("new")
    norm = table.row("model.norm.weight")
    assert norm[1:4] == ["Plamo2Model.load_weights", "norm.weight", "norm.weight"]
    assert "+1" in norm[4]
    assert story.delegation_table("moved-verbatim").row("model.norm.weight")[4] == "as is"
    assert table.row("lm_head.weight")[1] == "AutoWeightsLoader, walked"
    assert list(story.delegation_table("old", limit=5).notes) == ["... 25 more"]
    assert "final norm: 'model.norm.weight' in name -> matches nothing" in (
        story.delegation_picture("moved-verbatim")
    )
    loose = story.delegation_picture("loose-match", width=10_000).splitlines()[-1]
    assert (
        loose.split(" -> ")[1].count("'") == 12 and "'layers.layers.1.mixer.q_norm.weight'" in loose
    )
    assert "'model.' stripped" in story.delegation_picture("new", tied=True)
    tests = story.final_norm_test_table()
    assert tests.row("model.norm.weight")[1:] == [
        "model.norm.weight", "norm.weight", "+1.0", "+1.0", "no", "+1.0"
    ]  # fmt: skip
    b_norm = next(r for r in tests.cells() if "B_norm_weight" in r[0])
    assert b_norm[3:] == ["no", "no", "no", "+1.0"]
    for tied in (False, True):
        side = story.ledger_side_by_side(tied=tied)
        assert list(side.notes) == ["same parameters loaded: True; never loaded: old [], new []"]
    tied = story.ledger_side_by_side(kind="tied-with-lm-head")
    skipped = [r for r in tied.cells() if r[0].startswith("checkpoint lm_head")]
    assert skipped == [
        [
            "checkpoint lm_head.weight",
            "skipped: old loader: tied lm_head.weight",
            "skip_prefixes 'lm_head.'",
        ]
    ]
    assert tied.tail(1).cells() == skipped  # the notebook shows this row alone


def test_heatmap_shows_every_behaviour_and_the_toggle_swaps_checkpoints():
    view = story.main_view()
    assert view.toggle.options == ("untied", "tied") and view.toggle.value == "untied"
    (trace,) = view.chart.fig.data
    assert len(trace.y) == 30 and len(trace.x) == len(BEHAVIOURS)
    assert [x.split("<br>")[1] for x in trace.x] == ["all exact", "all exact", "1 wrong", "5 wrong"]
    cells = {
        (r, c): v
        for r, row in zip(trace.y, trace.z, strict=True)
        for c, v in zip(trace.x, row, strict=True)
        if v
    }
    assert sorted(cells.values()) == [-1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert cells[("norm.weight", trace.x[2])] == -1.0  # moved-verbatim: final norm 1.0 too low
    view.toggle.value = "tied"
    (trace,) = view.chart.fig.data
    assert len(trace.y) == 29 and "lm_head.weight" not in trace.y
    assert view.chart.fig.layout.title.text.endswith("[tied]")
    assert "heatmap: 29 x 4 cells, values ['-1', '0', '1']" in figure_data(view.chart)


def test_forward_and_lm_head_figures_say_exact():
    fig = story.forward_figure(story.forward_record())
    (trace,) = fig.data
    assert [x.split("<br>")[1] for x in trace.x] == ["all exact", "all exact", "1 wrong", "5 wrong"]
    lm = story.lm_head_figure(story.lm_head_overwrite())
    # Only "skip_prefixes removed" ends with lm_head.weight in the embedding: its bar is the
    # checkpoint's own gap between the two tensors, read here with the safetensors library.
    folder = story.DATA_DIR / "plamo2" / "tied-with-lm-head"
    tensors = {}
    for shard in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(shard))
    gap = (tensors["lm_head.weight"] - tensors["model.embed_tokens.weight"]).abs().max().item()
    assert gap > 0
    labels = [t.split(":")[0] for t in lm.data[0].text]
    assert labels == ["exact", "exact", f"{gap:.3g}", "exact"]


def test_missing_data_names_the_file(monkeypatch, tmp_path):
    monkeypatch.setattr(story, "DATA_DIR", tmp_path)
    with pytest.raises(story.CheckpointError, match="generate.py"):
        story.read_weights("tied")


def test_in_proj_figure():
    fig = story.in_proj_figure(Plamo2Config())
    z = fig.data[0].z
    assert list(z[0][:8]) == [0] * 8 and list(z[1][:12]) == [0] * 4 + [1] * 4 + [2] * 4


@pytest.mark.parametrize("kind", list(story.DATA_FILES))
def test_story_configs_build_on_meta_the_shapes_of_their_checkpoint(kind):
    config = story.config_of(kind)
    with torch.device("meta"):
        model = Plamo2ForCausalLM(config)
    got = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert all(p.is_meta for p in model.parameters())
    header = open_checkpoint(story.data_path(kind)).tensors
    tied_head = {"lm_head.weight"} if config.tie_word_embeddings else set()
    want = {rename(k): tuple(t.shape) for k, t in header.items() if k not in tied_head}
    assert got == want
