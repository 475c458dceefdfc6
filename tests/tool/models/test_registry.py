"""``--model`` specs: the built-in models, what a built-in refuses."""

import pytest
from repo_paths import DATA

from loadkit.errors import CheckpointError
from loadkit_inspect.inspector import inspect_checkpoint
from loadkit_inspect.models import registry
from loadkit_inspect.models.registry import ModelSpecError, build_model


def test_a_builtin_whose_module_is_missing_says_so(monkeypatch):
    monkeypatch.setitem(registry.BUILTIN, "future-model", "loadkit.models.not_yet:Model")
    with pytest.raises(ModelSpecError, match="loadkit.models.not_yet, which this checkout"):
        build_model("future-model", {})


def test_a_checkpoint_of_another_model_is_unusable_for_a_builtin():
    # plamo2 cannot size itself from it (the error names the file, the key)
    where = r"gemma4_like/model\.safetensors.*'model\.embed_tokens\.weight'"
    with pytest.raises(CheckpointError, match=where):
        inspect_checkpoint(str(DATA / "gemma4_like" / "model.safetensors"), model="plamo2")
