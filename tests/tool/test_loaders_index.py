"""Index problems judged by what the loaders do (issue 24), each case against the oracles:
transformers' own ``from_pretrained`` run in the test on a tiny sharded Llama it wrote, and
vLLM 0.28.0's weight_utils (read: ``filter_duplicate_safetensors_files`` raises
FileNotFoundError for a listed file that is missing, weight_utils.py:594, and keeps only listed
files, :598; ``safetensors_weights_iterator`` yields each file's own keys, never the index's)."""

from __future__ import annotations

import json
import shutil
from importlib.metadata import version
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError

from loadkit import open_checkpoint
from loadkit_inspect.inspector import inspect_checkpoint

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


# What from_pretrained raises for the index problems here: a listed shard missing, a shard it
# cannot read, a size mismatch without ignore_mismatched_sizes. Anything else fails the test.
REFUSALS = (FileNotFoundError, SafetensorError, RuntimeError)


def from_pretrained(folder: Path) -> dict | BaseException:
    """The oracle: transformers' ``from_pretrained`` on the folder, its loading info, or what it
    raised."""
    import transformers

    try:
        _, info = transformers.LlamaForCausalLM.from_pretrained(folder, output_loading_info=True)
    except REFUSALS as exc:  # the test compares what was raised with loadkit's column
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
    assert (problem.kind, problem.severity) == ("in no shard", "inconsistent")
    text = r.render()
    assert "index problems (1): loads; the index is inconsistent" in text
    verdict = " ".join(text[text.index("\nverdict:") :].split())  # the columns wrap
    assert verdict == (
        f"verdict: transformers {version('transformers')}: would load cleanly vllm 0.34.0, "
        "native LlamaForCausalLM: would load cleanly the index is inconsistent (1 problem "
        "above; loaders read the files it names, not its list of keys) (exit 0)"
    )
    assert list(open_checkpoint(folder).tensors) == [t.name for t in r.checkpoint.tensors]
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
        "in no shard",
        key,
        "inconsistent",
    )
    assert r.from_pretrained.missing == (key,)
    assert r.loaders["transformers"].problems == [f"1 newly initialised at random (MISSING: {key})"]
    assert r.loaders["transformers"].outcome == "warns"  # it loads, with that tensor random
    # vLLM 0.34.0's native Llama packs up_proj into gate_up_proj (shard 1): the shard is missing
    assert r.loaders["vllm"].problems == ["1 missing: model.layers.1.mlp.gate_up_proj.weight.1"]
    assert r.exit_status == 1 and r.clean is False


def _shard_of(folder: Path, key: str) -> str:
    return json.loads((folder / INDEX).read_text())["weight_map"][key]


def _other_shard(folder: Path, than: str) -> str:
    shards = sorted({*json.loads((folder / INDEX).read_text())["weight_map"].values()})
    return next(s for s in shards if s != than)


def _columns_and_verdict(r) -> tuple[dict[str, list[str]], str]:
    text = r.render()
    return {n: v.problems for n, v in r.loaders.items()}, " ".join(
        text[text.index("\nverdict:") :].split()
    )


def test_a_missing_shard_raises_in_both_columns_and_total_size_is_its_consequence(
    sharded_llama, tmp_path
):
    folder = copy_of(sharded_llama, tmp_path)
    gone = _shard_of(folder, "model.layers.0.mlp.up_proj.weight")
    (folder / gone).unlink()
    raised = from_pretrained(folder)
    assert isinstance(raised, FileNotFoundError) and gone in str(raised)  # the oracle raises
    r = inspect_checkpoint(folder, model="hf")
    columns, verdict = _columns_and_verdict(r)
    said = f"raises FileNotFoundError: listed shard '{gone}' missing"
    tf_said = f"FileNotFoundError: '{gone}' does not exist"
    assert columns == {"transformers": [tf_said], "vllm": [said]}  # no "N missing: ..." beside it
    assert r.from_pretrained.as_dict()["raises"] is True  # the text and --json say one thing
    assert r.exit_status == 1 and r.clean is False
    assert "every tensor still loads" not in verdict and "inconsistent" not in verdict
    total = next(p for p in r.checkpoint.problems if p.kind == "total_size")
    assert total.severity == "note" and "a consequence of the problem above" in total.message
    assert r.checkpoint.inconsistent == []
    assert f"transformers 5.24.0: would raise {tf_said}" in r.render()


def test_an_index_naming_a_shard_by_a_wrong_name_raises(sharded_llama, tmp_path):
    folder = copy_of(sharded_llama, tmp_path)
    real = _shard_of(folder, "model.norm.weight")
    typo = real.replace("-of-0000", "-of-000")
    edit_index(
        folder,
        lambda i: i["weight_map"].update(
            {k: typo for k, v in i["weight_map"].items() if v == real}
        ),
    )
    raised = from_pretrained(folder)
    assert isinstance(raised, FileNotFoundError) and typo in str(raised)
    r = inspect_checkpoint(folder, model="hf")
    said = f"raises FileNotFoundError: listed shard '{typo}' missing"
    tf_said = f"FileNotFoundError: '{typo}' does not exist"
    assert _columns_and_verdict(r)[0] == {"transformers": [tf_said], "vllm": [said]}
    assert r.exit_status == 1


def test_a_truncated_shard_raises_safetensor_error_in_both_columns(sharded_llama, tmp_path):

    folder = copy_of(sharded_llama, tmp_path)
    cut = _shard_of(folder, "model.layers.1.self_attn.v_proj.weight")
    data = (folder / cut).read_bytes()
    (folder / cut).write_bytes(data[: len(data) // 2])
    assert isinstance(from_pretrained(folder), SafetensorError)
    r = inspect_checkpoint(folder, model="hf")
    said = f"raises SafetensorError: shard '{cut}' cannot be read"
    tf_said = f"SafetensorError: '{cut}' cannot be read"
    assert _columns_and_verdict(r)[0] == {"transformers": [tf_said], "vllm": [said]}
    assert r.exit_status == 1 and r.checkpoint.inconsistent == []


@pytest.mark.parametrize("size", [32, 33])
def test_a_key_in_two_shards(sharded_llama, tmp_path, size):
    from safetensors.torch import load_file, save_file

    folder = copy_of(sharded_llama, tmp_path)
    key = "model.layers.0.input_layernorm.weight"  # [32]
    other = folder / _other_shard(folder, _shard_of(folder, key))
    tensors = load_file(other)
    tensors[key] = torch.ones(size)
    save_file(tensors, other, metadata={"format": "pt"})
    oracle = from_pretrained(folder)
    r = inspect_checkpoint(folder, model="hf")
    (problem,) = [p for p in r.checkpoint.problems if p.kind == "in two shards"]
    columns, _ = _columns_and_verdict(r)
    if size == 32:  # one shape: the last copy wins, and transformers loads it
        assert clean(oracle)
        assert problem.severity == "inconsistent" and "the last one wins" in problem.message
        assert r.exit_status == 0 and columns == {"transformers": [], "vllm": []}
        return
    # two shapes: vLLM loads every copy and its size assertion fails on the one that does not
    # fit (weight_utils.py:1231); transformers keeps the last copy (shards in sorted order) and
    # raises only when that one does not fit: here the [33] copy sorts first, then after
    assert problem.severity == "fails" and "last one wins" not in problem.message
    assert "shapes differ: [32] and [33]" in problem.message
    vllm_said = f"raises: 1 key stored twice with two shapes: {key}"
    assert columns["vllm"] == [vllm_said] and r.exit_status == 1
    last = problem.found_in[-1]
    if other.name == last:  # the [33] copy is the last one read: transformers raises
        assert isinstance(oracle, RuntimeError) and "ignore_mismatched_sizes" in str(oracle)
        assert columns["transformers"] == [mismatch_raises(key)]
    else:
        assert clean(oracle)
        assert columns["transformers"] == []


def mismatch_raises(key: str) -> str:
    return (
        f"RuntimeError: 1 size MISMATCH: {key} (checkpoint [33], model [32]); "
        "ignore_mismatched_sizes=True would reinitialise it at random"
    )


def test_of_two_shapes_transformers_keeps_the_last_copy(sharded_llama, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = copy_of(sharded_llama, tmp_path)
    key = "model.layers.0.input_layernorm.weight"
    own = _shard_of(folder, key)
    later = sorted({*json.loads((folder / INDEX).read_text())["weight_map"].values()})[-1]
    assert later > own
    tensors = load_file(folder / later)
    tensors[key] = torch.ones(33)
    save_file(tensors, folder / later, metadata={"format": "pt"})
    oracle = from_pretrained(folder)
    assert isinstance(oracle, RuntimeError) and "ignore_mismatched_sizes" in str(oracle)
    r = inspect_checkpoint(folder, model="hf")
    assert r.loaders["transformers"].problems == [mismatch_raises(key)]
    assert r.loaders["vllm"].problems == [f"raises: 1 key stored twice with two shapes: {key}"]
    assert "would load cleanly" not in r.render()


def test_a_single_file_beside_the_index_is_what_transformers_reads(sharded_llama, tmp_path):
    # transformers 5.24.0 looks for model.safetensors before the index (modeling_utils.py:591)
    # and never opens the shards; vLLM reads the files the index names
    from safetensors.torch import load_file, save_file

    folder = copy_of(sharded_llama, tmp_path)
    shards = sorted({*json.loads((folder / INDEX).read_text())["weight_map"].values()})
    whole = {k: v for s in shards for k, v in load_file(folder / s).items()}
    renamed = {k.replace("model.", "transformer.", 1): v for k, v in whole.items()}
    save_file(renamed, folder / "model.safetensors", metadata={"format": "pt"})
    oracle = from_pretrained(folder)
    assert isinstance(oracle, dict) and len(oracle["missing_keys"]) == 20
    r = inspect_checkpoint(folder, model="hf")
    fp = r.from_pretrained
    assert fp.files is not None and fp.files.files == ("model.safetensors",)
    assert set(fp.files.unread) == set(shards)
    assert sorted(fp.missing) == oracle["missing_keys"]
    assert sorted(fp.unexpected) == oracle["unexpected_keys"]
    assert r.loaders["vllm"].clean is True  # the shards load
    assert r.loaders["transformers"].outcome == "warns"  # it loads, 20 tensors at random
    assert r.loaders["transformers"].problems[0].startswith("20 newly initialised at random")
    assert r.exit_status == 1
    (note,) = [p for p in r.checkpoint.problems if p.kind == "unindexed shard"]
    assert "loaders never read it" not in note.message
    assert "from_pretrained reads it instead of the index" in note.message
    # the same file with the right names: transformers loads it cleanly, as its oracle does
    save_file(whole, folder / "model.safetensors", metadata={"format": "pt"})
    assert clean(from_pretrained(folder))
    again = inspect_checkpoint(folder, model="hf")
    assert again.from_pretrained.files.files == ("model.safetensors",) and again.clean is True
    assert "reads model.safetensors (preferred to the index, which it never opens)" in (
        again.render()
    )


def test_a_key_the_index_lists_twice_is_read_as_json_keeps_it(sharded_llama, tmp_path):
    """Issue 39: an index naming a key twice. Python's json keeps the last entry, as both
    loaders read the index; the report says so, and the folder loads (open_checkpoint too)."""
    folder = copy_of(sharded_llama, tmp_path)
    key = "model.norm.weight"
    right = _shard_of(folder, key)
    wrong = _other_shard(folder, right)
    text = (folder / INDEX).read_text()
    entry = f'"{key}": "{right}"'
    assert text.count(entry) == 1
    (folder / INDEX).write_text(text.replace(entry, f'{entry}, "{key}": "{wrong}"'))
    assert clean(from_pretrained(folder))  # the oracle loads it cleanly
    r = inspect_checkpoint(folder, model="hf")
    kinds = [(p.kind, p.key, p.severity) for p in r.checkpoint.problems]
    assert ("listed twice", key, "inconsistent") in kinds and (
        "wrong shard",
        key,
        "inconsistent",
    ) in kinds
    (twice,) = [p for p in r.checkpoint.problems if p.kind == "listed twice"]
    assert f'"{right}", then "{wrong}"' in twice.message and twice.listed == wrong
    assert r.exit_status == 0 and r.clean is True
    assert list(open_checkpoint(folder).tensors) == [t.name for t in r.checkpoint.tensors]
    assert inspect_checkpoint(folder, model="hf", strict_index=True).exit_status == 1
