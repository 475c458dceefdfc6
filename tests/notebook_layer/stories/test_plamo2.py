"""Notebook 02's loads (its own ``load``) and what ``loadkit_notebooks.stories.plamo2`` draws."""

import pytest
import torch
from notebook_code import notebook_namespace
from repo_paths import DATA as DATA_DIR
from safetensors.torch import load_file

from loadkit import open_checkpoint
from loadkit.models.plamo2 import BEHAVIOURS, Plamo2Config, Plamo2ForCausalLM, rename
from loadkit_notebooks.stories import plamo2 as story
from loadkit_notebooks.viz import figure_data

# The committed Plamo2 checkpoints (data/generate.py writes them).
DATA_FILES = {
    "untied": "plamo2/untied.safetensors",
    "tied": "plamo2/tied.safetensors",
    "tied-with-lm-head": "plamo2/tied-with-lm-head",
}
FIVE = ("B_norm.weight", "C_norm.weight", "dt_norm.weight", "q_norm.weight", "k_norm.weight")


@pytest.fixture(scope="module")
def nb():
    return notebook_namespace("02_plamo2_autoweightsloader.ipynb")


@pytest.fixture(scope="module")
def loads(nb):
    return {b: nb["load"](b) for b in BEHAVIOURS}


@pytest.fixture(scope="module")
def reference(nb, loads):
    return story.reference_state(loads["new"].model, nb["stream"])


def _weights(kind):
    return list(open_checkpoint(DATA_DIR / DATA_FILES[kind]).weights())


@pytest.mark.parametrize("kind", ["untied", "tied"])
def test_reference_state_is_what_old_and_new_load(nb, kind):
    weights = _weights(kind)
    config = Plamo2Config(tie_word_embeddings=kind == "tied")
    for behaviour in ("old", "new"):
        model = nb["load"](behaviour, weights, config).model
        ref = story.reference_state(model, weights)
        got = dict(model.named_parameters())
        assert got.keys() == ref.keys()
        assert all(torch.equal(got[k], ref[k]) for k in ref), (kind, behaviour)


def test_the_notebooks_stream_is_make_checkpoint_in_file_order(nb):
    assert [n for n, _ in nb["stream"]] == sorted(nb["tensors"])  # safetensors sorts by name
    assert nb["stream"][0][0] == "lm_head.weight"


def test_in_proj_source_rows_by_hand():
    # heads 3, head_dim 4: checkpoint rows per head are [gate 0..3, x 0..3].
    config = Plamo2Config()
    rows = story.in_proj_source_rows(config)
    assert rows[:8] == [0, 1, 2, 3, 8, 9, 10, 11]  # gates of heads 0 and 1
    assert rows[12:16] == [4, 5, 6, 7]  # hidden states of head 0
    assert sorted(rows) == list(range(24))
    before, after = story.in_proj_labels(config, rows)
    assert after == [before[r] for r in rows]
    assert after[4] == "h1 gate0" and after[12] == "h0 x0"
    z = story.in_proj_figure(config, rows).data[0].z
    assert list(z[0][:8]) == [0] * 8 and list(z[1][:12]) == [0] * 4 + [1] * 4 + [2] * 4


def test_outcomes(loads, reference):
    for behaviour, loaded in loads.items():
        out = story.outcome(loaded, reference)
        wrong = out["wrong"]
        if behaviour in ("old", "new"):
            assert wrong == {}
        elif behaviour == "moved-verbatim":
            assert wrong == {"model.norm.weight": -1.0}
        else:
            assert {n for n in wrong if n.endswith(FIVE)} == set(wrong) and len(wrong) == 5
            assert set(wrong.values()) == {1.0}
        assert out["ledger never loaded"] == 0  # the ledger cannot see a wrong value
    assert story.outcome(loads["old"], reference)["load_weights returned"] == "None"
    assert story.outcome(loads["new"], reference)["load_weights returned"] == "set of 30 names"


def test_the_map_shows_every_loader_and_only_the_wrong_rows(loads, reference):
    fig = story.deviation_figure(story.deviation_map(loads, reference))
    (trace,) = fig.data
    assert [x.split("<br>")[1] for x in trace.x] == ["all exact", "all exact", "1 wrong", "5 wrong"]
    assert list(trace.y)[-1] == "24 others: exact everywhere" and len(trace.y) == 7
    cells = {
        (r, c): v
        for r, row in zip(trace.y, trace.z, strict=True)
        for c, v in zip(trace.x, row, strict=True)
        if v
    }
    assert sorted(cells.values()) == [-1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert cells[("norm.weight (final)", trace.x[2])] == -1.0  # moved-verbatim: 1.0 too low
    assert fig.layout.height <= 500  # a screen high, with room for the text around it
    assert "heatmap: 7 x 4 cells, values ['-1', '0', '1']" in figure_data(fig)


def test_forward_record_changes_exactly_the_wrong_norms(loads, reference):
    rec = story.forward_record(loads, reference)
    assert list(rec.series) == list(BEHAVIOURS)
    nonzero = {b: {x for x, y in zip(s.x, s.y, strict=True) if y} for b, s in rec.series.items()}
    assert nonzero["old"] == nonzero["new"] == set()
    assert nonzero["moved-verbatim"] == {"model.norm"}
    assert nonzero["loose-match"] == {x for x in rec.series["new"].x if x.endswith(
        ("B_norm", "C_norm", "dt_norm", "q_norm", "k_norm"))}  # fmt: skip
    # Final norm weight w vs w + 1 on a normalised input: the output shifts by x / rms(x).
    assert rec.series["moved-verbatim"].y[-1] > 1.0
    (trace,) = story.forward_figure(rec).data
    assert [x.split("<br>")[1] for x in trace.x] == ["all exact", "all exact", "1 wrong", "5 wrong"]


def test_lm_head_overwrite(nb):
    tied = Plamo2Config(tie_word_embeddings=True)
    with_head = _weights("tied-with-lm-head")
    ckpt = dict(with_head)
    cases = {
        "new": nb["load"]("new", with_head, tied).model,
        "skip removed": nb["without_skip"](with_head),
    }
    embed, head = ckpt["model.embed_tokens.weight"], ckpt["lm_head.weight"]
    rec = story.lm_head_record(cases, embed, head)
    by_case = {e["case"]: e for e in rec.events}
    assert by_case["skip removed"]["embedding == checkpoint lm_head.weight"] is True
    assert by_case["skip removed"]["embed_tokens sources"] == ["lm_head.weight"]
    assert by_case["new"]["embedding == checkpoint embed_tokens"] is True
    # The overwritten bar is the checkpoint's own gap between the two tensors, read here with
    # the safetensors library.
    tensors = {}
    for shard in sorted((DATA_DIR / DATA_FILES["tied-with-lm-head"]).glob("*.safetensors")):
        tensors.update(load_file(shard))
    gap = (tensors["lm_head.weight"] - tensors["model.embed_tokens.weight"]).abs().max().item()
    labels = [t.split(":")[0] for t in story.lm_head_figure(rec).data[0].text]
    assert gap > 0 and labels == ["exact", f"{gap:.3g}"]


def test_tables(nb, loads):
    table = story.delegation_table(loads["new"])
    norm = table.row("model.norm.weight")
    assert norm[1:4] == ["Plamo2Model.load_weights", "norm.weight", "norm.weight"]
    assert "+1" in norm[4]
    assert story.delegation_table(loads["moved-verbatim"]).row("model.norm.weight")[4] == "as is"
    assert table.row("lm_head.weight")[1] == "AutoWeightsLoader, walked"
    assert list(story.delegation_table(loads["old"], limit=5).notes) == ["... 25 more"]
    assert "final norm: 'model.norm.weight' in name -> matches nothing" in (
        story.delegation_picture(loads["moved-verbatim"])
    )
    loose = story.delegation_picture(loads["loose-match"], width=10_000).splitlines()[-1]
    assert (
        loose.split(" -> ")[1].count("'") == 12 and "'layers.layers.1.mixer.q_norm.weight'" in loose
    )
    tests = story.final_norm_test_table(loads, nb["stream"])
    assert tests.row("model.norm.weight")[1:] == [
        "model.norm.weight", "norm.weight", "+1.0", "+1.0", "no", "+1.0"
    ]  # fmt: skip
    b_norm = next(r for r in tests.cells() if "B_norm_weight" in r[0])
    assert b_norm[3:] == ["no", "no", "no", "+1.0"]
    side = story.ledger_side_by_side(loads["old"], loads["new"])
    assert list(side.notes) == ["same parameters loaded: True; never loaded: old [], new []"]
    tied, with_head = Plamo2Config(tie_word_embeddings=True), _weights("tied-with-lm-head")
    pair = [nb["load"](b, with_head, tied) for b in ("old", "new")]
    assert "'model.' stripped" in story.delegation_picture(pair[1])
    skipped = [
        r for r in story.ledger_side_by_side(*pair).cells() if r[0].startswith("checkpoint lm")
    ]
    assert skipped == [
        [
            "checkpoint lm_head.weight",
            "skipped: old loader: tied lm_head.weight",
            "skip_prefixes 'lm_head.'",
        ]
    ]
    assert story.ledger_side_by_side(*pair).tail(1).cells() == skipped  # shown alone


@pytest.mark.parametrize("kind", list(DATA_FILES))
def test_configs_build_on_meta_the_shapes_of_their_checkpoint(kind):
    config = Plamo2Config(tie_word_embeddings=kind != "untied")
    with torch.device("meta"):
        model = Plamo2ForCausalLM(config)
    got = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert all(p.is_meta for p in model.parameters())
    header = open_checkpoint(DATA_DIR / DATA_FILES[kind]).tensors
    tied_head = {"lm_head.weight"} if config.tie_word_embeddings else set()
    want = {rename(k): tuple(t.shape) for k, t in header.items() if k not in tied_head}
    assert got == want
