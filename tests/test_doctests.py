"""The examples in the docstrings of the three parts (library, tool, notebook layer) run, and the
public API's functions have them."""

from __future__ import annotations

import doctest
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import loadkit
import loadkit_inspect
import loadkit_notebooks

REPO = Path(__file__).resolve().parent.parent
PARTS = (loadkit, loadkit_inspect, loadkit_notebooks)
MODULES = sorted(
    m.name
    for part in PARTS
    for m in pkgutil.walk_packages(part.__path__, f"{part.__name__}.")
    if m.name != "loadkit_inspect.__main__"
) + [part.__name__ for part in PARTS]
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

# The public API: each name has an example; each function also Args and Returns.
PUBLIC_API = [
    "loadkit.mapper:WeightsMapper",
    "loadkit.mapper:WeightsMapper.map_name",
    "loadkit.mapper:WeightsMapper.map_name_with_shard",
    "loadkit.mapper:WeightsMapper.apply",
    "loadkit.mapper:WeightsMapper.apply_list",
    "loadkit.mapper:WeightsMapper.apply_dict",
    "loadkit.mapper:WeightsMapper.__or__",
    "loadkit.loading.weight_loaders:default_weight_loader",
    "loadkit.loading.weight_loaders:composed_weight_loader",
    "loadkit.loading.auto_loader:AutoWeightsLoader",
    "loadkit.loading.auto_loader:AutoWeightsLoader.load_weights",
    "loadkit.loading.observe:LoadObserver",
    "loadkit.loading.counting:CopyCounter",
    "loadkit.loading.counting:CloneCounter",
    "loadkit.loading.counting:get_numel_loaded",
    "loadkit.pooling.adapter:as_pooling_model",
    "loadkit.reload.layerwise:record_metadata_for_reloading",
    "loadkit.reload.layerwise:initialize_layerwise_reload",
    "loadkit.reload.layerwise:finalize_layerwise_reload",
    "loadkit.reload.layerwise:reload_log",
    "loadkit.models.plamo2:Plamo2Config",
    "loadkit.models.plamo2:Plamo2ForCausalLM",
    "loadkit.models.plamo2:Plamo2ForCausalLM.load_weights",
    "loadkit.models.plamo2:make_checkpoint",
    "loadkit.models.gemma4:Gemma4ForConditionalGeneration",
    "loadkit.models.nemotron_h:NemotronHForCausalLM",
    "loadkit.models.transformers.wrappers:TransformersForCausalLM",
    "loadkit.models.transformers.wrappers:TransformersEmbeddingModel",
    "loadkit.models.transformers.wrappers:TransformersForSequenceClassification",
    "loadkit.checkpoint.reader:open_checkpoint",
    "loadkit_inspect.inspector:inspect_checkpoint",
    "loadkit.terms:check_behaviour",
]


def _resolve(spec: str) -> object:
    module, _, attr = spec.partition(":")
    obj: object = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, monkeypatch):
    monkeypatch.chdir(REPO)  # examples open the committed data/ checkpoints by relative path
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    for test in finder.find(module, name):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


@pytest.mark.parametrize("spec", PUBLIC_API)
def test_spec_named_api_is_documented_with_an_example(spec):
    doc = inspect.getdoc(_resolve(spec)) or ""
    assert ">>> " in doc, f"{spec}: no runnable example"
    if not inspect.isclass(_resolve(spec)):  # a class documents its fields where they are
        assert "Args:" in doc and "Returns:" in doc, f"{spec}: no Args/Returns"


def test_there_are_examples_to_run():
    finder = doctest.DocTestFinder(exclude_empty=True)
    examples = sum(
        len(t.examples) for name in MODULES for t in finder.find(importlib.import_module(name))
    )
    assert examples >= 60, examples
