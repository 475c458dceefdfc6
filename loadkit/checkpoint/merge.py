"""One sharded layout read: every shard's header merged into one checkpoint, strictly or not.

The one path for a local file or folder, a repository snapshot and a remote index alike: the
caller says which files (a ``loadkit.checkpoint.shards.Layout``) and how a file's header is read
(from disk, or by HTTP Range requests), and ``read_layout`` merges them.

Strictly (``open_checkpoint``), the first problem that stops a loader raises, as it stops vLLM's
and transformers' loaders: a shard that cannot be read, a key stored twice with two shapes (one
copy cannot fit); with ``strict_index`` also the first inconsistency (a key stored twice, a key
the index places in a shard that does not hold it), as ``loadkit inspect --strict-index`` fails
it. What loaders read without complaint (a key in another listed shard than the index says, a
listed key no shard holds, a key stored twice with one shape: the last copy wins) opens, as
``loadkit inspect`` says it loads. Leniently (the inspector), every shard that can be
read is read (the index's and, to find misplaced keys, any other ``*.safetensors`` beside it),
the tensors a loader following the index would read are kept, and every problem is collected as
an ``IndexProblem``:

- ``missing shard``: the index names a shard that is not there (its keys: wherever they are);
- ``wrong shard``: the index says a shard holds a key that it does not (the key is elsewhere);
- ``in no shard``: the index lists a key that no shard holds;
- ``not in index``: a shard holds a key the index does not list;
- ``in two shards``: one key stored twice (a loader reads both; the later copy wins, and is the
  one the checkpoint keeps);
- ``total_size``: the index's ``metadata.total_size`` is not the shards' tensor bytes (a note
  when a listed shard is missing or unreadable: its bytes cannot be counted);
- ``unreadable shard``: a shard whose header cannot be read (its keys are lost);
- ``unindexed shard``: a ``*.safetensors`` file the index does not name (a note, not a failure:
  vLLM never reads it, and repositories often ship one; a ``model.safetensors`` beside the index
  is the file transformers reads instead).

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
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Callable
from operator import attrgetter
from typing import Any, NamedTuple

from loadkit.checkpoint.header import TensorInfo
from loadkit.checkpoint.shards import SHOWN_REASONS, SINGLE_FILE, Layout
from loadkit.errors import CheckpointError, DuplicateKeyError, ShardIndexError, printable

__all__ = ["IndexProblem", "Merged", "read_layout"]

# How a file's header is read: its tensors (data-offset order) and its ``__metadata__`` text.
ReadHeader = Callable[[str], tuple[dict[str, TensorInfo], "str | None"]]


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


class Merged(NamedTuple):
    """What ``read_layout`` makes of a layout: a checkpoint's parts, and the problems found."""

    files: list[str]  # the shards read, in stream order
    tensors: dict[str, TensorInfo]  # as a loader following the index reads them
    metadata_text: dict[str, str | None]  # file -> its ``__metadata__`` JSON text
    problems: list[IndexProblem]  # always empty when strict
    # every file read (the index's shards and the files beside it) -> (tensors, bytes) its
    # header holds: a key stored in two files counts in each
    held: dict[str, tuple[int, int]] = {}  # noqa: RUF012 (a NamedTuple default, never mutated)


class _Headers(NamedTuple):
    """The headers read: by shard name, with each file's metadata text, the shards that are
    not there (lenient only), and the problems met reading them."""

    by_shard: dict[str, dict[str, TensorInfo]]
    metadata_text: dict[str, str | None]
    missing: set[str]
    problems: list[IndexProblem]


def read_layout(
    layout: Layout,
    read_header: ReadHeader,
    *,
    strict: bool = True,
    strict_index: bool = False,
    exists: Callable[[str], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Merged:
    """Read every shard of ``layout`` with ``read_header`` and merge them.

    Args:
        layout: the shards and the index, as ``loadkit.checkpoint.shards.local_layout`` (or a
            remote index) gives them.
        read_header: a file's header (``loadkit.checkpoint.reader.read_safetensors_header`` for
            a path); it raises a ``CheckpointError`` naming the file.
        strict: raise at the first problem that stops a loader (the reading's own error, a
            ``DuplicateKeyError`` for a key stored twice with two shapes), as
            ``open_checkpoint`` does; else collect them all.
        strict_index: with ``strict``, also raise at the first inconsistency (a key stored
            twice, a ``ShardIndexError`` for a key its shard does not hold).
        exists: leniently, whether a shard's file is there (one that is not is a ``missing
            shard``, never read); ``None``: every file is read.
        progress: called with (shards read, shards in all) before each shard and at the end.

    Example:
        >>> from loadkit.checkpoint.reader import read_safetensors_header
        >>> from loadkit.checkpoint.shards import local_layout
        >>> merged = read_layout(local_layout("data/plamo2/tied-with-lm-head"),
        ...                      read_safetensors_header)
        >>> len(merged.files), merged.tensors["lm_head.weight"].shape, merged.problems
        (2, (48, 16), [])
    """
    headers = _read_headers(layout, read_header, strict, strict_index, exists, progress)
    problems = headers.problems
    readable = [s for s in layout.shards if s in headers.by_shard]
    if not readable and layout.shards:  # {"weight_map": {}}: an empty checkpoint
        raise ShardIndexError(layout.path, _nothing_readable(layout, headers))
    first, several = _locate(headers.by_shard)
    as_indexed = layout.index is not None and layout.weight_map == first
    if layout.index is not None and not as_indexed:
        found = _index_vs_shards(layout, headers, first, several)
        if strict and strict_index and found:
            raise _strict_error(layout, found[0])
        problems += found
    tensors = _merge(layout, headers.by_shard, readable, several, as_indexed, problems)
    files = [layout.shards[s] for s in readable]
    held = _held(layout, headers.by_shard)
    if strict:  # a key the index does not list is read, and not a problem
        return Merged(files, tensors, headers.metadata_text, [], held)
    problems += _listed_twice(layout)
    problems += _copies(layout, headers.by_shard, readable, first, several)
    problems += _total_size(layout, headers.by_shard, tensors, several)
    problems += _unindexed(layout, headers.by_shard)
    return Merged(files, tensors, headers.metadata_text, problems, held)


def _held(layout: Layout, headers: dict[str, dict[str, TensorInfo]]) -> dict[str, tuple[int, int]]:
    """Each file read -> (tensors, bytes) of its own header, in reading order."""
    files = {**layout.shards, **layout.others}
    return {
        files[shard]: (len(infos), sum(map(_NBYTES, infos.values())))
        for shard, infos in headers.items()
    }


def _read_headers(
    layout: Layout,
    read_header: ReadHeader,
    strict: bool,
    strict_index: bool,
    exists: Callable[[str], bool] | None,
    progress: Callable[[int, int], None] | None,
) -> _Headers:
    """Each shard's header, in reading order. Strictly, an error raises and a key met twice
    with two shapes (with ``strict_index``, at all) is a ``DuplicateKeyError`` at once;
    leniently, an unreadable shard is a problem."""
    read = _Headers({}, {}, set(), [])
    held: dict[str, TensorInfo] = {}  # strictly: every key read so far
    shards = [*layout.shards.items(), *layout.others.items()]
    for done, (shard, file) in enumerate(shards):
        if progress is not None:
            progress(done, len(shards))
        if exists is not None and not exists(file):
            read.missing.add(shard)  # reported with its keys by _index_vs_shards
            continue
        if strict:
            infos, read.metadata_text[file] = read_header(file)
            _refuse_twice(held, infos, file, strict_index)
            read.by_shard[shard] = infos
            continue
        try:
            read.by_shard[shard], read.metadata_text[file] = read_header(file)
        except CheckpointError as exc:
            read.problems.append(_unreadable(layout, shard, exc))
    if progress is not None:
        progress(len(shards), len(shards))
    return read


def _refuse_twice(
    held: dict[str, TensorInfo], infos: dict[str, TensorInfo], file: str, any_copy: bool
) -> None:
    """A key stored twice with two shapes (``any_copy``: at all) raises."""
    if not held.keys().isdisjoint(infos):
        for name, info in infos.items():
            if name in held and (any_copy or held[name].shape != info.shape):
                raise DuplicateKeyError(
                    file,
                    f"also stored in {held[name].file} (shapes {list(held[name].shape)} "
                    f"and {list(info.shape)})",
                    name,
                )
    held.update(infos)


def _unreadable(layout: Layout, shard: str, exc: CheckpointError) -> IndexProblem:
    lost = [k for k, s in layout.weight_map.items() if s == shard]
    what = f" ({len(lost)} indexed keys lost: {', '.join(lost[:3])}" if lost else ""
    what += ", ...)" if len(lost) > 3 else (")" if lost else "")
    # an unindexed one is never read by a loader: a note
    severity = "fails" if shard in layout.shards else "note"
    return IndexProblem("unreadable shard", None, f"{exc}{what}", (shard,), severity, shard)


def _strict_error(layout: Layout, problem: IndexProblem) -> ShardIndexError:
    """``open_checkpoint``'s error for the first key the index places wrongly."""
    file = layout.shards[problem.listed or ""]
    where = layout.shards[problem.found_in[0]] if problem.found_in else "no shard"
    return ShardIndexError(
        str(layout.index),
        f"says shard '{os.path.basename(file)}' holds it, but {where} does ({file} does not)",
        problem.key,
    )


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


def _where(files: list[str]) -> str:
    if not files:
        return "no shard holds it"
    return "it is in " + " and ".join(files)


def _index_vs_shards(
    layout: Layout,
    headers: _Headers,
    first: dict[str, str],
    several: dict[str, list[str]],
) -> list[IndexProblem]:
    """Index entries whose shard is missing, or does not hold the key."""
    problems = []
    read = headers.by_shard  # what a loader reads

    def located(key: str) -> list[str]:
        return several.get(key) or ([first[key]] if key in first else [])

    for key, shard in layout.weight_map.items():
        if shard in headers.missing:  # vLLM raises for it (FileNotFoundError), whatever holds it
            where = located(key)
            msg = f"the index names shard '{shard}', which does not exist; {_where(where)}"
            problems.append(IndexProblem("missing shard", key, msg, tuple(where), "fails", shard))
        elif shard in read and key not in read[shard]:
            problems.append(_misplaced(layout, key, shard, located(key)))
    return problems


def _misplaced(layout: Layout, key: str, shard: str, where: list[str]) -> IndexProblem:
    """A key the index places in a shard that does not hold it. Loaders read each listed
    shard's own tensors, never the index's key list (vLLM 0.28.0 and 0.34.0: the index only
    filters files, ``filter_duplicate_safetensors_files``; transformers likewise): where no
    listed shard holds the key, nothing reads it, and a model tensor of that name is left
    missing (the dry load reports it); neither stops the load."""
    said = f"the index says shard '{shard}' holds it"
    if not where:  # a key the index lists and no file holds
        msg = f"{said}, but no shard does: there is no such tensor to read"
        return IndexProblem("in no shard", key, msg, (), listed=shard)
    msg = f"{said}, but {_where(where)}"
    if not any(s in layout.shards for s in where):
        msg += ", which loaders never read (the index does not name it): the key is not read"
    else:
        msg += ", where loaders read it"
    return IndexProblem("wrong shard", key, msg, tuple(where), listed=shard)


def _merge(
    layout: Layout,
    headers: dict[str, dict[str, TensorInfo]],
    readable: list[str],
    several: dict[str, list[str]],
    as_indexed: bool,
    problems: list[IndexProblem],
) -> dict[str, TensorInfo]:
    """The tensors a loader following the index reads: every readable indexed shard's, in
    stream order (shards in reading order, each header's tensors in data order), a key stored
    twice in the place of its last copy; a key the index does not list is a problem."""
    tensors: dict[str, TensorInfo] = {}
    weight_map = layout.weight_map
    has_index = layout.index is not None
    for shard in readable:
        infos = headers[shard]
        if not several and (not has_index or as_indexed or infos.keys() <= weight_map.keys()):
            tensors.update(infos)  # nearly every shard: each key listed, and held only here
            continue
        for name, info in infos.items():
            first_copy = tensors.pop(name, None) is None
            # A later copy replaces it, in its own place in the stream (reported by _copies,
            # once per key): loaders read the shards in order and every copy, so the last one
            # is what stays loaded.
            tensors[name] = info
            if first_copy and has_index and name not in weight_map:
                msg = f"shard '{shard}' holds it, but the index does not list it"
                problems.append(IndexProblem("not in index", name, msg, (shard,), listed=None))
    return tensors


def _listed_twice(layout: Layout) -> list[IndexProblem]:
    """Each key the index's ``weight_map`` names more than once: JSON keeps the last entry, and
    so do both loaders (each parses the index with Python's json)."""
    problems = []
    for key, entries in layout.listed_twice.items():
        shown = ", then ".join(json.dumps(e) for e in entries)
        message = (
            f"the index lists it {len(entries)} times ({shown}); its JSON keeps the last, as both "
            "loaders read it (a shard only an earlier entry names is not read)"
        )
        listed = layout.weight_map.get(key)
        problems.append(IndexProblem("listed twice", key, message, listed=listed))
    return problems


def _copies(
    layout: Layout,
    headers: dict[str, dict[str, TensorInfo]],
    readable: list[str],
    first: dict[str, str],
    several: dict[str, list[str]],
) -> list[IndexProblem]:
    """Each key stored in two readable shards, once."""
    problems = []
    for name in [n for n in first if n in several] if several else []:
        read = [s for s in several[name] if s in readable]
        if len(read) < 2:
            continue
        shapes = {str(list(headers[s][name].shape)) for s in read}
        listed = layout.weight_map.get(name)
        said = f"; the index says '{listed}'" if listed is not None else ""
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
                listed,
            )
        )
    return problems


_NBYTES = attrgetter("nbytes")


def _total_size(
    layout: Layout,
    headers: dict[str, dict[str, TensorInfo]],
    tensors: dict[str, TensorInfo],
    several: dict[str, list[str]],
) -> list[IndexProblem]:
    """The index's ``total_size`` against the tensors' bytes, each tensor counted once, as
    ``save_pretrained`` counts it: a key stored twice by the copy in the shard the index names
    for it (the copy kept may be another)."""
    total = layout.total_size
    if not isinstance(total, int) or isinstance(total, bool):
        return []
    stored = sum(map(_NBYTES, tensors.values()))
    for name, shards in several.items():
        listed = layout.weight_map.get(name)
        if name in tensors and listed in shards and listed in headers:
            stored += headers[listed][name].nbytes - tensors[name].nbytes
    if total == stored:
        return []
    lost = sorted(s for s in layout.shards if s not in headers)  # missing or unreadable
    why = ""
    if lost:  # their bytes cannot be counted: a consequence, said under them, not a problem
        quoted = " and ".join(f"'{s}'" for s in lost)
        why = (
            f"; expected while {quoted} cannot be read (its bytes are not counted): "
            "a consequence of the problem above, not one of its own"
        )
    message = (
        f"the index's metadata.total_size is {total} bytes, but the shards hold "
        f"{stored} bytes of tensors ({len(tensors)} tensors){why}"
    )
    return [IndexProblem("total_size", None, message, severity="note" if lost else "inconsistent")]


def _unindexed(layout: Layout, headers: dict[str, dict[str, TensorInfo]]) -> list[IndexProblem]:
    """A note for each ``*.safetensors`` file beside the index that it does not name (one that
    cannot be read has its own note, and no loader reads it)."""
    problems = []
    for shard in [s for s in layout.others if s in headers]:
        n = len(headers[shard])
        who = "loaders never read it"
        if fnmatch.fnmatch(os.path.basename(shard), "consolidated*.safetensors"):
            who = (
                "transformers never reads it, but vLLM does, and not the index's shards (a "
                "consolidated*.safetensors file selects its Mistral format)"
            )
        elif shard == SINGLE_FILE:
            who = (
                "vLLM never reads it (it reads the files the index names), but transformers' "
                "from_pretrained reads it instead of the index and its shards"
            )
        message = f"'{shard}' ({n} tensors) is not named by the index: {who}"
        problems.append(IndexProblem("unindexed shard", None, message, (shard,), "note"))
    return problems


def _nothing_readable(layout: Layout, headers: _Headers) -> str:
    """Why a layout gives nothing to inspect, with each shard's reason (the first few)."""
    unreadable = {pr.listed: pr.message for pr in headers.problems if pr.kind == "unreadable shard"}
    reasons = []
    for shard, file in layout.shards.items():
        why = unreadable.get(shard, ": it does not exist")
        path = printable(file)
        if why.startswith(path):  # the error names the file: named once, inside the folder
            why = why[len(path) :]
        reasons.append(printable(shard) + (why if why[:2] in (": ", ", ") else f": {why}"))
    shown = "; ".join(reasons[:SHOWN_REASONS])
    if len(reasons) > SHOWN_REASONS:
        shown += f"; and {len(reasons) - SHOWN_REASONS} more"
    n = len(layout.shards)
    if layout.index is not None:
        what = (
            f"none of the {n} shards the index names" if n > 1 else "the one shard the index names"
        )
    else:
        what = f"none of its {n} .safetensors files" if n > 1 else "its one .safetensors file"
    return f"{what} can{'' if n > 1 else 'not'} be read; nothing to inspect: {shown}"
