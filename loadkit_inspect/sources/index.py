"""A sharded checkpoint read as far as it can be: every index problem collected, none raised.

``open_checkpoint`` raises at the first inconsistency. A debugging tool needs all of
them, each with where the key really is, and whatever can still be read: ``open_lenient`` reads
every shard it can (the index's and, to find misplaced keys, any other ``*.safetensors`` in the
folder), keeps the tensors a loader following the index would read, and lists:

- ``missing shard``: the index names a shard that is not there (its keys: wherever they are);
- ``wrong shard``: the index says a shard holds a key that it does not (the key is elsewhere);
- ``not in index``: a shard holds a key the index does not list;
- ``in two shards``: one key stored twice (a loader reads both; the later copy wins, and is the
  one the checkpoint keeps);
- ``total_size``: the index's ``metadata.total_size`` is not the shards' tensor bytes (a note
  when a listed shard is missing or unreadable: its bytes cannot be counted);
- ``unreadable shard``: a shard whose header cannot be read (its keys are lost);
- ``unindexed shard``: a ``*.safetensors`` file the index does not name (a note, not a failure:
  vLLM never reads it, and repositories often ship one; a ``model.safetensors`` beside the index
  is the file transformers reads instead: ``single_file_beside_index``).

Each problem has a ``severity``, from what loaders do with the index (vLLM 0.28.0 reads every
tensor of every file the index names, never the index's list of keys, and raises for a named
file that is missing; transformers likewise opens every named shard): ``fails`` where the load
raises (a missing or unreadable shard, a key stored twice with two shapes: one copy cannot
fit), ``inconsistent`` where it does not (a key in another listed shard than the index says, a
key the index does not list, a listed key no listed shard holds: nothing reads it, and a model
tensor it would fill is reported missing by the dry load; a key in two shards with one shape, a
wrong ``total_size``), ``note`` for an unindexed shard.

A folder without an index is read the same way (every ``*.safetensors`` is a shard): a key in two
shards and an unreadable shard are collected too. Only when no shard can be read at all does it
raise. Torch-free.

Hostile folders are refused as ``open_checkpoint`` refuses them (``loadkit.checkpoint.shards``):
an index is read bounded and only from a regular file, its entries must be plain file names
inside the folder, only regular files are read as shards (a FIFO is an unreadable shard, never
opened), and one file under two spellings or two links is one shard.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from operator import attrgetter
from pathlib import Path
from typing import Any, NamedTuple

from loadkit.checkpoint.reader import INDEX_NAME, Checkpoint, TensorInfo, read_safetensors_header
from loadkit.checkpoint.shards import plain_relative, read_index
from loadkit.errors import CheckpointError, ShardIndexError, printable


class IndexProblem(NamedTuple):
    """One inconsistency between an index and its shards."""

    kind: str  # missing shard, wrong shard, not in index, in two shards, total_size, ...
    key: str | None
    message: str  # says where the key really is
    found_in: tuple[str, ...] = ()  # the shards (file names) that hold the key
    severity: str = "inconsistent"  # "fails" (a tensor cannot be read), "inconsistent", "note"
    listed: str | None = None  # the shard the index names for the key

    @property
    def fails(self) -> bool:
        """Can a tensor not be read (a loader following the index fails)?"""
        return self.severity == "fails"

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "key": self.key,
            "message": self.message,
            "found_in": list(self.found_in),
            "listed": self.listed,
            "severity": self.severity,
            "fails": self.fails,
        }


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


def _quoted(shards: list[str]) -> str:
    return " and ".join(f"'{s}'" for s in shards)


def _where(files: list[str]) -> str:
    if not files:
        return "no shard holds it"
    return "it is in " + " and ".join(files)


def _read_index(folder: Path) -> tuple[dict[str, str], Any]:
    """The index's ``weight_map`` with each shard spelled plainly (``./a`` -> ``a``), and its
    ``metadata.total_size``; an entry that could leave the folder is refused."""
    index = str(folder / INDEX_NAME)
    data = read_index(index)  # bounded, a regular file, any JSON failure a ShardIndexError
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict):
        raise ShardIndexError(index, "unreadable index: weight_map is not an object")
    try:
        spellings = set(weight_map.values())  # a few shards named thousands of times
    except TypeError:  # an entry that is a list or an object: refused below, in index order
        spellings = None
    if spellings is not None:
        plain_of = {e: p for e in spellings if (p := plain_relative(e)) is not None}
        if len(plain_of) == len(spellings):  # every spelling a plain file name
            if all(p == e for e, p in plain_of.items()):  # as writers write them: kept as is
                return weight_map, _total_size(data)
            return {key: plain_of[e] for key, e in weight_map.items()}, _total_size(data)
    # Some entry is refused: the first one in index order names its key.
    plain_map: dict[str, str] = {}
    seen: dict[str, str] = {}  # each spelling checked once
    for key, entry in weight_map.items():
        if isinstance(entry, str) and entry in seen:
            plain_map[key] = seen[entry]
            continue
        plain = plain_relative(entry)
        if plain is None:
            shown = json.dumps(entry, ensure_ascii=True)
            why = "not a plain file name inside the folder (no absolute path, no '..')"
            why = why if isinstance(entry, str) else "not a file name"
            raise ShardIndexError(index, f"names shard {shown}, which is {why}", key)
        plain_map[key] = seen[entry] = plain
    return plain_map, _total_size(data)


def _total_size(index: dict[str, Any]) -> Any:
    """The index's ``metadata.total_size`` (``None`` without one)."""
    metadata = index.get("metadata")
    return metadata.get("total_size") if isinstance(metadata, dict) else None


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


def open_lenient(
    folder: str | os.PathLike[str], *, progress: Callable[[int, int], None] | None = None
) -> tuple[Checkpoint, list[IndexProblem]]:
    """Open a folder of shards (with or without an index), collecting every problem.

    Returns the checkpoint as a loader following the index would read it, and the problems.
    ``progress``, if given, is called with (shards read, shards in all) before each shard
    and at the end.

    Example:
        >>> ck, problems = open_lenient("data/plamo2/tied-with-lm-head")
        >>> len(ck.tensors) > 0, problems
        (True, [])
    """
    p = Path(folder)
    on_disk = sorted(f for f in os.listdir(p) if f.endswith(".safetensors"))
    has_index = os.path.lexists(p / INDEX_NAME)  # a dangling link is an unreadable index
    if has_index:
        weight_map, total_size = _read_index(p)
    else:
        weight_map, total_size = {}, None
    same = _one_per_file(p, [*on_disk, *set(weight_map.values())])
    if any(same[shard] != shard for shard in set(weight_map.values())):  # links to one file
        weight_map = {key: same[shard] for key, shard in weight_map.items()}
    indexed = sorted(set(weight_map.values())) if has_index else sorted(set(same.values()))
    others = sorted({same[f] for f in on_disk} - set(indexed))
    problems: list[IndexProblem] = []
    headers: dict[str, dict[str, TensorInfo]] = {}
    metadata: dict[str, str | None] = {}
    shards = [*indexed, *others]
    for done, shard in enumerate(shards):
        if progress is not None:
            progress(done, len(shards))
        path = p / shard
        if not os.path.lexists(path):
            continue  # a missing shard: reported with its keys below
        try:
            headers[shard], metadata[str(path)] = read_safetensors_header(path)
        except CheckpointError as exc:
            lost = [k for k, s in weight_map.items() if s == shard]
            what = f" ({len(lost)} indexed keys lost: {', '.join(lost[:3])}" if lost else ""
            what += ", ...)" if len(lost) > 3 else (")" if lost else "")
            # an unindexed one is never read by a loader: a note
            severity = "fails" if shard in indexed else "note"
            problems.append(
                IndexProblem("unreadable shard", None, f"{exc}{what}", (shard,), severity, shard)
            )
    if progress is not None:
        progress(len(shards), len(shards))
    readable = [s for s in indexed if s in headers]
    if not readable and (indexed or not has_index):  # {"weight_map": {}}: an empty checkpoint
        raise ShardIndexError(str(p), _nothing_readable(p, has_index, indexed, problems))

    first, several = _locate(headers)

    def located(name: str) -> list[str]:
        return several.get(name) or ([first[name]] if name in first else [])

    # Nearly always, every key is in the shard the index names for it: checked at once.
    as_indexed = has_index and weight_map == first
    if not as_indexed:
        problems += _index_vs_shards(p, weight_map, indexed, headers, located)

    tensors: dict[str, TensorInfo] = {}
    for shard in readable:
        infos = headers[shard]
        if not several and (not has_index or as_indexed or infos.keys() <= weight_map.keys()):
            tensors.update(infos)  # nearly every shard: each key listed, and held only here
            continue
        for name, info in infos.items():
            first_copy = tensors.pop(name, None) is None
            # A later copy replaces it, in its own place in the stream (reported below, once
            # per key): loaders read the shards in order and every copy, so the last one is
            # what stays loaded.
            tensors[name] = info
            if first_copy and has_index and name not in weight_map:
                msg = f"shard '{shard}' holds it, but the index does not list it"
                problems.append(IndexProblem("not in index", name, msg, (shard,), listed=None))
    for name in [n for n in first if n in several] if several else []:
        shards = several[name]
        read = [s for s in shards if s in readable]
        if len(read) > 1:
            shapes = {str(list(headers[s][name].shape)) for s in read}
            said = f"; the index says '{weight_map[name]}'" if name in weight_map else ""
            # Of one shape, the last copy wins. Of two: vLLM loads every copy, and the one whose
            # shape the parameter does not have fails its size assertion (default_weight_loader,
            # weight_utils.py:1231); transformers merges the shards in order and checks only the
            # last copy (its size mismatch raises). The checkpoint keeps the last copy.
            outcome = (
                f"shapes differ: {' and '.join(sorted(shapes))}: vLLM loads every copy and "
                "raises for the one the parameter's shape does not fit; transformers keeps the "
                f"last (in {read[-1]}) and raises only if that one does not fit"
                if len(shapes) > 1
                else "a loader reads every copy, and the last one wins"
            )
            problems.append(
                IndexProblem(
                    "in two shards",
                    name,
                    f"stored in {' and '.join(read)}{said}; {outcome}",
                    tuple(read),
                    # one copy of the two shapes cannot fit the parameter: the load fails
                    "fails" if len(shapes) > 1 else "inconsistent",
                    weight_map.get(name),
                )
            )
    # Each tensor counted once, as save_pretrained counts it: a key stored twice by the copy in
    # the shard the index names for it (the copy kept may be another).
    stored = sum(map(_NBYTES, tensors.values()))
    for name, shards in several.items():
        listed = weight_map.get(name)
        if name in tensors and listed in shards and listed in headers:
            stored += headers[listed][name].nbytes - tensors[name].nbytes
    if isinstance(total_size, int) and not isinstance(total_size, bool) and total_size != stored:
        lost = sorted(s for s in indexed if s not in headers)  # missing or unreadable
        why = ""
        if lost:  # their bytes cannot be counted: a consequence, said under them, not a problem
            why = (
                f"; expected while {_quoted(lost)} cannot be read (its bytes are not counted): "
                "a consequence of the problem above, not one of its own"
            )
        problems.append(
            IndexProblem(
                "total_size",
                None,
                f"the index's metadata.total_size is {total_size} bytes, but the shards hold "
                f"{stored} bytes of tensors ({len(tensors)} tensors){why}",
                severity="note" if lost else "inconsistent",
            )
        )
    for shard in others:
        n = len(headers.get(shard, {}))
        who = "loaders never read it"
        if shard == SINGLE_FILE:
            who = (
                "vLLM never reads it (it reads the files the index names), but transformers' "
                "from_pretrained reads it instead of the index and its shards"
            )
        problems.append(
            IndexProblem(
                "unindexed shard",
                None,
                f"'{shard}' ({n} tensors) is not named by the index: {who}",
                (shard,),
                "note",
            )
        )
    # In stream order already (shards in file-name order, each header's tensors in data order):
    # as Checkpoint.weights() yields them.
    files = [str(p / s) for s in readable]
    return Checkpoint(str(p), files, tensors, metadata), problems


_NBYTES = attrgetter("nbytes")


def _locate(
    headers: dict[str, dict[str, TensorInfo]],
) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Where each key is: the first shard (in reading order) holding it, and for the rare key
    held by several, all of them (in reading order)."""
    first: dict[str, str] = {}
    several: dict[str, list[str]] = {}
    for shard, infos in headers.items():
        if first.keys().isdisjoint(infos):  # nearly every shard: whole-set operations
            first.update(dict.fromkeys(infos, shard))
            continue
        for name in infos:
            held = first.setdefault(name, shard)
            if held != shard:
                several.setdefault(name, [held]).append(shard)
    return first, several


SHOWN_REASONS = 3  # files whose reason the "nothing readable" error gives; the rest counted
# weight files of other formats, named when a folder has no safetensors file at all
_OTHER_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx", ".npz")


def _first(names: list[str]) -> str:
    more = f", and {len(names) - SHOWN_REASONS} more" if len(names) > SHOWN_REASONS else ""
    return ", ".join(printable(n) for n in names[:SHOWN_REASONS]) + more


def _nothing_readable(
    p: Path, has_index: bool, indexed: list[str], problems: list[IndexProblem]
) -> str:
    """Why a folder gives nothing to inspect, with each file's reason (the first few).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as empty:
        ...     _nothing_readable(Path(empty), False, [], [])
        'no .safetensors file at all (the folder is empty); nothing to inspect'
    """
    if not indexed:  # no index and no *.safetensors file
        files = sorted(os.listdir(p))
        others = [f for f in files if f.endswith(_OTHER_WEIGHTS)]
        if others:
            found = f"found {_first(others)}: loadkit reads safetensors only"
        else:
            found = f"found: {_first(files)}" if files else "the folder is empty"
        return f"no .safetensors file at all ({found}); nothing to inspect"
    unreadable = {pr.listed: pr.message for pr in problems if pr.kind == "unreadable shard"}
    reasons = []
    for shard in indexed:
        why = unreadable.get(shard, ": it does not exist")
        path = printable(str(p / shard))
        if why.startswith(path):  # the error names the file: named once, inside the folder
            why = why[len(path) :]
        reasons.append(printable(shard) + (why if why[:2] in (": ", ", ") else f": {why}"))
    shown = "; ".join(reasons[:SHOWN_REASONS])
    if len(reasons) > SHOWN_REASONS:
        shown += f"; and {len(reasons) - SHOWN_REASONS} more"
    n = len(indexed)
    if has_index:
        what = (
            f"none of the {n} shards the index names" if n > 1 else "the one shard the index names"
        )
    else:
        what = f"none of its {n} .safetensors files" if n > 1 else "its one .safetensors file"
    return f"{what} can{'' if n > 1 else 'not'} be read; nothing to inspect: {shown}"


def _index_vs_shards(
    p: Path,
    weight_map: dict[str, str],
    indexed: list[str],
    headers: dict[str, dict[str, TensorInfo]],
    located: Callable[[str], list[str]],
) -> list[IndexProblem]:
    """Index entries whose shard is missing, or does not hold the key."""
    problems = []
    exists = {shard: os.path.lexists(p / shard) for shard in indexed}  # one stat per shard
    read = {shard for shard in indexed if shard in headers}  # what a loader reads
    for key, shard in weight_map.items():
        if not exists[shard]:  # vLLM raises for it (FileNotFoundError), whatever holds the key
            where = located(key)
            msg = f"the index names shard '{shard}', which does not exist; {_where(where)}"
            problems.append(IndexProblem("missing shard", key, msg, tuple(where), "fails", shard))
        elif shard in headers and key not in headers[shard]:
            # Loaders read each listed shard's own tensors, never the index's key list (vLLM
            # 0.28.0: the index only filters files, weight_utils.py:598; transformers likewise):
            # a listed key that no listed shard holds is not read, and does not stop the load.
            # A model tensor it would have filled is left missing: the dry load reports that.
            where = located(key)
            msg = f"the index says shard '{shard}' holds it, but {_where(where)}"
            if where and not read.intersection(where):
                msg += ", which loaders never read (the index does not name it)"
            if not read.intersection(where):
                msg += ": nothing reads the key (a model tensor it would fill is left missing)"
            problems.append(IndexProblem("wrong shard", key, msg, tuple(where), listed=shard))
    return problems
