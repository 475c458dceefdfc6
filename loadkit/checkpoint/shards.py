"""Which files a checkpoint path stands for, opened safely.

A path is one ``.safetensors`` file, or a folder: with ``model.safetensors.index.json`` the index
names the shards, otherwise every ``*.safetensors`` file in it is one (as upstream globs them).
Hostile folders are refused instead of followed:

- an index entry must be a plain relative file name inside the folder: no absolute path, no
  ``..``; its last component may be a symlink pointing anywhere (the Hugging Face cache links
  ``snapshots/<rev>/model.safetensors`` to ``../../blobs/<sha>``), since the folder's owner put
  the link there, but the index cannot name a path outside the folder;
- only regular files are opened, and never in a way that blocks (a FIFO named
  ``x.safetensors`` would hang a plain ``open``);
- one file under two spellings (``a.safetensors`` and ``./a.safetensors``, or two links to one
  blob) is one shard.

>>> import tempfile, pathlib
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> (folder / "model.safetensors.index.json").write_text('{"weight_map": {"w": "../x"}}')
29
>>> try:
...     local_layout(folder)
... except ShardIndexError as exc:
...     print(str(exc).split(": ", 1)[1])
names shard "../x", which is not a plain file name inside the folder (no absolute path, no '..')
"""

from __future__ import annotations

import json
import os
import posixpath
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from loadkit.errors import CheckpointError, ShardIndexError, printable

INDEX_NAME = "model.safetensors.index.json"
MAX_INDEX_BYTES = 100_000_000  # loadkit's limit on an index (as safetensors' on a header)


class Layout(NamedTuple):
    """What a checkpoint path (or URL) names, before any header is read: the one input of
    ``loadkit.checkpoint.merge.read_layout``.

    ``shards`` maps each shard's name (as the index spells it, plainly; a lone file's own path)
    to the file it is (a path or a URL), in reading order; ``others`` likewise the
    ``*.safetensors`` files beside an index that it does not name (read only leniently, to find
    misplaced keys); ``weight_map`` maps each key to the shard name the index gives it.
    """

    path: str  # the checkpoint, as its errors and ``Checkpoint.path`` name it
    # the index file (or URL); ``None``: a lone file or a folder without one
    index: str | None  # type: ignore[assignment]  # a field named like tuple.index
    shards: dict[str, str]
    others: dict[str, str]
    weight_map: dict[str, str]
    total_size: Any = None  # the index's ``metadata.total_size``, as written
    # (leniently) each key the index's weight_map lists more than once -> every entry, in order
    listed_twice: dict[str, tuple[Any, ...]] = {}  # noqa: RUF012 (a NamedTuple default)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str, error: Callable[[str], Exception] | None = None) -> int:
    """A read-only descriptor of ``path``, which must be a regular file.

    Opened non-blocking and checked with ``fstat`` afterwards, so neither a FIFO nor a file
    swapped for one after a ``stat`` can make the open hang.
    """
    make = error or (lambda message: CheckpointError(path, message))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise make(f"cannot read: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise make(f"is {_kind(mode)}, not a regular file")
    os.set_blocking(fd, True)
    return fd


def _regular(path: str) -> os.stat_result | None:
    """``path``'s stat (following links) when it is a regular file; ``None`` if it is missing."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointError(path, f"cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(path, f"is {_kind(st.st_mode)}, not a regular file")
    return st


def local_layout(path: str | os.PathLike[str], *, strict: bool = True) -> Layout:
    """The shards ``path`` (a file or a folder) stands for.

    Strictly (``open_checkpoint``), every file the index names must be there and be a regular
    file; leniently (the inspector), a folder's missing or unreadable shards are left for the
    merge to report, and the ``*.safetensors`` files the index does not name are read too.
    Anything else raises a ``loadkit.errors`` error.
    """
    p = str(Path(path))  # "folder/" and "./folder" name their shards as "folder" does
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise CheckpointError(p, "no such file or folder") from None
    except OSError as exc:
        raise CheckpointError(p, f"cannot read: {exc.strerror or exc}") from None
    if stat.S_ISREG(st.st_mode):
        return Layout(p, None, {p: p}, {}, {})
    if not stat.S_ISDIR(st.st_mode):
        raise CheckpointError(p, f"is {_kind(st.st_mode)}, not a .safetensors file or a folder")
    if strict:
        return _strict_folder(p)
    return _lenient_folder(p)


def _strict_folder(p: str) -> Layout:
    index = os.path.join(p, INDEX_NAME)
    if os.path.lexists(index):
        return _from_index(p, index)
    files: dict[tuple[int, int], str] = {}
    for name in sorted(os.listdir(p)):
        if not name.endswith(".safetensors"):
            continue
        file = os.path.join(p, name)
        found = _regular(file)
        if found is None:
            raise CheckpointError(file, "is a link to nothing (a dangling symlink)")
        files.setdefault((found.st_dev, found.st_ino), file)
    if not files:
        raise CheckpointError(p, "folder holds no *.safetensors files and no index")
    chosen = sorted(files.values())
    return Layout(p, None, {os.path.basename(f): f for f in chosen}, {}, {})


def _from_index(folder: str, index: str) -> Layout:
    data = read_index(index)
    weight_map = index_entries(data, index, "inside the folder")
    by_identity: dict[tuple[int, int], str] = {}
    chosen: dict[str, str] = {}  # each plain name -> the name of the file it is (links: one)
    for key, plain in weight_map.items():
        if plain in chosen:
            continue
        found = _regular(os.path.join(folder, plain))
        if found is None:
            raise ShardIndexError(
                index, f"names shard '{plain}', which does not exist in {folder}", key
            )
        chosen[plain] = by_identity.setdefault((found.st_dev, found.st_ino), plain)
    names = sorted(set(chosen.values()), key=lambda name: os.path.join(folder, name))
    shards = {name: os.path.join(folder, name) for name in names}
    mapped = {key: chosen[plain] for key, plain in weight_map.items()}
    return Layout(folder, index, shards, {}, mapped, total_size(data))


def _lenient_folder(p: str) -> Layout:
    folder = Path(p)
    on_disk = sorted(f for f in os.listdir(p) if f.endswith(".safetensors"))
    has_index = os.path.lexists(folder / INDEX_NAME)  # a dangling link is an unreadable index
    index = str(folder / INDEX_NAME) if has_index else None
    weight_map: dict[str, str] = {}
    size = None
    twice: dict[str, list[Any]] = {}
    if index is not None:
        # bounded, a regular file, any JSON failure a ShardIndexError; keys named twice noted
        data = read_index(index, twice=twice)
        weight_map, size = index_entries(data, index, "inside the folder"), total_size(data)
        raw_map = data.get("weight_map")
        twice = {k: v for k, v in twice.items() if isinstance(raw_map, dict) and k in raw_map}
    elif not on_disk:
        raise ShardIndexError(p, nothing_to_read(p))
    same = _one_per_file(folder, [*on_disk, *set(weight_map.values())])
    if any(same[shard] != shard for shard in set(weight_map.values())):  # links to one file
        weight_map = {key: same[shard] for key, shard in weight_map.items()}
    indexed = sorted(set(weight_map.values())) if has_index else sorted(set(same.values()))
    others = sorted({same[f] for f in on_disk} - set(indexed))
    return Layout(
        p,
        index,
        {s: str(folder / s) for s in indexed},
        {s: str(folder / s) for s in others},
        weight_map,
        size,
        {k: tuple(v) for k, v in twice.items()},
    )


def _identity(path: Path) -> tuple[int, int] | None:
    """``(device, inode)`` of a regular file (links followed); ``None`` if absent or not one."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None


def _one_per_file(p: Path, names: list[str]) -> dict[str, str]:
    """Each name -> the first name (sorted) of the same file: two links to one blob, one shard."""
    first: dict[tuple[int, int], str] = {}
    out = {}
    for name in sorted(set(names)):
        ident = _identity(p / name)
        out[name] = name if ident is None else first.setdefault(ident, name)
    return out


SINGLE_FILE = "model.safetensors"  # transformers' SAFE_WEIGHTS_NAME


def single_file_beside_index(folder: str | os.PathLike[str]) -> Path | None:
    """The ``model.safetensors`` of a folder that also has an index, if any: transformers'
    ``from_pretrained`` reads it and ignores the index (it looks for the single file first,
    transformers 5.24.0 ``modeling_utils._get_resolved_checkpoint_files``, modeling_utils.py:591),
    where vLLM reads the files the index names.

    >>> single_file_beside_index("data/plamo2/tied-with-lm-head") is None
    True
    """
    p = Path(folder)
    if not (p.is_dir() and os.path.lexists(p / INDEX_NAME)):
        return None
    single = p / SINGLE_FILE
    return single if _identity(single) is not None else None


SHOWN_REASONS = 3  # files whose reason the "nothing readable" error gives; the rest counted
# weight files of other formats, named when a folder has no safetensors file at all
_OTHER_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx", ".npz")


def first_names(names: list[str]) -> str:
    """The first ``SHOWN_REASONS`` names, printable, and how many more."""
    more = f", and {len(names) - SHOWN_REASONS} more" if len(names) > SHOWN_REASONS else ""
    return ", ".join(printable(n) for n in names[:SHOWN_REASONS]) + more


def nothing_to_read(folder: str) -> str:
    """Why a folder without an index or a ``*.safetensors`` file gives nothing to inspect.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as empty:
        ...     nothing_to_read(empty)
        'no .safetensors file at all (the folder is empty); nothing to inspect'
    """
    files = sorted(os.listdir(folder))
    others = [f for f in files if f.endswith(_OTHER_WEIGHTS)]
    if others:
        found = f"found {first_names(others)}: loadkit reads safetensors only"
    else:
        found = f"found: {first_names(files)}" if files else "the folder is empty"
    return f"no .safetensors file at all ({found}); nothing to inspect"


def plain_relative(entry: Any) -> str | None:
    """An index entry normalised (``./a`` -> ``a``), or ``None`` if it may leave the folder.

    >>> plain_relative(".//sub/./a.safetensors"), plain_relative("../a"), plain_relative("/a")
    ('sub/a.safetensors', None, None)
    """
    if not isinstance(entry, str) or not entry or "\0" in entry or "\\" in entry:
        return None
    if posixpath.isabs(entry):
        return None
    parts = [part for part in entry.split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        return None
    return "/".join(parts)


def read_index(index: str, *, twice: dict[str, list[Any]] | None = None) -> dict[str, Any]:
    """The index's JSON object, read as transformers reads it (Python's json), without its
    failure modes: any problem is a ``ShardIndexError``; ``twice``: see ``parse_index``."""
    fd = open_regular(index, lambda message: ShardIndexError(index, message))
    with os.fdopen(fd, "rb") as f:
        raw = f.read(MAX_INDEX_BYTES + 1)
    return parse_index(raw, index, twice=twice)


def parse_index(
    raw: bytes, index: str, *, twice: dict[str, list[Any]] | None = None
) -> dict[str, Any]:
    """An index's bytes (at most ``MAX_INDEX_BYTES``; one more says it is larger) as its JSON
    object; ``index`` (a path or a URL) names it in every ``ShardIndexError``. Python's json
    keeps the last of a key named twice in one object (as loaders read it); ``twice``, when
    given, gets each such key with every value it was given, in order.

    >>> twice = {}
    >>> parse_index(b'{"weight_map": {"w": "a", "w": "b"}}', "i", twice=twice), twice
    ({'weight_map': {'w': 'b'}}, {'w': ['a', 'b']})
    """
    if len(raw) > MAX_INDEX_BYTES:
        raise ShardIndexError(index, f"index is larger than loadkit's limit of {MAX_INDEX_BYTES} B")
    try:
        data = json.loads(raw.decode("utf-8"), object_pairs_hook=_noting(twice))
    except UnicodeDecodeError as exc:
        raise ShardIndexError(
            index, f"index is not UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None
    except RecursionError:
        raise ShardIndexError(index, "index nests too deeply to be read") from None
    except ValueError as exc:  # JSONDecodeError, or an integer of more than 4300 digits
        raise ShardIndexError(index, f"index is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ShardIndexError(index, f"index is a JSON {type(data).__name__}, not an object")
    return data


def _noting(twice: dict[str, list[Any]] | None) -> Any:
    """json's ``object_pairs_hook`` that notes the keys an object names more than once (``None``:
    json's own dict, at C speed)."""
    if twice is None:
        return None

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(pairs)
        if len(out) != len(pairs):
            seen: dict[str, list[Any]] = {}
            for key, value in pairs:
                seen.setdefault(key, []).append(value)
            twice.update({k: v for k, v in seen.items() if len(v) > 1})
        return out

    return hook


def index_entries(data: dict[str, Any], index: str, where: str) -> dict[str, str]:
    """The index's ``weight_map``, each shard spelled plainly (``./a`` -> ``a``); an entry that
    could leave the folder is refused, the first in index order naming its key (``where`` says
    where a shard must be: ``inside the folder``, ``beside the index``).

    >>> index_entries({"weight_map": {"w": "./a.safetensors"}}, "index.json", "inside the folder")
    {'w': 'a.safetensors'}
    """
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict):
        raise ShardIndexError(index, f"'weight_map' is {_json_kind(weight_map)}, not an object")
    try:
        spellings = set(weight_map.values())  # a few shards named thousands of times
    except TypeError:  # an entry that is a list or an object: refused below, in index order
        spellings = None
    if spellings is not None:
        plain_of = {e: p for e in spellings if (p := plain_relative(e)) is not None}
        if len(plain_of) == len(spellings):  # every spelling a plain file name
            if all(p == e for e, p in plain_of.items()):  # as writers write them: kept as is
                return weight_map
            return {key: plain_of[e] for key, e in weight_map.items()}
    plain_map: dict[str, str] = {}
    seen: dict[str, str] = {}  # each spelling checked once
    for key, entry in weight_map.items():
        if isinstance(entry, str) and entry in seen:
            plain_map[key] = seen[entry]
            continue
        plain = plain_relative(entry)
        if plain is None:
            shown = json.dumps(entry, ensure_ascii=True)
            why = f"not a plain file name {where} (no absolute path, no '..')"
            why = why if isinstance(entry, str) else "not a file name"
            raise ShardIndexError(index, f"names shard {shown}, which is {why}", key)
        plain_map[key] = seen[entry] = plain
    return plain_map


def total_size(index: dict[str, Any]) -> Any:
    """The index's ``metadata.total_size`` (``None`` without one)."""
    metadata = index.get("metadata")
    return metadata.get("total_size") if isinstance(metadata, dict) else None


def _json_kind(value: Any) -> str:
    if value is None:
        return "missing (or null)"
    return {
        str: "a string",
        list: "an array",
        bool: "a boolean",
        int: "a number",
        float: "a number",
    }.get(type(value), "not an object")
