"""Saved notebooks that every reader can read: checks and the one clean-up they need.

Notebooks are committed executed, without widget state (it would carry plotly.js, megabytes per
chart). A widget view without its state is dead: JupyterLab shows "Error displaying widget: model
not found" in its place until the notebook runs again. ``drop_dead_views`` removes those views
from the saved outputs, so JupyterLab, a code host and nbviewer all show the output's other
forms: the chart's picture and its line of text (``loadkit_notebooks.chart``). nbval skips widget
views and pictures, so the saved and the fresh outputs still compare equal.

    python -m loadkit_notebooks.saved notebooks/*.ipynb     # after executing them (make notebooks)
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loadkit.fmt import WIDTH

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
MAX_BYTES = 1_500_000  # per notebook
# ipykernel's own kernel spec as JupyterLab writes it on open: a notebook saved with another
# display name opens as modified.
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def _outputs(nb: dict[str, Any]) -> Iterator[tuple[int, dict[str, Any]]]:
    for i, cell in enumerate(nb.get("cells", [])):
        for out in cell.get("outputs", []):
            yield i, out


def _saved_models(nb: dict[str, Any]) -> set[str]:
    state = nb.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    return set(state)


def drop_dead_views(nb: dict[str, Any]) -> int:
    """Remove widget views whose state is not saved; returns how many were removed.

    >>> out = {"data": {WIDGET_VIEW: {"model_id": "a"}, "text/plain": "x"}}
    >>> nb = {"cells": [{"outputs": [out]}]}
    >>> drop_dead_views(nb), nb["cells"][0]["outputs"][0]["data"]
    (1, {'text/plain': 'x'})
    """
    alive = _saved_models(nb)
    dropped = 0
    for _, out in _outputs(nb):
        view = out.get("data", {}).get(WIDGET_VIEW)
        if view is not None and view.get("model_id") not in alive:
            del out["data"][WIDGET_VIEW]
            dropped += 1
    return dropped


def problems(path: str | Path, max_columns: int | None = WIDTH) -> list[str]:
    """What keeps a saved notebook from reading well without a kernel, one line per problem
    (``max_columns=None``: printed lines of any length)."""
    path = Path(path)
    raw = path.read_bytes()
    nb = json.loads(raw)
    found = []
    if len(raw) > MAX_BYTES:
        found.append(f"{path.name}: {len(raw)} bytes, more than {MAX_BYTES}")
    kernelspec = nb.get("metadata", {}).get("kernelspec")
    if kernelspec != KERNELSPEC:
        found.append(f"{path.name}: kernelspec {kernelspec}, not {KERNELSPEC} (opens as modified)")
    alive = _saved_models(nb)
    for i, out in _outputs(nb):
        data = out.get("data", {})
        view = data.get(WIDGET_VIEW)
        if view is not None and view.get("model_id") not in alive:
            found.append(f"{path.name} cell {i}: a widget view without saved state (dead widget)")
        plain = "".join(data.get("text/plain", ""))
        if plain.startswith(("chart", "picture")) and "image/png" not in data:
            found.append(f"{path.name} cell {i}: {plain.splitlines()[0]!r} has no picture")
        if "image/png" in data and not out.get("metadata", {}).get("image/png", {}).get("alt"):
            found.append(f"{path.name} cell {i}: a picture without alt text")
        if plain.startswith(("FigureWidget(", "Figure(")):
            found.append(f"{path.name} cell {i}: a figure's repr as text ({plain[:30]}...)")
        # Printed text, results' text and error messages: what nbval compares and a terminal shows.
        kind = out.get("output_type", "")
        text = {"stream": "".join(out.get("text", "")), "error": out.get("evalue", "")}.get(
            kind, plain
        )
        limit = max_columns if max_columns is not None else float("inf")
        for line in text.splitlines():
            if len(line) > limit:
                found.append(f"{path.name} cell {i}: a line of {len(line)} columns: {line[:60]}...")
                break
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadkit_notebooks.saved",
        description="Drop dead widget views from executed notebooks, then check them.",
    )
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true", help="only check, change nothing")
    args = parser.parse_args(argv)
    status = 0
    for path in args.notebooks:
        if not args.check:
            nb = json.loads(path.read_text())
            dropped = drop_dead_views(nb)
            # nbformat's layout: one space indent, keys sorted, a final newline.
            path.write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
            print(f"{path}: {dropped} dead widget views dropped")
        for line in problems(path):
            print(line)
            status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main())
