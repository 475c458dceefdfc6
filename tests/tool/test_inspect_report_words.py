"""The report's words (issue 24): counts that add up, one order for shapes, hints where the layout
has them, and sections that look alike."""

from __future__ import annotations

from hf_cases import ARCHS, m_transpose, read_tensors, write_variant

from loadkit_inspect import inspect_checkpoint


def _section(text: str, title: str) -> list[str]:
    """The lines of the report section that starts with ``title``, up to the next blank line."""
    return text.split(f"\n{title}")[1].split("\n\n")[0].splitlines()


def test_a_transposed_gpt2_weight_is_counted_and_hinted(hf_clean, tmp_path):
    clean = hf_clean("gpt2")
    tensors = m_transpose(ARCHS["gpt2"], read_tensors(clean))
    (key,) = [k for k, v in tensors.items() if v.shape != read_tensors(clean)[k].shape]
    report = inspect_checkpoint(
        write_variant(clean, tensors, tmp_path / "t"), model="hf", model_impl="transformers"
    )
    text = report.render()
    load = report.load
    assert load is not None
    mismatched, errored = load.failed_tensors()
    assert (mismatched, errored) == (1, 0)
    # filled, missing and mismatched add up to the model's tensors: nothing counted nowhere
    assert load.filled + len(load.missing) + mismatched == load.model_tensors
    n, filled, missing = load.model_tensors, load.filled, len(load.missing)
    assert f"  model {n} tensors: {filled} filled, {missing} missing, 1 mismatched" in text
    shape = list(tensors[key].shape)
    pair = f"checkpoint {shape}, model {shape[::-1]} (transposed?)"
    # one order and one pair of words in both loaders' sections
    vllm_rows = [r for r in _section(text, "load  (") if r.startswith(f"    {key} -> ")]
    assert len(vllm_rows) == 1 and vllm_rows[0].endswith(f": {pair}")
    assert f"    {key}  {pair}" in _section(text, "transformers  ")
    assert "parameter [" not in text
    counts = report.as_dict()["load"]["counts"]["model"]
    assert (counts["mismatched"], counts["load_error"]) == (1, 0)


def test_mapper_rules_print_once_as_written_and_a_dropped_key_is_named(hf_clean):
    """GPT-2 under vLLM's backend: its ``attn.bias`` regex (from transformers'
    ``_keys_to_ignore_on_load_unexpected``) also drops ``c_attn.bias`` (docs/fidelity.md)."""
    report = inspect_checkpoint(
        hf_clean("gpt2"), model="hf", model_impl="transformers", loader="vllm"
    )
    text = report.render()
    (entry,) = [m for m in report.as_dict()["load"]["missing"] if ".h.0." in m["name"]]
    assert (entry["dropped_key"], entry["dropped_by"]) == (
        "transformer.h.0.attn.c_attn.bias",
        "regex 'attn.bias'",
    )
    mapper = _section(text, "mapper  (")
    # a renaming's label says what it writes: once, not again after an arrow
    assert "  renaming 'LayerNorm.gamma -> LayerNorm.weight': fired for 0 keys" in mapper
    # a regex as the regex itself (what --mapper JSON decodes to), not the repr of its repr
    assert any(
        r.startswith("  regex    '^transformer\\.(.+)' -> 'model.\\1': fired for ") for r in mapper
    )
    assert not any("\\\\" in r for r in mapper)
    assert "           e.g. transformer.h.0.attn.c_attn.bias -> dropped" in mapper
    assert "    transformer.h.0.attn.c_attn.bias  (regex 'attn.bias')" in mapper
    missing = _section(text, "  missing: model tensors never filled")
    i = missing.index("    model.h.0.attn.c_attn.bias  [48] float32")
    assert missing[i + 1] == (
        "      its key transformer.h.0.attn.c_attn.bias was dropped by regex 'attn.bias'"
    )
    # every section's rows start 4 columns in; a row's details 6
    other = _section(text, "  other keys, not loaded")
    assert other[1] == "    2 dropped by mapper: regex 'attn.bias'"
    assert other[2] == "      transformer.h.0.attn.c_attn.bias, transformer.h.1.attn.c_attn.bias"


def test_a_suggested_regex_reads_as_written_not_json_escaped():
    """Issue 39: the readable line showed ``regex '(?<![^.])encoder\\\\.layer\\\\.1(?=\\\\.|$)'``
    (JSON's escaping); the pasteable ``--mapper`` JSON keeps its own."""
    from loadkit_inspect.fixes.suggest import Rule

    rule = Rule("regex", r"(?<![^.])encoder\.layer\.1(?=\.|$)", "encoder.layer.0")
    assert rule.words() == r"regex '(?<![^.])encoder\.layer\.1(?=\.|$)' -> 'encoder.layer.0'"
    assert Rule("prefix", "model.\n", "").words() == "prefix 'model.\\n' -> ''"
