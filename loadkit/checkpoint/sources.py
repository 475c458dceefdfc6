"""What a checkpoint argument names, opened: a path, a Hugging Face repo id, or a URL.

In this order: a path that exists always wins (a ``models--org--name`` folder of a hub cache
stands for that repo); then an ``http://`` or ``https://`` URL, read header-only
(``loadkit.checkpoint.remote``); then ``org/name`` or ``org/name@revision``, resolved offline
from the Hugging Face cache (``loadkit.checkpoint.hub``); anything else is a path that does not
exist. A folder is read leniently (``loadkit.checkpoint.index``: every index problem collected),
a file strictly.

>>> ck, problems, source = open_source("data/plamo2/tied-with-lm-head")
>>> source.kind, len(ck.files), problems
('path', 2, [])
"""

from __future__ import annotations

import os

from loadkit.checkpoint.hub import Snapshot, parse_repo_id, repo_folder, resolve_snapshot
from loadkit.checkpoint.index import IndexProblem, open_lenient
from loadkit.checkpoint.reader import Checkpoint, open_checkpoint
from loadkit.checkpoint.record import Record
from loadkit.checkpoint.remote import (
    DEFAULT_TIMEOUT,
    Fetched,
    RemoteCheckpoint,
    is_url,
    open_remote,
)
from loadkit.errors import CheckpointError

__all__ = ["Source", "open_source"]


class Source(Record):
    """What the checkpoint argument named: ``kind`` is ``path``, ``hub`` (with the resolved
    ``snapshot``) or ``url`` (with what reading its headers ``fetched``)."""

    kind: str
    name: str  # as given
    snapshot: Snapshot | None = None
    fetched: Fetched | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "name": self.name,
            "hub": self.snapshot.as_dict() if self.snapshot else None,
            "fetched": self.fetched.as_dict() if self.fetched else None,
        }


def _open_path(path: str) -> tuple[Checkpoint, list[IndexProblem]]:
    if os.path.isdir(path):  # every index problem collected; the rest still read
        return open_lenient(path)
    return open_checkpoint(path), []


def _open_snapshot(name: str, snapshot: Snapshot) -> tuple[Checkpoint, list[IndexProblem]]:
    try:
        return _open_path(snapshot.folder)
    except CheckpointError as exc:
        if not snapshot.lacks:
            raise
        raise CheckpointError(
            name,
            f"the cached snapshot (commit {snapshot.commit}) is incomplete, it lacks "
            f"{', '.join(snapshot.lacks)}: {exc}",
        ) from None


def open_source(
    name: str | os.PathLike[str],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[Checkpoint, list[IndexProblem], Source]:
    """Open what ``name`` names: ``(checkpoint, index problems, source)``.

    Args:
        name: a ``.safetensors`` file, a folder (of shards, with an index, or a hub cache's
            ``models--org--name``), ``org/name[@revision]`` in the local Hugging Face cache, or
            an ``http(s)://`` URL of a ``.safetensors`` file or an index.
        timeout: seconds each request to a remote checkpoint may take.
        cache_dir: the Hugging Face cache for a repo id; ``None``: huggingface_hub's own
            (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``).

    Returns:
        The checkpoint (``RemoteCheckpoint`` for a URL), the problems of a folder's index, and
        the ``Source``. Bad input raises a ``loadkit.errors.CheckpointError`` naming it.
    """
    text = os.fspath(name)
    if os.path.lexists(text):
        found = repo_folder(text)
        if found is None:
            ck, problems = _open_path(text)
            return ck, problems, Source("path", text)
        snapshot = resolve_snapshot(found[0], cache_dir=found[1])
    elif is_url(text):
        remote: RemoteCheckpoint = open_remote(text, timeout=timeout)
        return remote, [], Source("url", text, fetched=remote.fetched)
    else:
        parsed = parse_repo_id(text)
        if parsed is None:
            ck, problems = _open_path(text)  # raises: no such file or folder
            return ck, problems, Source("path", text)
        snapshot = resolve_snapshot(*parsed, cache_dir=cache_dir)
    ck, problems = _open_snapshot(text, snapshot)
    return ck, problems, Source("hub", text, snapshot=snapshot)
