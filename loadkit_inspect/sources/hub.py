"""A Hugging Face repo id (``org/name`` or ``org/name@revision``) resolved offline from the cache.

huggingface_hub does the resolving, exactly as ``from_pretrained`` offline does:
``snapshot_download(repo_id, revision=..., local_files_only=True, allow_patterns=...)`` reads
``refs/<revision>`` for the commit and returns ``snapshots/<commit>``; it never touches the
network. The cache is the one huggingface_hub uses (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
``~/.cache/huggingface/hub``). Beyond what it does:

- a snapshot that its cached tree listing shows to be partial (``IncompleteSnapshotError``) is
  still returned, with the files it lacks (``Snapshot.lacks``): the report says what is missing;
- a cache without ``refs/<revision>`` (copied by hand, or pruned) falls back to the revisions it
  holds (as ``scan_cache_dir`` lists them): one is taken and the report says so; several are
  listed, to name one as ``org/name@<commit>``;
- a ``models--org--name`` folder stands for that repo in the cache it lies in.

huggingface_hub is imported only here, and only when a repo id is asked for; without it a repo
id is one clear error saying what to install.

>>> parse_repo_id("sentence-transformers/all-MiniLM-L6-v2@main")
('sentence-transformers/all-MiniLM-L6-v2', 'main')
>>> parse_repo_id("data/plamo2/untied.safetensors") is None  # three parts: a path
True
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, NamedTuple

from loadkit.errors import CheckpointError
from loadkit.fmt import plural

if TYPE_CHECKING:
    from types import ModuleType

__all__ = ["PATTERNS", "Snapshot", "parse_repo_id", "repo_folder", "resolve_snapshot"]

# What loadkit reads of a snapshot: the weights' headers, the index, and --model hf's config.
PATTERNS = ["*.safetensors", "*.safetensors.index.json", "config.json"]
_REPO_ID = re.compile(r"([\w.-]+/[\w.-]+)(?:@(\S+))?")
_REPO_FOLDER = "models--"  # huggingface_hub's prefix of a model repo's folder in its cache
INSTALL_HINT = "pip install 'loadkit[hf]', or huggingface_hub alone"


class Snapshot(NamedTuple):
    """A cached snapshot: what was asked for, what it resolved to, and what it lacks."""

    repo_id: str
    revision: str  # as asked for (``main`` by default), or how the fallback found it
    commit: str
    folder: str  # ``<cache>/models--org--name/snapshots/<commit>``
    cache: str  # the hub cache it was found in
    lacks: tuple[str, ...] = ()  # files of the cached tree listing missing from the folder
    note: str | None = None  # how the revision was found, when not through refs/

    def as_dict(self) -> dict[str, object]:
        return {
            "repo_id": self.repo_id,
            "revision": self.revision,
            "commit": self.commit,
            "folder": self.folder,
            "cache": self.cache,
            "lacks": list(self.lacks),
            "note": self.note,
        }


def parse_repo_id(text: str) -> tuple[str, str | None] | None:
    """``(repo_id, revision or None)`` when ``text`` has the form ``org/name[@revision]``."""
    m = _REPO_ID.fullmatch(text)
    return (m.group(1), m.group(2)) if m else None


def _hub(text: str) -> ModuleType:
    try:
        import huggingface_hub
    except ImportError:
        raise CheckpointError(
            text,
            "no such file or folder; to read it as a Hugging Face repo id from the local "
            f"cache, loadkit needs huggingface_hub ({INSTALL_HINT})",
        ) from None
    return huggingface_hub


def repo_folder(path: str) -> tuple[str, str] | None:
    """``(repo_id, cache)`` when ``path`` is a ``models--org--name`` folder of a hub cache."""
    name = os.path.basename(os.path.normpath(path))
    if not name.startswith(_REPO_FOLDER) or not os.path.isdir(os.path.join(path, "snapshots")):
        return None
    repo_id = name[len(_REPO_FOLDER) :].replace("--", "/")
    return repo_id, os.path.dirname(os.path.abspath(path))


def resolve_snapshot(
    repo_id: str, revision: str | None = None, *, cache_dir: str | os.PathLike[str] | None = None
) -> Snapshot:
    """The cached snapshot of ``repo_id`` at ``revision`` (``main`` when ``None``), offline.

    Args:
        repo_id: ``org/name``.
        revision: a branch, tag or commit hash, as ``from_pretrained`` takes it.
        cache_dir: the hub cache; ``None``: huggingface_hub's (``HF_HUB_CACHE``, ``HF_HOME``).

    Returns:
        A ``Snapshot``. A repo or revision not in the cache raises a ``CheckpointError`` that
        says where it looked (and which revisions the cache holds).

    Example (a cache laid out as huggingface_hub writes it, as the tests build one):
        >>> s = resolve_snapshot("org/tiny", cache_dir="cache")  # doctest: +SKIP
        >>> s.revision, s.commit[:7], os.path.basename(s.folder) == s.commit  # doctest: +SKIP
        ('main', '1f0e3a2', True)
    """
    shown = repo_id + (f"@{revision}" if revision else "")
    hub = _hub(shown)
    from huggingface_hub import errors
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
    from huggingface_hub.file_download import repo_folder_name

    # huggingface_hub 1.22 and later tell a partial snapshot (from the revision's cached file
    # listing); before, snapshot_download returns it as it is, and only its index can tell.
    incomplete = getattr(errors, "IncompleteSnapshotError", None)

    cache = os.fspath(cache_dir) if cache_dir is not None else str(hub.constants.HF_HUB_CACHE)
    try:
        storage = os.path.join(cache, repo_folder_name(repo_id=repo_id, repo_type="model"))
        if not os.path.isdir(storage):
            raise CheckpointError(
                shown,
                f"no such file or folder, and no such repo in the Hugging Face cache (looked for "
                f"{os.path.basename(storage)} in {cache}; set HF_HUB_CACHE or HF_HOME for "
                "another cache)",
            )
        asked = revision or "main"
        note = None
        try:
            folder = hub.snapshot_download(
                repo_id,
                revision=asked,
                cache_dir=cache,
                local_files_only=True,
                allow_patterns=PATTERNS,
            )
        except LocalEntryNotFoundError as exc:
            if incomplete is not None and isinstance(exc, incomplete):
                folder = exc.snapshot_path
            else:
                folder, note = _fallback(hub, shown, repo_id, asked, revision, storage)
    except HFValidationError as exc:
        raise CheckpointError(
            shown, f"no such file or folder (nor a repo id huggingface_hub accepts: {exc})"
        ) from None
    folder = str(folder)
    commit = os.path.basename(folder)
    lacks = _lacking(hub, repo_id, commit, folder, cache)
    return Snapshot(repo_id, asked, commit, folder, cache, lacks, note)


def _fallback(
    hub: ModuleType,
    shown: str,
    repo_id: str,
    asked: str,
    revision: str | None,
    storage: str,
) -> tuple[str, str]:
    """No snapshot for ``asked`` through ``refs/``: the revisions the cache holds decide (a
    single one when none was asked for, or the one a short commit hash names)."""
    info = hub.scan_cache_dir(os.path.dirname(storage))
    held = [r for r in info.repos if r.repo_id == repo_id and r.repo_type == "model"]
    if not held:
        why = "; ".join(str(w) for w in info.warnings if storage in str(w)) or "no snapshots"
        raise CheckpointError(
            shown, f"the cached repo in {storage} cannot be read by huggingface_hub: {why}"
        )
    revisions = sorted(held[0].revisions, key=lambda r: (-r.last_modified, r.commit_hash))
    refs = {ref for r in revisions for ref in r.refs}
    # the notes say how, not which: the report prints the commit beside them
    if revision is None and "main" not in refs and len(revisions) == 1:
        return str(revisions[0].snapshot_path), "no refs/main: the only revision cached"
    short = [r for r in revisions if len(asked) >= 7 and r.commit_hash.startswith(asked.lower())]
    if len(short) == 1:
        return str(short[0].snapshot_path), "a short commit hash: the one cached commit it starts"
    hexa = re.fullmatch(r"[0-9a-f]{40}", asked) is not None
    why = "no snapshot of that commit" if hexa else f"no refs/{asked}"
    listed = ", ".join(
        r.commit_hash + (f" ({', '.join(sorted(r.refs))})" if r.refs else "") for r in revisions
    )
    holds = plural(len(revisions), "revision") + (", newest first" if len(revisions) > 1 else "")
    raise CheckpointError(
        shown,
        f"revision {asked!r} is not in the cache ({why} in {storage}); it holds "
        f"{holds}: {listed or 'none'}; name one as {repo_id}@<commit>",
    )


def _lacking(
    hub: ModuleType, repo_id: str, commit: str, folder: str, cache: str
) -> tuple[str, ...]:
    """Files of ``PATTERNS`` that the cached tree listing of ``commit`` names and the snapshot
    folder does not hold (``()`` when no listing is cached: then nothing is known to lack)."""
    from huggingface_hub.utils import filter_repo_objects

    if not hasattr(hub, "get_cached_repo_tree"):  # before huggingface_hub 1.23: no listing kept
        return ()
    from huggingface_hub.errors import CachedRepoTreeNotFoundError

    try:
        tree = hub.get_cached_repo_tree(repo_id, revision=commit, cache_dir=cache)
    except CachedRepoTreeNotFoundError:
        return ()
    wanted = filter_repo_objects([f.path for f in tree], allow_patterns=PATTERNS)
    return tuple(p for p in wanted if not os.path.isfile(os.path.join(folder, *p.split("/"))))
