"""The notebooks' story modules (04 debug, 00 tour) and the built-in models on data/ checkpoints."""

import json
import os

import pytest

from loadkit import open_checkpoint
from loadkit.demo.stories import debug, tour
from loadkit.errors import CheckpointError
from loadkit.inspection.inspector import inspect_checkpoint
from loadkit.models import registry
from loadkit.models.registry import BUILTIN, ModelSpecError, build_model


@pytest.fixture
def in_notebooks(monkeypatch):
    monkeypatch.chdir(debug.DATA.parent / "notebooks")


def test_every_data_checkpoint_loads_cleanly_into_its_builtin_model(in_notebooks):
    paths = debug.data_checkpoints()
    # Every built-in has data. The vision tower's opens header-only in the panel: its own mapper
    # is vLLM 0.28.0's stacked stage, which fails on it on purpose (bug 5, notebook 06).
    tower = "../data/vision_tower/model.safetensors"
    assert {debug.model_for(p) for p in paths if p != tower} == set(BUILTIN) - {"vision-tower"}
    report = inspect_checkpoint(tower, model="vision-tower")
    assert report.load.problems() == ["8 unexpected"] and report.mapper.rematches
    for path in (p for p in paths if p != tower):
        report = inspect_checkpoint(path, model=debug.model_for(path))
        assert report.clean, (path, report.load.problems())
        assert report.load.filled == report.model.parameters


def test_builtin_models_are_built_on_meta_and_sized_from_the_header(in_notebooks):
    specs = {p: debug.model_for(p) for p in debug.data_checkpoints()}
    specs["../data/vision_tower/model.safetensors"] = "vision-tower"  # header-only in the panel
    for path, name in specs.items():
        model, spec = build_model(name, open_checkpoint(path).tensors)
        assert all(p.is_meta for p in model.parameters()), spec


def test_a_builtin_whose_module_is_missing_says_so(monkeypatch):
    monkeypatch.setitem(registry.BUILTIN, "future-model", "loadkit.models.not_yet:Model")
    with pytest.raises(ModelSpecError, match="loadkit.models.not_yet, which this checkout"):
        build_model("future-model", {})


def test_a_checkpoint_of_another_model_is_unusable_for_a_builtin(in_notebooks):
    # plamo2 cannot size itself from it (the error names the file, the key)
    where = r"gemma4_like/model\.safetensors.*'model\.embed_tokens\.weight'"
    with pytest.raises(CheckpointError, match=where):
        inspect_checkpoint("../data/gemma4_like/model.safetensors", model="plamo2")


def test_default_checkpoint_and_choices(in_notebooks):
    path, model = debug.default_checkpoint()
    assert path == "../data/gemma4_like/model.safetensors" and model == "gemma4-like"
    assert debug.model_choices()[:2] == [debug.HEADER_ONLY, "hf"]
    assert set(BUILTIN) <= set(debug.model_choices())
    assert debug.model_for("/elsewhere/x.safetensors") == debug.HEADER_ONLY
    assert not any("big" in p.split(os.sep) for p in debug.data_checkpoints())


def test_treemap_tables_and_probe(in_notebooks):
    path, model = debug.default_checkpoint()
    report = debug.inspect(path, model)
    fig = debug.treemap_figure(report)
    (trace,) = fig.data
    assert trace.values[0] == report.checkpoint.total_bytes
    text = debug.treemap_data(fig)
    assert "largest boxes under model.language_model:" in text
    assert "  layers: " in text
    probe = debug.probe_table(report)
    assert "old    no hit" in probe and "100%" in probe
    assert "#0 model.language_model.embed_tokens.weight" in probe
    assert "verdict: loads cleanly (exit 0)" in debug.mismatch_tables(report)
    header_only = debug.inspect(path, debug.HEADER_ONLY)
    assert debug.probe_table(header_only) == "pooling probe: needs a model"


def test_broken_copy_is_found_out(in_notebooks, tmp_path):
    broken = debug.broken_copy(
        "../data/plamo2/untied.safetensors",
        tmp_path / "broken.safetensors",
        rename={"model.norm.weight": "model.norm_f.weight"},
        drop=["model.layers.layers.1.mlp.down_proj.weight"],
        reshape={"model.layers.layers.0.pre_mixer_norm.weight": [17]},
    )
    assert not os.path.isabs(broken)
    report = debug.inspect(broken, "plamo2")
    load = report.load
    assert [u.name for u in load.unexpected] == ["model.norm_f.weight"]
    missing = {m.name: m.suggestions for m in load.missing}
    assert missing == {
        "model.norm.weight": ["model.norm_f.weight"],
        "model.layers.layers.1.mlp.down_proj.weight": [],
    }
    assert [s.name for s in load.shape_mismatches] == [
        "model.layers.layers.0.pre_mixer_norm.weight"
    ]
    tables = debug.mismatch_tables(report)
    assert "model tensors never filled (2)" in tables and "(exit 1)" in tables


def test_debug_panel_follows_its_widgets(in_notebooks):
    path, model = debug.default_checkpoint()
    panel = debug.DebugPanel(path, model)
    assert panel.report.clean and "old    no hit" in panel.summary()
    panel.path.value = "../data/nowhere.safetensors"
    assert panel.summary().startswith("error: ../data/nowhere.safetensors: no such file")
    assert "no such file" in panel.output.value
    panel.path.value = "../data/plamo2/untied.safetensors"
    panel.model.value = "plamo2"
    assert panel.error is None and panel.report.model.cls == "Plamo2ForCausalLM"
    assert "untied.safetensors" in panel.figure.layout.title.text
    panel.mapper.value = json.dumps({"orig_to_new_prefix": {"model.": "x."}})
    assert panel.report.clean is False
    panel.mapper.value = "{broken"
    assert "not valid JSON" in panel.summary()


def test_tour_steps(in_notebooks, tmp_path):
    path = tour.write_checkpoint(tmp_path / "tiny.safetensors")
    ck = open_checkpoint(path)
    model, ledger, copies = tour.load(path)
    counts = ledger.counts()["checkpoint"]
    assert (counts["loaded"], counts["skipped"], counts["dropped by mapper"]) == (11, 1, 1)
    assert ledger.never_loaded == []
    assert copies == 12  # one per loaded name, and A's composed loader copies twice
    side = tour.side_by_side(ck, model)
    assert "names in common: none" in side
    traces = tour.trace_table(model.hf_to_vllm_mapper, list(ck.tensors))
    assert "-> DROPPED" in traces and "[shard 'k']" in traces
    walk = tour.walk_picture(model.hf_to_vllm_mapper, list(ck.tensors))
    assert walk.splitlines()[0] == "model  (11 names)" and "qkv_proj  (3 names)" in walk
    journey = tour.journey("backbone.layers.0.mixer.A_log", ck, model, ledger)
    assert "composed_weight_loader(default_weight_loader)" in journey
    assert journey.endswith("ledger      loaded -> model.layers.0.mixer.A")
    assert "ckpt: mtp -> dropped by mapper: 1" in tour.sankey_data(ledger)
    assert "packed_weight_loader(model.layers.1.mixer.qkv_proj.weight)" in tour.loader_table(model)
    report = inspect_checkpoint(path, model="loadkit.demo.stories.tour:TinyHybrid", probe=True)
    assert report.clean and not report.probe["old"].hit and report.probe["new"].walked == 1


def test_notebook_parameters(in_notebooks, tmp_path):
    assert debug.start(None, None) == debug.default_checkpoint()
    assert debug.start(None, "(header only)")[1] == "(header only)"
    # a folder with a config.json is a Hugging Face checkpoint: "hf" reads it
    (tmp_path / "config.json").write_text("{}")
    assert debug.start(str(tmp_path), None) == (str(tmp_path), "hf")
    assert debug.model_for(str(tmp_path / "model.safetensors")) == "hf"
    assert debug.start(str(tmp_path), "pkg.mod:fn") == (str(tmp_path), "pkg.mod:fn")


def test_a_hugging_face_checkpoint_in_the_panel(in_notebooks, tmp_path):
    folder = debug.tiny_hf_checkpoint(tmp_path / "gpt2", "gpt2")
    assert not os.path.isabs(folder) and debug.model_for(folder) == "hf"
    panel = debug.DebugPanel(folder, debug.HEADER_ONLY)
    assert panel.report.model is None
    panel.model.value = "hf"  # typed, not picked: the field takes any spec
    assert panel.error is None and panel.report.model.cls == "TransformersForCausalLM"
    assert "model.h.0.attn.c_attn.bias" in panel.summary()  # vLLM's pitfall on GPT-2
    mapper = debug.report_sections(panel.report, "mapper", verdict=False)
    assert mapper.startswith("mapper  (TransformersForCausalLM.hf_to_vllm_mapper)")
    assert "transformer.h.0.attn.c_attn.bias  (regex 'attn.bias')" in mapper
    both = debug.report_sections(panel.report, "model", "mapper")
    verdict = "verdict:\n  transformers: would load cleanly\n  vllm: would NOT load (2 missing: "
    assert both.index("model  hf:") < both.index("mapper  (") < both.index(verdict)
    summary = " ".join(panel.summary().split("\nverdict: ")[-1].split())  # folded at 100
    assert summary == (
        "transformers: would load cleanly | vllm: would NOT load (2 missing: "
        "model.h.0.attn.c_attn.bias, model.h.1.attn.c_attn.bias) (exit 1)"
    )
    panel.model.value = "hf-nonsense"
    assert panel.summary().startswith("error: --model 'hf-nonsense'")
