"""A small old/new story, and a notebook built on it the way the bug notebooks are built.

The story is real loadkit code: a Mamba2-like mixer whose ``A`` loads through a composed loader
(two copies) and whose ``dt_bias`` and ``D`` load plainly; ``get_numel_loaded`` counts the elements
each load copied, uncapped (``"old"``) or capped at the parameter's size (``"new"``).

The generated notebook imports this module from its own folder (the test copies it there), so the
page and the test compute the records with the same code.
"""

from __future__ import annotations

import inspect
import shutil
from pathlib import Path

import nbformat

from loadkit_notebooks.scenario import Record, run_behaviours

SIZES = {"A": 6, "dt_bias": 6, "D": 6}


def scenario(behaviour: str) -> Record:
    import torch

    from loadkit import composed_weight_loader, default_weight_loader, get_numel_loaded

    record = Record(behaviour)
    running = 0
    for name, numel in SIZES.items():
        param = torch.nn.Parameter(torch.zeros(numel), requires_grad=False)
        weight = torch.arange(numel, dtype=torch.float32) / numel
        loader = (
            composed_weight_loader(default_weight_loader, lambda p: -torch.exp(p))
            if name == "A"
            else default_weight_loader
        )
        args = inspect.signature(loader).bind(param, weight)
        counted, _ = get_numel_loaded(loader, args, behaviour=behaviour)
        running += counted
        record.add_point("elements counted", name, counted, mode="bar")
        record.add_point("running count", name, running)
    record.outcome = {"counted": running, "total": sum(SIZES.values())}
    return record


def main_records() -> dict[str, Record]:
    return run_behaviours(scenario)


CELLS = [
    ("markdown", "# Toy story: the toggle drives the chart"),
    (
        "code",
        "from toy_story import main_records\n"
        "from loadkit_notebooks.scenario import outcome_table\n"
        "from loadkit_notebooks.viz import figure, figure_data, record_view\n"
        "\n"
        "records = main_records()\n"
        "print(outcome_table(records))",
    ),
    (
        "code",
        "view = record_view(records, figure)\nview.panel()",
    ),
    (
        "code",
        'view.toggle.value = "new"\nprint(figure_data(view.chart))\nview.toggle.value = "old"',
    ),
]

# The link broken on purpose: the panel shows a copy of the chart (a live ``Chart`` of the same
# figure, not the one the toggle redraws), so the chart in the page stops following the toggle
# while the printed figure data (of ``view.chart``) still does.
BROKEN_DISPLAY = (
    "# NBVAL_IGNORE_OUTPUT\n"
    "from loadkit_notebooks.chart import Chart, Panel\n"
    "\n"
    "view = record_view(records, figure)\n"
    "Panel(view.toggle, Chart(view.chart.fig), chart=view.chart)"
)


def write_toy_notebook(
    folder: Path, name: str = "toy_toggle.ipynb", *, broken: bool = False
) -> Path:
    """Write the toy notebook (and this module, which it imports) into ``folder``."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    for kind, source in CELLS:
        if broken and "view.panel()" in source:
            source = BROKEN_DISPLAY
        make = nbformat.v4.new_code_cell if kind == "code" else nbformat.v4.new_markdown_cell
        nb.cells.append(make(source))
    path = folder / name
    nbformat.write(nb, path)
    shutil.copyfile(Path(__file__), folder / "toy_story.py")
    return path
