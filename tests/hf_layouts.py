"""Folder layouts of a checkpoint transformers wrote, and every verdict on each, against loaders.

``hf_cases`` mutates a checkpoint's tensors; here the tensors stay and the *folder* changes: the
index removed, one file oddly named, a stale ``model.safetensors`` beside the shards, a PEFT
adapter saved into the same folder, a shard missing or truncated, the index pointing a key at
another shard, listing a key no shard holds or spelling a shard ``./name``, a key stored in two
files without an index, a file the index does not name. Each loader chooses its files itself
(``loadkit_inspect.sources.files``), so the two columns can part ways on the same folder.

The oracles:

- the ``transformers`` column against ``from_pretrained(folder, output_loading_info=True)`` run
  on the folder: its outcome (``loads``, ``warns``, ``raises``), its lists, and when it raises the
  exception's class (and the file it names);
- the ``vllm`` column: where vLLM raises before loading (a file the index names that its glob
  does not find: ``filter_duplicate_safetensors_files``; a file the safetensors library refuses),
  that it raises, and what; otherwise, against transformers' verdict on a plain
  ``model.safetensors`` holding exactly the tensors vLLM reads (every tensor of every file it
  reads, the last copy of a key), with ``hf_cases``' known differences applied. Which files vLLM
  reads is pinned against vLLM's own code in ``tests/upstream/test_file_choice_upstream.py``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hf_cases import (
    ARCHS,
    Arch,
    Verdict,
    expected_vllm,
    read_tensors,
    transformers_verdict,
    write_variant,
)

INDEX = "model.safetensors.index.json"
Tensors = dict[str, torch.Tensor]


def _shards(folder: Path) -> list[str]:
    return sorted({*json.loads((folder / INDEX).read_text())["weight_map"].values()})


def _edit_index(folder: Path, edit: Callable[[dict[str, str]], dict[str, str]]) -> None:
    index = json.loads((folder / INDEX).read_text())
    index["weight_map"] = edit(index["weight_map"])
    (folder / INDEX).write_text(json.dumps(index, indent=1))


def _save(tensors: Tensors, path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata={"format": "pt"})


def _first_weight(tensors: Tensors) -> str:
    return next(k for k, v in tensors.items() if k.endswith(".weight") and v.ndim == 2)


# --- the layouts: each writes the folder, and says what vLLM reads there ------------------------


def index_removed(clean: Path, t: Tensors, folder: Path) -> Tensors:
    """Shards copied without their index: transformers finds neither ``model.safetensors`` nor
    an index (OSError); vLLM globs every ``*.safetensors``."""
    write_variant(clean, t, folder, shards=3)
    (folder / INDEX).unlink()
    return t


def odd_name(clean: Path, t: Tensors, folder: Path) -> Tensors:
    """One file named as a one-shard export (``model-00001-of-00001.safetensors``), no index."""
    write_variant(clean, t, folder)
    (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
    return t


def adapter_beside(clean: Path, t: Tensors, folder: Path) -> Tensors:
    """A PEFT adapter saved into the model's folder (``adapter_model.safetensors``, no index):
    transformers reads ``model.safetensors`` alone, vLLM every ``*.safetensors``."""
    write_variant(clean, t, folder)
    key = _first_weight(t)
    lora = {f"base_model.model.{key[: -len('.weight')]}.lora_A.weight": torch.zeros(2, 2)}
    _save(lora, folder / "adapter_model.safetensors")
    return {**t, **lora}


def stale_single_file(clean: Path, t: Tensors, folder: Path) -> Tensors:
    """A stale ``model.safetensors`` (one weight short) left beside the shards and their index:
    transformers reads it and never opens the index; vLLM reads the shards."""
    write_variant(clean, t, folder, shards=3)
    dropped = _first_weight(t)
    _save({k: v for k, v in t.items() if k != dropped}, folder / "model.safetensors")
    return t


def missing_shard(clean: Path, t: Tensors, folder: Path) -> None:
    """A shard the index names deleted (an interrupted copy): both raise."""
    write_variant(clean, t, folder, shards=3)
    (folder / _shards(folder)[1]).unlink()


def truncated_shard(clean: Path, t: Tensors, folder: Path) -> None:
    """A shard cut in half: the safetensors library refuses it in both."""
    write_variant(clean, t, folder, shards=3)
    shard = folder / _shards(folder)[1]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


def twice_no_index(clean: Path, t: Tensors, folder: Path) -> Tensors:
    """Two shards without an index, the second holding a copy of a key of the first."""
    write_variant(clean, t, folder, shards=2)
    (folder / INDEX).unlink()
    first, second = sorted(folder.glob("*.safetensors"))
    from safetensors.torch import load_file

    copy = next(iter(load_file(first)))
    _save({**load_file(second), copy: t[copy]}, second)
    return t


def index_wrong_shard(clean: Path, t: Tensors, folder: Path) -> Tensors:
    """The index points a key at another shard than the one holding it."""
    write_variant(clean, t, folder, shards=3)
    last = _shards(folder)[-1]
    key = next(k for k, s in json.loads((folder / INDEX).read_text())["weight_map"].items()
               if s != last)  # fmt: skip
    _edit_index(folder, lambda m: {**m, key: last})
    return t


def index_lists_a_ghost(clean: Path, t: Tensors, folder: Path) -> Tensors:
    """The index lists a key that no shard holds (a tensor removed after the index was made)."""
    write_variant(clean, t, folder, shards=3)
    _edit_index(folder, lambda m: {**m, "ghost_proj.weight": _shards(folder)[0]})
    return t


def unindexed_file(clean: Path, t: Tensors, folder: Path) -> Tensors:
    """A ``*.safetensors`` file the index does not name, holding an extra key: neither reads it."""
    write_variant(clean, t, folder, shards=3)
    _save({"extra_proj.weight": torch.zeros(2, 2)}, folder / "extra.safetensors")
    return t


def dot_slash_entries(clean: Path, t: Tensors, folder: Path) -> None:
    """The index spells one shard ``./model-00001-of-00003.safetensors``: transformers opens the
    path; vLLM compares ``os.path.join(folder, entry)`` with its glob's spelling and raises."""
    write_variant(clean, t, folder, shards=3)
    first = _shards(folder)[0]
    _edit_index(folder, lambda m: {k: (f"./{s}" if s == first else s) for k, s in m.items()})


@dataclass(frozen=True)
class Layout:
    """A folder layout: ``write`` lays the folder out and returns the tensors vLLM reads there
    (``None``: vLLM raises ``vllm_raises`` before reading a tensor)."""

    name: str
    write: Callable[[Path, Tensors, Path], Tensors | None]
    vllm_raises: str | None = None


LAYOUTS: dict[str, Layout] = {
    lay.name: lay
    for lay in [
        Layout("index removed", index_removed),
        Layout("one file, odd name", odd_name),
        Layout("adapter beside model.safetensors", adapter_beside),
        Layout("stale model.safetensors beside shards", stale_single_file),
        Layout("index names a missing shard", missing_shard, "FileNotFoundError"),
        Layout("truncated shard", truncated_shard, "SafetensorError"),
        Layout("key in two files, no index", twice_no_index),
        Layout("index points a key at another shard", index_wrong_shard),
        Layout("index lists a key no shard holds", index_lists_a_ghost),
        Layout("file the index does not name", unindexed_file),
        Layout("index spells a shard ./name", dot_slash_entries, "FileNotFoundError"),
    ]
}


def layout_cases() -> list[tuple[str, str]]:
    """Every (architecture, layout)."""
    return [(a, lay) for a in ARCHS for lay in LAYOUTS]


# --- the oracles ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """``from_pretrained``'s outcome on a folder: ``loads``, ``warns`` or ``raises`` (with the
    exception's class and message), and its lists where it returned."""

    outcome: str
    lists: Verdict | None = None
    error: str | None = None
    message: str = ""


def from_pretrained_outcome(arch: Arch, folder: Path) -> tuple[Outcome, Any]:
    """transformers' own ``from_pretrained(folder, output_loading_info=True)``: what it does,
    and the model (``None`` when it raises)."""
    import transformers

    cls = getattr(transformers, arch.cls)
    try:
        model, info = cls.from_pretrained(folder, output_loading_info=True)
    except Exception as exc:  # the oracle's answer: compared class by class with the column
        return Outcome("raises", None, type(exc).__name__, str(exc)), None
    lists = Verdict(
        frozenset(info["missing_keys"]),
        frozenset(info["unexpected_keys"]),
        frozenset(m[0] for m in info["mismatched_keys"]),
    )
    return Outcome("loads" if lists.clean else "warns", lists), model


def run_layout(arch: Arch, layout: str, clean: Path, work: Path) -> dict[str, Any]:
    """Every verdict on one (architecture, layout): transformers' own on the folder, loadkit's
    two columns, and what vLLM's column should say."""
    from loadkit_inspect import inspect_checkpoint

    lay = LAYOUTS[layout]
    tensors = read_tensors(clean)
    folder = work / "folder"
    read_by_vllm = lay.write(clean, tensors, folder)
    oracle, _ = from_pretrained_outcome(arch, folder)
    # vLLM 0.34.0's Transformers backend, whatever class auto would pick (as hf_cases checks it)
    report = inspect_checkpoint(folder, model="hf", model_impl="transformers")
    expected = None
    if read_by_vllm is not None:  # the tensors vLLM reads, in one plain file: transformers' view
        control = write_variant(clean, read_by_vllm, work / "control")
        said, model = from_pretrained_outcome(arch, control)
        assert said.lists is not None and model is not None, said
        hf = transformers_verdict(arch, control, said.lists, model)
        expected = expected_vllm(arch, "clean", hf, list(read_by_vllm))
    # vLLM refuses some architectures before it reads a file (hf_cases.REFUSED_BY_BACKEND and
    # others): that refusal, said of the clean checkpoint, is then the column, whatever the folder
    said = inspect_checkpoint(clean, model="hf", model_impl="transformers", loader="vllm")
    refused = next((p for p in said.loaders["vllm"].problems if p.startswith("vLLM refuses")), None)
    return {"oracle": oracle, "report": report, "expected_vllm": expected, "layout": lay,
            "folder": folder, "refused": refused}  # fmt: skip


def vllm_column(report: Any) -> Verdict:
    """The vllm column's lists, in the wrapper's names."""
    load = report.load
    return Verdict(
        frozenset(m.name for m in load.missing),
        frozenset(u.name for u in load.unexpected),
        frozenset(s.param for s in load.shape_mismatches),
    )


def copy_clean(clean: Path, work: Path) -> Path:
    """A copy of ``clean`` to lay out (the session's clean checkpoints stay untouched)."""
    out = work / "clean"
    shutil.copytree(clean, out)
    return out
