"""A notebook's own definitions, for tests: its code cells tagged ``define``, run as it runs them.

A bug notebook defines its experiment in a cell (``reload(behaviour, order)`` in 03, ...) and
hands that function to the widgets of ``loadkit_notebooks``. The story tests and the browser tests
take the same function from the notebook itself, so what they check is what the reader runs.
Cells run in the notebooks folder, as Jupyter runs them (relative paths resolve the same way).
"""

from __future__ import annotations

import contextlib
import functools
import json
from pathlib import Path
from typing import Any

from repo_paths import NOTEBOOKS

TAG = "define"


def defining_cells(name: str) -> list[str]:
    """The sources of the code cells of ``notebooks/<name>`` tagged ``define``, in order."""
    nb = json.loads((NOTEBOOKS / name).read_text())
    return [
        "".join(c["source"])
        for c in nb["cells"]
        if c["cell_type"] == "code" and TAG in c.get("metadata", {}).get("tags", [])
    ]


@functools.cache
def notebook_namespace(name: str) -> dict[str, Any]:
    """The names the notebook's defining cells leave (run once per test session)."""
    cells = defining_cells(name)
    assert cells, f"notebooks/{name} has no code cell tagged {TAG!r}"
    namespace: dict[str, Any] = {"__name__": f"notebook_{Path(name).stem}"}
    with contextlib.chdir(NOTEBOOKS):
        for i, source in enumerate(cells):
            exec(compile(source, f"{name} (defining cell {i})", "exec"), namespace)
    return namespace
