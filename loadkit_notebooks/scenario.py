"""The old/new pattern every bug notebook uses.

A scenario is a function that runs one behaviour and returns a ``Record``: the named series to
plot (each an x list and a y list), the events it saw, in order, and an outcome (a small dict of
findings). ``run_behaviours`` runs a scenario for each behaviour up front, so a widget can swap
between precomputed records without recomputing anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from loadkit.fmt import WIDTH, table, wrap


@dataclass
class Series:
    """One line (or bar set, or heatmap) of a chart.

    A heatmap (``mode="heatmap"``) has its cells in ``z`` (one list per ``y`` label); ``style``
    holds extra plotly trace options (a colour scale, ...).
    """

    x: list[Any]
    y: list[Any]
    mode: str = "lines+markers"  # plotly scatter mode, "bar" or "heatmap"
    text: list[Any] | None = None  # per point; per cell (a list per row) for a heatmap
    z: list[list[Any]] | None = None
    style: dict[str, Any] | None = None


@dataclass
class Record:
    """What one behaviour did: series to chart, events in order, findings."""

    behaviour: str
    series: dict[str, Series] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    outcome: dict[str, Any] = field(default_factory=dict)

    def add_point(self, series: str, x: Any, y: Any, **style: Any) -> None:
        s = self.series.setdefault(series, Series([], [], **style))
        s.x.append(x)
        s.y.append(y)

    def summary(self, width: int = WIDTH) -> str:
        """The outcome as aligned ``key : value`` lines, stable for notebook checks.

        Keys are padded to the longest of them up to a third of ``width``; a longer key, when its
        value would not fit after it, has its line to itself. A value too long for the line
        continues on the next lines under its start.

        >>> r = Record("new", outcome={"loaded": 3, "names": ["a.weight", "b.weight"]})
        >>> print(r.summary(width=24))
        [new]
          loaded : 3
          names  : ['a.weight',
                   'b.weight']
        """
        pad = min(max((len(k) for k in self.outcome), default=0), width // 3)
        column = 2 + pad + 3  # where values start: "  " key " : "
        lines = [f"[{self.behaviour}]"]
        for k, v in self.outcome.items():
            value = _fmt(v).replace("\n", "\n" + " " * column)
            head = f"  {k.ljust(pad)} : "
            if len(head) > column and len(head) + len(value.split("\n")[0]) > width:
                lines.append(head.rstrip())
                head = " " * column
            lines.append(wrap(head + value, width, hang=len(head.lstrip())))
        return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)) and len(value) > 8:
        return f"{list(value[:8])} ... ({len(value)} in all)"
    return str(value)


def run_behaviours(
    scenario: Callable[..., Record], behaviours: Iterable[str] = ("old", "new"), **kwargs: Any
) -> dict[str, Record]:
    """Run ``scenario(behaviour=b, **kwargs)`` for each behaviour, in order."""
    return {b: scenario(behaviour=b, **kwargs) for b in behaviours}


def outcome_table(records: dict[str, Record]) -> str:
    """Outcomes side by side: one row per finding, one column per behaviour."""
    keys: list[str] = []
    for r in records.values():
        keys += [k for k in r.outcome if k not in keys]
    cols = list(records)
    rows = [[k, *(_fmt(records[c].outcome.get(k, "-")) for c in cols)] for k in keys]
    return table(rows, header=["", *cols], align="l" + "r" * len(cols))
