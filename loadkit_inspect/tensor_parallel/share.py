"""One rank's share of a checkpoint, computed on the meta device without any process.

The model is built for rank ``r`` of ``tp`` inside a stand-in group, on ``torch.device("meta")``
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

from loadkit.checkpoint import TensorInfo, open_checkpoint
from loadkit.errors import LoadkitError
from loadkit.loading import meta_tensor
from loadkit.parallel import CopyRecord, HoldingsRecorder, stand_in_group, use_group

Tensors = Mapping[str, TensorInfo]
# Builds the model to share out from the checkpoint's header; called inside each rank's group.
ModelBuilder = Callable[[Tensors], nn.Module]


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
        yield name, meta_tensor(info)


def _load(model: nn.Module, weights: Any) -> None:
    own = getattr(model, "load_weights", None)
    if callable(own):
        own(weights)
    else:
        from loadkit.loading import AutoWeightsLoader

        AutoWeightsLoader(model).load_weights(weights)


def dry_load_rank(
    tensors: Tensors, rank: int, tp: int, build: Callable[[], nn.Module]
) -> RankShare:
    """Rank ``rank``'s share: ``build()`` runs inside the stand-in group, on meta.

    >>> from loadkit.models.llama import LlamaLikeConfig, checkpoint_layout, model_from_checkpoint
    >>> from loadkit.checkpoint import TensorInfo
    >>> layout = checkpoint_layout(LlamaLikeConfig())
    >>> header = {n: TensorInfo(n, "F32", s, 0, "x", 0) for n, s in layout}
    >>> share = dry_load_rank(header, 3, 4, lambda: model_from_checkpoint(header))
    >>> share.params["model.embed_tokens.weight"][0]   # 128 padded rows / 4 ranks
    (32, 32)
    """
    share = RankShare(rank, tp)
    with torch.device("meta"), use_group(stand_in_group(rank, tp)):
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


def _tensors(checkpoint: str | os.PathLike[str] | Tensors) -> Tensors:
    return checkpoint if isinstance(checkpoint, Mapping) else open_checkpoint(checkpoint).tensors


def dry_load_ranks(
    checkpoint: str | os.PathLike[str] | Tensors, tp: int, model: ModelBuilder
) -> list[RankShare]:
    """Every rank's share of ``checkpoint`` (a path or its header's tensors) over ``tp`` ranks,
    ``model(tensors)`` built for each rank."""
    tensors = _tensors(checkpoint)
    return [dry_load_rank(tensors, r, tp, lambda: model(tensors)) for r in range(tp)]


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


def memory_plan(
    checkpoint: str | os.PathLike[str] | Tensors, tp: int, model: ModelBuilder
) -> MemoryPlan:
    """Header-only: how ``model(tensors)``'s bytes split over ``tp`` ranks (meta device, no
    load)."""
    tensors = _tensors(checkpoint)
    sizes = []
    # Which parameters split is seen by comparing with two ranks even when tp is 1.
    for t in (1, max(tp, 2)):
        per_rank = []
        for r in range(t):
            with torch.device("meta"), use_group(stand_in_group(r, t)):
                built = model(tensors)
            per_rank.append({n: p.numel() * p.element_size() for n, p in built.named_parameters()})
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
