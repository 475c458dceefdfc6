"""A storage-less checkpoint tensor that remembers how a loader views it."""

import torch
from torch import nn

from loadkit.reload.trace import TraceTensor


def test_a_trace_has_no_data_and_remembers_its_views():
    from loadkit.reload.bake import PlanSink, Targets

    sink = PlanSink(Targets(nn.Module()))
    trace = TraceTensor.checkpoint("w", torch.Size((4, 6)), torch.float32, sink)
    part = trace.t().narrow(0, 1, 2)
    assert part.geom is not None and part.geom.storage_offset() == 1
    assert (part.key, part.shape) == ("w", torch.Size((2, 4)))
    assert trace.is_meta and part.is_meta  # no data anywhere
