"""A sharded checkpoint read as far as it can be: every index problem collected, none raised.

``open_checkpoint`` raises at the first inconsistency (SPEC 9). A debugging tool needs all of
them, each with where the key really is, and whatever can still be read: ``open_lenient`` reads
every shard it can (the index's and, to find misplaced keys, any other ``*.safetensors`` in the
folder), keeps the tensors a loader following the index would read, and lists:

- ``missing shard``: the index names a shard that is not there (its keys: wherever they are);
- ``wrong shard``: the index says a shard holds a key that it does not (the key is elsewhere);
- ``not in index``: a shard holds a key the index does not list;
- ``in two shards``: one key stored twice (a loader reads both; the later copy wins);
- ``total_size``: the index's ``metadata.total_size`` is not the shards' tensor bytes;
- ``unreadable shard``: a shard whose header cannot be read (its keys are lost);
- ``unindexed shard``: a ``*.safetensors`` file the index does not name (a note, not a failure:
  loaders following the index never read it, and repositories often ship one).

A folder without an index is read the same way (every ``*.safetensors`` is a shard): a key in two
shards and an unreadable shard are collected too. Only when no shard can be read at all does it
raise. Torch-free.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple

from loadkit.checkpoint.reader import INDEX_NAME, Checkpoint, TensorInfo, read_safetensors_header
from loadkit.errors import CheckpointError, ShardIndexError


class IndexProblem(NamedTuple):
    """One inconsistency between an index and its shards."""

    kind: str  # missing shard, wrong shard, not in index, in two shards, total_size, ...
    key: str | None
    message: str  # says where the key really is
    found_in: tuple[str, ...] = ()  # the shards (file names) that hold the key

    @property
    def fails(self) -> bool:
        """Does it make the checkpoint inconsistent (all but the ``unindexed shard`` note)?"""
        return self.kind != "unindexed shard"

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "key": self.key,
            "message": self.message,
            "found_in": list(self.found_in),
            "fails": self.fails,
        }


def _where(files: list[str]) -> str:
    if not files:
        return "no shard holds it"
    return "it is in " + " and ".join(files)


def _read_index(folder: Path) -> tuple[dict[str, str], Any]:
    index = folder / INDEX_NAME
    try:
        data = json.loads(index.read_text())
        weight_map = data["weight_map"]
        if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
        ):
            raise TypeError("weight_map is not an object of key -> shard file name")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        why = f"unreadable index ({type(exc).__name__}: {exc})"
        raise ShardIndexError(str(index), why) from None
    metadata = data.get("metadata") if isinstance(data, dict) else None
    total = metadata.get("total_size") if isinstance(metadata, dict) else None
    return weight_map, total


def open_lenient(folder: str | os.PathLike[str]) -> tuple[Checkpoint, list[IndexProblem]]:
    """Open a folder of shards (with or without an index), collecting every problem.

    Returns the checkpoint as a loader following the index would read it, and the problems.

    Example:
        >>> ck, problems = open_lenient("data/plamo2/tied-with-lm-head")
        >>> len(ck.tensors) > 0, problems
        (True, [])
    """
    p = Path(folder)
    on_disk = sorted(f.name for f in p.glob("*.safetensors"))
    has_index = (p / INDEX_NAME).exists()
    if has_index:
        weight_map, total_size = _read_index(p)
        indexed = sorted(set(weight_map.values()))
    else:
        weight_map, total_size, indexed = {}, None, on_disk
    others = [f for f in on_disk if f not in set(indexed)]
    problems: list[IndexProblem] = []
    headers: dict[str, dict[str, TensorInfo]] = {}
    metadata: dict[str, dict] = {}
    for shard in [*indexed, *others]:
        path = p / shard
        if not path.is_file():
            continue  # a missing shard: reported with its keys below
        try:
            headers[shard], metadata[str(path)] = read_safetensors_header(path)
        except CheckpointError as exc:
            lost = [k for k, s in weight_map.items() if s == shard]
            what = f" ({len(lost)} indexed keys lost: {', '.join(lost[:3])}" if lost else ""
            what += ", ...)" if len(lost) > 3 else (")" if lost else "")
            problems.append(IndexProblem("unreadable shard", None, f"{exc}{what}", (shard,)))
    readable = [s for s in indexed if s in headers]
    if not readable:
        what = "no shard the index names" if has_index else "no *.safetensors file in it"
        raise ShardIndexError(str(p), f"{what} can be read; nothing to inspect")

    located: dict[str, list[str]] = {}
    for shard, infos in headers.items():
        for name in infos:
            located.setdefault(name, []).append(shard)
    problems += _index_vs_shards(p, weight_map, indexed, headers, located)

    tensors: dict[str, TensorInfo] = {}
    for shard in readable:
        for name, info in headers[shard].items():
            if name in tensors:
                continue  # a second copy: reported below, once per key
            tensors[name] = info
            if has_index and name not in weight_map:
                msg = f"shard '{shard}' holds it, but the index does not list it"
                problems.append(IndexProblem("not in index", name, msg, (shard,)))
    for name, shards in located.items():
        read = [s for s in shards if s in readable]
        if len(read) > 1:
            shapes = {str(list(headers[s][name].shape)) for s in read}
            said = f"; the index says '{weight_map[name]}'" if name in weight_map else ""
            differ = f"; shapes differ: {' and '.join(sorted(shapes))}" if len(shapes) > 1 else ""
            problems.append(
                IndexProblem(
                    "in two shards",
                    name,
                    f"stored in {' and '.join(read)}{said}{differ}: a loader reads every copy, "
                    "and the last one wins",
                    tuple(read),
                )
            )
    stored = sum(t.nbytes for t in tensors.values())
    if isinstance(total_size, int) and not isinstance(total_size, bool) and total_size != stored:
        problems.append(
            IndexProblem(
                "total_size",
                None,
                f"the index's metadata.total_size is {total_size} bytes, but the shards hold "
                f"{stored} bytes of tensors ({len(tensors)} tensors)",
            )
        )
    for shard in others:
        n = len(headers.get(shard, {}))
        problems.append(
            IndexProblem(
                "unindexed shard",
                None,
                f"'{shard}' ({n} tensors) is not named by the index: loaders never read it",
                (shard,),
            )
        )
    files = [str(p / s) for s in readable]
    return Checkpoint(str(p), files, _in_stream_order(tensors, files), metadata), problems


def _index_vs_shards(
    p: Path,
    weight_map: dict[str, str],
    indexed: list[str],
    headers: dict[str, dict[str, TensorInfo]],
    located: dict[str, list[str]],
) -> list[IndexProblem]:
    """Index entries whose shard is missing, or does not hold the key."""
    problems = []
    exists = {shard: (p / shard).is_file() for shard in indexed}  # one stat per shard
    for key, shard in weight_map.items():
        if not exists[shard]:
            where = located.get(key, [])
            msg = f"the index names shard '{shard}', which does not exist; {_where(where)}"
            problems.append(IndexProblem("missing shard", key, msg, tuple(where)))
        elif shard in headers and key not in headers[shard]:
            where = located.get(key, [])
            msg = f"the index says shard '{shard}' holds it, but {_where(where)}"
            problems.append(IndexProblem("wrong shard", key, msg, tuple(where)))
    return problems


def _in_stream_order(tensors: dict[str, TensorInfo], files: list[str]) -> dict[str, TensorInfo]:
    """Shards in file-name order, tensors in data order: as ``Checkpoint.weights()`` yields."""
    rank = {f: i for i, f in enumerate(files)}
    ordered = sorted(tensors.values(), key=lambda t: (rank[t.file], t.offset))
    return {t.name: t for t in ordered}
