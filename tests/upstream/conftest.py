"""The differential suite's fixtures: the fetched upstream, and the tally printed at the end."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from upstream.common import CENSUS, EXAMPLES, TALLY, tally_json, tally_table
from upstream.fetch import OLD, PINS, REFERENCE, UpstreamFetchError, ensure_sources
from upstream.harness import Upstream, load_upstream


def upstream_at(version: str) -> Upstream:
    """vLLM ``version``'s code (fetched and extracted once, loaded once per process)."""
    try:
        src = ensure_sources(version)
    except UpstreamFetchError as exc:
        pytest.fail(f"cannot fetch the vLLM {version} wheel: {exc}", pytrace=False)
    return load_upstream(version, src)


@pytest.fixture(scope="session")
def up_at():
    """``up_at("0.31.0")``: any version's upstream (a version not in fetch.PINS is fetched
    without a pin)."""
    return upstream_at


# The version the properties compare with: the reference, or the release `make upstream-drift`
# follows (tests/upstream/drift.py sets it).
COMPARED = os.environ.get("LOADKIT_UPSTREAM_REFERENCE", REFERENCE)


@pytest.fixture(scope="session")
def up() -> Upstream:
    """The reference, vLLM 0.34.0: what loadkit's "new" behaviour and API follow (or the
    release ``LOADKIT_UPSTREAM_REFERENCE`` names, for ``make upstream-drift``)."""
    # A session fixture that fails is not retried: one fetch attempt, then every test errors.
    return upstream_at(COMPARED)


@pytest.fixture(scope="session")
def up_old() -> Upstream:
    """vLLM 0.28.0, where an "old" behaviour or API is pinned to it (skip_prefixes...)."""
    return upstream_at(OLD)


@pytest.fixture(autouse=True)
def _quiet_upstream_log(request):
    # Each test starts with an empty upstream log (properties clear it per example too).
    if "up" in request.fixturenames:
        request.getfixturevalue("up").log.clear()
    yield


def pytest_configure(config):
    # Both sides warn about what the generated cases do on purpose (a child's load_weights
    # returning None, layers left partly loaded): expected, and compared where it matters.
    config.addinivalue_line("filterwarnings", "ignore::UserWarning")


def pytest_report_header(config):
    pins = ", ".join(f"vllm {v} (sha256 {sha[:16]}...)" for v, sha in PINS.items())
    return [
        f"upstream: {pins}, {EXAMPLES} examples per property"
        + (", census mode (differences counted, not failed)" if CENSUS else "")
    ]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not TALLY:
        return
    terminalreporter.section(
        f"loadkit vs vLLM {COMPARED}, per property (another version where the property says)"
    )
    terminalreporter.write_line(tally_table())
    for prop, t in sorted(TALLY.items()):
        for what in t.first_unexplained:
            terminalreporter.write_line(f"  {prop}: {what}")
        for what in t.first_documented:
            terminalreporter.write_line(f"  {prop} (documented): {what}")
    out = os.environ.get("LOADKIT_UPSTREAM_TALLY")
    if out:
        Path(out).write_text(tally_json())
