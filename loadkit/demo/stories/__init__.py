"""Scenario functions behind the notebooks: one module per notebook, reachable from tests.

Each module exposes ``main_records() -> dict[str, Record]``: exactly the records the notebook's
main old/new toggle swaps between.
"""

from pathlib import Path

# The repository's data/ folder: the committed checkpoints the stories load.
DATA_DIR = Path(__file__).resolve().parents[3] / "data"
