"""Notebook 04's story (debug your checkpoint), run on the notebook's own functions, and the
built-in models on the data/ checkpoints it lists."""

import json
import os
from importlib.metadata import version

from notebook_code import notebook_namespace

from loadkit import open_checkpoint
from loadkit.terms import VLLM_VERSION
from loadkit_inspect.inspector import inspect_checkpoint
from loadkit_inspect.models.registry import BUILTIN, build_model
from loadkit_notebooks.stories import debug


def nb04(name):
    """A function notebook 04 defines (``inspect``, ``broken_copy``, ...), as it defines it."""
    return notebook_namespace("04_debug_your_checkpoint.ipynb")[name]


def test_every_data_checkpoint_loads_cleanly_into_its_builtin_model(in_notebooks):
    paths = debug.data_checkpoints()
    # Every built-in has data. The vision tower's opens header-only in the panel: its own mapper
    # is vLLM 0.28.0's stacked stage, which fails on it on purpose (bug 5, notebook 06).
    tower = "../data/vision_tower/model.safetensors"
    # Notebook 07's padded MoE is no built-in (its model is not sized from a header): the
    # panel opens it header-only.
    unbuilt = {p for p in paths if "/padded_moe/" in p}
    assert {debug.model_for(p) for p in unbuilt} <= {debug.HEADER_ONLY}
    rest = [p for p in paths if p != tower and p not in unbuilt]
    assert {debug.model_for(p) for p in rest} == set(BUILTIN) - {"vision-tower"}
    report = inspect_checkpoint(tower, model="vision-tower")
    assert report.load.problems() == ["8 unexpected"] and report.mapper.rematches
    for path in rest:
        report = inspect_checkpoint(path, model=debug.model_for(path))
        assert report.clean, (path, report.load.problems())
        assert report.load.filled == report.model.parameters


def test_builtin_models_are_built_on_meta_and_sized_from_the_header(in_notebooks):
    specs = {p: debug.model_for(p) for p in debug.data_checkpoints()}
    specs["../data/vision_tower/model.safetensors"] = "vision-tower"  # header-only in the panel
    for path, name in specs.items():
        if name == debug.HEADER_ONLY:  # no built-in reads it (notebook 07's padded MoE)
            continue
        model, spec = build_model(name, open_checkpoint(path).tensors)
        assert all(p.is_meta for p in model.parameters()), spec


def test_default_checkpoint_and_choices(in_notebooks):
    path, model = debug.default_checkpoint()
    assert path == "../data/gemma4_like/model.safetensors" and model == "gemma4-like"
    assert debug.model_choices()[:2] == [debug.HEADER_ONLY, "hf"]
    assert set(BUILTIN) <= set(debug.model_choices())
    assert debug.model_for("/elsewhere/x.safetensors") == debug.HEADER_ONLY
    assert not any("big" in p.split(os.sep) for p in debug.data_checkpoints())


def test_treemap_tables_and_probe(in_notebooks):
    path, model = debug.default_checkpoint()
    report = nb04("inspect")(path, model)
    fig = debug.treemap_figure(report)
    (trace,) = fig.data
    assert trace.ids[0] == "(checkpoint)" and trace.values[0] == len(report.checkpoint.tensors)
    leaves = [c for c in trace.customdata if c[2]]
    assert len(leaves) == 73 and {c[1] for c in leaves} == {"loaded"}
    text = debug.treemap_data(fig)
    assert "loads cleanly into Gemma4ForConditionalGeneration" in text and "73 loaded" in text
    probe = debug.probe_table(report)
    assert "old    no hit" in probe and "100%" in probe
    assert "#0 model.language_model.embed_tokens.weight" in probe
    assert f"verdict: vllm {VLLM_VERSION}: loads cleanly (exit 0)" in debug.mismatch_tables(report)
    header_only = nb04("inspect")(path, debug.HEADER_ONLY)
    assert debug.probe_table(header_only) == "pooling probe: needs a model"
    assert set(debug.key_fates(header_only).values()) == {"header only"}


def _colour_of(fig, name):
    (trace,) = fig.data
    row = next(i for i, c in enumerate(trace.customdata) if c[2] == name)
    return trace.marker.colors[row], trace.text[row]


def test_every_key_and_missing_tensor_has_its_fate_colour(in_notebooks, tmp_path):
    from loadkit_notebooks.fates import FATE_COLOURS, PROBLEMS

    broken = nb04("broken_copy")("../data/plamo2/untied.safetensors", str(tmp_path / "b.st"))
    report = nb04("inspect")(broken, "plamo2")
    fates = debug.key_fates(report)
    assert fates["model.layers.layers.0.post_ffn_norm.weight"] == "unexpected"
    assert fates["model.norm.weight"] == "shape mismatch"
    assert fates["lm_head.weight"] == "loaded"
    fig = debug.treemap_figure(report)
    assert _colour_of(fig, "model.norm.weight") == (
        FATE_COLOURS["shape mismatch"],
        "shape mismatch",
    )
    assert _colour_of(fig, "lm_head.weight") == (FATE_COLOURS["loaded"], "")  # not red
    # the model tensors no key filled are boxes too, under a branch of their own
    missing = _colour_of(fig, "model.layers.layers.1.mlp.down_proj.weight")
    assert missing == (FATE_COLOURS["missing"], "missing")
    (trace,) = fig.data
    branch = trace.ids.index(
        "(checkpoint and missing tensors)/(missing: model tensors no key filled)"
    )
    # three missing tensors, each box drawn WEIGHT times an ordinary key's (readable labels)
    assert trace.values[branch] == 3 * debug.WEIGHT
    assert trace.values[trace.ids.index(next(i for i in trace.ids if i.endswith("/A_log")))] == 1
    # one outline width for every box: a width per box draws NaN paths on zoom (plotly)
    assert trace.marker.line.width == 2.5
    # only problem fates get warning colours, and the legend names each colour shown
    quiet = {FATE_COLOURS[f] for f in FATE_COLOURS if f not in PROBLEMS}
    assert not quiet & {FATE_COLOURS[p] for p in PROBLEMS}
    legend = fig.layout.annotations[0].text
    for fate, n in {"loaded": 26, "unexpected": 2, "shape mismatch": 1, "missing": 3}.items():
        assert f'<span style="color:{FATE_COLOURS[fate]}">\u25a0</span> {n} {fate}' in legend
    # every box has its colour given: plotly's default colour sequence is never reached
    assert len(trace.marker.colors) == len(trace.ids) and all(trace.marker.colors)


def test_broken_copy_is_found_out_and_its_fix_is_proven_by_pasting(in_notebooks, tmp_path):
    broken = nb04("broken_copy")("../data/plamo2/untied.safetensors", str(tmp_path / "b.st"))
    report = nb04("inspect")(broken, "plamo2")
    load = report.load
    assert [u.name for u in load.unexpected] == [
        "model.layers.layers.0.post_ffn_norm.weight",
        "model.layers.layers.1.post_ffn_norm.weight",
    ]
    assert [s.name for s in load.shape_mismatches] == ["model.norm.weight"]
    fix = debug.fix_text(report)
    rules = {"orig_to_new_substr": {".post_ffn_norm.": ".post_mlp_norm."}}
    assert f"--mapper '{json.dumps(rules)}'" in fix
    assert f"mapper box (notebook): {json.dumps(rules)}" in fix
    pasted = nb04("inspect")(broken, "plamo2", json.dumps(rules))  # the fix, as pasted
    assert pasted.load.unexpected == [] and pasted.load.problems() == [
        "1 shape mismatch",
        "1 model tensor never filled",
    ]
    tables = debug.mismatch_tables(report)
    assert "missing: model tensors never filled (3)" in tables and "(exit 1)" in tables


def test_index_problems_are_shown_and_their_keys_outlined(in_notebooks, tmp_path):
    from loadkit_notebooks.fates import INDEX_OUTLINE

    folder = nb04("with_index_mistakes")("../data/plamo2/tied-with-lm-head", tmp_path / "ix")
    report = nb04("inspect")(str(folder), "plamo2")
    assert report.clean and len(report.checkpoint.inconsistent) == 2
    text = debug.index_text(report)
    assert text.startswith("index problems (2): loads; the index is inconsistent")
    assert "wrong shard: 'model.norm.weight'" in text and "not in index: 'lm_head.weight'" in text
    fig = debug.treemap_figure(report)
    (trace,) = fig.data
    lines = zip(trace.customdata, trace.marker.line.color, strict=True)
    outlined = [c[2] for c, o in lines if o != "white"]
    assert sorted(outlined) == ["lm_head.weight", "model.norm.weight"]
    assert set(trace.marker.line.color) == {"white", INDEX_OUTLINE}
    assert "outlined: 2 keys an index problem names" in debug.treemap_data(fig)


def test_debug_panel_follows_its_widgets(in_notebooks, tmp_path):
    path, model = debug.default_checkpoint()
    calls = []

    def inspect(*args):  # the notebook's function, counted: the panel calls it on each change
        calls.append(args)
        return nb04("inspect")(*args)

    panel = debug.DebugPanel(inspect, path, model)
    assert calls == [(path, model, "")]
    assert panel.report.clean and "old    no hit" in panel.summary()
    assert panel.paste_fix.disabled
    panel.path.value = "../data/nowhere.safetensors"
    assert panel.summary().startswith("error: ../data/nowhere.safetensors: no such file")
    assert "no such file" in panel.output.value
    # the previous checkpoint's picture is gone; the error is printed once, below it
    assert panel.figure.data == () and panel.chart.spec["data"] == []
    assert not panel.figure.layout.annotations
    assert panel.figure.layout.title.text.endswith("(its error is below)")
    assert panel.output.value.count("no such file") == 1
    broken = nb04("broken_copy")("../data/plamo2/untied.safetensors", str(tmp_path / "b.st"))
    panel.model.value = "plamo2"
    panel.path.value = broken
    assert panel.error is None and panel.report.model.cls == "Plamo2ForCausalLM"
    assert "b.st" in panel.figure.layout.title.text and not panel.paste_fix.disabled
    panel.paste_fix.click()
    assert panel.mapper.value == '{"orig_to_new_substr": {".post_ffn_norm.": ".post_mlp_norm."}}'
    assert calls[-1] == (broken, "plamo2", panel.mapper.value)
    assert panel.report.load.unexpected == [] and panel.paste_fix.disabled
    panel.mapper.value = json.dumps({"orig_to_new_prefix": {"model.": "x."}})
    assert panel.report.clean is False
    panel.mapper.value = "{broken"
    assert "not valid JSON" in panel.summary() and panel.figure.data == ()


def test_notebook_parameters(in_notebooks, tmp_path):
    assert debug.start(None, None) == debug.default_checkpoint()
    assert debug.start(None, "(header only)")[1] == "(header only)"
    # a folder with a config.json is a Hugging Face checkpoint: "hf" reads it
    (tmp_path / "config.json").write_text("{}")
    assert debug.start(str(tmp_path), None) == (str(tmp_path), "hf")
    assert debug.model_for(str(tmp_path / "model.safetensors")) == "hf"
    assert debug.start(str(tmp_path), "pkg.mod:fn") == (str(tmp_path), "pkg.mod:fn")


def test_a_hugging_face_checkpoint_in_the_panel(in_notebooks, tmp_path):
    gpt2 = {"n_embd": 16, "n_layer": 2, "n_head": 2, "vocab_size": 64, "n_positions": 32}
    folder = nb04("tiny_hf_checkpoint")(
        str(tmp_path / "gpt2"), "GPT2LMHeadModel", "GPT2Config", **gpt2, bos_token_id=0
    )
    assert debug.model_for(folder) == "hf"
    panel = debug.DebugPanel(nb04("inspect"), folder, debug.HEADER_ONLY)
    assert panel.report.model is None
    panel.model.value = "hf"  # typed, not picked: the field takes any spec
    # vLLM 0.34.0 serves GPT-2 with its native class: its mapper drops the mask buffers
    # (".attn.bias", with a dot), not c_attn.bias; the colours are that load's
    assert panel.error is None and panel.report.model.cls == "GPT2LMHeadModel"
    tf, vllm = f"transformers {version('transformers')}", f"vllm {VLLM_VERSION}"
    native = f"{vllm}, native GPT2LMHeadModel: loads cleanly"
    verdict = f"{tf}: loads cleanly, {native} (colours: the load into GPT2LMHeadModel)"
    assert verdict in panel.figure.layout.annotations[0].text
    from loadkit_notebooks.fates import FATE_COLOURS, LEFT_OUT, NOT_CHECKED

    assert set(debug.key_fates(panel.report).values()) == {"loaded"}
    summary = " ".join(panel.summary().split("\nverdict: ")[-1].split())  # folded at 100
    assert (
        summary
        == f"{tf}: would load cleanly | {vllm}, native GPT2LMHeadModel: would load cleanly (exit 0)"
    )
    # the Transformers backend, asked for: vLLM's pitfall on GPT-2, the biases a rule set aside
    from loadkit_inspect import inspect_checkpoint

    backend = inspect_checkpoint(folder, model="hf", model_impl="transformers")
    fates = debug.key_fates(backend)
    assert fates["transformer.h.0.attn.c_attn.bias"] == LEFT_OUT
    assert fates["transformer.h.0.attn.c_attn.weight"] == "loaded"
    figure = debug.treemap_figure(backend)
    assert _colour_of(figure, "transformer.h.1.attn.c_attn.bias")[0] == FATE_COLOURS[LEFT_OUT]
    assert "2 set aside by a rule, yet its tensor is missing" in figure.layout.annotations[0].text
    mapper = debug.report_sections(backend, "mapper", verdict=False)
    assert mapper.startswith("mapper  (TransformersForCausalLM.hf_to_vllm_mapper)")
    assert "transformer.h.0.attn.c_attn.bias  (regex 'attn.bias')" in mapper
    assert "model.h.0.attn.c_attn.bias" in debug.mismatch_tables(backend)
    panel.model.value = "hf-nonsense"
    assert panel.summary().startswith("error: --model 'hf-nonsense'")
    # OPT: served by vLLM 0.34.0's native OPTForCausalLM, which loadkit does not re-implement:
    # said so, and no load of another class colours the picture
    opt = {"hidden_size": 16, "ffn_dim": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
           "vocab_size": 64, "max_position_embeddings": 32, "word_embed_proj_dim": 16}  # fmt: skip
    panel.path.value = nb04("tiny_hf_checkpoint")(
        str(tmp_path / "opt"), "OPTForCausalLM", "OPTConfig", **opt
    )
    panel.model.value = "hf"
    unchecked = f"{vllm}, native OPTForCausalLM: not checked"
    verdict = f"{tf}: loads cleanly, {unchecked} (colours: no vLLM load simulated)"
    assert verdict in panel.figure.layout.annotations[0].text
    assert set(debug.key_fates(panel.report).values()) == {NOT_CHECKED}
    assert debug.probe_table(panel.report) == (
        "pooling probe: not run (the vllm column is not checked)"
    )
    summary = " ".join(panel.summary().split("\nverdict: ")[-1].split())
    assert summary.startswith(f"{tf}: would load cleanly | {unchecked} (vLLM 0.34.0 would use its")
    assert summary.endswith("(exit 0)")  # the one loader checked decides


def test_each_loaders_verdict_in_a_few_words():
    from loadkit_inspect.loaders import LoaderVerdict

    def said(**kw):
        return debug._said(LoaderVerdict("transformers", False, ["why"], "5", **kw))

    assert said(outcome="unknown") == "not judged"  # a quantizer loadkit does not model
    assert said(outcome="raises") == "raises" and said(outcome="warns") == "loads with warnings"
    assert said(checked=False) == "not checked" and said() == "would NOT load"
