"""Runs one command (the JupyterLab server) and ends it, with everything it started, when its
parent (the test process) ends, however that ends: a clean exit, Ctrl-C, a timeout, SIGKILL.

    python lab_guard.py --parent PID -- jupyter lab ...

The guard starts the command in a session of its own and, every ``POLL`` seconds, notes the
command's descendants (the kernels run in sessions of their own, so a process-group signal alone
would miss them). When the parent is gone (this process is re-parented), or on SIGTERM/SIGINT, it
sends SIGTERM to the command (JupyterLab then shuts its kernels down), waits ``GRACE`` seconds,
then SIGKILLs the command's group and every descendant it noted that is still alive. It exits with
the command's status.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import psutil

POLL = 0.2  # seconds between looks at the parent and the descendants
PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent ends
GRACE = 15.0  # seconds JupyterLab gets to stop its kernels before the rest is killed


def dies_with_parent(parent: int) -> Callable[[], None]:
    """A ``preexec_fn`` for a nested run (a pytest run a test starts): the child is SIGKILLed
    when ``parent``, the process starting it, ends, however it ends (SIGKILL included), so it
    never outlives the test that started it; its own children then end as when it is killed
    (the lab under its guard, Chromium with its driver's pipe). Linux's ``PR_SET_PDEATHSIG``;
    the browser tests need Debian's Chromium, so Linux is where they run."""

    def arm() -> None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
            os._exit(127)  # cannot promise it: do not start at all
        if os.getppid() != parent:  # the parent ended before the promise was made
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def stop_tree(proc: subprocess.Popen[bytes], noted: dict[int, psutil.Process]) -> None:
    """SIGTERM to ``proc``, then SIGKILL to its group and to every noted descendant left."""
    for p in _descendants(proc.pid):
        noted.setdefault(p.pid, p)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=GRACE)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the group id is its pid
    except ProcessLookupError:
        pass
    if proc.poll() is None:
        proc.wait(timeout=10)
    alive = [p for p in noted.values() if p.is_running()]
    for p in alive:
        try:
            p.kill()  # psutil checks the pid still names the same process (its start time)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parent", type=int, required=True, help="the pid to outlive no longer")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")

    stopping = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    proc = subprocess.Popen(command, start_new_session=True)
    noted: dict[int, psutil.Process] = {}
    try:
        while not stopping and proc.poll() is None and os.getppid() == args.parent:
            for p in _descendants(proc.pid):
                noted.setdefault(p.pid, p)
            time.sleep(POLL)
    finally:
        stop_tree(proc, noted)
    return proc.returncode if proc.returncode is not None else 1


if __name__ == "__main__":
    sys.exit(main())
