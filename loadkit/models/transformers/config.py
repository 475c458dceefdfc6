"""Reading a Hugging Face ``config.json`` into transformers' own config class.

The checks that need no transformers come first (the file is there, it is JSON, it names a
``model_type``), so the common mistakes fail fast; transformers is imported only to look the
``model_type`` up and build its config class. Every failure is a ``ModelSpecError`` (exit 2 in
the CLI) naming the file. transformers is an optional extra (``pip install 'loadkit[hf]'``): without
it, the first step that needs it fails with one line saying what to install.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadkit.errors import ModelSpecError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

CONFIG_NAME = "config.json"


def config_path(source: str | os.PathLike[str], *, given: bool = False) -> Path:
    """The ``config.json`` that ``source`` names: the file itself, or the one in the folder.

    A checkpoint file stands for its folder: ``folder/model.safetensors`` ->
    ``folder/config.json``. For example ``config_path("ckpt")`` is ``ckpt/config.json`` when that
    file exists; otherwise a ``ModelSpecError`` says where it looked. ``given``: the user named
    ``source`` (``--model hf:PATH``), so the error says what is wrong with that path.
    """
    named = path = Path(source)
    if path.is_dir():
        path = path / CONFIG_NAME
    elif path.suffix == ".safetensors" or path.name.endswith(".safetensors.index.json"):
        path = path.parent / CONFIG_NAME
    if not path.is_file() and given:
        if not os.path.lexists(named):
            why = "does not exist"
        else:
            why = f"has no {CONFIG_NAME}" if named.is_dir() else f"has no {CONFIG_NAME} beside it"
        raise ModelSpecError(
            f"{named}: {why}; --model hf:PATH names a {CONFIG_NAME} or the folder holding one"
        )
    if not path.is_file():
        where = path.parent if path.name == CONFIG_NAME else path
        raise ModelSpecError(
            f"{path}: no such config file; --model hf reads the {CONFIG_NAME} that "
            f"save_pretrained writes next to the weights (none in {where}); give one with "
            "--model hf:PATH"
        )
    return path


def read_config_dict(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object in ``path``, with a ``model_type`` (no transformers needed)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelSpecError(f"{path}: cannot read the config: {exc}") from None
    return config_dict(text, path)


def config_dict(text: str, path: str | os.PathLike[str]) -> dict[str, Any]:
    """``text`` (the config read from ``path``, a file or a URL) as a JSON object with a
    ``model_type``."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelSpecError(f"{path}: the config is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ModelSpecError(f"{path}: the config must be a JSON object, not {type(data).__name__}")
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ModelSpecError(
            f"{path}: the config has no 'model_type' (transformers picks the architecture by it)"
        )
    return data


INSTALL_HINT = "pip install 'loadkit[hf]'"


def require_transformers() -> None:
    """Import transformers, or say in one line what to install: it is the ``hf`` extra, needed
    only for Hugging Face architectures (``--model hf``), never for the rest of loadkit.

    >>> require_transformers()  # installed here: nothing to say
    """
    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        raise ModelSpecError(
            f"--model hf needs transformers, which cannot be imported ({exc}): {INSTALL_HINT}"
        ) from None


def config_from_dict(data: dict[str, Any], source: str) -> PretrainedConfig:
    """transformers' config class for ``data["model_type"]``, built from ``data``."""
    require_transformers()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

    model_type = data["model_type"]
    if model_type not in CONFIG_MAPPING_NAMES:
        hint = _nearest_types(str(model_type), list(CONFIG_MAPPING_NAMES))
        import transformers

        raise ModelSpecError(
            f"{source}: unknown model_type {model_type!r}: transformers "
            f"{transformers.__version__} has no such architecture{hint}"
        )
    try:
        return CONFIG_MAPPING[model_type].from_dict(dict(data))
    except Exception as exc:  # transformers validates values: say which file was wrong
        raise ModelSpecError(
            f"{source}: transformers cannot build a {model_type!r} config from it: {one_line(exc)}"
        ) from exc


def _nearest_types(model_type: str, known: list[str]) -> str:
    """The known model types nearest to ``model_type``; when none is close, the nearest anyway.

    >>> _nearest_types("Llama-3", ["llama", "mllama", "bert"])
    '; nearest: llama, mllama'
    >>> _nearest_types("foo", ["llama", "bert", "gpt2"])
    '; none is close among 3 known; the nearest: llama, gpt2, bert'
    """
    wanted = model_type.lower().replace("-", "_")
    close = difflib.get_close_matches(wanted, known, n=3)
    if close:
        return f"; nearest: {', '.join(close)}"
    anyway = difflib.get_close_matches(wanted, known, n=3, cutoff=0.0)
    return f"; none is close among {len(known)} known; the nearest: {', '.join(anyway)}"


def one_line(exc: BaseException) -> str:
    """An exception as one line (transformers' validation errors span several)."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def load_config(source: str | os.PathLike[str]) -> tuple[PretrainedConfig, str]:
    """``(config, path it came from)`` for a ``config.json``, a folder or a checkpoint file.

    >>> load_config("no/such/folder")  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    loadkit.errors.ModelSpecError: no/such/folder/config.json: no such config file ...
    """
    path = config_path(source)
    return config_from_dict(read_config_dict(path), str(path)), str(path)
