"""Both columns of ``inspect --model hf`` on checkpoints transformers wrote, against transformers.

For each architecture (tiny config, seeded values, ``save_pretrained``; sharded for some) and each
mutation of its checkpoint (a key dropped, renamed, reshaped, transposed, an extra key, a stray
bias, the base-model prefix added or removed, ``model.`` before every key, one float16 tensor,
sharded with an index, a head saved inside the base model, legacy names, a stale buffer, a tied
head saved):

- the ``transformers`` column (header-only) equals ``from_pretrained(...,
  output_loading_info=True)``: missing, unexpected and mismatched keys, whether it loads cleanly,
  and whether ``from_pretrained`` raises;
- the ``vllm`` column equals transformers' answer, or transformers' answer with the documented
  difference applied (``hf_cases.KNOWN_DIFFERENCES`` and the rest), and such a difference is
  real on the clean checkpoint. ``make test-upstream`` holds it against vLLM's own code.
"""

from __future__ import annotations

import pytest
from hf_cases import (
    ARCHS,
    CASE_DIFFERENCES,
    KNOWN_DIFFERENCES,
    MUTATION_DIFFERENCES,
    cases,
    run_case,
)
from hf_layouts import layout_cases, run_layout, vllm_column

REQUIRED = {
    "BartForConditionalGeneration",
    "MBartForConditionalGeneration",
    "DebertaV2Model",
    "ElectraModel",
    "DistilBertForSequenceClassification",
    "LlamaForSequenceClassification",
    "BertModel",
    "GPT2LMHeadModel",
    "GPTNeoXForCausalLM",
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "MistralForCausalLM",
    "GemmaForCausalLM",
    "Phi3ForCausalLM",
    "OPTForCausalLM",
    "T5ForConditionalGeneration",
    "ViTModel",
    "WhisperForConditionalGeneration",
    "BloomForCausalLM",
}


@pytest.mark.slow  # about 400 cases: a save, two from_pretrained and an inspect each (~1 min)
@pytest.mark.parametrize(("arch", "mutation"), cases())
def test_both_columns_against_transformers(arch, mutation, hf_clean, tmp_path):
    row = run_case(ARCHS[arch], mutation, hf_clean(arch), tmp_path / "variant")
    column, raw = row["transformers_column"], row["from_pretrained"]
    assert set(column.missing) == raw.missing
    assert set(column.unexpected) == raw.unexpected
    assert {m.name for m in column.mismatched} == raw.mismatched
    assert column.clean == raw.clean
    assert column.raises == row["from_pretrained_raises"]
    assert row["transformers_agrees"]
    # its outcome in its own terms: it raises, or returns the model with warnings, or cleanly
    raises = row["from_pretrained_raises"]
    outcome = "raises" if raises else "loads" if raw.clean else "warns"
    assert column.outcome == report_outcome(row["report"]) == outcome

    ours, hf, expected, report = row["loadkit"], row["transformers"], row["expected"], row["report"]
    differs = (
        arch in KNOWN_DIFFERENCES
        or mutation in MUTATION_DIFFERENCES
        or (arch, mutation) in CASE_DIFFERENCES
    )
    if expected is not None:
        assert ours == expected, (
            f"\ntransformers: {hf.describe()}\nexpected:     {expected.describe()}"
            f"\nvllm column:  {ours.describe()}\n{report.render(limit=50)}"
        )
    if not differs:
        assert ours == hf
    if mutation == "clean":
        # transformers loads every clean checkpoint; vLLM too, unless a known difference bites,
        # and then the difference must be real (this fails once transformers or the rule moves).
        assert raw.clean and column.clean
        assert ours.clean == (arch not in KNOWN_DIFFERENCES)


def test_enough_architectures_and_mutations():
    assert len(ARCHS) >= 25
    assert REQUIRED <= {a.cls for a in ARCHS.values()}
    names = {m for _, m in cases()}
    assert len(names) >= 10
    assert {
        "clean",
        "key dropped",
        "key renamed",
        "key reshaped",
        "key transposed",
        "extra key",
        "extra bias",
        "base prefix added",
        "base prefix removed",
        "one float16 tensor",
        "tied head saved",
        "sharded with an index",
    } <= names
    # Each vLLM wrapper is exercised: generative, embedding and classification models.
    kinds = {ARCHS[a].cls for a, _ in cases()}
    assert {"BertModel", "BertForSequenceClassification", "LlamaForCausalLM"} <= kinds


def report_outcome(report) -> str:
    """The outcome the report's text and its JSON give the transformers loader, which must be
    one."""
    doc = report.as_dict()
    said = report.loaders["transformers"].phrase()
    words = {
        "loads": ": would load cleanly",
        "warns": ": would load, but ",
        "raises": ": would raise ",
    }
    assert words[doc["transformers"]["outcome"]] in said, said
    assert doc["loaders"]["transformers"]["outcome"] == doc["transformers"]["outcome"]
    assert doc["transformers"]["raises"] == (doc["transformers"]["outcome"] == "raises")
    return doc["transformers"]["outcome"]


@pytest.mark.slow  # 374 cases: a folder, from_pretrained on it and on a control, two inspects
@pytest.mark.parametrize(("arch", "layout"), layout_cases())
def test_folder_layouts_against_both_loaders(arch, layout, hf_clean, tmp_path):
    """Each loader chooses its files itself: the transformers column is from_pretrained on the
    folder (outcome, lists, what it raises); the vllm column raises where vLLM raises before
    loading, and otherwise is transformers' verdict on exactly the tensors vLLM reads."""
    row = run_layout(ARCHS[arch], layout, hf_clean(arch), tmp_path)
    oracle, report = row["oracle"], row["report"]
    column, verdict = report.from_pretrained, report.loaders["transformers"]
    text = report.render()
    assert (column.outcome, verdict.outcome) == (oracle.outcome, oracle.outcome), text
    assert report_outcome(report) == oracle.outcome
    assert report.as_dict()["transformers"]["raises"] == (oracle.outcome == "raises")
    if oracle.outcome == "raises":
        assert column.error is not None and column.error.error == oracle.error, text
        if oracle.error in ("OSError", "ValueError"):  # transformers' own words, quoted
            assert column.error.message == oracle.message
        assert f"transformers 5.24.0: would raise {oracle.error}" in text
    else:
        assert oracle.lists is not None
        assert set(column.missing) == oracle.lists.missing
        assert set(column.unexpected) == oracle.lists.unexpected
        assert {m.name for m in column.mismatched} == oracle.lists.mismatched
    vllm = report.loaders["vllm"]
    if row["refused"]:  # vLLM refuses the architecture first, whatever the folder
        assert not vllm.clean and vllm.problems == [row["refused"]], text
    elif row["layout"].vllm_raises is not None:
        assert not vllm.clean and any(
            p.startswith(f"raises {row['layout'].vllm_raises}") for p in vllm.problems
        ), text
    else:
        assert vllm_column(report) == row["expected_vllm"], text
        assert vllm.clean == row["expected_vllm"].clean, text
    # the exit status is every column's, and --json says the same
    assert report.exit_status == (0 if vllm.clean and verdict.clean else 1)


def test_what_from_pretrained_raises_before_loading_outranks_a_quantizer_not_modelled():
    from loadkit_inspect.simulate.from_pretrained import FromPretrained, Raised

    fp = FromPretrained("M", (), (), (), (), False, {}, "5", quantized="fp8")
    assert fp.outcome == "unknown" and not fp.clean
    missing = fp._replace(raised=Raised("FileNotFoundError", "no model-00002 shard"))
    assert missing.outcome == "raises"
    assert "not simulated" in missing.render(20)[-1] and "lists below" not in missing.render(20)[-2]


def test_a_conversion_error_is_said_without_transformers_traceback(tmp_path, quiet_transformers):
    """One expert's up projection missing: transformers cannot concatenate the layer's experts
    and raises; its log keeps a traceback of torch's internals, the verdict keeps the error."""
    from native_cases import ARCHS, Variant, read_tensors, save_clean, write_variant

    from loadkit_inspect import inspect_checkpoint

    clean = save_clean(ARCHS["qwen3-moe"], tmp_path / "clean")
    drop = "model.layers.1.mlp.experts.2.up_proj.weight"
    t = {k: v for k, v in read_tensors(clean).items() if k != drop}
    report = inspect_checkpoint(write_variant(clean, Variant(t), tmp_path / "v"), model="hf")
    verdict = report.loaders["transformers"]
    assert verdict.outcome == "raises"
    (error,) = report.from_pretrained.errors
    assert error.startswith("model.layers.1.mlp.experts.gate_up_proj: RuntimeError: ")
    assert "Traceback" not in error and "File " not in error and "\n" not in error
    assert error.endswith("destined for model.layers.1.mlp.experts.gate_up_proj. Ckpt contains: 2")
