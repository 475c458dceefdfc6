"""What a checkpoint argument names, opened: a path, a Hugging Face repo id, or a URL.

In this order: a path that exists always wins (a ``models--org--name`` folder of a hub cache
stands for that repo); then an ``http://`` or ``https://`` URL, read header-only
(``loadkit_inspect.sources.remote``); then ``org/name`` or ``org/name@revision``, resolved offline
from the Hugging Face cache (``loadkit_inspect.sources.hub``); anything else is a path that does
not exist. A folder is read leniently (``loadkit_inspect.sources.index``: every index problem
collected), a file strictly.

>>> ck, problems, source = open_source("data/plamo2/tied-with-lm-head")
>>> source.kind, len(ck.files), problems
('path', 2, [])
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from loadkit.checkpoint import Checkpoint, IndexProblem, open_checkpoint
from loadkit.errors import CheckpointError, printable
from loadkit.fmt import format_bytes
from loadkit_inspect.sources.index import open_lenient

if TYPE_CHECKING:
    from loadkit_inspect.sources.hub import Snapshot
    from loadkit_inspect.sources.remote import Fetched

# loadkit_inspect.sources.remote is imported for a URL only (urllib.request and http.client cost a
# plain `inspect PATH` more than parsing its headers), loadkit_inspect.sources.hub for what may be a
# repo id or a cache's repo folder.

__all__ = ["Source", "is_url", "open_source"]


def is_url(text: str) -> bool:
    """Does ``text`` name a remote checkpoint (``http://`` or ``https://``)?"""
    return text[:8].lower().startswith(("http://", "https://"))


class Source(NamedTuple):
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

    def render(self) -> list[str]:
        """The report's lines saying what a repo id resolved to, or what reading a URL's headers
        cost (none for a path)."""
        if self.kind == "path":
            return []
        if self.snapshot is not None:
            return _snapshot_lines(self.snapshot)
        f = self.fetched
        assert f is not None
        share = f" ({100 * f.bytes / f.size:.3g}%)" if f.size else ""
        return [
            f"  header-only over HTTP: {f.requests} requests, {f.bytes} bytes fetched "
            f"({format_bytes(f.bytes)}) of {format_bytes(f.size)}{share}"
        ]


def _snapshot_lines(s: Snapshot) -> list[str]:
    lines = [f"  from the Hugging Face cache: {printable(s.repo_id)}, commit {printable(s.commit)}"]
    if s.revision != s.commit:  # a branch, a tag or a short hash: which commit it named
        lines = [
            f"  from the Hugging Face cache: {printable(s.repo_id)}, "
            f"revision {printable(s.revision)}",
            f"    commit {printable(s.commit)}",
        ]
    if s.note:
        lines.append(f"    ({printable(s.note)})")
    if s.lacks:
        lacks = ", ".join(printable(n) for n in s.lacks)
        lines.append(f"    the snapshot lacks {lacks} (an incomplete download)")
    return lines


def _open_path(
    path: str, progress: Callable[[int, int], None] | None
) -> tuple[Checkpoint, list[IndexProblem]]:
    if os.path.isdir(path):  # every index problem collected; the rest still read
        return open_lenient(path, progress=progress)
    return open_checkpoint(path, progress=progress), []


def _open_snapshot(
    name: str, snapshot: Snapshot, progress: Callable[[int, int], None] | None
) -> tuple[Checkpoint, list[IndexProblem]]:
    """The snapshot's checkpoint; each weight file the hub lists and the cache lacks is a
    ``not downloaded`` problem (a loader reading the snapshot would lack it too)."""
    try:
        ck, problems = _open_path(snapshot.folder, progress)
    except CheckpointError as exc:
        if not snapshot.lacks:
            raise
        raise CheckpointError(
            name,
            f"the cached snapshot (commit {snapshot.commit}) is incomplete, it lacks "
            f"{', '.join(snapshot.lacks)}: {exc}",
        ) from None
    for file in snapshot.lacks:
        if file.endswith((".safetensors", ".safetensors.index.json")):
            message = (
                f"the hub lists '{file}' for commit {snapshot.commit}, but the cached snapshot "
                "lacks it (an interrupted download?)"
            )
            problems.append(IndexProblem("not downloaded", None, message, severity="fails"))
    return ck, problems


def open_source(
    name: str | os.PathLike[str],
    *,
    timeout: float | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[Checkpoint, list[IndexProblem], Source]:
    """Open what ``name`` names: ``(checkpoint, index problems, source)``.

    Args:
        name: a ``.safetensors`` file, a folder (of shards, with an index, or a hub cache's
            ``models--org--name``), ``org/name[@revision]`` in the local Hugging Face cache, or
            an ``http(s)://`` URL of a ``.safetensors`` file or an index.
        timeout: seconds each request to a remote checkpoint may take (``None``:
            ``loadkit_inspect.sources.remote.DEFAULT_TIMEOUT``).
        cache_dir: the Hugging Face cache for a repo id; ``None``: huggingface_hub's own
            (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``).

    Returns:
        The checkpoint (``RemoteCheckpoint`` for a URL), the problems of a folder's index, and
        the ``Source``. Bad input raises a ``loadkit.errors.CheckpointError`` naming it.
    """
    text = os.fspath(name)
    if os.path.lexists(text):
        if not os.path.isdir(os.path.join(text, "snapshots")):  # not a cache's repo folder
            ck, problems = _open_path(text, progress)
            return ck, problems, Source("path", text)
        from loadkit_inspect.sources.hub import repo_folder, resolve_snapshot

        found = repo_folder(text)
        if found is None:
            ck, problems = _open_path(text, progress)
            return ck, problems, Source("path", text)
        snapshot = resolve_snapshot(found[0], cache_dir=found[1])
    elif is_url(text):
        from loadkit_inspect.sources.remote import DEFAULT_TIMEOUT, open_remote

        wait = DEFAULT_TIMEOUT if timeout is None else timeout
        remote = open_remote(text, timeout=wait, progress=progress)
        return remote, [], Source("url", text, fetched=remote.fetched)
    else:
        from loadkit_inspect.sources.hub import parse_repo_id, resolve_snapshot

        parsed = parse_repo_id(text)
        if parsed is None:
            ck, problems = _open_path(text, progress)  # raises: no such file or folder
            return ck, problems, Source("path", text)
        snapshot = resolve_snapshot(*parsed, cache_dir=cache_dir)
    ck, problems = _open_snapshot(text, snapshot, progress)
    return ck, problems, Source("hub", text, snapshot=snapshot)
