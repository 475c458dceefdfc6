"""A suggested rule is proven, never only plausible: numbered siblings keep their places (issue 24).

The published all-MiniLM-L6-v2 is a 6-layer BERT; a conversion script that numbers its layers
1..6 gave it the off-by-one studied here. transformers writes the tiny BERT of that shape, and the
mutation renames its keys.
"""

import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from loadkit_inspect.fixes.fix import NotOffered, suggest_fix
from loadkit_inspect.fixes.suggest import find_shifts, renumberings
from loadkit_inspect.inspector import inspect_checkpoint
from loadkit_inspect.report.records import KeyOutcome, LoadReport, Missing, Unexpected


def _shift(key, by=1):
    return re.sub(r"layer\.(\d+)\.", lambda m: f"layer.{int(m.group(1)) + by}.", key)


@pytest.fixture(scope="module")
def minilm(tmp_path_factory, quiet_transformers):
    """A MiniLM-L6-shaped BertModel (6 layers) saved by transformers, and its off-by-one."""
    import shutil

    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=16, num_hidden_layers=6, num_attention_heads=2, intermediate_size=32,
        vocab_size=64, max_position_embeddings=32,
    )  # fmt: skip
    root = tmp_path_factory.mktemp("minilm")
    transformers.BertModel(config).save_pretrained(root / "clean")
    tensors = load_file(root / "clean" / "model.safetensors")
    off = root / "layers-1-to-6"
    off.mkdir()
    shutil.copy(root / "clean" / "config.json", off / "config.json")
    save_file({_shift(k): v for k, v in tensors.items()}, off / "model.safetensors")
    return off


def test_a_layer_off_by_one_is_said_in_words_and_fixed_by_one_rule_per_layer(minilm):
    r = inspect_checkpoint(minilm, model="hf", model_impl="transformers")
    assert r.clean is False
    fix = r.fix
    assert [s.words() for s in fix.shifts] == [
        "checkpoint layers 1..6, model layers 0..5: shifted by 1 (model.encoder.layer.N)"
    ]
    assert [s.rule.stage for s in fix.suggestions] == ["regex"] * 6
    assert fix.explains == 96  # 16 tensors in each of the 6 layers, every one renumbered
    assert fix.proven and fix.result.clean and not fix.rejected
    text = r.render()
    assert "'.6.'" not in text  # the rule that moved layer 6 into layer 0 alone is gone
    assert "  checkpoint layers 1..6, model layers 0..5: shifted by 1" in text
    # Each checkpoint layer lands in the model layer one below it, never elsewhere.
    moved = {k.name: k.target for k in fix.result.keys if k.status == "loaded"}
    for key, target in moved.items():
        assert target == "model." + _shift(key, -1), key


def test_rules_that_move_one_sibling_and_leave_the_others_are_a_scramble():
    before = {f"k{i}": f"model.layer.{i}.w" for i in range(1, 7)}
    after = {**before, "k6": "model.layer.0.w"}  # what substr '.6.' -> '.0.' does
    (r,) = renumberings(before, after)
    assert (r.context, r.moves, r.stays, r.keys) == (
        "model.layer",
        {6: 0},
        (1, 2, 3, 4, 5),
        ("k6",),
    )
    assert "layers 6 -> 0" in r.words() and "layers 1..5 keep their numbers" in r.words()
    # Every sibling shifted alike is a shift, not a scramble.
    shifted = {k: v.replace(f".{i}.", f".{i - 1}.") for i, (k, v) in enumerate(before.items(), 1)}
    assert renumberings(before, shifted) == []
    # Numbers under another layer are other siblings: layer 1's experts are not layer 2's.
    nested = {f"e{i}{j}": f"layer.{i}.experts.{j}.w" for i in (1, 2) for j in (0, 1)}
    swap = {**nested, "e10": "layer.1.experts.1.w", "e11": "layer.1.experts.0.w"}
    assert [x.context for x in renumberings(nested, swap)] == ["layer.1.experts"]


def test_a_shift_needs_every_layer_to_hold_the_same_tensors():
    model = [f"layer.{i}.{p}" for i in range(3) for p in ("q", "k")]
    keys = {f"layer.{i}.{p}": f"layer.{i}.{p}" for i in (1, 2, 3) for p in ("q", "k")}
    (s,) = find_shifts(keys, model)
    assert (s.by, s.numbers, s.anchor) == (-1, (1, 2, 3), "layer")
    assert [(x.old, x.new) for x in s.rules()] == [  # 1->0 before 2->1: rules chain
        ("(?<![^.])layer\\.1(?=\\.|$)", "layer.0"),
        ("(?<![^.])layer\\.2(?=\\.|$)", "layer.1"),
        ("(?<![^.])layer\\.3(?=\\.|$)", "layer.2"),
    ]
    up = find_shifts({k: k for k in model}, list(keys))
    assert [x.by for x in up] == [1] and up[0].rules()[0].new == "layer.3"  # 2->3 first
    del keys["layer.3.k"]
    assert find_shifts(keys, model) == []  # layer 3 lacks a tensor layer 2 has: no shift


def test_a_scrambling_rule_is_never_offered_even_when_the_second_load_is_clean():
    # The model has layers 0..3, the checkpoint 1, 2, 3 and 6: no shift (6 is not 4), and the
    # names alone say substr '.6.' -> '.0.'. A clean second load does not make that rule right.
    model = [f"layer.{i}.q" for i in range(4)]
    ck = [f"layer.{i}.q" for i in (1, 2, 3, 6)]
    load = LoadReport(
        keys=[
            KeyOutcome(k, "loaded", k, k) if k in model else KeyOutcome(k, "unexpected", k)
            for k in ck
        ],
        missing=[Missing("layer.0.q", (2,), "float32", ["layer.6.q"])],
        unexpected=[Unexpected("layer.6.q", "layer.6.q", "no such name")],
        shape_mismatches=[], dtype_casts=[], errors=[], model_tensors=4, filled=3, runs=1,
    )  # fmt: skip
    tried = []

    def retry(mapper):
        tried.append(mapper)
        names = {k: mapper.map_name(k) for k in ck}
        return LoadReport(
            keys=[KeyOutcome(k, "loaded", v, v) for k, v in names.items()],
            missing=[], unexpected=[], shape_mismatches=[], dtype_casts=[], errors=[],
            model_tensors=4, filled=4, runs=1,
        )  # fmt: skip

    # one pair is no pattern: two layers renumbered alike would be (the rule explains both)
    assert suggest_fix(load, None, retry) is None
    load.missing.append(Missing("layer.0.k", (2,), "float32", ["layer.6.k"]))
    load.unexpected.append(Unexpected("layer.6.k", "layer.6.k", "no such name"))
    load.keys.append(KeyOutcome("layer.6.k", "unexpected", "layer.6.k"))
    ck.append("layer.6.k")
    refused = suggest_fix(load, None, retry)
    # the rule was tried (its second load is clean), then refused for what it does to layer 6
    assert [list(m.rules()) for m in tried] == [[("substr", ".6.", ".0.")]]
    assert isinstance(refused, NotOffered)
    ((rule, why),) = refused.rejected
    assert (rule.stage, rule.old, rule.new) == ("substr", ".6.", ".0.")
    assert why == (
        "it would send checkpoint layers 6 -> 0 (layer.N) while layers 1..3 keep their numbers: "
        "a scrambled model"
    )


@pytest.fixture(scope="module")
def bert4(tmp_path_factory, quiet_transformers):
    """A 4-layer BertModel transformers saved, and two conversions the suggester cannot fix:
    layer 0 saved as layer 6, and each layer's ``output.dense`` flattened to ``dense``."""
    import shutil

    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=16, num_hidden_layers=4, num_attention_heads=2, intermediate_size=32,
        vocab_size=64, max_position_embeddings=32,
    )  # fmt: skip
    root = tmp_path_factory.mktemp("bert4")
    transformers.BertModel(config).save_pretrained(root / "clean")
    tensors = load_file(root / "clean" / "model.safetensors")
    out = {}
    for name, rename in [
        ("layer-0-as-6", lambda k: k.replace("layer.0.", "layer.6.")),
        ("flat-dense", lambda k: re.sub(r"(layer\.\d+)\.output\.dense", r"\1.dense", k)),
    ]:
        (root / name).mkdir()
        shutil.copy(root / "clean" / "config.json", root / name / "config.json")
        save_file({rename(k): v for k, v in tensors.items()}, root / name / "model.safetensors")
        out[name] = root / name
    return out


def _not_offered_lines(report):
    return [line for line in report.render().splitlines() if "not offered" in line]


def test_a_rule_refused_for_scrambling_layers_is_said_when_no_fix_is_offered(bert4, loadkit_cli):
    r = inspect_checkpoint(bert4["layer-0-as-6"], model="hf", model_impl="transformers")
    assert r.fix is None and r.exit_status == 1
    why = (
        "it would send checkpoint layers 6 -> 0 (model.encoder.layer.N) while layers 1..3 keep "
        "their numbers: a scrambled model"
    )
    assert [(x.stage, x.old, x.new, w) for x, w in r.not_offered.rejected] == [
        ("substr", ".6.", ".0.", why)
    ]
    line = f"not offered: substr '.6.' -> '.0.': {why}"
    assert _not_offered_lines(r) == [line]
    assert "suggested fix" not in r.render()
    res = loadkit_cli(
        "inspect", bert4["layer-0-as-6"], "--model", "hf", "--model-impl", "transformers", "--json"
    )
    doc = json.loads(res.stdout)
    assert res.returncode == 1 and doc["suggested_fix"] is None
    assert doc["not_offered"] == [{"stage": "substr", "old": ".6.", "new": ".0.", "why": why}]
    text = loadkit_cli(
        "inspect", bert4["layer-0-as-6"], "--model", "hf", "--model-impl", "transformers"
    )
    assert line in text.stdout.splitlines() and text.returncode == 1


def test_a_rule_whose_second_load_is_worse_is_said_when_no_fix_is_offered(bert4):
    # Two pairs per layer vote for one regex: a number, then 'output.' inserted. It fires on
    # every numbered name, so the second load has more problems than the first.
    r = inspect_checkpoint(bert4["flat-dense"], model="hf", model_impl="transformers")
    assert r.fix is None and r.load.problems() == ["8 unexpected", "8 model tensors never filled"]
    ((rule, why),) = r.not_offered.rejected
    assert (rule.stage, rule.old, rule.new) == ("regex", r"(\d+)\.", r"\g<1>.output.")
    assert why == (
        "the load simulated again with it is no better: 112 problems, 16 without "
        "(56 unexpected, 56 model tensors never filled)"
    )
    # the pattern as written (a backslash once), not its repr
    assert _not_offered_lines(r) == [f"not offered: regex '{rule.old}' -> '{rule.new}': {why}"]
    assert json.loads(r.to_json())["not_offered"][0]["why"] == why


def test_nothing_refused_nothing_said(minilm):
    r = inspect_checkpoint(minilm, model="hf", model_impl="transformers")
    assert r.fix is not None and r.not_offered is None
    assert json.loads(r.to_json())["not_offered"] == []
