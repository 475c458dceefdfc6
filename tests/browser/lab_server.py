"""JupyterLab started the way the README's `make lab` starts it, in a throwaway folder.

The command comes from the Makefile itself (`make -n lab`), so the browser tests follow the lab
command if it changes. Only what a test needs is added: no browser, no token, a free loopback port.
Every folder Jupyter and IPython write to lives under the given home, never in the user's.
The server runs under ``lab_guard.py``, which ends it and its kernels when the test process ends,
however it ends (a SIGKILLed pytest included).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data"
GUARD = Path(__file__).resolve().parent / "lab_guard.py"


def make_lab_command(repo: Path = REPO) -> list[str]:
    """The `jupyter lab ...` line that `make lab` runs, as an argument list."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    out = subprocess.run(
        ["make", "--no-print-directory", "-n", "lab"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # A stale setup stamp makes `make -n` list the setup steps first: the lab line is the last.
    lines = [ln for ln in out.splitlines() if " lab" in ln and "jupyter" in ln]
    if not lines:
        raise RuntimeError(f"`make -n lab` printed no `jupyter lab` line:\n{out}")
    argv = shlex.split(lines[-1])
    exe = Path(argv[0])
    if not exe.is_absolute():
        argv[0] = str(repo / exe)
    return argv


def lab_argv(notebook_dir: Path, port: int, repo: Path = REPO) -> list[str]:
    """`make lab`'s command pointed at ``notebook_dir``, headless, tokenless, on ``port``."""
    argv = make_lab_command(repo)
    dir_flags = [a for a in argv if a.startswith("--notebook-dir")]
    if len(dir_flags) != 1 or "=" not in dir_flags[0]:
        raise RuntimeError(f"expected one --notebook-dir=DIR in `make lab`'s command: {argv}")
    argv[argv.index(dir_flags[0])] = f"--notebook-dir={notebook_dir}"
    if os.geteuid() == 0 and "--allow-root" not in argv:
        argv.append("--allow-root")
    return [
        *argv,
        "--no-browser",
        "--IdentityProvider.token=",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        "--ip=127.0.0.1",
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def jupyter_env(home: Path, bin_dir: Path) -> dict[str, str]:
    """Environment that keeps Jupyter's, IPython's and temp folders under ``home``."""
    dirs = {
        "JUPYTER_CONFIG_DIR": home / "jupyter-config",
        "JUPYTER_DATA_DIR": home / "jupyter-data",
        "JUPYTER_RUNTIME_DIR": home / "jupyter-runtime",
        "JUPYTERLAB_SETTINGS_DIR": home / "lab-user-settings",
        "JUPYTERLAB_WORKSPACES_DIR": home / "lab-workspaces",
        "IPYTHONDIR": home / "ipython",
        "MPLCONFIGDIR": home / "matplotlib",
        "TMPDIR": home / "tmp",
        "HOME": home,
    }
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    # Pop-ups that would cover the notebook: the news, and the kernel choice on opening (the
    # setting is the dialog's own "Always start the preferred kernel" box).
    settings = {
        "apputils-extension/notification": {"fetchNews": "false"},
        "notebook-extension/tracker": {"autoStartDefaultKernel": True},
    }
    for plugin, values in settings.items():
        path = dirs["JUPYTERLAB_SETTINGS_DIR"] / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env = dict(os.environ, **{k: str(v) for k, v in dirs.items()})
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["JUPYTER_PLATFORM_DIRS"] = "1"
    # The notebooks run from copies in a temp folder: the stories are told where data/ is.
    env["LOADKIT_DATA"] = str(DATA)
    env.pop("JUPYTER_PATH", None)
    return env


class LabServer:
    """One JupyterLab server process; ``stop()`` ends it (and its kernels) by its own PID."""

    def __init__(self, notebook_dir: Path, home: Path, repo: Path = REPO) -> None:
        self.notebook_dir = notebook_dir
        self.home = home
        self.repo = repo
        self.log_path = home / "jupyter-lab.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.argv: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0, attempts: int = 3) -> None:
        for _ in range(attempts):
            self.port = free_port()
            self.argv = lab_argv(self.notebook_dir, self.port, self.repo)
            env = jupyter_env(self.home, Path(self.argv[0]).parent)
            with open(self.log_path, "ab") as log:
                log.write(f"$ {shlex.join(self.argv)}\n".encode())
                log.flush()
                self.proc = subprocess.Popen(
                    [sys.executable, str(GUARD), "--parent", str(os.getpid()), "--", *self.argv],
                    cwd=self.repo,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            if self._wait_ready(timeout):
                return
            self.stop()  # another process took the port between our probe and the bind: retry
        raise RuntimeError(f"JupyterLab did not start; its log: {self.log_path}")

    def _wait_ready(self, timeout: float) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/api/status", timeout=2) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        """SIGTERM to the guard: it stops the server (which shuts its kernels down), then kills
        whatever of theirs is left, and exits."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def pids(self) -> list[int]:
        """The guard's, the server's and its kernels' process ids (for the clean-up tests)."""
        if self.proc is None:
            return []
        try:
            guard = psutil.Process(self.proc.pid)
            return [guard.pid] + [p.pid for p in guard.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
