"""A folder of shards read as far as it can be: every index problem collected, none raised.

``open_checkpoint`` raises at the first inconsistency. A debugging tool needs all of them, each
with where the key really is, and whatever can still be read: ``open_lenient`` reads the folder's
layout leniently (``loadkit.checkpoint.merge.read_layout``, which lists the problems it finds).
Hostile folders are refused as ``open_checkpoint`` refuses them (``loadkit.checkpoint.shards``).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from loadkit.checkpoint import (
    Checkpoint,
    IndexProblem,
    local_layout,
    read_layout,
    read_safetensors_header,
)

__all__ = ["open_lenient"]


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
    layout = local_layout(folder, strict=False)
    merged = read_layout(
        layout, read_safetensors_header, strict=False, exists=os.path.lexists, progress=progress
    )
    ck = Checkpoint(layout.path, merged.files, merged.tensors, merged.metadata_text, merged.held)
    return ck, merged.problems
