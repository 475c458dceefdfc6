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
...     shard_files(folder)
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

from loadkit.checkpoint.record import Record
from loadkit.errors import CheckpointError, ShardIndexError

TYPE_CHECKING = False  # typing's, without importing typing (see loadkit.checkpoint.record)
if TYPE_CHECKING:
    from typing import Any

INDEX_NAME = "model.safetensors.index.json"
MAX_INDEX_BYTES = 100_000_000  # loadkit's limit on an index (as safetensors' on a header)


class Shards(Record):
    """The shard files (sorted, each once) and, with an index, its ``weight_map`` with every
    entry replaced by the shard file it resolves to."""

    files: list[str]
    weight_map: dict[str, str] | None
    index: str | None  # type: ignore[assignment]  # a field named like tuple.index


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


def shard_files(path: str | os.PathLike[str]) -> Shards:
    """The shards ``path`` stands for; raises ``loadkit.errors`` errors for anything else."""
    p = str(Path(path))  # "folder/" and "./folder" name their shards as "folder" does
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise CheckpointError(p, "no such file or folder") from None
    except OSError as exc:
        raise CheckpointError(p, f"cannot read: {exc.strerror or exc}") from None
    if stat.S_ISREG(st.st_mode):
        return Shards([p], None, None)
    if not stat.S_ISDIR(st.st_mode):
        raise CheckpointError(p, f"is {_kind(st.st_mode)}, not a .safetensors file or a folder")
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
    return Shards(sorted(files.values()), None, None)


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


def read_index(index: str) -> dict[str, Any]:
    """The index's JSON object, read as transformers reads it (Python's json), without its
    failure modes: any problem is a ``ShardIndexError``."""
    fd = open_regular(index, lambda message: ShardIndexError(index, message))
    with os.fdopen(fd, "rb") as f:
        raw = f.read(MAX_INDEX_BYTES + 1)
    return parse_index(raw, index)


def parse_index(raw: bytes, index: str) -> dict[str, Any]:
    """An index's bytes (at most ``MAX_INDEX_BYTES``; one more says it is larger) as its JSON
    object; ``index`` (a path or a URL) names it in every ``ShardIndexError``."""
    if len(raw) > MAX_INDEX_BYTES:
        raise ShardIndexError(index, f"index is larger than loadkit's limit of {MAX_INDEX_BYTES} B")
    try:
        data = json.loads(raw.decode("utf-8"))
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


def _from_index(folder: str, index: str) -> Shards:
    data = read_index(index)
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict):
        raise ShardIndexError(index, f"'weight_map' is {_json_kind(weight_map)}, not an object")
    resolved: dict[str, str] = {}  # spelling in the index -> shard file
    by_identity: dict[tuple[int, int], str] = {}
    files: dict[str, str] = {}  # the chosen path of each distinct file
    for key, entry in weight_map.items():
        if isinstance(entry, str) and entry in resolved:
            continue
        plain = plain_relative(entry)
        if plain is None:
            shown = json.dumps(entry, ensure_ascii=True)
            raise ShardIndexError(
                index,
                f"names shard {shown}, which is not a plain file name inside the folder "
                "(no absolute path, no '..')"
                if isinstance(entry, str)
                else f"names shard {shown}, which is not a file name",
                key,
            )
        file = os.path.join(folder, plain)
        found = _regular(file)
        if found is None:
            raise ShardIndexError(
                index, f"names shard '{plain}', which does not exist in {folder}", key
            )
        file = by_identity.setdefault((found.st_dev, found.st_ino), file)
        resolved[entry] = files.setdefault(file, file)
    return Shards(sorted(files), {k: resolved[v] for k, v in weight_map.items()}, index)


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
