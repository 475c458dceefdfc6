"""Run ``tp`` ranks as real processes on this machine and collect what each loaded.

``run_tensor_parallel`` starts one process per rank (``torch.multiprocessing``, spawn), joined in
a ``torch.distributed`` group (gloo on CPU) through a ``TCPStore`` that the launcher itself
opens on a free loopback port (port 0: the system picks one per run, so parallel runs never
collide). Every rank runs the same jobs; each job builds the model, streams the checkpoint into
it and, if every rank loaded, computes the logits.

Failures end cleanly: a rank whose load raises reports it and the others skip the forward; a
rank that dies or stops answering is named, the others are given the collective timeout to
report and are then ended; no process outlives the call (the ranks also exit if the launcher
is killed).
"""

from __future__ import annotations

import os
import queue as queue_module
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from loadkit.checkpoint.reader import open_checkpoint
from loadkit.executor.results import Fault, Job, ModelFactory, RankResult, TPRun
from loadkit.executor.worker import LaunchSpec, run_rank
from loadkit.parallel.state import TensorParallelError, stand_in_group, use_group

DEFAULT_INPUT_IDS = (1, 7, 42, 99, 3, 64, 15, 80)


def check_tensor_parallel(
    checkpoint: str | os.PathLike[str], tp: int, model: ModelFactory
) -> list[Any]:
    """Header-only: what ``model``'s config says of ``tp`` ranks (``verify_tensor_parallel``,
    where it has one); raises if any finding says it cannot work. The model is built once, on
    the meta device, as the only rank of a simulated group."""
    tensors = open_checkpoint(checkpoint).tensors
    with torch.device("meta"), use_group(stand_in_group(0, 1)):
        built = Job().build(model, tensors)
    verify = getattr(getattr(built, "config", None), "verify_tensor_parallel", None)
    findings = list(verify(tp)) if callable(verify) else []
    errors = [f.message for f in findings if f.severity == "error"]
    if errors:
        raise TensorParallelError(f"{checkpoint}: tp={tp} cannot work: " + "; ".join(errors))
    return findings


@dataclass
class _Watch:
    """The launcher's view of its ranks while they run."""

    procs: list[Any]
    spec: LaunchSpec
    results: dict[tuple[int, int], RankResult] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)  # ranks that reported "done"
    fatal: dict[int, str] = field(default_factory=dict)
    gone: dict[int, tuple[str, str]] = field(default_factory=dict)  # rank -> status, how
    first_failure: float | None = None

    def failed(self) -> None:
        if self.first_failure is None:
            self.first_failure = time.monotonic()

    def take(self, item: tuple) -> None:
        kind, rank, payload = item[0], item[1], item[2:]
        if kind == "result":
            job, result = payload
            self.results[(job, rank)] = result
            if result.status != "ok":
                self.failed()
        elif kind == "done":
            self.finished.add(rank)
        elif kind == "fatal":
            self.fatal[rank] = payload[0]
            self.finished.add(rank)
            self.failed()

    def pending(self) -> list[int]:
        return [r for r in range(self.spec.tp) if r not in self.finished and r not in self.gone]


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def _context(start_method: str) -> Any:
    """A multiprocessing context whose processes start without the launcher's state.

    ``"forkserver"`` (the default where available) imports torch once, in a server process that
    has never run an operator or joined a group, and forks each rank from it: a rank starts in
    milliseconds instead of importing torch again. ``"spawn"`` starts each rank from scratch.
    """
    if start_method == "forkserver":
        try:
            ctx = mp.get_context("forkserver")
        except ValueError:  # not on this platform
            return mp.get_context("spawn")
        ctx.set_forkserver_preload(["torch", "loadkit.executor.worker"])
        return ctx
    return mp.get_context(start_method)


@dataclass
class _Bars:
    """One tqdm bar per rank: bytes of the checkpoint that rank has streamed in the current job
    (the ranks post their counts to the store; the launcher polls them)."""

    spec: LaunchSpec
    total: int
    bars: list[Any] = field(default_factory=list)
    job: int = -1

    def update(self, store: Any, job: int) -> None:
        from tqdm import tqdm

        # A new job streams the checkpoint again: fresh bars. Every job gets its bars, even one
        # whose results all arrived between two polls (the supervisor skips polling then).
        while self.job < job:
            self._refresh(store)  # the finished job's final counts
            for bar in self.bars:
                bar.close()
            self.job += 1
            name = self.spec.jobs[self.job].name
            self.bars = [
                tqdm(total=self.total, unit="B", unit_scale=True, desc=f"{name} rank {r}")
                for r in range(self.spec.tp)
            ]
        self._refresh(store)

    def _refresh(self, store: Any) -> None:
        for r, bar in enumerate(self.bars):
            done = store.add(f"progress/{self.job}/{r}", 0)
            if done >= self.total:  # set silently: close() prints the full bar, once
                bar.n = done
            else:
                bar.update(max(done - bar.n, 0))

    def close(self) -> None:
        for bar in self.bars:
            bar.close()


def _current_job(watch: _Watch) -> int:
    """The first job rank 0 has not reported (the last one once all are in)."""
    jobs = range(len(watch.spec.jobs))
    return min((j for j in jobs if (j, 0) not in watch.results), default=len(jobs) - 1)


def run_tensor_parallel(
    checkpoint: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    tp: int,
    jobs: Sequence[Job] | None = None,
    *,
    model: ModelFactory,
    input_ids: Sequence[int] = DEFAULT_INPUT_IDS,
    timeout: float = 300.0,
    collective_timeout: float = 30.0,
    track_rows: bool = True,
    progress: bool = False,
    fault: Fault | None = None,
    backend: str = "gloo",
    threads: int = 1,
    start_method: str = "forkserver",
) -> list[TPRun]:
    """Load ``checkpoint`` into ``model`` on ``tp`` real processes, once per job; one ``TPRun``
    per job. ``model`` builds each rank's model from the header and the job's behaviours
    (``loadkit.executor.results.ModelFactory``).

    ``checkpoint`` may be one path per rank (a rank whose copy lacks a shard then fails with
    the file named). A rank's failure is in its ``RankResult``; a launch in which every rank
    died before reporting anything raises ``TensorParallelError`` (in a script, call this under
    ``if __name__ == "__main__":``: the rank processes import the script). ``timeout`` bounds
    the whole call; ``collective_timeout`` bounds each wait for the other ranks. ``progress``
    shows a bar per rank (bytes streamed) for long loads.

    >>> from loadkit.models.llama import model_from_checkpoint as llama
    >>> runs = run_tensor_parallel("ckpt.safetensors", 2, model=llama)  # doctest: +SKIP
    >>> runs[0].raise_for_errors().logits.shape  # doctest: +SKIP
    (8, 100)
    """
    spec = _launch_spec(
        checkpoint,
        tp,
        jobs,
        model=model,
        input_ids=input_ids,
        collective_timeout=collective_timeout,
        track_rows=track_rows,
        fault=fault,
        backend=backend,
        threads=threads,
    )
    # A tp that cannot work fails here, before any process.
    check_tensor_parallel(spec.checkpoints[0], tp, model)
    return _launch(spec, timeout=timeout, progress=progress, start_method=start_method)


def _launch_spec(
    checkpoint: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    tp: int,
    jobs: Sequence[Job] | None,
    *,
    model: ModelFactory,
    input_ids: Sequence[int],
    collective_timeout: float,
    track_rows: bool,
    fault: Fault | None,
    backend: str,
    threads: int,
) -> LaunchSpec:
    """What every rank process is given, the arguments checked."""
    if tp < 1:
        raise TensorParallelError(f"tp must be at least 1, not {tp}")
    paths = (
        [str(checkpoint)] * tp
        if isinstance(checkpoint, (str, os.PathLike))
        else [str(p) for p in checkpoint]
    )
    if len(paths) != tp:
        raise TensorParallelError(f"{len(paths)} checkpoint paths given for {tp} ranks")
    jobs = list(jobs) if jobs is not None else [Job()]
    if not jobs:
        raise TensorParallelError("no jobs to run")
    return LaunchSpec(
        checkpoints=tuple(paths),
        tp=tp,
        jobs=tuple(jobs),
        input_ids=tuple(int(i) for i in input_ids),
        model=model,
        backend=backend,
        collective_timeout=collective_timeout,
        track_rows=track_rows,
        threads=threads,
        fault=fault,
    )


def _launch(spec: LaunchSpec, *, timeout: float, progress: bool, start_method: str) -> list[TPRun]:
    """Start the rank processes, watch them to the end, and collect one ``TPRun`` per job."""
    tp, first = spec.tp, spec.checkpoints[0]
    # The launcher owns the rendezvous store: bound to port 0 on loopback, a free port per run.
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        None,
        True,
        timedelta(seconds=spec.collective_timeout),
        wait_for_workers=False,
    )
    ctx = _context(start_method)
    results_queue = ctx.Queue()
    procs = [
        ctx.Process(
            target=run_rank,
            args=(r, spec, store.port, os.getpid(), results_queue),
            name=f"loadkit-tp{tp}-rank{r}",
            daemon=True,
        )
        for r in range(tp)
    ]
    watch = _Watch(procs, spec)
    bars = _Bars(spec, open_checkpoint(first).total_bytes) if progress else None
    try:
        for p in procs:
            p.start()
        _supervise(watch, results_queue, store, bars, timeout)
    finally:
        _end(procs)
        if bars is not None:  # the ranks may have finished between two polls: final counts
            bars.update(store, _current_job(watch))
            bars.close()
        results_queue.close()
    _raise_if_none_reported(watch)
    return _collect(watch, first)


def _raise_if_none_reported(watch: _Watch) -> None:
    """Every rank died before reporting anything: nothing was loaded, and a list of dead ranks
    handed back would read as results. The usual cause is a script without the main guard: each
    rank imports the script (spawn, forkserver) and runs the launch again, which fails."""
    if watch.results or watch.fatal:
        return
    if any(watch.gone.get(r, ("",))[0] != "died" for r in range(watch.spec.tp)):
        return
    deaths = "; ".join(f"rank {r}: {watch.gone[r][1]}" for r in range(watch.spec.tp))
    raise TensorParallelError(
        f"every rank died before reporting ({deaths}); their errors are above. A script that "
        'calls run_tensor_parallel must call it under `if __name__ == "__main__":`: each rank '
        "process imports the script"
    )


def _supervise(watch: _Watch, q: Any, store: Any, bars: _Bars | None, timeout: float) -> None:
    spec = watch.spec
    deadline = time.monotonic() + timeout
    # After a first failure, the others get one collective timeout (and a margin) to report.
    grace = spec.collective_timeout + 2.0
    while watch.pending():
        try:
            watch.take(q.get(timeout=0.1))
            continue
        except queue_module.Empty:
            pass
        if bars is not None:
            bars.update(store, _current_job(watch))
        now = time.monotonic()
        for r in watch.pending():
            p = watch.procs[r]
            if not p.is_alive():
                _drain(watch, q)
                if r in watch.pending():
                    watch.gone[r] = ("died", f"{_exit_text(p.exitcode)} without reporting")
                    watch.failed()
                    _post_for_the_dead(watch, store, r)
        if watch.first_failure is not None and now > watch.first_failure + grace:
            for r in watch.pending():
                watch.gone[r] = ("killed", f"no report within {grace:g} s of the first failure")
            return
        if now > deadline:
            for r in watch.pending():
                watch.gone[r] = ("killed", f"still running after the {timeout:g} s timeout")
            return


def _post_for_the_dead(watch: _Watch, store: Any, rank: int) -> None:
    # The others wait for every rank's load status: post the dead rank's, so they learn at once
    # instead of after the collective timeout.
    for j in range(len(watch.spec.jobs)):
        if (j, rank) not in watch.results:
            store.set(f"status/{j}/{rank}", watch.gone[rank][1])


def _drain(watch: _Watch, q: Any) -> None:
    while True:
        try:
            watch.take(q.get(timeout=0.2))
        except queue_module.Empty:
            return


def _end(procs: list[Any]) -> None:
    """No rank outlives the launcher: terminate, then kill, whatever is still running."""
    started = [p for p in procs if p.pid is not None]
    for p in started:
        if p.is_alive():
            p.terminate()
    for p in started:
        p.join(timeout=3)
        if p.is_alive():
            p.kill()
            p.join(timeout=3)


def _collect(watch: _Watch, checkpoint: str) -> list[TPRun]:
    spec = watch.spec
    runs = []
    for j, job in enumerate(spec.jobs):
        ranks = []
        for r in range(spec.tp):
            res = watch.results.get((j, r))
            if res is None:
                res = RankResult(r, spec.tp, job, status="died")
                if r in watch.fatal:
                    res.status, res.error = "load error", watch.fatal[r]
                elif r in watch.gone:
                    res.status, res.error = watch.gone[r]
                else:
                    res.error = "never reached this job (an earlier job's failure ended the run)"
            ranks.append(res)
        pids = tuple(p.pid for p in watch.procs if p.pid is not None)
        runs.append(TPRun(spec.tp, job, ranks, checkpoint, pids))
    return runs


def run_one(
    checkpoint: str | os.PathLike[str] | Path,
    tp: int,
    job: Job | None = None,
    *,
    model: ModelFactory,
    **kwargs: Any,
) -> TPRun:
    """``run_tensor_parallel`` for a single job (all bugs fixed unless ``job`` says otherwise)."""
    return run_tensor_parallel(checkpoint, tp, [job or Job()], model=model, **kwargs)[0]
