"""loadkit's copy of vLLM 0.34.0's model registry (``loadkit_inspect.models.vllm_registry``)
against the wheel's ``vllm/model_executor/models/registry.py``, entry by entry: the table
``--model hf`` picks vLLM's class from, and the two lists of architectures vLLM refuses with a
reason. The registry's tables are executed from the wheel's source (``harness.exec_definitions``:
the assignments and the tables they merge, nothing else of the file)."""

from __future__ import annotations

import pytest

from loadkit.models.native import CLASSES
from loadkit_inspect.models import vllm_registry
from upstream.fetch import REFERENCE, UpstreamFetchError, ensure_sources
from upstream.harness import exec_definitions, root_of

TABLES = ("_VLLM_MODELS", "_PREVIOUSLY_SUPPORTED_MODELS", "_OOT_SUPPORTED_MODELS")


@pytest.fixture(scope="module")
def registry():
    try:
        src = ensure_sources(REFERENCE)
    except UpstreamFetchError as exc:
        pytest.fail(f"cannot fetch the vLLM {REFERENCE} wheel: {exc}", pytrace=False)
    path = src / "vllm" / "model_executor" / "models" / "registry.py"
    # a module of its own beside the harness's: nothing else of the version is needed
    name = f"{root_of(REFERENCE)}_registry_tables"
    module, _ = exec_definitions(path, name, TABLES)
    return module


def test_loadkit_registry_is_the_wheels(registry):
    assert vllm_registry.VERSION == REFERENCE
    assert vllm_registry.MODELS == registry._VLLM_MODELS
    # the order decides nothing, but a dict compares without it: the lists as they stand
    assert list(vllm_registry.MODELS) == list(registry._VLLM_MODELS)
    assert vllm_registry.PREVIOUSLY_SUPPORTED == registry._PREVIOUSLY_SUPPORTED_MODELS
    assert vllm_registry.OUT_OF_TREE == registry._OOT_SUPPORTED_MODELS


def test_every_native_class_is_one_the_wheel_registers(registry):
    registered = {cls for _, cls in registry._VLLM_MODELS.values()}
    assert set(CLASSES) <= registered
    # and each under an architecture of its own name, as --model hf looks it up
    for name in CLASSES:
        assert registry._VLLM_MODELS[name][1] == name
