import pytest

from loadkit_notebooks.stories import debug


@pytest.fixture
def in_notebooks(monkeypatch):
    """Run in notebooks/, as a notebook does (its paths are relative to it)."""
    monkeypatch.chdir(debug.DATA.parent / "notebooks")
