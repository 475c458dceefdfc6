"""The files each loader reads (``loadkit_inspect.sources.files``).

vLLM's choice is held against its own ``_prepare_weights`` in
``tests/upstream/test_file_choice_upstream.py`` (14 layouts, 0.28.0 and 0.34.0), transformers'
against ``from_pretrained`` on 11 layouts in ``tests/tool/simulate/test_from_pretrained.py``;
here, the config's ``transformers_weights`` against ``from_pretrained`` too, and the parts.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from loadkit_inspect.inspector import inspect_checkpoint
from loadkit_inspect.sources.files import (
    loader_files,
    natural_key,
    read_chosen,
    transformers_files,
    vllm_files,
)


def _w(path, **tensors):
    save_file(tensors or {"w": torch.zeros(2)}, str(path))


def _from_pretrained(folder):
    import transformers

    try:
        _, info = transformers.LlamaForCausalLM.from_pretrained(folder, output_loading_info=True)
    except Exception as exc:  # the oracle's answer, compared by class and message
        return exc
    return {k: sorted(v) for k, v in info.items() if k != "error_msgs"}


def _with_weights_file(clean, tmp_path, name):
    folder = tmp_path / "ck"
    shutil.copytree(clean, folder)
    config = json.loads((folder / "config.json").read_text())
    config["transformers_weights"] = name
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_the_configs_transformers_weights_is_the_file_from_pretrained_reads(hf_clean, tmp_path):
    # a stale model.safetensors, one weight short, and the full weights under another name that
    # the config names: from_pretrained reads that file and loads cleanly
    clean = hf_clean("llama")
    tensors = {k: v for s in sorted(clean.glob("*.safetensors")) for k, v in load_file(s).items()}
    folder = _with_weights_file(clean, tmp_path, "full.safetensors")
    for shard in folder.glob("model-*.safetensors"):
        shard.unlink()
    (folder / "model.safetensors.index.json").unlink()
    save_file(tensors, str(folder / "full.safetensors"))
    save_file(dict(list(tensors.items())[1:]), str(folder / "model.safetensors"))
    oracle = _from_pretrained(folder)
    assert isinstance(oracle, dict) and not any(oracle.values())
    report = inspect_checkpoint(folder, model="hf", model_impl="transformers")
    fp = report.from_pretrained
    assert fp.outcome == "loads" and fp.files.files == ("full.safetensors",)
    assert fp.files.how == "the config's transformers_weights"
    assert report.loaders["transformers"].clean


def test_a_transformers_weights_outside_the_folder_raises_as_from_pretrained(hf_clean, tmp_path):
    folder = _with_weights_file(hf_clean("llama"), tmp_path, "../elsewhere.safetensors")
    oracle = _from_pretrained(folder)
    assert isinstance(oracle, ValueError)
    report = inspect_checkpoint(folder, model="hf", model_impl="transformers")
    error = report.from_pretrained.error
    assert (error.error, error.message) == ("ValueError", str(oracle))
    assert report.exit_status == 1 and report.as_dict()["transformers"]["raises"] is True


def test_a_later_copy_wins_and_the_first_file_that_cannot_be_opened_is_named(tmp_path):
    _w(tmp_path / "a.safetensors", w=torch.zeros(2), v=torch.zeros(1))
    _w(tmp_path / "b.safetensors", w=torch.zeros(3))
    (tmp_path / "c.safetensors").write_bytes(b"\x01")
    infos, raised = read_chosen(tmp_path, ("a.safetensors", "b.safetensors", "gone.safetensors",
                                           "c.safetensors"))  # fmt: skip
    assert {i.name: i.shape for i in infos} == {"w": (3,), "v": (1,)}
    assert raised is not None and raised.error == "FileNotFoundError"
    assert raised.why == "'gone.safetensors' does not exist"
    _, raised = read_chosen(tmp_path, ("c.safetensors",))
    assert raised is not None and raised.error == "SafetensorError"


def test_transformers_prefers_the_single_file_then_the_index_then_raises(tmp_path):
    none = transformers_files(tmp_path)
    assert none.raises is not None and none.raises.error == "OSError" and none.files == ()
    assert (
        none.raises.why
        == "no model.safetensors and no index in the folder (the folder has no weights)"
    )
    _w(tmp_path / "part-1.safetensors")
    assert "(it never reads part-1.safetensors)" in transformers_files(tmp_path).raises.why
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "part-1.safetensors", "v": "part-1.safetensors"}})
    )
    indexed = transformers_files(tmp_path)
    assert (indexed.files, indexed.how) == (("part-1.safetensors",), "the files the index names")
    _w(tmp_path / "model.safetensors")
    single = transformers_files(tmp_path)
    assert single.files == ("model.safetensors",) and single.unread == ("part-1.safetensors",)
    assert single.how == "preferred to the index, which it never opens"


def test_vllm_reads_in_natural_order_and_never_a_hidden_file(tmp_path):
    # the expectations are vLLM's own answers (tests/upstream/test_file_choice_upstream.py)
    for name in ("part-10.safetensors", "part-2.safetensors", ".part-1.safetensors"):
        _w(tmp_path / name)
    choice = vllm_files(tmp_path)
    assert choice.files == ("part-2.safetensors", "part-10.safetensors")
    assert choice.unread == (".part-1.safetensors",)
    assert sorted(["b-10", "b-9", "a"], key=natural_key) == ["a", "b-9", "b-10"]
    _w(tmp_path / "consolidated.safetensors")
    mistral = vllm_files(tmp_path)
    assert mistral.files == ("consolidated.safetensors",) and mistral.mistral


@pytest.mark.parametrize("kind", ["path", "url"])
def test_a_lone_file_or_a_url_is_what_both_loaders_read(tmp_path, kind):
    _w(tmp_path / "m.safetensors")
    path = str(tmp_path / "m.safetensors")
    choices = loader_files(path, kind, [path])
    assert {n: c.files for n, c in choices.items()} == {
        "transformers": ("m.safetensors",),
        "vllm": ("m.safetensors",),
    }
    assert loader_files(path, None, [path]) == {}
