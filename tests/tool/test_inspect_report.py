"""The whole report (loadkit_inspect.inspect_report): each section's own text, in order, the
loaders' headline first and the verdict last; its ``--json`` document; keyword-only sections."""

import json

import pytest
from repo_paths import DATA

from loadkit.checkpoint import open_checkpoint
from loadkit.terms import VLLM_VERSION
from loadkit_inspect import InspectReport, inspect_checkpoint
from loadkit_inspect.report.summary import summarize_checkpoint


def heads(report: InspectReport, **kw) -> list[str]:
    """The report's section titles: its lines that start at column 0."""
    return [line.split("  ")[0] for line in report.render(**kw).splitlines() if line[:1].strip()]


def test_a_header_only_report_is_the_checkpoint_its_layout_and_the_verdict():
    report = inspect_checkpoint(DATA / "plamo2" / "tied-with-lm-head")
    assert heads(report) == ["checkpoint", "layout", "verdict: headers valid; no model given, so "
                             "names were not matched (exit 0)"]  # fmt: skip


def test_the_fix_comes_first_and_the_verdict_last_under_one_loader(plamo2_broken):
    report = inspect_checkpoint(plamo2_broken, model="plamo2")
    assert heads(report)[:5] == ["suggested fix", "checkpoint", "layout", "model", "load"]
    last = report.render().splitlines()[-1]
    assert last.startswith(f"verdict: vllm {VLLM_VERSION}: would NOT load: 2 unexpected;")
    assert last.endswith("(exit 1)") and report.exit_status == 1
    # the load section leaves out what the fix explains, and says so
    assert "  unexpected names (2): 2 explained by the suggested fix, above" in report.render()


def test_two_loaders_put_their_headline_first_and_name_each_section(hf_clean):
    report = inspect_checkpoint(hf_clean("llama"), model="hf")
    lines = report.render().splitlines()
    phrases = [report.loaders[n].phrase() for n in report.selected_loaders]
    assert len(phrases) == 2 and all("would load cleanly" in p for p in phrases)
    # each loader's verdict first (one line, or a line each when they do not fit on one) ...
    head = lines[: lines.index("")]
    assert head in ([" | ".join(phrases)], phrases)
    # ... the load section says whose it is, the transformers section follows it ...
    assert "load  (vllm loader: simulated on the meta device, 1 pass)" in lines
    assert heads(report).index("transformers") > heads(report).index("load")
    # ... and the verdict repeats them, last
    tail = lines[lines.index("verdict:") :] if "verdict:" in lines else lines[-1:]
    assert tail in (["verdict:", *(f"  {p}" for p in phrases), "  (exit 0)"],
                    [f"verdict: {' | '.join(phrases)} (exit 0)"])  # fmt: skip


def test_the_json_document_holds_every_section_and_the_verdict():
    report = inspect_checkpoint(DATA / "plamo2" / "untied.safetensors", model="plamo2", tp=None)
    doc = json.loads(report.to_json())
    assert sorted(doc) == [
        "checkpoint", "clean", "exit_status", "layout", "load", "loaders", "mapper", "model",
        "not_offered", "probe", "rename_fix", "schema", "selected_loaders", "suggested_fix",
        "tensor_parallel", "transformers",
    ]  # fmt: skip
    assert doc["clean"] is True and doc["exit_status"] == 0 and doc["probe"] is None
    assert doc["model"]["class"] == "Plamo2ForCausalLM"
    assert json.loads(report.to_json(indent=2)) == doc


def test_sections_are_given_by_name_only():
    summary = summarize_checkpoint(open_checkpoint(DATA / "plamo2" / "untied.safetensors"))
    report = InspectReport(summary, strict_index=True)
    assert report.clean is None and report.exit_status == 0
    with pytest.raises(TypeError):
        InspectReport(summary, None)  # type: ignore[misc]  # the second section by position
