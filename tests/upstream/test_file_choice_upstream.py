"""Which files vLLM reads from a folder: ``loadkit_inspect.sources.files.vllm_files`` against
vLLM's own ``DefaultModelLoader._prepare_weights`` (0.28.0 and 0.34.0), run from the wheel.

``_prepare_weights`` is a method: its function is taken from ``default_loader.py`` with ``ast``
(same file name and line numbers) and run with ``self.load_config`` at its defaults
(``load_format="auto"``), with vLLM's own ``filter_duplicate_safetensors_files``,
``filter_files_not_needed_for_inference`` and ``_natural_sort_key`` (``weight_utils.py``) and
``list_filtered_repo_files`` (``transformers_utils/repo_utils.py``). Two names are stood in for:
``maybe_download_from_modelscope`` returns ``None``, as it does unless ``VLLM_USE_MODELSCOPE`` is
set, and the hub downloads raise (a local folder never reaches them). The files are compared in
the order ``safetensors_weights_iterator`` reads them (``sorted(..., key=_natural_sort_key)``).
"""

from __future__ import annotations

import ast
import glob
import json
import os
import sys
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from loadkit_inspect.sources.files import vllm_files
from upstream.fetch import OLD, REFERENCE
from upstream.harness import _compile, _module, _register, exec_definitions

INDEX = "model.safetensors.index.json"


def _never(*args, **kwargs):
    raise AssertionError("a local folder never downloads")


def prepare_weights(up) -> types.FunctionType:
    """vLLM ``up.version``'s ``DefaultModelLoader._prepare_weights``, as a plain function."""
    pkg = up.src / "vllm"
    root = up.root
    if f"{root}.version" not in sys.modules:  # hf_api tags requests with it; never called here
        _register(_module(f"{root}.version", __version__=up.version))
        _register(_module(f"{root}.transformers_utils", package=True))
    repo_utils, _ = exec_definitions(
        pkg / "transformers_utils" / "repo_utils.py",
        f"{root}.transformers_utils.repo_utils",
        ("list_filtered_repo_files",),
    )
    weight_utils, _ = exec_definitions(
        pkg / "model_executor" / "model_loader" / "weight_utils.py",
        f"{root}.model_executor.model_loader.weight_utils_files",
        ("filter_duplicate_safetensors_files", "filter_files_not_needed_for_inference",
         "_natural_sort_key"),
    )  # fmt: skip
    path = pkg / "model_executor" / "model_loader" / "default_loader.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    cls = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DefaultModelLoader"
    )
    func = next(
        n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_prepare_weights"
    )
    scope = {
        "__name__": f"{root}.model_executor.model_loader.default_loader",
        "glob": glob,
        "os": os,
        "SAFE_WEIGHTS_INDEX_NAME": INDEX,
        "list_filtered_repo_files": repo_utils.list_filtered_repo_files,
        "filter_duplicate_safetensors_files": weight_utils.filter_duplicate_safetensors_files,
        "filter_files_not_needed_for_inference": weight_utils.filter_files_not_needed_for_inference,
        "maybe_download_from_modelscope": lambda model, revision=None, *a, **k: None,
        "download_weights_from_hf": _never,
        "download_safetensors_index_file_from_hf": _never,
    }
    exec(_compile(ast.Module(body=[func], type_ignores=[]), path, root), scope)
    prepare = scope["_prepare_weights"]
    natural = weight_utils._natural_sort_key

    def run(folder: Path) -> tuple[tuple[str, ...], bool] | tuple[str, str]:
        self = types.SimpleNamespace(
            load_config=types.SimpleNamespace(
                load_format="auto", download_dir=None, ignore_patterns=None
            )
        )
        try:
            result = prepare(self, str(folder), None, None, True, None)
        except Exception as exc:  # vLLM's answer: compared class and message with loadkit's
            return type(exc).__name__, str(exc)
        files = sorted(result[1], key=natural)
        return tuple(os.path.relpath(f, folder) for f in files), result[2]

    return run


def _w(path: Path, **tensors: torch.Tensor) -> None:
    save_file(tensors or {"w": torch.zeros(2)}, str(path))


def _index(folder: Path, weight_map: dict[str, str]) -> None:
    (folder / INDEX).write_text(json.dumps({"weight_map": weight_map}))


def _sharded(folder: Path) -> None:
    _w(folder / "model-00001-of-00002.safetensors", a=torch.zeros(1))
    _w(folder / "model-00002-of-00002.safetensors", b=torch.zeros(1))
    _index(
        folder, {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    )


def _layouts() -> dict[str, object]:
    def no_index(f):
        _sharded(f)
        (f / INDEX).unlink()

    def odd_name(f):
        _w(f / "weights.safetensors")

    def adapter(f):
        _w(f / "model.safetensors")
        _w(f / "adapter_model.safetensors")

    def stale_single(f):
        _sharded(f)
        _w(f / "model.safetensors")

    def missing_shard(f):
        _sharded(f)
        (f / "model-00002-of-00002.safetensors").unlink()

    def unindexed(f):
        _sharded(f)
        _w(f / "extra.safetensors")

    def dot_slash(f):
        _sharded(f)
        _index(
            f, {"a": "./model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
        )

    def subfolder_entry(f):
        _sharded(f)
        (f / "sub").mkdir()
        (f / "model-00002-of-00002.safetensors").rename(f / "sub" / "b.safetensors")
        _index(f, {"a": "model-00001-of-00002.safetensors", "b": "sub/b.safetensors"})

    def mistral(f):
        _sharded(f)
        _w(f / "consolidated.safetensors")

    def mistral_in_a_subfolder(f):
        _sharded(f)
        (f / "original").mkdir()
        _w(f / "original" / "consolidated.safetensors")

    def natural_order(f):
        for i in (1, 2, 10):
            _w(f / f"part-{i}.safetensors")

    def hidden(f):
        _w(f / "model.safetensors")
        _w(f / ".model.safetensors")

    def pickles_only(f):
        torch.save({"w": torch.zeros(1)}, f / "pytorch_model.bin")
        torch.save({}, f / "training_args.bin")

    def empty(f):
        (f / "config.json").write_text("{}")

    return {name: fn for name, fn in locals().items() if callable(fn) and not name.startswith("_")}


LAYOUTS = _layouts()


@pytest.mark.parametrize("version", [OLD, REFERENCE])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_files_vllm_reads(up_at, version, layout, tmp_path):
    folder = tmp_path / layout
    folder.mkdir()
    LAYOUTS[layout](folder)
    theirs = prepare_weights(up_at(version))(folder)
    ours = vllm_files(folder)
    if isinstance(theirs[1], str):  # vLLM raised before reading a tensor
        error, message = theirs
        assert ours.raises is not None, (layout, theirs, ours)
        assert (ours.raises.error, ours.raises.message) == (error, message)
        assert ours.files == ()
        return
    files, safetensors = theirs
    assert ours.raises is None, (layout, theirs, ours)
    assert ours.files == files
    assert ours.pickle == (not safetensors)
    assert ours.mistral == any(os.path.basename(f).startswith("consolidated") for f in files)
