"""Fetch the reference upstreams: vLLM wheels, read but never installed.

``python tests/upstream/fetch.py`` (``make test-upstream`` runs it first) makes sure each pinned
wheel (``PINS``) is in the cache and that the upstream source files the differential tests run
are extracted next to it, one folder per version. Every step is verified: pip checks the wheel
against the index's sha256 (pinned below, in hash-checking mode), a cached wheel is hashed again
before it is reused, and every extracted file is checked against the wheel's own RECORD. Anything
missing or wrong fails with a non-zero exit and says why: the suite never skips because the index
was unreachable.

``python tests/upstream/fetch.py --version 0.31.0`` fetches one version. A version that is not
pinned (``make upstream-drift VLLM=X.Y.Z``) is downloaded without a pin: pip still checks the
sha256 the index publishes beside the file, and the digest is printed so that it can be pinned.

Adding files or versions:

- a version: one line in ``PINS`` (its sha256 as the index lists it);
- files every version has: a path or a glob in ``SOURCES`` (``vllm/model_executor/models/*.py``
  takes the directory's Python files as the wheel's RECORD lists them);
- files only some versions have: ``SOURCES_BY_VERSION``.

A version's folder only grows: files extracted for one worktree's pattern list stay for
another's, and concurrent fetches of one version wait for each other (a lock file).

The cache lives outside the repository, shared by every clone and worktree on the machine:
``$LOADKIT_UPSTREAM_CACHE``, else ``$XDG_CACHE_HOME/loadkit/upstream``, else
``~/.cache/loadkit/upstream``. A wheel needs CUDA to import, so it is never installed; the
harness (``tests/upstream/harness.py``) executes the extracted source files' own definitions.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import csv
import fcntl
import fnmatch
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
from collections.abc import Iterator
from pathlib import Path

# The reference versions, each with the index's sha256 of its x86-64 Linux wheel
# (https://pypi.org/simple/vllm/); pip refuses anything else.
PINS = {
    # The last release with AutoWeightsLoader's skip_prefixes / skip_substrs: the "old"
    # behaviours pinned to it (docs/fidelity.md).
    "0.28.0": "addb0ffdaafd8155d75e9b3f5ddb3da28fdee9e8a7097ede91f7db2e9e1a3889",
    # Layerwise reload's padding rules, release by release (bug 6): 0.30.0 counts a padded
    # weight's every element, 0.31.0 only its weight_loader_numel.
    "0.30.0": "ef52ee58c410ead0b8afb190838fa4cbcb52075596f67862a03859d984966ac4",
    "0.31.0": "39132b433967f0962d03d8a5f633b9bee6b32708f566c7d5637b79f8d0ef3433",
    # The reference: what loadkit's "new" behaviour and API follow.
    "0.34.0": "79ca4b3cd74aec08c4bf476bdf0cb15735b605ae5368526a2faae1e30f044ca2",
}
REFERENCE = "0.34.0"  # the version loadkit mirrors
OLD = "0.28.0"  # kept where an "old" behaviour is pinned to it
DEFAULT_VERSIONS = (OLD, REFERENCE)  # what a plain `fetch.py` (make test-upstream) fetches

# The upstream files the harness reads (paths or globs inside the wheel), in every version.
SOURCES = (
    "vllm/model_executor/models/utils.py",
    "vllm/model_executor/models/adapters.py",
    "vllm/model_executor/model_loader/weight_utils.py",
    "vllm/model_executor/model_loader/reload/*.py",
    # The Transformers modeling backend (tests/upstream/hf_backend.py)
    "vllm/model_executor/models/transformers/__init__.py",
    "vllm/model_executor/models/transformers/base.py",
    "vllm/model_executor/models/transformers/causal.py",
    "vllm/model_executor/models/transformers/legacy.py",
    "vllm/model_executor/models/transformers/pooling.py",
    "vllm/model_executor/model_loader/default_loader.py",
    "vllm/model_executor/layers/linear.py",
    "vllm/model_executor/utils.py",
    "vllm/config/model.py",
    "vllm/config/utils.py",
    # which files the default loader reads (tests/upstream/test_file_choice_upstream.py)
    "vllm/transformers_utils/repo_utils.py",
)
# Files only some versions have (added to SOURCES for that version).
SOURCES_BY_VERSION: dict[str, tuple[str, ...]] = {
    # vLLM's registry and the native classes loadkit re-implements, with the layers their
    # load_weights call (tests/upstream/native_models.py, test_vllm_registry_upstream.py)
    "0.34.0": (
        "vllm/model_executor/models/registry.py",
        *(
            f"vllm/model_executor/models/{name}.py"
            for name in (
                "llama", "phi3", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "mixtral",
                "qwen2_moe", "qwen3_moe", "deepseek_v2", "gpt_oss", "qwen2_5_vl", "gpt2",
            )
        ),
        "vllm/model_executor/layers/fused_moe/routed_experts.py",
        "vllm/model_executor/layers/fused_moe/runner/moe_runner.py",
        "vllm/model_executor/layers/fused_moe/layer.py",
        "vllm/distributed/eplb/eplb_state.py",
    ),
}  # fmt: skip
MARKER = "extracted.json"


class UpstreamFetchError(RuntimeError):
    """A reference wheel could not be fetched, verified or read."""


def cache_dir() -> Path:
    explicit = os.environ.get("LOADKIT_UPSTREAM_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "loadkit" / "upstream"


def source_dir(version: str = REFERENCE, cache: Path | None = None) -> Path:
    """Where a version's extracted files live: ``<cache>/vllm-X.Y.Z-src/vllm/...``."""
    return (cache or cache_dir()) / f"vllm-{version}-src"


def sources(version: str) -> tuple[str, ...]:
    """The paths and globs extracted for ``version``."""
    return SOURCES + SOURCES_BY_VERSION.get(version, ())


def wheel_glob(version: str) -> str:
    return f"vllm-{version}-*.whl"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _record_digest(data: bytes) -> str:
    # RECORD stores urlsafe base64 of the sha256, without padding (PEP 376 / wheel spec).
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@contextlib.contextmanager
def _locked(cache: Path, version: str) -> Iterator[None]:
    """One fetch of ``version`` at a time on this machine (worktrees share the cache)."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".lock-{version}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _cached_wheel(cache: Path, version: str, log) -> Path | None:
    pin = PINS.get(version)
    for wheel in sorted(cache.glob(wheel_glob(version))):
        if pin is None:
            return wheel  # an unpinned version: pip checked it against the index's digest
        digest = sha256_file(wheel)
        if digest == pin:
            return wheel
        log(f"fetch: cached {wheel} has sha256 {digest}, not {pin}: downloading again")
        wheel.unlink()
    return None


def _pip_download(version: str, dest: Path) -> tuple[subprocess.CompletedProcess, float]:
    pin = PINS.get(version)
    req = dest.parent / "requirements.txt"
    req.write_text(f"vllm=={version}" + (f" --hash=sha256:{pin}" if pin else "") + "\n")
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps",
        *(["--require-hashes"] if pin else []),
        # The x86-64 Linux wheel on every machine: the bytes (and the pinned hash) do not
        # depend on where the tests run. Its Python source is all the harness reads.
        "--only-binary=:all:", "--platform", "manylinux_2_28_x86_64",
        "--python-version", "3.11", "--implementation", "cp",
        # No second copy in pip's own HTTP cache: this cache is the one that is kept.
        "--no-cache-dir", "--dest", str(dest), "-r", str(req),
    ]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return proc, time.monotonic() - start


def ensure_wheel(version: str = REFERENCE, cache: Path | None = None, log=print) -> Path:
    """The verified wheel of ``version`` in the cache, downloaded with ``pip download
    --no-deps`` if absent (hash-pinned when ``PINS`` has the version)."""
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    wheel = _cached_wheel(cache, version, log)
    if wheel is not None:
        return wheel
    pin = PINS.get(version)
    with tempfile.TemporaryDirectory(dir=cache, prefix="download-") as tmp:
        out = Path(tmp) / "out"
        log(f"fetch: pip download vllm=={version}" + (" (hash-pinned)" if pin else " (unpinned)"))
        proc, seconds = _pip_download(version, out)
        got = sorted(out.glob(wheel_glob(version))) if out.exists() else []
        if proc.returncode != 0 or len(got) != 1:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise UpstreamFetchError(
                f"pip download of vllm=={version} failed (exit {proc.returncode}) after "
                f"{seconds:.1f} s; the differential tests need the wheel from the package "
                f"index.\n{tail}"
            )
        digest = sha256_file(got[0])
        if pin is not None and digest != pin:  # pip checked already; guards a changed config
            raise UpstreamFetchError(f"downloaded {got[0].name} has sha256 {digest}, not {pin}")
        wheel = cache / got[0].name
        shutil.move(got[0], wheel)
        mib = wheel.stat().st_size / 2**20
        log(f"fetch: downloaded {wheel.name} ({mib:.1f} MiB, sha256 {digest}) in {seconds:.1f} s")
    return wheel


def _read_marker(src: Path) -> dict:
    try:
        return json.loads((src / MARKER).read_text())
    except (OSError, ValueError):
        return {}


def _extracted_ok(src: Path, version: str = REFERENCE) -> bool:
    """Every pattern of ``sources(version)`` extracted, every file equal to its RECORD hash."""
    recorded = _read_marker(src)
    pin = PINS.get(version)
    if recorded.get("version") != version:
        return False
    if pin is not None and recorded.get("wheel_sha256") != pin:
        return False
    if not set(sources(version)) <= set(recorded.get("patterns", ())):
        return False
    for path, digest in recorded.get("files", {}).items():
        f = src / path
        if not f.exists() or _record_digest(f.read_bytes()) != digest:
            return False
    return True


def _resolve(record: dict[str, str], patterns: list[str], wheel: str) -> list[str]:
    paths: list[str] = []
    for pattern in patterns:
        hits = sorted(p for p in record if fnmatch.fnmatchcase(p, pattern))
        if not hits:
            raise UpstreamFetchError(f"{wheel}: nothing in its RECORD matches {pattern}")
        paths.extend(p for p in hits if p not in paths)
    return paths


def _extract(wheel: Path, src: Path, patterns: list[str]) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as zf:
        record_name = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        rows = csv.reader(io.StringIO(zf.read(record_name).decode()))
        record = {row[0]: row[1] for row in rows if row and row[1]}
        files: dict[str, str] = {}
        for path in _resolve(record, patterns, wheel.name):
            data = zf.read(path)
            algo, _, digest = record[path].partition("=")
            if algo != "sha256" or _record_digest(data) != digest:
                raise UpstreamFetchError(f"{wheel.name}: {path} does not match its RECORD hash")
            out = src / path
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
            files[path] = digest
    return files


def ensure_sources(version: str = REFERENCE, cache: Path | None = None, log=print) -> Path:
    """``version``'s extracted upstream sources, each verified against the wheel's RECORD."""
    cache = cache or cache_dir()
    src = source_dir(version, cache)
    if _extracted_ok(src, version):
        return src
    with _locked(cache, version):
        if _extracted_ok(src, version):  # another process extracted it meanwhile
            return src
        wheel = ensure_wheel(version, cache, log)
        digest = sha256_file(wheel)
        kept = _read_marker(src)
        if kept.get("wheel_sha256") != digest:
            kept = {}
        patterns = list(dict.fromkeys([*kept.get("patterns", ()), *sources(version)]))
        if src.exists():
            shutil.rmtree(src)
        files = _extract(wheel, src, patterns)
        marker = {
            "version": version,
            "wheel": wheel.name,
            "wheel_sha256": digest,
            "patterns": patterns,
            "files": files,
        }
        (src / MARKER).write_text(json.dumps(marker, indent=1))
        log(f"fetch: extracted {len(files)} files of vllm=={version} into {src}")
    return src


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--version",
        action="append",
        help=f"a vLLM version (repeatable); default: {', '.join(DEFAULT_VERSIONS)}",
    )
    args = parser.parse_args(argv)
    start = time.monotonic()
    for version in args.version or DEFAULT_VERSIONS:
        try:
            src = ensure_sources(version)
        except UpstreamFetchError as exc:
            print(f"fetch: ERROR: {exc}", file=sys.stderr)
            return 1
        print(f"fetch: vllm=={version} sources ready in {src} ({time.monotonic() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
