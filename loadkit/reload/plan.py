"""The load plan (vLLM 0.34.0's ``reload/plan.py``): which part of each checkpoint tensor goes
where in live memory, found once by tracing ``load_weights``, then replayed for every update.

``plan_loads`` runs the model's ``load_weights`` once over storage-less checkpoint tensors
(``bake``), between ``start_reload(model, mode="direct")`` and ``finish_reload``, so it sees the
layout the direct reload restored, and reduces each traced ``copy_`` to a box of the checkpoint
tensor and a strided region of its target (``geometry``). A name is direct only if every byte it
writes is a copy of one incoming byte; anything else (a cast, a computed value, a loader that
reads its destination, writes that overlap) is a fallback, which ``load_planned`` sends in full
through ``load_weights``. The plan holds for every later update of the same model.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from math import prod
from typing import Any, cast

import torch
from torch import nn

from loadkit.errors import Fallback, LoadPlanError
from loadkit.reload.bake import Copy, ParamMeta, Targets, Traced, trace_loads
from loadkit.reload.direct import direct_reload_active, storage_view
from loadkit.reload.geometry import Box, Region, Write, box_and_region, byte_runs, merge_writes

__all__ = ["Box", "Entry", "LoadPlan", "ParamMeta", "load_planned", "param_metas", "plan_loads"]

Dest = tuple[tuple[Box, torch.Tensor], ...]


@dataclass(frozen=True)
class Entry:
    """One declared checkpoint name in the plan."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    boxes: tuple[Box, ...] | None  # the parts of it this model needs; None: nothing
    writes: tuple[Write, ...] | None  # where they go; None: a fallback
    reason: str | None = None  # why it is a fallback

    @property
    def kind(self) -> str:
        """``"direct"``, ``"fallback"`` or ``"unneeded"``."""
        return "fallback" if self.writes is None else "direct" if self.boxes else "unneeded"


# One planned copy: the index of the checkpoint part (None: the whole tensor), the shape it is
# viewed as (None: as it is), the live view it goes into.
Step = tuple[tuple[slice, ...] | None, tuple[int, ...] | None, torch.Tensor]


@dataclass(frozen=True)
class LoadPlan:
    entries: dict[str, Entry]  # per declared name, in declaration order
    dests: dict[str, Dest]  # live views, built when planned: not data
    steps: dict[str, tuple[Step, ...]] = field(default_factory=dict)  # dests, ready to replay

    def get_boxes(self, name: str) -> tuple[Box, ...] | None:
        """The parts of checkpoint tensor ``name`` this model needs; ``None``: nothing."""
        return self.entries[name].boxes

    def get_dest(self, name: str) -> list[tuple[Box, torch.Tensor]] | None:
        """(part of a box, live tensor) pairs: copying each part, reshaped to its tensor's
        shape, into that tensor is exactly what the loader would have written. ``None``: a
        fallback, to be loaded through ``load_weights``."""
        if self.entries[name].writes is None:
            return None
        return list(self.dests[name])

    def summary(self) -> dict[str, tuple[int, int]]:
        """Per kind (``direct``, ``fallback``, ``unneeded``): (names, bytes moved)."""
        out: dict[str, list[int]] = {k: [0, 0] for k in ("direct", "fallback", "unneeded")}
        for e in self.entries.values():
            out[e.kind][0] += 1
            out[e.kind][1] += _nbytes(e)
        return {k: (n, b) for k, (n, b) in out.items()}

    def fallbacks(self) -> dict[str, list[str]]:
        """Fallback names grouped by their reason."""
        grouped: dict[str, list[str]] = defaultdict(list)
        for e in self.entries.values():
            if e.reason is not None:
                grouped[e.reason].append(e.name)
        return dict(grouped)


def param_metas(weights: Iterable[tuple[str, torch.Tensor]]) -> list[ParamMeta]:
    """The declarations of ``weights`` (their names, shapes and dtypes), for ``plan_loads``.

    >>> param_metas([("w", torch.zeros(2, 3, dtype=torch.bfloat16))])
    [ParamMeta(name='w', shape=(2, 3), dtype=torch.bfloat16)]
    """
    return [ParamMeta(name, tuple(t.shape), t.dtype) for name, t in weights]


def plan_loads(model: nn.Module, metadata: Iterable[ParamMeta]) -> LoadPlan:
    """Trace ``model.load_weights`` over the declared checkpoint tensors once; return where each
    lands. Nothing is loaded: the traced tensors have no data (loaders' constant writes land).

    Args:
        model: a model inside a direct reload (``start_reload(model, mode="direct")``).
        metadata: every checkpoint tensor an update will send (``param_metas``).

    Returns:
        The ``LoadPlan``; ``load_planned`` replays it.

    Raises:
        LoadPlanError: outside a direct reload, a name declared twice, or a loader that writes
            nothing itself for a name (it combines several checkpoint tensors).
    """
    if not direct_reload_active(model):
        raise LoadPlanError(
            "load plan: call plan_loads between start_reload(model, mode='direct') and "
            "finish_reload; the plan takes its layout from what the direct reload restored"
        )
    metas: dict[str, ParamMeta] = {}
    for meta in metadata:
        if meta.name in metas:
            raise LoadPlanError(f"load plan: {meta.name!r} is declared twice")
        metas[meta.name] = meta
    targets = Targets(model)
    traced = trace_loads(model, metas, targets)
    if traced.lonely:
        raise LoadPlanError(
            f"load plan: {len(traced.lonely)} fallback names write nothing themselves (e.g. "
            f"{traced.lonely[:3]}); their loaders combine several checkpoint tensors"
        )
    for name, reason in _overlaps(traced, targets).items():
        traced.reasons.setdefault(name, reason)
    entries = {name: _entry(meta, traced, targets) for name, meta in metas.items()}
    dests = {
        name: tuple((w.src, _dest(targets, w, e.dtype)) for w in e.writes)
        for name, e in entries.items()
        if e.writes is not None
    }
    steps = {
        name: tuple(_step(box, view, entries[name].shape) for box, view in dest)
        for name, dest in dests.items()
    }
    return LoadPlan(entries, dests, steps)


def _step(box: Box, view: torch.Tensor, shape: tuple[int, ...]) -> Step:
    """``(box, view)`` as the replay does it, with no slice or reshape it does not need."""
    whole = all(a == 0 and b == n for (a, b), n in zip(box, shape, strict=True))
    index = None if whole else tuple(slice(a, b) for a, b in box)
    part = tuple(b - a for a, b in box)
    return index, (None if tuple(view.shape) == part else tuple(view.shape)), view


def load_planned(
    model: nn.Module, plan: LoadPlan, weights: Iterable[tuple[str, torch.Tensor]]
) -> set[str]:
    """Load full checkpoint tensors as ``plan`` says: each direct name's boxes copied into their
    destinations, names this model needs nothing of skipped, fallbacks passed to
    ``model.load_weights``. Call between ``start_reload`` and ``finish_reload``.

    Returns:
        The names written directly, with what ``load_weights`` reported for the fallbacks.
    """
    fallbacks, written = [], set()
    steps = plan.steps
    with torch.no_grad():
        for name, full in weights:
            planned = steps.get(name)
            if planned is None:
                fallbacks.append((name, full))
                continue
            for index, shape, view in planned:
                part = full if index is None else full[index]
                view.copy_(part if shape is None else part.reshape(shape))
            written.add(name)
    if fallbacks:
        written |= set(cast(Any, model).load_weights(fallbacks) or ())
    return written


def _entry(meta: ParamMeta, traced: Traced, targets: Targets) -> Entry:
    name, shape = meta.name, tuple(meta.shape)
    full: Box = tuple((0, n) for n in shape)
    try:
        if name in traced.reasons:
            raise Fallback(traced.reasons[name])
        found = [_write(c, shape, meta.dtype, targets) for c in traced.copies.get(name, ())]
    except Fallback as reason:
        return Entry(name, shape, meta.dtype, (full,), None, str(reason))
    writes = [w for w in found if w is not None]
    if not writes:  # a tied alias, a skipped name: nothing to write
        return Entry(name, shape, meta.dtype, None, ())
    merged = merge_writes(writes)
    boxes = tuple(dict.fromkeys(w.src for w in merged))
    return Entry(name, shape, meta.dtype, boxes, tuple(merged))


def _write(
    copy: Copy, shape: tuple[int, ...], dtype: torch.dtype, targets: Targets
) -> Write | None:
    """``copy`` as a box and a region; ``None`` if it copies nothing. Raises ``Fallback``."""
    src = copy.src
    if src.geom is None:
        raise Fallback(src.lost or "not a view of the checkpoint tensor")
    if src.dtype != copy.dtype:
        raise Fallback(f"casts {src.dtype} to {copy.dtype} at copy_")
    target = targets.by_storage.get(copy.storage)
    if target is None:
        raise Fallback("copies into a tensor that is not a checkpoint tensor")
    size = dtype.itemsize
    rel = copy.byte_offset - target.byte_offset
    if rel % size or target.byte_offset % size:
        raise Fallback("copies into a destination viewed with another element size")
    if 0 in copy.shape:
        return None
    geom = src.geom
    if tuple(geom.shape) != copy.shape:
        if geom.numel() != prod(copy.shape):
            raise Fallback("broadcasting copy_")
        try:
            geom = geom.view(copy.shape)
        except RuntimeError:
            raise Fallback("copy_ with a reshape that is not a view") from None
    dims = list(zip(copy.shape, geom.stride(), copy.stride, strict=True))
    box, dst_shape, dst_stride = box_and_region(shape, int(geom.storage_offset()), dims)
    return Write(box, target.module, target.tensor, Region(rel // size, dst_shape, dst_stride))


def _dest(targets: Targets, write: Write, dtype: torch.dtype) -> torch.Tensor:
    """The live view ``write`` lands in, in the checkpoint dtype."""
    target = targets.by_name[(write.module, write.tensor)]
    r = write.dst
    offset = target.byte_offset // dtype.itemsize + r.offset
    return storage_view(target.real.untyped_storage(), offset, r.shape, r.stride, dtype)


def _overlaps(traced: Traced, targets: Targets) -> dict[str, str]:
    """Names whose writes share a byte with another write: direct writes land in any order, so
    these go through ``load_weights`` in arrival order."""
    runs: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
    for name, copies in traced.copies.items():
        for c in copies:
            if c.storage in targets.by_storage and 0 not in c.shape:
                spans = byte_runs(c.byte_offset, c.shape, c.stride, c.dtype.itemsize)
                runs[c.storage] += [(a, b, name) for a, b in spans]
    reasons: dict[str, str] = {}
    for named in runs.values():
        named.sort()
        active: list[tuple[int, str]] = []  # a heap of (stop, name)
        for start, stop, name in named:
            while active and active[0][0] <= start:
                heapq.heappop(active)
            for _, other in active:
                reasons.setdefault(name, f"writes overlap with {other!r}")
                reasons.setdefault(other, f"writes overlap with {name!r}")
            heapq.heappush(active, (stop, name))
    return reasons


def _nbytes(entry: Entry) -> int:
    """What an update moves for ``entry``."""
    if entry.writes is None:
        return prod(entry.shape) * entry.dtype.itemsize
    return sum(prod(b - a for a, b in box) for box in entry.boxes or ()) * entry.dtype.itemsize
