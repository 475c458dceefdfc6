"""What each rank process runs (``loadkit.executor.launcher`` starts ``tp`` of them).

Per job: build the model for this rank, load the checkpoint from a streaming iterator (one
reused read buffer), recording the copies, the per-layer counters and the anonymous memory; post
this rank's load status in the store; wait (with a timeout) for every rank's status; run the
forward only if every rank loaded. A rank that failed to load therefore never leaves the others
waiting in a collective, and a rank that is gone is named by the one that waited for it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from loadkit.checkpoint.reader import open_checkpoint
from loadkit.errors import LoadkitError
from loadkit.executor.results import Fault, Job, ModelFactory, RankResult
from loadkit.parallel.holdings import HoldingsRecorder
from loadkit.parallel.state import TPGroup, destroy_tp_group, init_tp_group, use_group


@dataclass(frozen=True)
class LaunchSpec:
    """Everything a rank needs; sent to each process when it starts."""

    checkpoints: tuple[str, ...]  # one per rank
    tp: int
    jobs: tuple[Job, ...]
    input_ids: tuple[int, ...]
    model: ModelFactory
    backend: str = "gloo"
    collective_timeout: float = 30.0
    track_rows: bool = True
    threads: int = 1
    fault: Fault | None = None


def rss_anon_bytes() -> int:
    """This process's anonymous resident memory (``RssAnon``): page-cache pages of the
    checkpoint file do not count, the model's tensors and any copies do."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0  # not Linux: memory is not measured


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _exit_with_launcher(launcher: int) -> None:
    # A rank must not outlive the launcher: if it is killed, the ranks follow within a second.
    # (Under forkserver the rank's parent is the server, which exits with the launcher.)
    parent = os.getppid()

    def watch() -> None:
        while True:
            if os.getppid() != parent or not _alive(launcher):
                os._exit(3)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True).start()


class _Stream:
    """The checkpoint stream as a rank consumes it: counts, memory samples, progress, faults."""

    def __init__(self, rank: int, job_index: int, store: Any, fault: Fault | None) -> None:
        self.rank, self.job_index, self.store, self.fault = rank, job_index, store, fault
        self.count = 0
        self.key: str | None = None
        self.peak = rss_anon_bytes()

    def _inject(self) -> None:
        f = self.fault
        if f is None or f.rank != self.rank or f.job != self.job_index:
            return
        if self.count != f.after_tensors:
            return
        if f.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if f.kind == "hang":
            time.sleep(3600)
        raise RuntimeError(f"injected fault after {self.count} tensors")

    def __call__(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            self._inject()
            self.key = name
            self.peak = max(self.peak, rss_anon_bytes())
            yield name, tensor
            self.count += 1
            self.peak = max(self.peak, rss_anon_bytes())  # after the loader copied it
            self.store.add(f"progress/{self.job_index}/{self.rank}", tensor.nbytes)


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if not isinstance(exc, LoadkitError):
        frame = traceback.extract_tb(exc.__traceback__)[-1:]
        if frame:
            text += f" (at {os.path.basename(frame[0].filename)}:{frame[0].lineno})"
    return text


def _wait_for_statuses(store: Any, job_index: int, tp: int, timeout: float) -> dict[int, str]:
    """Every rank's load status; a rank that posts none within ``timeout`` is reported missing."""
    keys = [f"status/{job_index}/{r}" for r in range(tp)]
    try:
        store.wait(keys, timedelta(seconds=timeout))
    except Exception:  # the store's timeout error: find out who is missing
        pass
    out = {}
    for r, key in enumerate(keys):
        out[r] = (
            store.get(key).decode()
            if store.check([key])
            else (f"posted no load status within {timeout:g} s (dead or hung)")
        )
    return out


def _run_job(spec: LaunchSpec, group: TPGroup, store: Any, job_index: int) -> RankResult:
    rank, job = group.rank, spec.jobs[job_index]
    result = RankResult(rank, spec.tp, job)
    stream = _Stream(rank, job_index, store, spec.fault)
    result.anon_baseline = stream.peak
    model = None
    start = time.perf_counter()
    try:
        with use_group(group):
            ck = open_checkpoint(spec.checkpoints[rank])
            model = job.build(spec.model, ck.tensors)
            result.param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
            weights = stream(ck.weights(reuse_buffer=True))
            if spec.track_rows:
                with HoldingsRecorder(model) as rec:
                    try:
                        model.load_weights(rec.watch(weights))
                    finally:
                        result.records = rec.records
                        result.loaded_per_layer = rec.loaded_per_layer()
            else:
                model.load_weights(weights)
    except Exception as exc:
        where = f" while loading checkpoint key '{stream.key}'" if stream.key else ""
        result.status, result.error = "load error", f"{_describe(exc)}{where}"
    result.load_seconds = time.perf_counter() - start
    result.tensors_read, result.anon_peak = stream.count, max(stream.peak, rss_anon_bytes())
    ledger = getattr(model, "ledger", None)
    result.ledger = ledger.as_dict() if ledger is not None else None

    store.set(f"status/{job_index}/{rank}", "ok" if result.status == "ok" else result.error)
    statuses = _wait_for_statuses(store, job_index, spec.tp, spec.collective_timeout)
    failed = {r: s for r, s in statuses.items() if s != "ok" and r != rank}
    if result.status != "ok":
        return result
    if failed:
        result.status = "skipped"
        result.error = "no forward: " + "; ".join(f"rank {r} {s}" for r, s in failed.items())
        return result
    try:
        assert model is not None  # the load succeeded on every rank, so it was built
        with use_group(group), torch.no_grad():
            logits = model(torch.tensor(spec.input_ids, dtype=torch.long))
        result.logits = logits.float().numpy()
    except Exception as exc:
        result.status, result.error = "forward error", _describe(exc)
    return result


def run_rank(rank: int, spec: LaunchSpec, port: int, launcher: int, queue: Any) -> None:
    """Entry point of rank ``rank``: joins the group, runs every job, reports each on ``queue``."""
    _exit_with_launcher(launcher)
    torch.set_num_threads(spec.threads)
    # Only the loopback interface: the group never reaches beyond this machine.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        store = dist.TCPStore(
            "127.0.0.1", port, None, False, timedelta(seconds=spec.collective_timeout)
        )
        group = init_tp_group(
            rank,
            spec.tp,
            dist.PrefixStore("pg", store),
            backend=spec.backend,
            timeout_s=spec.collective_timeout,
        )
        for j in range(len(spec.jobs)):
            queue.put(("result", rank, j, _run_job(spec, group, store, j)))
        destroy_tp_group()
    except Exception as exc:
        queue.put(("fatal", rank, _describe(exc)))
        return
    queue.put(("done", rank, None))
