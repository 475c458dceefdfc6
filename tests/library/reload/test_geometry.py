"""A traced copy as a box of the checkpoint tensor and a strided target region; merged writes
and their byte runs."""

import pytest
import torch

from loadkit.reload.geometry import Region, Write, box_and_region, byte_runs, merge_writes


@pytest.mark.parametrize(
    ("ckpt", "view", "box"),
    [
        ((4, 6), lambda w: w, ((0, 4), (0, 6))),
        ((4, 6), lambda w: w.t(), ((0, 4), (0, 6))),
        ((4, 6), lambda w: w[1:3], ((1, 3), (0, 6))),
        ((4, 6), lambda w: w[:, 2:5], ((0, 4), (2, 5))),
        ((4, 6), lambda w: w.flatten()[6:18], ((1, 3), (0, 6))),
        ((2, 3, 4), lambda w: w[1].transpose(0, 1), ((1, 2), (0, 3), (0, 4))),
    ],
)
def test_a_copy_is_a_box_and_a_region_that_put_every_element_where_copy_did(ckpt, view, box):
    source = torch.arange(float(torch.Size(ckpt).numel())).view(ckpt)
    part = view(source)
    dest = torch.full((64,), -1.0).as_strided(part.shape, torch.empty(part.shape).stride(), 5)
    dims = list(zip(part.shape, part.stride(), dest.stride(), strict=True))
    got_box, shape, stride = box_and_region(ckpt, part.storage_offset(), dims)
    assert got_box == box
    replay = torch.full((64,), -1.0)
    picked = source[tuple(slice(a, b) for a, b in got_box)]
    replay.as_strided(shape, stride, 5).copy_(picked.reshape(shape))
    dest.copy_(part)
    assert torch.equal(replay, dest.as_strided((64,), (1,), 0))


def test_writes_that_continue_one_another_merge_and_byte_runs_cover_them():
    rows = [Write(((i, i + 1), (0, 4)), "m", "w", Region(4 * i, (1, 4), (4, 1))) for i in (2, 0, 1)]
    (merged,) = merge_writes(rows)
    assert merged.src == ((0, 3), (0, 4)) and merged.dst == Region(0, (3, 4), (4, 1))
    strided = [Write(((i, i + 1), (0, 4)), "m", "w", Region(8 * i, (1, 4), (4, 1))) for i in (0, 1)]
    assert merge_writes(strided)[0].dst == Region(0, (2, 4), (8, 1))  # rows 8 apart: one write
    apart = [Write(((i, i + 1), (0, 4)), "m", "w", Region(4 * i, (1, 4), (4, 1))) for i in (0, 2)]
    assert len(merge_writes(apart)) == 2  # source rows 0 and 2: not one box
    assert byte_runs(0, (3, 4), (4, 1), 4) == [(0, 48)]
    assert byte_runs(8, (2, 2), (8, 1), 2) == [(8, 12), (24, 28)]
