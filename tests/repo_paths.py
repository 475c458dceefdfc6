"""Where the repository's folders are, for tests in any folder below ``tests/``."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data"
NOTEBOOKS = REPO / "notebooks"
BENCHMARKS = REPO / "benchmarks"
