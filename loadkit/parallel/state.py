"""The tensor-parallel process group every parallel layer and loader asks for its rank.

vLLM keeps one global group (``get_tensor_model_parallel_rank()`` reads it). loadkit scopes it
instead: ``use_group(group)`` makes ``group`` current for the code inside the ``with`` (a
``ContextVar``, so threads and notebook cells do not leak groups into each other). A group is
either backed by ``torch.distributed`` (real processes; ``init_tp_group``), or a stand-in
(``stand_in_group(rank, tp)``): one rank's view without any process, for meta-device checks.

Nothing here is CPU-specific: the collectives are ``torch.distributed``'s, so the same code runs
on gloo (CPU, these tests) and nccl.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

# Defined in loadkit.errors (every error is); importable from here too, where they are raised.
from loadkit.errors import NotDivisibleError, TensorParallelError


@dataclass(frozen=True)
class TPGroup:
    """One rank's view of its tensor-parallel group.

    ``pg`` is the ``torch.distributed`` process group, or ``None`` for a stand-in group (no
    processes: collectives are refused unless the group has a single rank).
    """

    rank: int
    world_size: int
    pg: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise TensorParallelError(
                f"rank {self.rank} is outside a group of {self.world_size} ranks"
            )

    @property
    def stand_in(self) -> bool:
        """Does this group stand in for a rank without processes (``stand_in_group``)?"""
        return self.pg is None

    def _check_real(self, what: str) -> bool:
        """True when the collective must really run; False when it is the identity (tp=1)."""
        if self.world_size == 1:
            return False
        if self.pg is None:
            raise TensorParallelError(
                f"{what} needs the other {self.world_size - 1} ranks, but this group is a stand-in "
                f"(rank {self.rank} of {self.world_size}, no processes): run it with "
                "loadkit.executor.launcher.run_tensor_parallel"
            )
        return True

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of ``tensor`` (a new tensor; the input is left alone)."""
        if not self._check_real("all_reduce"):
            return tensor
        out = tensor.clone()
        dist.all_reduce(out, group=self.pg)
        return out

    def all_gather(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's ``tensor`` concatenated along ``dim``, in rank order."""
        if not self._check_real("all_gather"):
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous(), group=self.pg)
        return torch.cat(parts, dim=dim)


_CURRENT: ContextVar[TPGroup | None] = ContextVar("loadkit_tp_group", default=None)


@contextmanager
def use_group(group: TPGroup) -> Iterator[TPGroup]:
    """Make ``group`` the current tensor-parallel group inside the ``with`` block.

    >>> with use_group(stand_in_group(1, 2)):
    ...     get_tensor_model_parallel_rank()
    1
    """
    token = _CURRENT.set(group)
    try:
        yield group
    finally:
        _CURRENT.reset(token)


def stand_in_group(rank: int, world_size: int) -> TPGroup:
    """Rank ``rank`` of ``world_size`` without processes: for building and loading on meta."""
    return TPGroup(rank, world_size)


_SINGLE = TPGroup(0, 1)


def get_tp_group() -> TPGroup:
    """The current group; outside any ``use_group``, a single rank (plain one-process use).

    A layer built for more ranks and loaded outside its group is caught by the loaders (the
    parameter remembers the group size it was built for).
    """
    group = _CURRENT.get()
    return _SINGLE if group is None else group


def get_tensor_model_parallel_rank() -> int:
    """This process's rank in the current group (vLLM's name)."""
    return get_tp_group().rank


def get_tensor_model_parallel_world_size() -> int:
    """The number of ranks in the current group (vLLM's name)."""
    return get_tp_group().world_size


def divide(numerator: int, denominator: int, what: str) -> int:
    """``numerator // denominator``, or ``NotDivisibleError`` naming ``what`` when it leaves a rest.

    >>> divide(8, 4, "attention heads")
    2
    """
    if numerator % denominator:
        raise NotDivisibleError(
            f"{what} ({numerator}) is not divisible by the tensor-parallel size ({denominator})"
        )
    return numerator // denominator


def init_tp_group(
    rank: int,
    world_size: int,
    store: Any,
    *,
    backend: str = "gloo",
    timeout_s: float = 30.0,
) -> TPGroup:
    """Join the ``torch.distributed`` group of ``world_size`` processes through ``store``.

    Every collective of the group fails after ``timeout_s`` instead of waiting for a rank that
    is gone. ``backend="nccl"`` works unchanged on GPUs.
    """
    dist.init_process_group(
        backend,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    return TPGroup(rank, world_size, dist.group.WORLD)


def destroy_tp_group() -> None:
    """Leave the ``torch.distributed`` group (a no-op when none was joined)."""
    if dist.is_initialized():
        dist.destroy_process_group()
