"""The differential suite's fixtures: the fetched upstream, and the tally printed at the end."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from upstream.common import CENSUS, EXAMPLES, TALLY, tally_json, tally_table
from upstream.fetch import WHEEL, WHEEL_SHA256, UpstreamFetchError, ensure_sources
from upstream.harness import Upstream, load_upstream


@pytest.fixture(scope="session")
def up() -> Upstream:
    # A session fixture that fails is not retried: one fetch attempt, then every test errors.
    try:
        src = ensure_sources()
    except UpstreamFetchError as exc:
        pytest.fail(f"cannot fetch the reference vLLM wheel: {exc}", pytrace=False)
    return load_upstream(src)


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
    return [
        f"upstream: {WHEEL} (sha256 {WHEEL_SHA256[:16]}...), {EXAMPLES} examples per property"
        + (", census mode (differences counted, not failed)" if CENSUS else "")
    ]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not TALLY:
        return
    terminalreporter.section("loadkit vs vLLM 0.28.0, per property")
    terminalreporter.write_line(tally_table())
    for prop, t in sorted(TALLY.items()):
        for what in t.first_unexplained:
            terminalreporter.write_line(f"  {prop}: {what}")
        for what in t.first_documented:
            terminalreporter.write_line(f"  {prop} (documented): {what}")
    out = os.environ.get("LOADKIT_UPSTREAM_TALLY")
    if out:
        Path(out).write_text(tally_json())
