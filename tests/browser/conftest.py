"""One JupyterLab server and one headless Chromium for the whole browser-test session.

The server serves COPIES of the notebooks from a temp folder (JupyterLab autosaves: it must never
write into the committed notebooks), laid out like the repository so ``../data`` still resolves.
Without Chromium at /usr/bin/chromium the browser tests are skipped and the run says so in one line.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from lab_server import REPO, LabServer

if TYPE_CHECKING:
    from lab_page import NotebookPage
    from playwright.sync_api import BrowserContext

HERE = Path(__file__).resolve().parent
CHROMIUM = Path("/usr/bin/chromium")

if importlib.util.find_spec("playwright") is None:
    SKIP_REASON: str | None = "Python playwright is not installed (make setup installs it)"
    collect_ignore = ["test_notebooks_in_browser.py"]
elif not CHROMIUM.exists():
    SKIP_REASON = f"no Chromium at {CHROMIUM} (apt-get install -y chromium; .ci/run installs it)"
else:
    SKIP_REASON = None


BROWSER_FIXTURES = {"browser", "lab", "open_notebook"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if SKIP_REASON:
        for item in items:
            uses_browser = BROWSER_FIXTURES & set(getattr(item, "fixturenames", ()))
            if HERE in Path(item.path).parents and uses_browser:
                item.add_marker(pytest.mark.skip(reason=f"browser tests skipped: {SKIP_REASON}"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    # pytest lists skip reasons only with -rs: this is the one line that says why, every time.
    if SKIP_REASON:
        terminalreporter.write_line(f"BROWSER TESTS SKIPPED: {SKIP_REASON}", yellow=True, bold=True)


@pytest.fixture(scope="session")
def lab_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``<tmp>/notebooks`` (copies) and ``<tmp>/data`` (a link to the repository's data)."""
    root = tmp_path_factory.mktemp("lab-root")
    shutil.copytree(
        REPO / "notebooks",
        root / "notebooks",
        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"),
    )
    (root / "data").symlink_to(REPO / "data", target_is_directory=True)
    return root


@pytest.fixture(scope="session")
def lab(lab_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    server = LabServer(lab_root / "notebooks", tmp_path_factory.mktemp("lab-home"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrowserContext]:
    from lab_page import CHROMIUM_ARGS
    from playwright.sync_api import sync_playwright

    home = tmp_path_factory.mktemp("chromium-home")
    for sub in ("tmp", "config", "cache"):
        (home / sub).mkdir()
    env = dict(
        os.environ,
        HOME=str(home),
        TMPDIR=str(home / "tmp"),
        XDG_CONFIG_HOME=str(home / "config"),
        XDG_CACHE_HOME=str(home / "cache"),
    )
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(home / "profile"),
            executable_path=str(CHROMIUM),
            args=CHROMIUM_ARGS,
            headless=True,
            env=env,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def open_notebook(
    lab: LabServer, browser: BrowserContext
) -> Iterator[Callable[[str], NotebookPage]]:
    """``open_notebook(name)`` -> a ``NotebookPage`` on the served copy; closed after the test."""
    from lab_page import NotebookPage

    pages: list[NotebookPage] = []

    def open_(name: str) -> NotebookPage:
        page = NotebookPage(browser, lab.url, name)
        pages.append(page)
        return page

    yield open_
    for page in pages:
        page.close()
