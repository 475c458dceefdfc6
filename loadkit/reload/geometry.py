"""The load plan's integer geometry (vLLM 0.34.0's ``reload/geometry.py``): one traced ``copy_``
as a box of the checkpoint tensor and a strided region of its target, writes merged where they
continue one another, and the byte runs a write covers. No torch.

Coordinates: a checkpoint tensor is contiguous, of shape ``C``; element ``(i0, i1, ...)`` sits at
``sum(i_k * cs_k)`` with ``cs_k = prod(C[k+1:])``. A box is a half-open ``(start, stop)`` per
dimension. A region is ``as_strided`` arguments (offset, shape, stride) in elements of the
checkpoint dtype, relative to where the target tensor starts in its storage.
"""

from __future__ import annotations

import itertools
from math import prod
from typing import NamedTuple

from loadkit.errors import Fallback

Box = tuple[tuple[int, int], ...]


class Region(NamedTuple):
    """Where a box's elements land, in row-major box order (a box dim may be split in two)."""

    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


class Write(NamedTuple):
    src: Box  # part of the checkpoint tensor
    module: str  # the target tensor, by name
    tensor: str
    dst: Region


def _assign(
    ckpt_shape: tuple[int, ...], start: list[int], dims: list[tuple[int, int, int]]
) -> list[list[tuple[int, int, int]]]:
    """Per checkpoint dim, the copy's dims that step through it: (step, size, dst stride).

    A copy dim steps through the checkpoint dim whose element stride is the largest one not
    above its own source stride; a flattened dim that runs on into the next outer dim is cut
    where it wraps (``flatten`` of a box that starts at 0 in the inner dim)."""
    strides = [prod(ckpt_shape[k + 1 :]) for k in range(len(ckpt_shape))]
    parts: list[list[tuple[int, int, int]]] = [[] for _ in ckpt_shape]
    for size, src_stride, dst_stride in dims:
        if size == 1:
            continue
        if src_stride <= 0:
            raise Fallback("repeats source elements (expand or broadcast)")
        if dst_stride <= 0:
            raise Fallback("writes one destination element twice")
        while True:
            k = next(k for k, s in enumerate(strides) if s <= src_stride)
            if src_stride % strides[k]:
                raise Fallback("source slice is not a box")
            step = src_stride // strides[k]
            if (size - 1) * step < ckpt_shape[k]:
                parts[k].append((step, size, dst_stride))
                break
            inner = ckpt_shape[k] // step  # how many steps fit before the dim wraps
            if k == 0 or ckpt_shape[k] % step or size % inner or start[k]:
                raise Fallback("source slice is not a box")
            parts[k].append((step, inner, dst_stride))
            size, src_stride, dst_stride = size // inner, src_stride * inner, dst_stride * inner
    return parts


def box_and_region(
    ckpt_shape: tuple[int, ...], src_offset: int, dims: list[tuple[int, int, int]]
) -> tuple[Box, tuple[int, ...], tuple[int, ...]]:
    """One ``copy_`` as (the box of the checkpoint it reads, the destination shape and strides
    of the box's elements in row-major box order).

    ``dims`` are the copied tensor's (size, source stride, destination stride) per dim;
    ``src_offset`` is where its first element sits in the checkpoint tensor. The parts of the
    copy that step through one checkpoint dim must tile a contiguous range of it.

    ``P.copy_(W.t())``, ``W`` of shape (4, 6) and ``P`` (6, 4), both contiguous: the box is all
    of ``W`` and its elements land with strides (1, 4):

    >>> box_and_region((4, 6), 0, [(6, 1, 4), (4, 6, 1)])
    (((0, 4), (0, 6)), (4, 6), (1, 4))
    >>> box_and_region((4, 6), 6, [(2, 6, 3), (3, 2, 1)])  # W[1:3, ::2]: a step
    Traceback (most recent call last):
    ...
    loadkit.errors.Fallback: source slice has a step or is not a box
    """
    strides = [prod(ckpt_shape[k + 1 :]) for k in range(len(ckpt_shape))]
    start = [(src_offset // s) % n for s, n in zip(strides, ckpt_shape, strict=True)]
    parts = _assign(ckpt_shape, start, dims)
    box: list[tuple[int, int]] = []
    shape: list[int] = []
    stride: list[int] = []
    for k, dim_parts in enumerate(parts):
        dim_parts.sort(reverse=True)  # outer (larger step) first
        extent = 1
        for step, size, _ in reversed(dim_parts):
            if step != extent:
                raise Fallback("source slice has a step or is not a box")
            extent *= size
        if start[k] + extent > ckpt_shape[k]:
            raise Fallback("source slice is not a box")
        box.append((start[k], start[k] + extent))
        merged: list[tuple[int, int]] = []  # (size, dst stride), contiguous runs joined
        for _, size, dst in dim_parts or [(1, 1, 1)]:
            if merged and merged[-1][1] == dst * size:
                merged[-1] = (merged[-1][0] * size, dst)
            else:
                merged.append((size, dst))
        shape += [n for n, _ in merged]
        stride += [s for _, s in merged]
    return tuple(box), tuple(shape), tuple(stride)


def _join(a: Write, b: Write) -> Write | None:
    """``a`` then ``b`` as one write, if ``b`` continues ``a`` along exactly one box dim into
    the same target with the same destination stride there; else ``None``."""
    rank = len(a.src)
    if (a.module, a.tensor) != (b.module, b.tensor):
        return None
    if not len(a.dst.shape) == len(b.dst.shape) == rank:
        return None  # a split dim: no single stride to continue along
    differ = [k for k in range(rank) if a.src[k] != b.src[k]]
    if len(differ) != 1 or a.src[differ[0]][1] != b.src[differ[0]][0]:
        return None
    k = differ[0]
    for j in range(rank):
        if j == k:
            continue
        if a.dst.shape[j] != b.dst.shape[j]:
            return None
        if a.dst.shape[j] > 1 and a.dst.stride[j] != b.dst.stride[j]:
            return None
    na, nb = a.dst.shape[k], b.dst.shape[k]
    gap = b.dst.offset - a.dst.offset
    step = a.dst.stride[k] if na > 1 else gap
    if (b.dst.stride[k] if nb > 1 else step) != step or gap != step * na:
        return None
    src = tuple((a.src[j][0], b.src[j][1]) if j == k else a.src[j] for j in range(rank))
    shape = tuple(na + nb if j == k else n for j, n in enumerate(a.dst.shape))
    stride = tuple(step if j == k else s for j, s in enumerate(a.dst.stride))
    return Write(src, a.module, a.tensor, Region(a.dst.offset, shape, stride))


def merge_writes(writes: list[Write]) -> list[Write]:
    """Writes of one name that continue one another (a loader's per-expert or per-row loop)
    merged into single writes, sorted by target and offset.

    >>> rows = [Write(((i, i + 1), (0, 4)), "m", "w", Region(4 * i, (1, 4), (4, 1)))
    ...         for i in (2, 0, 1)]
    >>> merge_writes(rows)
    [Write(src=((0, 3), (0, 4)), module='m', tensor='w', dst=Region(offset=0, shape=(3, 4), \
stride=(4, 1)))]
    """
    out: list[Write] = []
    for w in writes:
        i = 0
        while i < len(out):
            joined = _join(out[i], w) or _join(w, out[i])
            if joined is None:
                i += 1
            else:
                del out[i]
                w, i = joined, 0  # the result may continue another write
        out.append(w)
    return sorted(out, key=lambda w: (w.module, w.tensor, w.dst.offset))


MAX_RUNS = 1 << 16


def byte_runs(
    byte_offset: int, shape: tuple[int, ...], stride: tuple[int, ...], itemsize: int
) -> list[tuple[int, int]]:
    """The bytes a strided write covers, as [start, stop) runs; one covering span when there
    would be more than ``MAX_RUNS``.

    >>> byte_runs(0, (2, 3), (4, 1), 2)  # two rows of 3 two-byte elements, 4 apart
    [(0, 6), (8, 14)]
    """
    dims = sorted(
        ((n, s) for n, s in zip(shape, stride, strict=True) if n > 1), key=lambda d: -d[1]
    )
    run = 1  # contiguous elements at the innermost end
    while dims and dims[-1][1] == run:
        run *= dims.pop()[0]
    if prod(n for n, _ in dims) > MAX_RUNS:
        span = sum((n - 1) * s for n, s in dims) + run
        return [(byte_offset, byte_offset + span * itemsize)]
    return [
        (byte_offset + sum(o) * itemsize, byte_offset + (sum(o) + run) * itemsize)
        for o in itertools.product(*(range(0, n * s, s) for n, s in dims))
    ]
