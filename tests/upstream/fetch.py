"""Fetch the reference upstream: the ``vllm==0.28.0`` wheel, read but never installed.

``python tests/upstream/fetch.py`` (``make test-upstream`` runs it first) makes sure the wheel is
in the cache and that the few upstream source files the differential tests run are extracted next
to it. Every step is verified: pip checks the wheel against the index's sha256 (pinned below, in
hash-checking mode), a cached wheel is hashed again before it is reused, and every extracted file
is checked against the wheel's own RECORD. Anything missing or wrong fails with a non-zero exit
and says why: the suite never skips because the index was unreachable.

The cache lives outside the repository, shared by every clone and worktree on the machine:
``$LOADKIT_UPSTREAM_CACHE``, else ``$XDG_CACHE_HOME/loadkit/upstream``, else
``~/.cache/loadkit/upstream``. The wheel needs CUDA to import, so it is never installed; the
harness (``tests/upstream/harness.py``) executes the extracted source files' own definitions.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

VERSION = "0.28.0"
WHEEL = f"vllm-{VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl"
# The index's sha256 for WHEEL (https://pypi.org/simple/vllm/); pip refuses anything else.
WHEEL_SHA256 = "addb0ffdaafd8155d75e9b3f5ddb3da28fdee9e8a7097ede91f7db2e9e1a3889"
RECORD = f"vllm-{VERSION}.dist-info/RECORD"

# The upstream files the harness reads (paths inside the wheel).
SOURCES = (
    "vllm/model_executor/models/utils.py",
    "vllm/model_executor/models/adapters.py",
    "vllm/model_executor/model_loader/weight_utils.py",
    "vllm/model_executor/model_loader/reload/__init__.py",
    "vllm/model_executor/model_loader/reload/layerwise.py",
    "vllm/model_executor/model_loader/reload/meta.py",
    "vllm/model_executor/model_loader/reload/sanitize.py",
    "vllm/model_executor/model_loader/reload/torchao_decorator.py",
    "vllm/model_executor/model_loader/reload/types.py",
    "vllm/model_executor/model_loader/reload/utils.py",
    # The Transformers modeling backend (tests/upstream/hf_backend.py)
    "vllm/model_executor/models/transformers/__init__.py",
    "vllm/model_executor/models/transformers/base.py",
    "vllm/model_executor/models/transformers/causal.py",
    "vllm/model_executor/models/transformers/legacy.py",
    "vllm/model_executor/models/transformers/pooling.py",
    "vllm/model_executor/model_loader/default_loader.py",
    "vllm/config/model.py",
    "vllm/config/utils.py",
)
MARKER = "extracted.json"


class UpstreamFetchError(RuntimeError):
    """The reference wheel could not be fetched, verified or read."""


def cache_dir() -> Path:
    explicit = os.environ.get("LOADKIT_UPSTREAM_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "loadkit" / "upstream"


def source_dir(cache: Path | None = None) -> Path:
    """Where the extracted files live: ``<cache>/vllm-0.28.0-src/vllm/...``."""
    return (cache or cache_dir()) / f"vllm-{VERSION}-src"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _record_digest(data: bytes) -> str:
    # RECORD stores urlsafe base64 of the sha256, without padding (PEP 376 / wheel spec).
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def ensure_wheel(cache: Path | None = None, log=print) -> Path:
    """The verified wheel in the cache, downloaded with ``pip download --no-deps`` if absent."""
    cache = cache or cache_dir()
    wheel = cache / WHEEL
    if wheel.exists():
        digest = sha256_file(wheel)
        if digest == WHEEL_SHA256:
            return wheel
        log(f"fetch: cached {wheel} has sha256 {digest}, not {WHEEL_SHA256}: downloading again")
        wheel.unlink()
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix="download-") as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(f"vllm=={VERSION} --hash=sha256:{WHEEL_SHA256}\n")
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes",
            # The x86-64 Linux wheel on every machine: the bytes (and the pinned hash) do not
            # depend on where the tests run. Its Python source is all the harness reads.
            "--only-binary=:all:", "--platform", "manylinux_2_28_x86_64",
            "--python-version", "3.11", "--implementation", "cp",
            # No second copy in pip's own HTTP cache: this cache is the one that is kept.
            "--no-cache-dir", "--dest", str(Path(tmp) / "out"), "-r", str(req),
        ]  # fmt: skip
        log(f"fetch: {' '.join(cmd[1:])}")
        start = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.monotonic() - start
        got = Path(tmp) / "out" / WHEEL
        if proc.returncode != 0 or not got.exists():
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise UpstreamFetchError(
                f"pip download of vllm=={VERSION} failed (exit {proc.returncode}) after "
                f"{seconds:.1f} s; the differential tests need the wheel from the package "
                f"index.\n{tail}"
            )
        digest = sha256_file(got)
        if digest != WHEEL_SHA256:  # pip checked already; this guards a changed pip config
            raise UpstreamFetchError(f"downloaded {WHEEL} has sha256 {digest}, not {WHEEL_SHA256}")
        shutil.move(got, wheel)
        mib = wheel.stat().st_size / 2**20
        log(f"fetch: downloaded {WHEEL} ({mib:.1f} MiB) in {seconds:.1f} s")
    return wheel


def _extracted_ok(src: Path) -> bool:
    marker = src / MARKER
    if not marker.exists():
        return False
    try:
        recorded = json.loads(marker.read_text())
    except ValueError:
        return False
    if recorded.get("wheel_sha256") != WHEEL_SHA256 or set(recorded.get("files", {})) != set(
        SOURCES
    ):
        return False
    for path, digest in recorded["files"].items():
        f = src / path
        if not f.exists() or _record_digest(f.read_bytes()) != digest:
            return False
    return True


def ensure_sources(cache: Path | None = None, log=print) -> Path:
    """The extracted upstream sources, each verified against the wheel's RECORD."""
    cache = cache or cache_dir()
    src = source_dir(cache)
    if _extracted_ok(src):
        return src
    wheel = ensure_wheel(cache, log)
    with zipfile.ZipFile(wheel) as zf:
        rows = csv.reader(io.StringIO(zf.read(RECORD).decode()))
        record = {row[0]: row[1] for row in rows if row and row[1]}
        files: dict[str, str] = {}
        if src.exists():
            shutil.rmtree(src)
        for path in SOURCES:
            if path not in record:
                raise UpstreamFetchError(f"{WHEEL}: {path} is not in its RECORD")
            data = zf.read(path)
            algo, _, digest = record[path].partition("=")
            if algo != "sha256" or _record_digest(data) != digest:
                raise UpstreamFetchError(f"{WHEEL}: {path} does not match its RECORD hash")
            out = src / path
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
            files[path] = digest
    (src / MARKER).write_text(
        json.dumps({"wheel": WHEEL, "wheel_sha256": WHEEL_SHA256, "files": files}, indent=1)
    )
    log(f"fetch: extracted {len(SOURCES)} files into {src}")
    return src


def main() -> int:
    start = time.monotonic()
    try:
        src = ensure_sources()
    except UpstreamFetchError as exc:
        print(f"fetch: ERROR: {exc}", file=sys.stderr)
        return 1
    print(f"fetch: vllm=={VERSION} sources ready in {src} ({time.monotonic() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
