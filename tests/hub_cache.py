"""A Hugging Face hub cache laid out as huggingface_hub writes it, in a temp folder.

``hf_hub_download`` stores a repo as ``<cache>/models--org--name/``: the bytes once under
``blobs/<hash>``, each revision's files under ``snapshots/<commit>/<path>`` as *relative* symlinks
to the blob (``../../blobs/<hash>``, one ``../`` more per sub-folder; ``_create_symlink``), or as
copies where links are not supported; ``refs/<branch or tag>`` holds the commit hash (no newline);
since huggingface_hub 1.x ``snapshot_download`` also caches the revision's file listing in
``trees/<commit>.json`` (``_tree_cache``), which is how it knows a snapshot is incomplete. The
tests check that huggingface_hub itself reads these folders (``snapshot_download`` offline,
``try_to_load_from_cache``, ``scan_cache_dir``) and transformers too (``AutoConfig`` offline).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path


def commit_hash(seed: str) -> str:
    """A 40-hex commit id, as the hub's (a git SHA-1)."""
    return hashlib.sha1(seed.encode()).hexdigest()


def repo_dir(cache: Path, repo_id: str) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def add_snapshot(
    cache: Path,
    repo_id: str,
    files: dict[str, Path],
    *,
    commit: str,
    refs: tuple[str, ...] = ("main",),
    link: bool = True,
    listing: bool = True,
    missing: tuple[str, ...] = (),
) -> Path:
    """Add one revision of ``repo_id``: ``files`` (repo path -> local file to take the bytes
    from), linked to blobs (``link``) or copied; ``refs`` pointing at ``commit``; with
    ``listing`` its ``trees/<commit>.json``, which also names the ``missing`` files (listed by
    the hub but never downloaded). Returns the snapshot folder."""
    repo = repo_dir(cache, repo_id)
    snapshot = repo / "snapshots" / commit
    entries = {}
    for path, source in files.items():
        data = Path(source).read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        entries[path] = {"size": len(data), "blob_id": digest}
        target = snapshot / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if link:
            blob = repo / "blobs" / digest
            blob.parent.mkdir(parents=True, exist_ok=True)
            if not blob.exists():
                shutil.copyfile(source, blob)
            target.symlink_to(os.path.relpath(blob, target.parent))
        else:
            shutil.copyfile(source, target)
    for path in missing:
        entries[path] = {"size": 1, "blob_id": hashlib.sha256(path.encode()).hexdigest()}
    snapshot.mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    if listing:
        (repo / "trees").mkdir(parents=True, exist_ok=True)
        tree = {"format_version": 1, "files": dict(sorted(entries.items()))}
        (repo / "trees" / f"{commit}.json").write_text(json.dumps(tree, indent=1))
    return snapshot


def folder_files(folder: Path) -> dict[str, Path]:
    """Every file of a checkpoint folder, by its name (the repo's paths)."""
    return {p.name: p for p in sorted(Path(folder).iterdir()) if p.is_file()}
