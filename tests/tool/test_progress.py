"""The progress bar: on stderr, for an inspect that runs over 2 seconds, only on a terminal.

The command runs in a fresh process whose stderr is a pseudo-terminal (``pty``, 100 columns)
and whose stdout is a pipe, so what the bar draws and what the report prints are read apart.
"""

import json
import os
import pty
import select
import subprocess
import sys
import termios
import time

import pytest

from loadkit_inspect.inspector import inspect_checkpoint
from loadkit_inspect.progress import Progress, progress_delay

FOLDER = "data/plamo2/tied-with-lm-head"  # two shards


def run(*args, tty=True, env=None, timeout=300):
    """``loadkit inspect ARGS``: (exit status, stdout, stderr), stderr on a
    pseudo-terminal when ``tty``, else on a pipe."""
    return run_python("-m", "loadkit_inspect", "inspect", *args, tty=tty, env=env, timeout=timeout)


def run_python(*args, tty=True, env=None, timeout=300):
    """``python ARGS`` as ``run`` runs it."""
    environ = {k: v for k, v in os.environ.items() if k != "LOADKIT_PROGRESS_DELAY"}
    environ.update(env or {})
    cmd = [sys.executable, *map(str, args)]
    if not tty:
        done = subprocess.run(cmd, capture_output=True, env=environ, timeout=timeout)
        return done.returncode, done.stdout, done.stderr
    master, slave = pty.openpty()
    termios.tcsetwinsize(slave, (24, 100))  # a terminal has a size: tqdm draws to its width
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, env=environ)
    os.close(slave)
    stdout = proc.stdout.fileno()
    out = {stdout: b"", master: b""}
    deadline = time.monotonic() + timeout
    try:
        reading = set(out)
        while reading:
            ready, _, _ = select.select(list(reading), [], [], 1)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{cmd} took over {timeout} s")
            for fd in ready:
                try:
                    chunk = os.read(fd, 1 << 16)
                except OSError:  # the terminal's other end closed: the process is done with it
                    chunk = b""
                if chunk:
                    out[fd] += chunk
                else:
                    reading.discard(fd)
        status = proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        os.close(master)
    return status, out[stdout], out[master]


def test_a_quick_inspect_draws_nothing_even_on_a_terminal():
    status, out, err = run(FOLDER)
    assert status == 0 and err == b""
    assert b"2 files, 30 tensors" in out


def test_a_quick_inspect_does_not_import_tqdm():
    code = (
        "import sys\n"
        "from loadkit_inspect.cli.main import main\n"
        f"status = main(['inspect', {FOLDER!r}])\n"
        "print('tqdm imported:', 'tqdm' in sys.modules)\n"
    )
    status, out, err = run_python("-c", code)
    assert (status, err) == (0, b"")
    assert out.endswith(b"tqdm imported: False\n")
    status, out, err = run_python("-c", code, env={"LOADKIT_PROGRESS_DELAY": "0"})
    assert out.endswith(b"tqdm imported: True\n") and b"reading headers" in err  # it looks


def test_the_bar_counts_shards_when_the_delay_is_lowered():
    status, out, err = run(FOLDER, env={"LOADKIT_PROGRESS_DELAY": "0"})
    assert status == 0
    assert b"reading headers" in err and b"/2 [" in err and b"shard" in err
    assert (status, out) == run(FOLDER, tty=False)[:2]  # the report is the same


@pytest.mark.parametrize(
    "args, tty", [((FOLDER, "--json"), True), ((FOLDER,), False), ((FOLDER, "--json"), False)]
)
def test_no_bar_with_json_or_where_stderr_is_no_terminal(args, tty):
    status, out, err = run(*args, tty=tty, env={"LOADKIT_PROGRESS_DELAY": "0"})
    assert status == 0 and err == b""
    if "--json" in args:
        assert json.loads(out)["checkpoint"]["tensor_count"] == 30


def test_a_delay_that_is_no_number_is_a_usage_error():
    status, out, err = run(FOLDER, env={"LOADKIT_PROGRESS_DELAY": "soon"})
    assert status == 2 and out == b""
    assert b"LOADKIT_PROGRESS_DELAY='soon': not a number of seconds" in err


def test_the_api_draws_a_bar_only_when_asked(capfd, monkeypatch):
    monkeypatch.setenv("LOADKIT_PROGRESS_DELAY", "0")
    inspect_checkpoint(FOLDER)
    assert capfd.readouterr().err == ""
    inspect_checkpoint(FOLDER, progress=True)
    assert "reading headers" in capfd.readouterr().err


def test_the_delay_counts_from_the_start_of_the_inspect(capfd):
    progress = Progress(delay=0.2)
    count = progress.stage("dry load", "name")
    count(0, 10)
    assert capfd.readouterr().err == ""  # 0.2 s have not passed
    time.sleep(0.25)
    count(5, 10)
    progress.close()
    assert "dry load" in capfd.readouterr().err


def test_the_delay_is_read_from_the_environment():
    assert progress_delay({}) == 2.0
    assert progress_delay({"LOADKIT_PROGRESS_DELAY": " 0.5 "}) == 0.5
    for bad in ("-1", "inf", "nan", "2s"):
        with pytest.raises(ValueError, match="not a number of seconds"):
            progress_delay({"LOADKIT_PROGRESS_DELAY": bad})


@pytest.mark.slow
def test_a_long_inspect_shows_its_dry_load_on_a_terminal(large_layout_bench, tmp_path):
    # DeepSeek-V3's layout (91,991 names in 163 sparse shards) against a model without
    # parameters: the dry load feeds every name. A fast machine finishes it within the default
    # 2 s, so the bar is asked for from the start here (the delay has tests of its own).
    folder = tmp_path / "deepseek-v3"
    n, _ = large_layout_bench.write_layout(folder, large_layout_bench.CONFIG)
    args = (folder, "--model", "torch.nn:Module")
    status, out, err = run(*args, env={"LOADKIT_PROGRESS_DELAY": "0"})
    assert status == 1
    assert b"dry load" in err and f"/{n} [".encode() in err and b"name/s" in err
    assert b"\r" in err  # redrawn in place
    assert (status, out, b"") == run(*args, tty=False)  # stdout the same, stderr empty
    # --json on a terminal: test_no_bar_with_json_or_where_stderr_is_no_terminal (delay 0)
