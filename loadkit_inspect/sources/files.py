"""Which files each loader reads from a folder, chosen as that loader chooses them.

A folder can hold more weight files than a loader reads, and two loaders choose differently:

- **transformers** (5.24.0, ``modeling_utils._get_resolved_checkpoint_files`` on a local
  folder): the file the config's ``transformers_weights`` names, if any; else
  ``model.safetensors`` if it is a file (the index is then never opened); else
  ``model.safetensors.index.json`` and the shards it names, ``sorted(set(weight_map.values()))``
  (``utils/hub.get_checkpoint_shard_files``), each opened whole; else ``pytorch_model.bin`` or
  its index (a pickle, which loadkit does not read); else it raises ``OSError: Error no file
  named model.safetensors, or pytorch_model.bin, found in directory ...``. Any other
  ``.safetensors`` file, however named, is never read.
- **vLLM** (0.28.0 and 0.34.0, ``DefaultModelLoader._prepare_weights``, ``load_format="auto"``):
  ``consolidated*.safetensors`` anywhere under the folder selects the Mistral format (those files,
  indexed by ``consolidated.safetensors.index.json``); otherwise it globs ``*.safetensors`` in
  the folder (no hidden files), else ``*.bin``, else ``*.pt``. With safetensors and an index,
  ``filter_duplicate_safetensors_files`` (``weight_utils.py``) keeps the globbed files the index
  names, compared as ``os.path.join(folder, entry)`` strings, and raises ``FileNotFoundError``
  for a named one the glob did not find (also ``./a.safetensors`` or ``sub/a.safetensors``,
  which the glob spells otherwise or never sees). No file at all: ``RuntimeError: Cannot find
  any model weights``. The files are read in natural order (``model-2`` before ``model-10``),
  every tensor of each.

Torch-free: names and ``stat`` only; the headers are read elsewhere.

>>> choice = transformers_files("data/plamo2/tied-with-lm-head")
>>> choice.files, choice.raises
(('model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors'), None)
>>> vllm_files("data/plamo2/tied-with-lm-head").how
'the files the index names'
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from loadkit.checkpoint import INDEX_NAME, MAX_INDEX_BYTES, open_regular, parse_index
from loadkit.errors import CheckpointError, ShardIndexError

if TYPE_CHECKING:
    from loadkit.checkpoint import TensorInfo

SINGLE = "model.safetensors"  # transformers' SAFE_WEIGHTS_NAME
PT_SINGLE = "pytorch_model.bin"  # WEIGHTS_NAME
PT_INDEX = "pytorch_model.bin.index.json"  # WEIGHTS_INDEX_NAME
MISTRAL_PATTERN = "consolidated*.safetensors"
MISTRAL_INDEX = "consolidated.safetensors.index.json"
# vLLM's filter_files_not_needed_for_inference (a .bin or .pt folder only)
_TRAINING_FILES = (
    "training_args.bin",
    "optimizer.bin",
    "optimizer.pt",
    "scheduler.pt",
    "scaler.pt",
)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


class Raised(NamedTuple):
    """What a loader raises: the exception's class, its message (the loader's words, where
    loadkit knows them), and ``why`` in a few words of loadkit's (``""``: the message says it).
    """

    error: str
    message: str
    why: str = ""

    def text(self) -> str:
        """``OSError: no model.safetensors and no index ...``: the class and the shorter words."""
        return f"{self.error}: {self.why or self.message}"

    def as_dict(self) -> dict[str, str]:
        return {"type": self.error, "message": self.message, "why": self.why or self.message}


class FileChoice(NamedTuple):
    """The files one loader reads, in its reading order (names relative to the folder), and
    why; ``raises``: what it raises instead (or when it opens them: a missing or unreadable
    one is found by reading); ``pickle``: the files are PyTorch pickles, which loadkit cannot
    read header-only; ``unread``: the folder's other weight files, which it never opens."""

    loader: str
    files: tuple[str, ...]
    how: str
    raises: Raised | None = None
    pickle: bool = False
    unread: tuple[str, ...] = ()
    mistral: bool = False  # vLLM: consolidated*.safetensors, not the hf files and their index

    def as_dict(self) -> dict[str, Any]:
        return {
            "files": list(self.files),
            "how": self.how,
            "raises": self.raises.as_dict() if self.raises else None,
            "pickle": self.pickle,
            "unread": list(self.unread),
            "mistral_format": self.mistral,
        }


def weight_files(folder: str | os.PathLike[str]) -> list[str]:
    """The folder's weight files (``*.safetensors``, ``*.bin``, ``*.pt``, ``*.pth``), sorted.

    >>> weight_files("data/plamo2/tied-with-lm-head")
    ['model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors']
    """
    return sorted(f for f in os.listdir(folder) if f.endswith(WEIGHT_SUFFIXES))


def _unread(folder: Path, read: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f for f in weight_files(folder) if f not in read)


def _index_shards(index: Path) -> list[str]:
    """``sorted(set(weight_map.values()))``, as transformers lists an index's shards (an
    unreadable index is a ``ShardIndexError``: nothing can be inspected)."""
    path = str(index)
    fd = open_regular(path, lambda message: ShardIndexError(path, message))
    with os.fdopen(fd, "rb") as f:
        raw = f.read(MAX_INDEX_BYTES + 1)
    weight_map = parse_index(raw, path).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ShardIndexError(str(index), "unreadable index: weight_map is not an object of names")
    return sorted(set(weight_map.values()))


def transformers_files(folder: str | os.PathLike[str], explicit: str | None = None) -> FileChoice:
    """The files ``from_pretrained(folder)`` reads (transformers 5.24.0), ``explicit``: the
    config's ``transformers_weights``.

    >>> import tempfile
    >>> transformers_files(tempfile.mkdtemp()).raises.error
    'OSError'
    """
    p = Path(folder)
    if explicit is not None:
        return _explicit(p, explicit)
    if (p / SINGLE).is_file():
        how = "preferred to the index, which it never opens" if _exists(p / INDEX_NAME) else ""
        return FileChoice("transformers", (SINGLE,), how, unread=_unread(p, (SINGLE,)))
    if (p / INDEX_NAME).is_file():
        shards = tuple(_index_shards(p / INDEX_NAME))
        how = "the files the index names"
        return FileChoice("transformers", shards, how, unread=_unread(p, shards))
    for pickle in (PT_SINGLE, PT_INDEX):
        if (p / pickle).is_file():
            files = (pickle,) if pickle == PT_SINGLE else tuple(_index_shards(p / pickle))
            how = "a PyTorch pickle: loadkit reads safetensors only"
            return FileChoice("transformers", files, how, pickle=True, unread=_unread(p, files))
    message = (
        f"Error no file named {SINGLE}, or {PT_SINGLE}, found in directory {os.fspath(folder)}."
    )
    found = weight_files(p)
    why = f"no {SINGLE} and no index in the folder"
    if found:
        what = found[0] if len(found) == 1 else f"its {len(found)} weight files"
        why += f" (it never reads {what})"
    else:
        why += " (the folder has no weights)"
    raised = Raised("OSError", message, why)
    return FileChoice("transformers", (), "none", raised, unread=tuple(found))


def _explicit(p: Path, explicit: str) -> FileChoice:
    """The file the config's ``transformers_weights`` names: checked as transformers checks it."""
    if not explicit.endswith((".safetensors", ".safetensors.index.json")):
        message = (
            "The transformers file in the config seems to be incorrect: it is neither a "
            f"safetensors file (*.safetensors) nor a safetensors index file "
            f"(*.safetensors.index.json): {explicit}"
        )
        return FileChoice("transformers", (), "none", Raised("ValueError", message))
    base = os.path.abspath(p)
    if os.path.commonpath([base, os.path.abspath(p / explicit)]) != base:
        message = (
            "`transformers_weights` must reference a file inside the model directory, got "
            f"{explicit}"
        )
        return FileChoice("transformers", (), "none", Raised("ValueError", message))
    how = "the config's transformers_weights"
    if not explicit.endswith(".index.json"):
        return FileChoice("transformers", (explicit,), how, unread=_unread(p, (explicit,)))
    if not (p / explicit).is_file():
        message = f"Can't find a checkpoint index ({p / explicit}) in {p}."
        return FileChoice("transformers", (), how, Raised("ValueError", message))
    shards = tuple(_index_shards(p / explicit))
    return FileChoice("transformers", shards, how, unread=_unread(p, shards))


def natural_key(name: str) -> list[Any]:
    """vLLM's ``_natural_sort_key``: numbers compared as numbers.

    >>> sorted(["m-10.safetensors", "m-2.safetensors"], key=natural_key)
    ['m-2.safetensors', 'm-10.safetensors']
    """
    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", os.path.basename(name))]


def _mistral(p: Path) -> bool:
    """Does a ``consolidated*.safetensors`` file lie anywhere under the folder (vLLM lists the
    folder recursively to decide the Mistral format)?"""
    for root, _, names in os.walk(p):
        for name in names:
            if fnmatch.fnmatch(name, MISTRAL_PATTERN) and os.path.isfile(os.path.join(root, name)):
                return True
    return False


def vllm_files(folder: str | os.PathLike[str], version: str = "0.34.0") -> FileChoice:
    """The files vLLM's default loader reads from ``folder`` (the same in 0.28.0 and 0.34.0).

    >>> import tempfile
    >>> vllm_files(tempfile.mkdtemp()).raises.error
    'RuntimeError'
    """
    p = Path(folder)
    hf_folder = os.fspath(folder)
    mistral = _mistral(p)
    patterns = [MISTRAL_PATTERN] if mistral else ["*.safetensors", "*.bin", "*.pt"]
    found: list[str] = []
    for pattern in patterns:
        found = glob.glob(os.path.join(hf_folder, pattern))
        if found:
            break
    safetensors = bool(found) and found[0].endswith(".safetensors")
    loader = "vllm"
    if not found:
        message = f"Cannot find any model weights with `{hf_folder}`"
        return FileChoice(loader, (), "none", Raised("RuntimeError", message))
    if not safetensors:
        kept = [f for f in found if not f.endswith(_TRAINING_FILES)]
        files = tuple(os.path.basename(f) for f in sorted(kept, key=natural_key))
        how = "PyTorch pickles (no .safetensors file): loadkit reads safetensors only"
        return FileChoice(loader, files, how, pickle=True, unread=_unread(p, files))
    index_name = MISTRAL_INDEX if mistral else INDEX_NAME
    index = os.path.join(hf_folder, index_name)
    how = f"every {MISTRAL_PATTERN} file: the Mistral format" if mistral else "every *.safetensors"
    if os.path.isfile(index):
        named = _vllm_index_files(index, hf_folder)
        missing = sorted(named - set(found))
        if missing:
            message = f"Weight files referenced in index but missing: {set(missing)}"
            why = _unglobbed([os.path.relpath(m, hf_folder) for m in missing], hf_folder)
            raised = Raised("FileNotFoundError", message, why)
            return FileChoice(loader, (), how, raised, mistral=mistral)
        found = [f for f in found if f in named]
        how = "the files " + (MISTRAL_INDEX if mistral else "the index") + " names"
    else:
        how += " file, no index"
    files = tuple(os.path.relpath(f, hf_folder) for f in sorted(found, key=natural_key))
    return FileChoice(loader, files, how, unread=_unread(p, files), mistral=mistral)


def _unglobbed(entries: list[str], hf_folder: str) -> str:
    """Why index entries are missing from vLLM's glob: absent, or spelled otherwise than the
    glob spells the file (``./a.safetensors``; ``sub/a.safetensors``, which it never globs)."""
    absent = [e for e in entries if not os.path.exists(os.path.join(hf_folder, e))]
    if absent:
        return f"listed shard {', '.join(repr(e) for e in absent)} missing"
    shown = ", ".join(repr(e) for e in entries)
    return (
        f"the index names {shown}: vLLM compares the path it joins with the one its glob of the "
        "folder's *.safetensors gives, and they differ"
    )


def _vllm_index_files(index: str, hf_folder: str) -> set[str]:
    """The paths an index names, spelled as vLLM spells them (``os.path.join``: no
    normalisation)."""
    try:
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        return {os.path.join(hf_folder, weight_map[name]) for name in weight_map}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ShardIndexError(index, f"unreadable index: {exc}") from None


def _exists(path: Path) -> bool:
    return os.path.lexists(path)


def _count(files: tuple[str, ...] | list[str]) -> str:
    return f"{len(files)} file" + ("" if len(files) == 1 else "s")


def _names(files: list[str]) -> str:
    shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    return shown


def read_chosen(
    folder: str | os.PathLike[str], files: tuple[str, ...]
) -> tuple[list[TensorInfo], Raised | None]:
    """The tensors of ``files`` as a loader that merges them in order reads them (a key in two
    files: the later copy), and what it raises at the first file it cannot open (the tensors
    are then those of the files it could: what it would read once that one is fixed)."""
    from loadkit.checkpoint import read_safetensors_header

    merged: dict[str, TensorInfo] = {}
    raised: Raised | None = None
    for name in files:
        path = os.path.join(folder, name)
        try:
            infos, _ = read_safetensors_header(path)
        except CheckpointError as exc:
            raised = raised or _open_error(path, name, exc)
            continue
        merged.update(infos)
    return list(merged.values()), raised


def _open_error(path: str, name: str, exc: Exception) -> Raised:
    """What opening ``path`` raises in the safetensors library (``safe_open``)."""
    if not os.path.lexists(path) or not os.path.exists(path):  # also a dangling link
        return Raised("FileNotFoundError", f"No such file or directory: {path}",
                      f"'{name}' does not exist")  # fmt: skip
    if not os.path.isfile(path):
        return Raised("OSError", f"{path} is not a regular file", f"'{name}' is not a file")
    return Raised("SafetensorError", str(exc), f"'{name}' cannot be read")


def configured_weights(folder: str | os.PathLike[str]) -> str | None:
    """The ``transformers_weights`` of the folder's ``config.json`` (the file transformers reads
    instead of looking for one), or ``None``; a config that cannot be read names none (the
    model's build says what is wrong with it)."""
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            value = json.load(f).get("transformers_weights")
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    return value if isinstance(value, str) else None


def loader_files(path: str, kind: str | None, files: list[str]) -> dict[str, FileChoice]:
    """Each loader's files for a checkpoint opened from ``path`` (``kind``: what it named,
    ``path``, ``hub`` or ``url``; ``files``: what was read): a folder's chosen as each loader
    chooses them; a file or a URL is what both read."""
    if kind is None:
        return {}
    if kind != "url" and os.path.isdir(path):
        return {
            "transformers": transformers_files(path, configured_weights(path)),
            "vllm": vllm_files(path),
        }
    names = tuple(f.rsplit("/", 1)[-1] for f in files)
    how = "the files the index names" if path.endswith(".json") else ""
    return {loader: FileChoice(loader, names, how) for loader in ("transformers", "vllm")}
