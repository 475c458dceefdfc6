"""Index problems judged by what the loaders do (issue 24), each case against the oracles:
transformers' own ``from_pretrained`` run in the test on a tiny sharded Llama it wrote, and
vLLM 0.28.0's weight_utils (read: ``filter_duplicate_safetensors_files`` raises
FileNotFoundError for a listed file that is missing, weight_utils.py:594, and keeps only listed
files, :598; ``safetensors_weights_iterator`` yields each file's own keys, never the index's)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from loadkit.inspection.inspector import inspect_checkpoint

INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def sharded_llama(tmp_path_factory, quiet_transformers) -> Path:
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, vocab_size=128, max_position_embeddings=64,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("llama_sharded")
    transformers.LlamaForCausalLM(config).save_pretrained(folder, max_shard_size="20KB")
    assert len(json.loads((folder / INDEX).read_text())["weight_map"]) == 21
    return folder


def copy_of(folder: Path, tmp_path: Path) -> Path:
    out = tmp_path / "ck"
    shutil.copytree(folder, out)
    return out


def edit_index(folder: Path, edit) -> None:
    index = json.loads((folder / INDEX).read_text())
    edit(index)
    (folder / INDEX).write_text(json.dumps(index))


def from_pretrained(folder: Path) -> dict | BaseException:
    """The oracle: transformers' ``from_pretrained`` on the folder, its loading info, or what it
    raised."""
    import transformers

    try:
        _, info = transformers.LlamaForCausalLM.from_pretrained(folder, output_loading_info=True)
    except Exception as exc:  # the test compares what was raised with loadkit's column
        return exc
    return {k: sorted(v) for k, v in info.items() if k != "error_msgs"}


def clean(info: dict | BaseException) -> bool:
    return isinstance(info, dict) and not any(info.values())


def test_a_listed_key_no_shard_holds_loads_and_the_index_is_inconsistent(sharded_llama, tmp_path):
    folder = copy_of(sharded_llama, tmp_path)
    shard = sorted({*json.loads((folder / INDEX).read_text())["weight_map"].values()})[1]
    edit_index(
        folder, lambda i: i["weight_map"].update({"model.layers.5.mlp.up_proj.weight": shard})
    )
    assert clean(from_pretrained(folder))  # the oracle loads it cleanly
    r = inspect_checkpoint(folder, model="hf")
    assert r.exit_status == 0 and r.clean is True
    assert {n: v.clean for n, v in r.loaders.items()} == {"transformers": True, "vllm": True}
    (problem,) = r.checkpoint.problems
    assert (problem.kind, problem.severity) == ("wrong shard", "inconsistent")
    text = r.render()
    assert "index problems (1): loads; the index is inconsistent" in text
    assert text.splitlines()[-1] == (
        "verdict: transformers: would load cleanly | vllm: would load cleanly; the index is "
        "inconsistent (1 problem above, every tensor still loads) (exit 0)"
    )
    strict = inspect_checkpoint(folder, model="hf", strict_index=True)
    assert strict.exit_status == 1 and strict.clean is False


def test_a_listed_key_the_model_needs_that_no_shard_holds_is_missing(sharded_llama, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = copy_of(sharded_llama, tmp_path)
    key = "model.layers.1.mlp.up_proj.weight"
    shard = folder / json.loads((folder / INDEX).read_text())["weight_map"][key]
    tensors = load_file(shard)
    del tensors[key]  # still listed by the index
    save_file(tensors, shard, metadata={"format": "pt"})
    info = from_pretrained(folder)
    assert isinstance(info, dict) and info["missing_keys"] == [key]  # warns, does not raise
    r = inspect_checkpoint(folder, model="hf")
    assert [(p.kind, p.key, p.severity) for p in r.checkpoint.problems][0] == (
        "wrong shard",
        key,
        "inconsistent",
    )
    assert r.from_pretrained.missing == (key,)
    assert r.loaders["transformers"].problems == [f"1 missing: {key}"]
    assert r.loaders["vllm"].problems == [f"1 missing: {key}"]
    assert r.exit_status == 1 and r.clean is False
