"""One rank's share of a checkpoint, computed on the meta device without any process.

The model is built for rank ``r`` of ``tp`` inside a simulated group, on ``torch.device("meta")``
(no memory), and loaded with meta tensors of the checkpoint's shapes and dtypes, read from its
header, in stream order. The real loaders run; ``HoldingsRecorder`` reads the rows they take from
the views' geometry, which meta tensors keep. So the share agrees with a real multi-process load
(tested), for a checkpoint of any size, before any GPU is involved.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from loadkit import open_checkpoint
from loadkit.checkpoint.reader import DTYPES, TensorInfo
from loadkit.errors import LoadkitError
from loadkit.executor.results import Job
from loadkit.parallel.holdings import CopyRecord, HoldingsRecorder
from loadkit.parallel.state import simulated_group, use_group

Tensors = Mapping[str, TensorInfo]


@dataclass
class RankShare:
    """What rank ``rank`` of ``tp`` would hold: its parameters' sizes and the copies into them.

    ``error`` is the load's failure on this rank (as a real load would raise it), if any.
    """

    rank: int
    tp: int
    params: dict[str, tuple[tuple[int, ...], int]] = field(default_factory=dict)  # shape, bytes
    records: list[CopyRecord] = field(default_factory=list)
    loaded_per_layer: dict[str, int] = field(default_factory=dict)
    error: str | None = None

    @property
    def param_bytes(self) -> int:
        return sum(nbytes for _, nbytes in self.params.values())


def meta_weights(tensors: Tensors):
    """The checkpoint as meta tensors, in the order ``Checkpoint.weights()`` would yield it."""
    for name, info in tensors.items():
        dtype = getattr(torch, DTYPES[info.dtype][0])
        yield name, torch.empty(info.shape, dtype=dtype, device="meta")


def llama_builder(tensors: Tensors, job: Job) -> Callable[[], nn.Module]:
    """A builder of the Llama-like model sized from ``tensors``, with ``job``'s behaviours."""
    from loadkit.models.llama import LlamaForCausalLM, config_from_checkpoint

    config = config_from_checkpoint(tensors)
    return lambda: LlamaForCausalLM(
        config, rank_behaviour=job.rank_behaviour, kv_behaviour=job.kv_behaviour
    )


def _load(model: nn.Module, weights: Any) -> None:
    own = getattr(model, "load_weights", None)
    if callable(own):
        own(weights)
    else:
        from loadkit import AutoWeightsLoader

        AutoWeightsLoader(model).load_weights(weights)


def simulate_rank(
    tensors: Tensors, rank: int, tp: int, build: Callable[[], nn.Module]
) -> RankShare:
    """Rank ``rank``'s share: ``build()`` runs inside the simulated group, on meta.

    >>> from loadkit.models.llama import LlamaLikeConfig, checkpoint_layout
    >>> from loadkit.checkpoint import TensorInfo
    >>> layout = checkpoint_layout(LlamaLikeConfig())
    >>> header = {n: TensorInfo(n, "F32", s, 0, "x", 0) for n, s in layout}
    >>> share = simulate_rank(header, 3, 4, llama_builder(header, Job()))
    >>> share.params["model.embed_tokens.weight"][0]   # 128 padded rows / 4 ranks
    (32, 32)
    """
    share = RankShare(rank, tp)
    with torch.device("meta"), use_group(simulated_group(rank, tp)):
        model = build()
        for name, p in model.named_parameters():
            share.params[name] = (tuple(p.shape), p.numel() * p.element_size())
        with HoldingsRecorder(model) as rec:
            try:
                _load(model, rec.watch(meta_weights(tensors)))
            except LoadkitError as exc:
                share.error = f"{type(exc).__name__}: {exc}"
            finally:
                share.records = rec.records
                share.loaded_per_layer = rec.loaded_per_layer()
    return share


def simulate_shares(
    checkpoint: str | os.PathLike[str] | Tensors,
    tp: int,
    job: Job | None = None,
    build: Callable[[Tensors, Job], Callable[[], nn.Module]] = llama_builder,
) -> list[RankShare]:
    """Every rank's share of ``checkpoint`` (a path or its header's tensors) over ``tp`` ranks."""
    tensors = checkpoint if isinstance(checkpoint, Mapping) else open_checkpoint(checkpoint).tensors
    job = job or Job()
    return [simulate_rank(tensors, r, tp, build(tensors, job)) for r in range(tp)]


@dataclass(frozen=True)
class MemoryPlan:
    """Parameter bytes per rank against the ideal: 1/tp of what is split plus what is not.

    ``sharded_bytes``: at tp=1, the parameters that shrink when split; ``replicated_bytes``:
    the ones every rank holds whole (norms, row-parallel biases).
    """

    tp: int
    sharded_bytes: int
    replicated_bytes: int
    per_rank: tuple[int, ...]

    @property
    def ideal_per_rank(self) -> float:
        return self.sharded_bytes / self.tp + self.replicated_bytes


def memory_plan(checkpoint: str | os.PathLike[str] | Tensors, tp: int) -> MemoryPlan:
    """Header-only: how the model's bytes split over ``tp`` ranks (meta device, no load)."""
    tensors = checkpoint if isinstance(checkpoint, Mapping) else open_checkpoint(checkpoint).tensors
    build = llama_builder(tensors, Job())
    sizes = []
    # Which parameters split is seen by comparing with two ranks even when tp is 1.
    for t in (1, max(tp, 2)):
        per_rank = []
        for r in range(t):
            with torch.device("meta"), use_group(simulated_group(r, t)):
                model = build()
            per_rank.append({n: p.numel() * p.element_size() for n, p in model.named_parameters()})
        sizes.append(per_rank)
    full, split = sizes[0][0], sizes[1]
    sharded = sum(b for n, b in full.items() if split[0][n] < b)
    ranks = sizes[0] if tp == 1 else split
    return MemoryPlan(
        tp,
        sharded,
        sum(full.values()) - sharded,
        tuple(sum(r.values()) for r in ranks),
    )
