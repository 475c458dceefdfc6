"""``loadkit rename SRC DST [--mapper RULES]``: a corrected copy of a checkpoint, names changed.

A loader that takes no mapper (transformers' ``from_pretrained``) can only be fixed in the files:
where a checkpoint's names differ from the model's the same way, this writes a new checkpoint
whose keys are renamed by ``WeightsMapper`` rules (the same JSON as ``--mapper``, read here as
"checkpoint key -> its new name"), every tensor's bytes copied unchanged (dtype, shape and data),
laid out as ``save_pretrained`` lays a checkpoint out: ``model.safetensors``, or one shard per
source file (``model-00001-of-00003.safetensors`` ...) and ``model.safetensors.index.json``.
Without rules it only re-lays the files out (shards copied without their index, one file named
otherwise, an index whose entries vLLM cannot match). The other files of a source folder
(``config.json``, the tokenizer's) are copied beside them.

The tensors are those vLLM reads from the source (its own choice of files, one copy of each key:
``loadkit_inspect.inspector.read_checkpoint``); a source a loader cannot read (a missing or
unreadable shard) is refused. A rule that drops a key, or two keys given one name (a stacked rule
fuses tensors), is refused: renaming changes names only. ``DST`` must not exist or be empty; the
source is changed only with ``in_place`` (and then not when it holds weight files that were not
read: they would shadow the new ones). Torch-free: bytes are copied, never parsed as tensors.

>>> import tempfile, shutil
>>> out = tempfile.mkdtemp() + "/renamed"
>>> done = rename_checkpoint("data/plamo2/untied.safetensors", out,
...                          mapper={"orig_to_new_prefix": {"model.": "backbone."}})
>>> done.files, len(done.renamed) > 0
(['model.safetensors'], True)
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from loadkit.checkpoint import INDEX_NAME, TensorInfo
from loadkit.errors import LoadkitError, printable
from loadkit.fmt import format_bytes, plural

if TYPE_CHECKING:
    from loadkit.checkpoint import Checkpoint
    from loadkit.mapper import WeightsMapper

SINGLE = "model.safetensors"
CHUNK = 1 << 24  # bytes copied per read
MAX_HEADER_BYTES = 100_000_000  # the safetensors library's limit on a header


class Renamed(NamedTuple):
    """What ``rename_checkpoint`` wrote: the files (in ``dst``), how many tensors and bytes,
    each renamed key -> its new name, and the other files copied beside them."""

    src: str
    dst: str
    files: list[str]
    tensors: int
    nbytes: int
    renamed: dict[str, str]
    copied: list[str]

    def lines(self) -> list[str]:
        """What the command prints: what was written, then how to check it."""
        shown = ", ".join(self.files[:3]) + (
            f" and {len(self.files) - 3} more" if len(self.files) > 3 else ""
        )
        return [
            f"wrote {printable(self.dst)}: {shown} ({plural(self.tensors, 'tensor')}, "
            f"{format_bytes(self.nbytes)}); {plural(len(self.renamed), 'key')} renamed, every "
            "tensor's bytes copied unchanged",
            *([f"copied {', '.join(printable(c) for c in self.copied)}"] if self.copied else []),
            f"check it: loadkit inspect {printable(self.dst)}"
            + (" --model hf" if "config.json" in self.copied else ""),
        ]

    def as_dict(self) -> dict[str, Any]:
        return {
            "src": self.src,
            "dst": self.dst,
            "files": list(self.files),
            "tensors": self.tensors,
            "bytes": self.nbytes,
            "renamed": dict(self.renamed),
            "copied": list(self.copied),
        }


def rename_checkpoint(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str] | None = None,
    *,
    mapper: WeightsMapper | Mapping[str, Any] | str | None = None,
    in_place: bool = False,
) -> Renamed:
    """Write ``src``'s tensors under new names to ``dst`` (see the module's docstring).

    Args:
        src: a ``.safetensors`` file, a folder, or a repo id in the local Hugging Face cache.
        dst: a folder that does not exist or is empty (``None`` with ``in_place``).
        mapper: ``WeightsMapper`` rules (a mapper, its JSON fields, JSON text or a JSON file's
            path): each key's new name; ``None`` keeps the names (the layout alone changes).
        in_place: replace ``src``'s weight files and index with the new ones.

    Returns:
        ``Renamed``; bad input raises a ``LoadkitError`` naming the file or key.
    """
    from loadkit_inspect.fixes.rename_fix import new_names
    from loadkit_inspect.inspector import read_checkpoint
    from loadkit_inspect.mapper_trace import parse_mapper

    read = read_checkpoint(os.fspath(src))
    _refuse_unreadable(read.summary)
    ck = read.checkpoint
    names = new_names(ck.tensors, parse_mapper(mapper) if mapper is not None else None)
    folder = ck.path if os.path.isdir(ck.path) else os.path.dirname(ck.path)
    target = _target(ck, read.summary, dst, in_place)
    staging = Path(tempfile.mkdtemp(prefix=".loadkit-rename-", dir=target))
    try:
        files = _write_shards(ck, names, staging)
        copied = [] if in_place else _copy_others(folder, target)
        if in_place:
            _replace_weights(ck, read.summary, target)
        for f in files:
            os.replace(staging / f, target / f)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    renamed = {k: v for k, v in names.items() if k != v}
    total = sum(i.nbytes for i in ck.tensors.values())
    return Renamed(os.fspath(src), str(target), files, len(names), total, renamed, copied)


def _refuse_unreadable(summary: Any) -> None:
    """A source a loader cannot read has nothing whole to rewrite."""
    if summary.failing:
        first = summary.failing[0]
        what = f"'{printable(first.key)}': " if first.key else ""
        raise LoadkitError(
            f"{printable(summary.path)}: cannot be rewritten whole: {first.kind}: {what}"
            f"{printable(first.message)}"
        )
    if summary.source is not None and summary.source.kind == "url":
        raise LoadkitError(f"{printable(summary.path)}: a URL: rename reads local files only")


def _target(
    ck: Checkpoint, summary: Any, dst: str | os.PathLike[str] | None, in_place: bool
) -> Path:
    """The folder to write into: ``dst`` (created; refused when it holds anything), or with
    ``in_place`` the source's own folder (refused when it holds weight files not read)."""
    if in_place:
        if dst is not None:
            raise LoadkitError("--in-place writes into SRC: give no DST")
        if not os.path.isdir(ck.path):
            raise LoadkitError(f"{printable(ck.path)}: --in-place rewrites a folder, not a file")
        unread = [os.path.basename(s.file) for s in summary.files if s.file not in ck.files]
        if unread:
            raise LoadkitError(
                f"{printable(ck.path)}: holds {', '.join(printable(u) for u in unread)}, "
                "which vLLM does not read and a loader may read instead of the new files: move "
                "it away, or write to a new folder (DST)"
            )
        return Path(ck.path)
    if dst is None:
        raise LoadkitError("rename needs DST (a new folder), or --in-place")
    target = Path(dst)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise LoadkitError(f"{printable(str(target))}: exists and is not an empty folder")
    target.mkdir(parents=True, exist_ok=True)
    return target


def _write_shards(ck: Checkpoint, names: dict[str, str], out: Path) -> list[str]:
    """One output file per source file that holds a kept tensor, in reading order, named as
    ``save_pretrained`` names them; the index beside several."""
    groups: dict[str, list[TensorInfo]] = {}
    for info in ck.tensors.values():
        groups.setdefault(info.file, []).append(info)
    sources = [f for f in ck.files if f in groups]
    n = len(sources)
    shard_names = (
        [SINGLE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    )
    weight_map: dict[str, str] = {}
    for source, name in zip(sources, shard_names, strict=True):
        infos = sorted(groups[source], key=lambda i: i.offset)
        metadata = ck.metadata.get(source) or {"format": "pt"}
        _write_file(out / name, source, infos, names, metadata)
        weight_map.update(dict.fromkeys((names[i.name] for i in infos), name))
    if n > 1:
        total = sum(i.nbytes for i in ck.tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
        return [*shard_names, INDEX_NAME]
    return shard_names


def _write_file(
    path: Path,
    source: str,
    infos: list[TensorInfo],
    names: dict[str, str],
    metadata: Mapping[str, str],
) -> None:
    """A safetensors file of ``infos`` under their new names, each tensor's bytes copied from
    ``source`` as they are."""
    header: dict[str, Any] = {"__metadata__": dict(metadata)}
    offset = 0
    for info in infos:
        header[names[info.name]] = {
            "dtype": info.dtype,
            "shape": list(info.shape),
            "data_offsets": [offset, offset + info.nbytes],
        }
        offset += info.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # data starts 8-byte aligned, as safetensors writes it
    if len(blob) > MAX_HEADER_BYTES:
        raise LoadkitError(f"{path}: the header would be {len(blob)} bytes, over the limit")
    with open(source, "rb") as src, open(path, "wb") as out:
        out.write(len(blob).to_bytes(8, "little"))
        out.write(blob)
        for info in infos:
            src.seek(info.offset)
            left = info.nbytes
            while left:
                chunk = src.read(min(CHUNK, left))
                if not chunk:
                    raise LoadkitError(
                        f"{source}: key '{printable(info.name)}': the file ended early"
                    )
                out.write(chunk)
                left -= len(chunk)


def _copy_others(folder: str, target: Path) -> list[str]:
    """The source folder's other top-level files (config, tokenizer, generation config), copied
    (links followed); weight files and the index are not."""
    from loadkit_inspect.sources.files import WEIGHT_SUFFIXES

    copied = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name == INDEX_NAME or name.endswith((*WEIGHT_SUFFIXES, ".index.json")):
            continue
        if os.path.isfile(path) and not name.startswith("."):
            shutil.copyfile(path, target / name)
            copied.append(name)
    return copied


def _replace_weights(ck: Checkpoint, summary: Any, target: Path) -> None:
    """In place: the weight files read and the index make way for the new ones."""
    for f in ck.files:
        os.remove(f)
    if summary.index is not None and os.path.lexists(summary.index):
        os.remove(summary.index)
