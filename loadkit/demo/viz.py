"""Plotly figures from ``Record``s and the ipywidgets toggle that swaps between them.

plotly and ipywidgets are the ``notebooks`` extra: they are imported here only, on use.
"""

from __future__ import annotations

from typing import Any

from loadkit.demo.scenario import Record, Series


def _trace(name: str, s: Series) -> Any:
    import plotly.graph_objects as go

    style = s.style or {}
    if s.mode == "bar":
        return go.Bar(name=name, x=s.x, y=s.y, text=s.text, **style)
    if s.mode == "heatmap":
        return go.Heatmap(name=name, x=s.x, y=s.y, z=s.z, text=s.text, **style)
    return go.Scatter(name=name, x=s.x, y=s.y, mode=s.mode, text=s.text, **style)


def figure(
    record: Record,
    *,
    title: str = "",
    xaxis: str = "",
    yaxis: str = "",
    widget: bool = True,
    layout: dict[str, Any] | None = None,
) -> Any:
    """A figure of ``record``'s series: a live ``FigureWidget`` by default, else a ``Figure``."""
    import plotly.graph_objects as go

    cls = go.FigureWidget if widget else go.Figure
    fig = cls(data=[_trace(n, s) for n, s in record.series.items()])
    fig.update_layout(
        title=f"{title} [{record.behaviour}]" if title else record.behaviour,
        xaxis_title=xaxis,
        yaxis_title=yaxis,
        template="plotly_white",
        **(layout or {}),
    )
    fig._loadkit_title = title  # kept for show_record
    return fig


def show_record(fig: Any, record: Record) -> None:
    """Replace ``fig``'s traces with ``record``'s series, in one update."""
    with fig.batch_update():
        fig.data = ()
        fig.add_traces([_trace(n, s) for n, s in record.series.items()])
        title = getattr(fig, "_loadkit_title", "")
        fig.layout.title.text = f"{title} [{record.behaviour}]" if title else record.behaviour


def behaviour_toggle(
    records: dict[str, Record], fig: Any, *, description: str = "behaviour", on_change: Any = None
) -> Any:
    """A ToggleButtons over ``records``' behaviours that redraws ``fig`` from the chosen record.

    Records are precomputed, so switching costs no recomputation. ``on_change(record)`` runs after
    the redraw, for notebooks that also refresh a table.
    """
    import ipywidgets as widgets

    options = list(records)
    start = next((b for b in options if fig.layout.title.text.endswith(f"[{b}]")), options[0])
    toggle = widgets.ToggleButtons(options=options, value=start, description=description)

    def redraw(change: dict[str, Any]) -> None:
        record = records[change["new"]]
        show_record(fig, record)
        if on_change is not None:
            on_change(record)

    toggle.observe(redraw, names="value")
    return toggle


def figure_data(fig: Any, digits: int = 4) -> str:
    """The figure's traces as plain text: what nbval compares in place of the widget."""
    lines = [f"title: {fig.layout.title.text}"]
    for tr in fig.data:
        ys = [round(v, digits) if isinstance(v, float) else v for v in (tr.y or ())]
        lines.append(f"{tr.name}: x={list(tr.x or ())} y={ys}")
    return "\n".join(lines)
