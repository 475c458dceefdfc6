"""Scenario functions behind the notebooks: one module per notebook, reachable from tests.

Each module exposes ``main_records() -> dict[str, Record]``: exactly the records the notebook's
main old/new toggle swaps between.
"""

# The repository's data/ folder: the committed checkpoints the stories load.
from loadkit.models._common import DATA_DIR as DATA_DIR
