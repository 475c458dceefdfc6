"""What the notebooks draw: one module per notebook, reachable from tests.

A story only draws: the notebook makes the loads (or the inspection) in its own cells and hands
the results, or its own function for the widgets to call again, to the story
(``tests/test_architecture.py`` fails if a story calls what a notebook investigates).

The stories load the checkpoints committed in the repository's ``data/`` folder. The library
does not know where that is (an installed loadkit has no repository next to it): the folder is
``$LOADKIT_DATA`` when set, else the ``data/`` (the one holding ``generate.py``) of the current
folder or of the nearest folder above it, which is the repository's for a notebook run in
``notebooks/`` and for a test run in the repository.
"""

from __future__ import annotations

import os
from pathlib import Path

from loadkit.errors import LoadkitError


def find_data(start: str | os.PathLike[str] | None = None) -> Path:
    """The repository's ``data/`` folder, as found from ``start`` (the current folder).

    >>> find_data("notebooks") == find_data(".")  # in the repository
    True
    """
    if os.environ.get("LOADKIT_DATA"):
        return Path(os.environ["LOADKIT_DATA"]).resolve()
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "data" / "generate.py").is_file():
            return folder / "data"
    raise LoadkitError(
        f"no data/ folder with generate.py in {here} or above it: run the notebooks from the "
        "loadkit repository, or set LOADKIT_DATA to its data/ folder"
    )


# The committed checkpoints the stories load.
DATA_DIR = find_data()
