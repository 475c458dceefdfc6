"""``loadkit rename``: the fix for the loader that takes no mapper, proven on what it writes.

Each fix inspect offers is run as printed, and what it wrote is checked three ways: every tensor's
bytes equal the source's under its new name (safetensors reads both), transformers'
``from_pretrained`` loads it cleanly (the oracle), and ``loadkit inspect`` says so for both
loaders. The source is never touched unless ``--in-place``.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
from pathlib import Path

import pytest
import torch
from hf_cases import ARCHS, m_wrapper_prefix, read_tensors, write_variant
from safetensors.torch import load_file

from loadkit_inspect import inspect_checkpoint
from loadkit_inspect.cli.main import main

INDEX = "model.safetensors.index.json"


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


def _same_bytes(src: Path, dst: Path, renamed: dict[str, str]) -> None:
    before, after = _tensors(src), _tensors(dst)
    assert sorted(after) == sorted(renamed.get(k, k) for k in before)
    for key, tensor in before.items():
        new = after[renamed.get(key, key)]
        assert (new.dtype, new.shape) == (tensor.dtype, tensor.shape)
        assert torch.equal(new.reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8))


def _from_pretrained(cls: str, folder: Path) -> dict:
    import transformers

    _, info = getattr(transformers, cls).from_pretrained(folder, output_loading_info=True)
    return {k: sorted(v) for k, v in info.items() if k != "error_msgs"}


def _run_printed(command: str, capsys) -> dict:
    """The command inspect printed, run as the CLI runs it (with --json to read the result)."""
    argv = shlex.split(command)
    assert argv[:2] == ["loadkit", "rename"]
    assert main([*argv[1:], "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_model_prefix_fix_is_offered_run_and_proven(hf_clean, tmp_path, capsys):
    """The issue's example: a BertModel checkpoint with ``model.`` before every key, which
    transformers leaves entirely at random."""
    clean = hf_clean("bert")
    src = write_variant(
        clean, m_wrapper_prefix(ARCHS["bert"], read_tensors(clean)), tmp_path / "src"
    )
    report = inspect_checkpoint(src, model="hf", model_impl="transformers")
    fix = report.rename_fix
    assert report.from_pretrained.outcome == "warns" and fix is not None
    assert fix.rules == {"orig_to_new_prefix": {"model.": ""}} and fix.clean
    assert fix.results["transformers"].endswith("would load cleanly")
    text = report.render()
    assert f"  {fix.command()}" in text and "suggested fix for transformers" in text
    before = _digest(src)
    done = _run_printed(fix.command(str(tmp_path / "dst")), capsys)
    assert _digest(src) == before  # the source is untouched
    dst = tmp_path / "dst"
    assert done["files"] == ["model.safetensors"] and done["copied"] == ["config.json"]
    _same_bytes(src, dst, done["renamed"])
    assert not any(_from_pretrained("BertModel", dst).values())  # the oracle loads it cleanly
    for impl in ("transformers", "auto"):
        again = inspect_checkpoint(dst, model="hf", model_impl=impl)
        assert again.loaders["transformers"].clean and again.rename_fix is None
    assert inspect_checkpoint(dst, model="hf", model_impl="transformers").exit_status == 0


def test_shards_without_their_index_are_laid_out_anew(hf_clean, tmp_path, capsys):
    src = tmp_path / "src"
    shutil.copytree(hf_clean("llama"), src)
    (src / INDEX).unlink()
    report = inspect_checkpoint(src, model="hf")
    assert report.from_pretrained.error.error == "OSError"
    fix = report.rename_fix
    assert fix is not None and fix.kind == "layout" and fix.rules is None and fix.clean
    done = _run_printed(fix.command(str(tmp_path / "dst")), capsys)
    dst = tmp_path / "dst"
    shards = sorted(p.name for p in src.glob("*.safetensors"))
    assert done["files"] == [*(f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                               for i in range(len(shards))), INDEX]  # fmt: skip
    assert done["renamed"] == {}
    _same_bytes(src, dst, {})
    assert not any(_from_pretrained("LlamaForCausalLM", dst).values())
    index = json.loads((dst / INDEX).read_text())
    assert index["metadata"]["total_size"] == done["bytes"]
    assert inspect_checkpoint(dst, model="hf").exit_status == 0


def test_in_place_replaces_the_weights_and_keeps_the_rest(hf_clean, tmp_path, capsys):
    clean = hf_clean("bert")
    src = write_variant(
        clean, m_wrapper_prefix(ARCHS["bert"], read_tensors(clean)), tmp_path / "src"
    )
    copy = tmp_path / "original"
    shutil.copytree(src, copy)
    rules = '{"orig_to_new_prefix": {"model.": ""}}'
    assert main(["rename", str(src), "--in-place", "--mapper", rules]) == 0
    assert "check it: loadkit inspect" in capsys.readouterr().out
    assert sorted(p.name for p in src.iterdir()) == ["config.json", "model.safetensors"]
    _same_bytes(copy, src, {k: k.removeprefix("model.") for k in _tensors(copy)})
    assert not any(_from_pretrained("BertModel", src).values())


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("dst not empty", "exists and is not an empty folder"),
        ("a rule drops a key", "the rules drop it; rename changes names only"),
        ("two keys one name", "would both be named"),
        ("a shard missing", "cannot be rewritten whole: missing shard"),
        ("in place beside a stale file", "which vLLM does not read"),
        ("no dst", "give DST (a new folder) or --in-place"),
    ],
)
def test_what_rename_refuses_is_one_line_and_exit_2(hf_clean, tmp_path, capsys, case, said):
    src = tmp_path / "src"
    shutil.copytree(hf_clean("llama"), src)
    dst = tmp_path / "dst"
    argv = ["rename", str(src), str(dst)]
    if case == "dst not empty":
        dst.mkdir()
        (dst / "x").write_text("x")
    elif case == "a rule drops a key":
        argv += ["--mapper", '{"orig_to_new_regex": {"^lm_head\\\\..*": null}}']
    elif case == "two keys one name":
        argv += ["--mapper", '{"orig_to_new_substr": {"k_proj": "q_proj"}}']
    elif case == "a shard missing":
        (src / json.loads((src / INDEX).read_text())["weight_map"]["model.norm.weight"]).unlink()
    elif case == "in place beside a stale file":
        shutil.copy(next(src.glob("model-*.safetensors")), src / "model.safetensors")
        argv = ["rename", str(src), "--in-place"]
    elif case == "no dst":
        argv = ["rename", str(src)]
    before = _digest(src)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") <= 2 and "Traceback" not in err and said in err, err
    assert _digest(src) == before
    assert not dst.exists() or case == "dst not empty"
