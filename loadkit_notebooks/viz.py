"""Plotly figures from ``Record``s, the toggle that swaps between them, and their text summaries.

Figures are plain ``go.Figure``s; ``loadkit_notebooks.chart.Chart`` shows one live. A notebook cell
builds its widgets and displays them in the same cell (``RecordView.panel()``), so re-running the
cell makes fresh widgets instead of a second view of old ones.

plotly and ipywidgets are the ``notebooks`` extra: they are imported here only, on use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loadkit_notebooks.scenario import Record, Series

# One colour per behaviour, the same in every chart of every notebook.
BEHAVIOUR_COLOURS = {
    "old": "#d1495b",
    "new": "#2e86ab",
    "moved-verbatim": "#edae49",
    "loose-match": "#8e6c8a",
}
BASE_LAYOUT: dict[str, Any] = {
    "template": "plotly_white",
    "margin": {"l": 70, "r": 30, "t": 70, "b": 60},
    "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0},
    "title": {"x": 0, "xref": "paper", "xanchor": "left", "font": {"size": 15}},
}


def _trace(name: str, s: Series) -> Any:
    import plotly.graph_objects as go

    colour = BEHAVIOUR_COLOURS.get(name)
    style = dict(s.style or {})
    if s.mode == "heatmap":
        return go.Heatmap(name=name, x=s.x, y=s.y, z=s.z, text=s.text, **style)
    if s.mode == "bar":
        style.setdefault("marker_color", colour)
        return go.Bar(name=name, x=s.x, y=s.y, text=s.text, **style)
    style.setdefault("line_color", colour)
    return go.Scatter(name=name, x=s.x, y=s.y, mode=s.mode, text=s.text, **style)


def base_figure(title: str, *, height: int = 420, **layout: Any) -> Any:
    """An empty figure with the notebooks' common look (full width: no width is ever set)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.update_layout(BASE_LAYOUT, height=height)
    fig.update_layout(title_text=title, **layout)
    return fig


def figure(
    record: Record,
    *,
    title: str = "",
    xaxis: str = "",
    yaxis: str = "",
    layout: dict[str, Any] | None = None,
) -> Any:
    """A figure of ``record``'s series, titled ``"<title> [<behaviour>]"``.

    >>> r = Record("new", series={"clones": Series([0, 1], [1, 1])})
    >>> figure(r, title="probe").layout.title.text
    'probe [new]'
    """
    layout = dict(layout or {})
    height = layout.pop("height", 420)
    fig = base_figure(
        f"{title} [{record.behaviour}]" if title else record.behaviour,
        height=height,
        xaxis_title=xaxis,
        yaxis_title=yaxis,
    )
    fig.add_traces([_trace(n, s) for n, s in record.series.items()])
    fig.update_layout(**layout)
    return fig


@dataclass
class RecordView:
    """A ToggleButtons over precomputed records and the chart it redraws.

    Records are computed up front, so a click costs no recomputation; ``on_change(record)`` runs
    after each redraw, for views that also refresh other charts.
    """

    records: dict[str, Record]
    build: Callable[[Record], Any]
    toggle: Any
    chart: Any

    def show(self, key: str) -> None:
        self.chart.draw(self.build(self.records[key]))

    def panel(self, *extra: Any, text: str = "") -> Any:
        """Toggle, chart and ``extra`` widgets in one output (with a picture of the chart)."""
        from loadkit_notebooks.chart import Panel

        return Panel(self.toggle, self.chart, *extra, chart=self.chart, text=text)


def record_view(
    records: dict[str, Record],
    build: Callable[[Record], Any],
    *,
    start: str | None = None,
    description: str = "behaviour",
    on_change: Callable[[Record], None] | None = None,
) -> RecordView:
    """A ``RecordView`` showing ``records[start]`` (the first record by default)."""
    import ipywidgets as widgets

    from loadkit_notebooks.chart import Chart

    start = start or next(iter(records))
    chart = Chart(build(records[start]))
    toggle = widgets.ToggleButtons(options=list(records), value=start, description=description)
    view = RecordView(records, build, toggle, chart)

    def redraw(change: dict[str, Any]) -> None:
        view.show(change["new"])
        if on_change is not None:
            on_change(records[change["new"]])

    toggle.observe(redraw, names="value")
    return view


def _fmt(v: Any, digits: int) -> str:
    if isinstance(v, float):
        return f"{round(v, digits):g}"
    return str(v)


def trace_summary(trace: Any, digits: int = 4) -> str:
    """One line for one trace: its points in brief (what nbval compares, not a dump)."""
    name = trace.name if trace.name is not None else trace.type
    if trace.type == "heatmap":
        z = [list(row) for row in trace.z]
        flat = [v for row in z for v in row if v is not None]
        distinct = sorted({_fmt(v, digits) for v in flat})
        return f"{name}: {len(z)} x {len(z[0]) if z else 0} cells, values {distinct}"
    ys = list(trace.y if trace.y is not None else ())
    xs = list(trace.x if trace.x is not None else ())
    numbers = [y for y in ys if isinstance(y, (int, float))]
    if not numbers:
        return f"{name}: {len(ys)} points"
    head = f"{name}: {len(ys)} points"
    if len(set(numbers)) == 1:
        return f"{head}, all {_fmt(numbers[0], digits)}"
    if trace.type == "bar":
        nonzero = [(x, y) for x, y in zip(xs, ys, strict=False) if y]
        shown = ", ".join(f"{x}={_fmt(y, digits)}" for x, y in nonzero[:4])
        more = f", ... ({len(nonzero)} in all)" if len(nonzero) > 4 else ""
        return f"{head}, {len(nonzero)} non-zero: {shown}{more}"
    return (
        f"{head}, from {_fmt(ys[0], digits)} to {_fmt(ys[-1], digits)}"
        f" (min {_fmt(min(numbers), digits)}, max {_fmt(max(numbers), digits)})"
    )


def figure_data(fig: Any, digits: int = 4) -> str:
    """The figure (or a ``Chart``'s figure) in brief: its title and one line per trace."""
    fig = getattr(fig, "fig", fig)
    lines = [f"title: {fig.layout.title.text}"]
    lines += [trace_summary(tr, digits) for tr in fig.data]
    return "\n".join(lines)


class Explorer:
    """A notebook's widgets, wired: the behaviour ``toggle`` over ``records`` and its other
    ``parts`` (controls, the charts they redraw, what they read), each an attribute by its name
    (``ex.order``, ``ex.grid``). ``outputs()`` lays them out for one cell; ``state()`` says what
    they show, as text (what nbval compares and a reader without a kernel sees). Each story says
    both (``layout``, ``describe``) and wires the callbacks; this is the one widget class.
    """

    def __init__(
        self,
        records: dict[str, Record],
        toggle: Any,
        parts: dict[str, Any],
        *,
        layout: Callable[[Explorer], tuple[Any, ...]],
        describe: Callable[[Explorer], str],
    ) -> None:
        # ``records``: what the toggle swaps between, where the story keeps them ({} where the
        # toggle picks a run the notebook's function makes on demand)
        self.records = records
        self.toggle = toggle
        self.parts = dict(parts)
        self._layout, self._describe = layout, describe

    def __getattr__(self, name: str) -> Any:
        parts = self.__dict__.get("parts", {})
        if name in parts:
            return parts[name]
        raise AttributeError(f"{type(self).__name__} has no part {name!r}")

    def outputs(self) -> tuple[Any, ...]:
        """What one cell displays: ``display(*ex.outputs())``."""
        return self._layout(self)

    def state(self) -> str:
        return self._describe(self)
