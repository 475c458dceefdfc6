"""What a tensor-parallel run hands back: plain, picklable records (they cross processes)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from loadkit.parallel.holdings import CopyRecord
from loadkit.parallel.state import TensorParallelError
from loadkit.terms import Behaviour, check_behaviour

BUGS = ("gguf-rank", "kv-replication")

# What a run loads: ``model(tensors, rank_behaviour=..., kv_behaviour=...)`` builds the model for
# the current rank from the checkpoint's header (name -> ``TensorInfo``) and a job's behaviours.
# Every rank process receives it, so it must pickle: a module-level function (the Llama-like
# model's is ``loadkit.models.llama.model_from_checkpoint``).
ModelFactory = Callable[..., Any]


@dataclass(frozen=True)
class Job:
    """One load (and forward) every rank runs: a name and a behaviour per bug.

    ``rank_behaviour``: vllm-gguf-plugin #103 (``"old"``: the merged-column and QKV loaders read
    the rank from a defaulted keyword). ``kv_behaviour``: vLLM #2379 (``"old"``: kv shards
    without replication).
    """

    name: str = "new"
    rank_behaviour: Behaviour = "new"
    kv_behaviour: Behaviour = "new"

    @classmethod
    def for_bug(cls, bug: str, behaviour: Behaviour) -> Job:
        """``behaviour`` for ``bug`` (``"gguf-rank"`` or ``"kv-replication"``), the other fixed.

        >>> Job.for_bug("kv-replication", "old")
        Job(name='kv-replication/old', rank_behaviour='new', kv_behaviour='old')
        """
        if bug not in BUGS:
            raise ValueError(f"bug must be one of {BUGS}, not {bug!r}")
        check_behaviour(behaviour)
        if bug == "gguf-rank":
            return cls(f"{bug}/{behaviour}", rank_behaviour=behaviour)
        return cls(f"{bug}/{behaviour}", kv_behaviour=behaviour)

    def build(self, model: ModelFactory, tensors: Mapping[str, Any]) -> Any:
        """``model`` built for the current rank with this job's behaviours."""
        return model(tensors, rank_behaviour=self.rank_behaviour, kv_behaviour=self.kv_behaviour)


@dataclass(frozen=True)
class Fault:
    """A failure to inject on one rank, for testing what the others do.

    ``kind``: ``"kill"`` (the process is killed, as by the OOM killer), ``"raise"`` (an
    exception in the load) or ``"hang"`` (the rank stops responding), after ``after_tensors``
    checkpoint tensors of job ``job``.
    """

    rank: int
    after_tensors: int = 0
    kind: Literal["kill", "raise", "hang"] = "kill"
    job: int = 0


@dataclass
class RankResult:
    """One rank's account of one job.

    ``status``: ``"ok"``, ``"load error"`` (this rank's load raised), ``"skipped"`` (loaded, but
    another rank did not, so no forward ran), ``"forward error"``, ``"died"`` (the process ended
    without reporting) or ``"killed"`` (it stopped answering and was ended).
    """

    rank: int
    tp: int
    job: Job
    status: str = "ok"
    error: str | None = None
    ledger: dict[str, Any] | None = None
    records: list[CopyRecord] = field(default_factory=list)
    loaded_per_layer: dict[str, int] = field(default_factory=dict)
    param_bytes: int = 0
    tensors_read: int = 0
    anon_baseline: int = 0
    anon_peak: int = 0
    load_seconds: float = 0.0
    logits: np.ndarray | None = None

    @property
    def anon_growth(self) -> int:
        """Peak anonymous memory during the load minus what the process held before building
        the model: the model's share, plus what loading needed on the way."""
        return max(self.anon_peak - self.anon_baseline, 0)


@dataclass
class TPRun:
    """One job on ``tp`` ranks: every rank's ``RankResult``, in rank order."""

    tp: int
    job: Job
    ranks: list[RankResult]
    checkpoint: str = ""
    pids: tuple[int, ...] = ()  # the rank processes (all ended when the run returns)

    @property
    def ok(self) -> bool:
        return all(r.status == "ok" for r in self.ranks)

    @property
    def errors(self) -> list[str]:
        return [f"rank {r.rank}: {r.status}: {r.error}" for r in self.ranks if r.status != "ok"]

    @property
    def logits(self) -> np.ndarray | None:
        """The logits every rank computed (all-gathered, so identical; rank 0's), or ``None``."""
        return self.ranks[0].logits if self.ok else None

    def raise_for_errors(self) -> TPRun:
        """``self``, or a ``TensorParallelError`` naming every rank that failed and why."""
        if not self.ok:
            raise TensorParallelError(
                f"tensor-parallel job {self.job.name!r} on {self.tp} ranks failed: "
                + "; ".join(self.errors)
            )
        return self
