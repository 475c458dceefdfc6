"""The model and load sections (loadkit_inspect.report.records): records, JSON and text, built
by hand so each line can be checked against what the record holds."""

from loadkit.terms import Status
from loadkit_inspect.options import LoadRules
from loadkit_inspect.report.records import (
    DtypeCast,
    KeyOutcome,
    LoadReport,
    Missing,
    ModelSummary,
    ShapeMismatch,
    Unexpected,
    render_load,
)


def a_load(**kw) -> LoadReport:
    """Five keys: two loaded, one unexpected, one shape mismatch, one skipped by a rule; a missing
    tensor allowed by --allow-missing, one that is not; an incompatible cast."""
    keys = [
        KeyOutcome("a.weight", Status.LOADED, target="a.weight"),
        KeyOutcome("b.weight", Status.LOADED, target="b.weight"),
        KeyOutcome("extra.bias", Status.UNEXPECTED, message="no such parameter"),
        KeyOutcome("c.weight", Status.SHAPE_MISMATCH, target="c.weight"),
        KeyOutcome("rotary.inv_freq", Status.SKIPPED, rule="skip_prefixes 'rotary.'"),
    ]
    return LoadReport(
        keys=keys,
        missing=[
            Missing("head.weight", (4, 2), "F32", suggestions=["extra.bias"]),
            Missing("pool.bias", (2,), "F32", allowed="pool.*"),
        ],
        unexpected=[
            Unexpected(
                "extra.bias", "model.extra.bias", "no such parameter", ["head.weight"], (4,), "F32"
            )
        ],
        shape_mismatches=[ShapeMismatch("c.weight", "c.weight", (2, 4), (4, 2), "size")],
        dtype_casts=[DtypeCast("b.weight", "b.weight", "float32", "int64", True)],
        errors=[],
        model_tensors=5,
        filled=2,
        runs=1,
        rules=LoadRules(allow_missing=("pool.*",)),
        **kw,
    )


def test_the_load_section_says_each_fate_once():
    lines = render_load(a_load(), 20, majority="float32")
    assert lines == [
        "load  (simulated on the meta device, 1 pass)",
        "  checkpoint 5 keys: 2 loaded, 1 skipped, 1 unexpected, 1 shape mismatch",
        "  model 5 tensors: 2 filled, 2 missing (1 allowed by --allow-missing), 1 mismatched",
        "  unexpected names (1)",
        "    extra.bias  [4] F32  (looked up as 'model.extra.bias')\n"
        "      nearest: head.weight\n"
        "      no such parameter",
        "  missing: model tensors never filled (2)",
        "    head.weight  [4, 2] F32\n      renamed? unused key: extra.bias",
        "    pool.bias  [2] F32  (allowed by --allow-missing 'pool.*')",
        "  shape mismatches (1)",
        "    c.weight -> c.weight: checkpoint [4, 2], model [2, 4] (transposed?)",
        "  dtype casts, by (from, to) (1)",
        "    1 tensor float32 -> int64  INCOMPATIBLE\n      b.weight",
        "  other keys, not loaded (1)",
        "    1 skipped: skip_prefixes 'rotary.'\n      rotary.inv_freq",
    ]


def test_what_a_fix_explains_is_said_and_left_out_of_the_lists():
    lines = render_load(
        a_load(), 20, explained_keys={"model.extra.bias"}, explained_tensors={"head.weight"}
    )
    assert "  unexpected names (1): 1 explained by the suggested fix, above" in lines
    assert (
        "  missing: model tensors never filled (2): 1 explained by the suggested fix, above; "
        "the others:"
    ) in lines
    assert not any(line.startswith("    extra.bias") for line in lines)
    assert not any(line.startswith("    head.weight") for line in lines)


def test_limit_zero_counts_every_list_and_shows_no_row():
    lines = render_load(a_load(), 0)
    assert "    1 row, none shown (--json lists them all)" in lines
    assert "    2 rows, none shown (--json lists them all)" in lines
    assert not any(line.startswith("    extra.bias") for line in lines)


def test_a_cast_from_another_dtype_than_most_is_noted_and_strict_dtype_fails_every_cast():
    load = a_load()
    load.dtype_casts = [DtypeCast("b.weight", "b.weight", "int32", "float32", False)]
    load.rules = LoadRules(strict_dtype=True)
    rows = render_load(load, 20, majority="bfloat16")
    (row,) = [line for line in rows if "int32 -> float32" in line]
    assert row == (
        "    1 tensor int32 -> float32  fails (--strict-dtype)  (integers into a float parameter; "
        "unlike the checkpoint's bfloat16 tensors)\n      b.weight"
    )
    assert "1 dtype cast (--strict-dtype)" in load.problems()


def test_the_verdicts_counts_and_json_agree_with_the_lists():
    load = a_load()
    assert not load.clean
    assert load.problems() == [
        "1 unexpected",
        "1 shape mismatch",
        "1 model tensor never filled",
        "1 incompatible dtype cast",
    ]
    doc = load.as_dict()
    assert doc["counts"]["model"] == {
        "tensors": 5,
        "filled": 2,
        "missing": 2,
        "missing_allowed": 1,
        "mismatched": 1,
        "load_error": 0,
    }
    assert doc["unexpected"][0]["shape"] == [4] and doc["missing"][1]["allowed"] == "pool.*"
    assert doc["dtype_summary"] == [
        {"from_dtype": "float32", "to_dtype": "int64", "tensors": 1, "incompatible": True,
         "keys": ["b.weight"]}
    ]  # fmt: skip


def test_a_load_that_stopped_or_failed_says_so():
    lines = render_load(a_load(complete=False, failure="RuntimeError: boom"), 20, loader="vllm: ")
    assert lines[0] == "load  (vllm: simulated on the meta device, 1 pass)"
    assert "  stopped early: too many failing names; the rest was not simulated" in lines
    assert "  load failed: RuntimeError: boom" in lines


def test_the_model_section_names_what_was_built_and_how_it_loads():
    plain = ModelSummary("plamo2", "Plamo2ForCausalLM", 30, 2048, True)
    assert plain.render() == [
        "model  plamo2: Plamo2ForCausalLM, 30 tensors, 2 KiB (built on meta: no memory used); "
        "loads with its own load_weights"
    ]
    backend = {
        "transformers_version": "5.0",
        "transformers_class": "BertModel",
        "model_type": "bert",
        "wrapper": "TransformersEmbeddingModel",
        "wrapper_reason": "an encoder",
    }
    hf = ModelSummary("hf", "TransformersEmbeddingModel", 5, 10, False, backend=backend)
    assert hf.render()[1:] == [
        "  transformers 5.0 built BertModel (model_type 'bert') as self.model",
        "  wrapper TransformersEmbeddingModel: an encoder",
    ]
    assert hf.render()[0].endswith("loads with AutoWeightsLoader")
    assert hf.as_dict()["class"] == "TransformersEmbeddingModel"
