"""Notebook 01's pictures of the pooling prefix probe: what a load through the adapter left.

The notebook loads for real in functions of its own (``as_pooling_model(..., behaviour=...)``,
``load_weights`` under a ``CloneCounter``, ``predict_probe``); ``watched`` notes the clones after
each key the load reads, ``ProbeRun.of`` gathers what the load left, and the functions here draw
it. The widgets take the notebook's function and call it again when a click asks for a run not
made yet.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from loadkit.fmt import format_bytes, plural, table
from loadkit.pooling import ProbeRecord
from loadkit_notebooks.scenario import Record, Series
from loadkit_notebooks.show import Table

GiB = 2**30
MiB = 2**20
BEHAVIOURS = ("old", "new")


def watched(
    stream: Iterable[tuple[str, torch.Tensor]], counter: Any, events: list[dict[str, Any]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Pass ``stream`` through, noting in ``events`` after each key how many clones ``counter``
    (a ``CloneCounter``) has seen so far.

    The note is taken when the consumer asks for the next key, so it includes what the probe (or
    the parent loader) did with this one.
    """
    for read, (name, tensor) in enumerate(stream, 1):
        nbytes = tensor.numel() * tensor.element_size()
        yield name, tensor
        events.append(
            {
                "read": read,
                "key": name,
                "nbytes": nbytes,
                "clones": counter.count,
                "cloned_bytes": counter.cloned_bytes,
            }
        )


def wrong_values(model: torch.nn.Module, truth: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """Per parameter, the percentage of its values that differ from the checkpoint."""
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    return {n: 100.0 * (state[n] != t).float().mean().item() for n, t in truth.items()}


@dataclasses.dataclass
class ProbeRun:
    """One load through the pooling adapter, as the notebook ran it."""

    behaviour: str
    probe: ProbeRecord  # model.probe_record
    events: list[dict[str, Any]]  # from ``watched``
    clones: int
    cloned_bytes: int
    tensors: int  # in the checkpoint
    total_bytes: int
    loaded: int  # names load_weights returned
    wrong: dict[str, float]  # per parameter, % of values wrong ({} when not compared)

    @classmethod
    def of(
        cls,
        behaviour: str,
        model: Any,
        loaded: set[str],
        counter: Any,
        events: list[dict[str, Any]],
        *,
        truth: Mapping[str, torch.Tensor] | None = None,
    ) -> ProbeRun:
        """Read a finished load: ``counter`` the ``CloneCounter`` it ran under, ``events`` what
        ``watched`` noted, ``truth`` the checkpoint's values per parameter (to compare)."""
        return cls(
            behaviour,
            model.probe_record,
            events,
            counter.count,
            counter.cloned_bytes,
            len(events),
            sum(e["nbytes"] for e in events),
            len(loaded),
            wrong_values(model, truth) if truth is not None else {},
        )

    def exact(self) -> str:
        return f"{sum(1 for v in self.wrong.values() if v == 0)} of {len(self.wrong)}"


def prefix(p: str | None) -> str:
    return "none (no hit)" if p is None else repr(p)


def hit(probe: ProbeRecord) -> str:
    """The key that hit, numbered from 0 in stream order, as ``loadkit inspect`` numbers it
    (``#0``: the first key read)."""
    if probe.hit_key is None or probe.hit_index is None:
        return "-"
    return f"#{probe.hit_index} {probe.hit_key}"


def outcome(run: ProbeRun) -> dict[str, Any]:
    """What the probe found and what it cost, for the side-by-side table."""
    found = {
        "prefix found": prefix(run.probe.prefix),
        "hit at key": hit(run.probe),
        "keys held by the probe": run.probe.walked,
        "clone() calls counted": run.clones,
        "bytes cloned": format_bytes(run.cloned_bytes),
        "checkpoint tensors": run.tensors,
        "checkpoint tensor data": format_bytes(run.total_bytes),
        "parameters loaded": run.loaded,
    }
    if run.wrong:
        found["values exact"] = run.exact()
    return found


def summary(run: ProbeRun) -> str:
    """``outcome(run)`` as aligned lines under the behaviour's name."""
    return Record(run.behaviour, outcome=outcome(run)).summary()


def outcome_table(runs: Mapping[str, ProbeRun]) -> str:
    """Outcomes side by side: one row per finding, one column per behaviour."""
    cols = {b: outcome(r) for b, r in runs.items()}
    keys = list(dict.fromkeys(k for o in cols.values() for k in o))
    rows = [[k, *(str(o.get(k, "-")) for o in cols.values())] for k in keys]
    return table(rows, header=["", *cols], align="l" + "r" * len(cols))


# --- the main chart: old and new in one view, per stream -----------------------------------------


def stream_record(stream: str, runs: Mapping[str, ProbeRun]) -> Record:
    """One record per stream: each behaviour's share of the checkpoint held as clones, key by
    key (the main chart's lines), and both outcomes."""
    rec = Record(stream)
    for b, run in runs.items():
        s = rec.series.setdefault(b, Series([], [], text=[]))
        for e in run.events:
            s.x.append(e["read"])
            s.y.append(round(100 * e["cloned_bytes"] / run.total_bytes, 2))
            assert s.text is not None
            s.text.append(
                f"{e['clones']} clones, {format_bytes(e['cloned_bytes'])}, after {e['key']}"
            )
        rec.outcome[b] = (
            f"{run.clones} clones, {format_bytes(run.cloned_bytes)}, hit {hit(run.probe)}"
        )
    return rec


def main_figure(record: Record) -> Any:
    """Old and new on one chart: % of the checkpoint's bytes held as clones after each key read,
    each line ending in a label that says what it holds."""
    import plotly.graph_objects as go

    from loadkit_notebooks.viz import BEHAVIOUR_COLOURS, base_figure

    keys = max(len(s.x) for s in record.series.values())
    fig = base_figure(
        f"What the probe holds as clones, key by key, old and new [{record.behaviour}]",
        height=400,
        xaxis={"title": "keys read from the checkpoint", "range": [0.5, keys + 9]},
        yaxis={"title": "% of the checkpoint's bytes held as clones", "range": [0, 108]},
    )
    for b, s in record.series.items():
        fig.add_trace(
            go.Scatter(
                name=b,
                x=s.x,
                y=s.y,
                text=s.text,
                mode="lines+markers",
                line={"color": BEHAVIOUR_COLOURS[b], "width": 3},
                marker={"size": 5},
                hovertemplate="key %{x}: %{text}<extra>" + b + "</extra>",
            )
        )
        fig.add_annotation(
            x=s.x[-1],
            y=s.y[-1],
            text=f"<b>{b}</b>: {s.y[-1]:g}%",
            showarrow=False,
            xanchor="left",
            xshift=6,
            font={"color": BEHAVIOUR_COLOURS[b], "size": 13},
        )
    return fig


def main_view(runs: Callable[[str], Mapping[str, ProbeRun]], streams: Iterable[str]) -> Any:
    """A toggle over ``streams`` and the chart it redraws; ``runs(stream)`` is the notebook's
    function, returning each behaviour's run of that stream (called on the first click that
    needs it, then remembered)."""
    import ipywidgets as widgets

    from loadkit_notebooks.chart import Chart
    from loadkit_notebooks.viz import RecordView

    runs = functools.cache(runs)
    streams = list(streams)
    records: dict[str, Record] = {}

    def record(stream: str) -> Record:
        if stream not in records:
            records[stream] = stream_record(stream, runs(stream))
        return records[stream]

    chart = Chart(main_figure(record(streams[0])))
    toggle = widgets.ToggleButtons(options=streams, value=streams[0], description="stream")
    toggle.observe(lambda change: chart.draw(main_figure(record(change["new"]))), names="value")
    return RecordView(records, main_figure, toggle, chart)


# --- why the probe exists -----------------------------------------------------------------------


def layouts_table(predicted: Mapping[str, tuple[str, Mapping[str, ProbeRecord]]]) -> Table:
    """The probe's record per checkpoint layout (rows: label -> (its first key, record per
    behaviour)) and behaviour (columns)."""
    rows = []
    for label, (first, by_behaviour) in predicted.items():
        cells = [f"{prefix(v.prefix)}, {v.walked} of {v.forwarded}" for v in by_behaviour.values()]
        rows.append((label, first, *cells))
    head = ("checkpoint", "first key", *(f"{b}: prefix, keys walked" for b in BEHAVIOURS))
    return Table(head, rows)


# --- vLLM 0.34.0: a clone only where the load format may reuse buffers -------------------------


def clone_grid(
    runs: Mapping[tuple[str, str], ProbeRun], setups: Iterable[str]
) -> tuple[list[str], list[str], list[list[int]], int]:
    """Rows (behaviours), columns (``setups``), corrupted parameters per cell, parameters."""
    rows, cols = list(BEHAVIOURS), list(setups)
    counts = [[sum(1 for v in runs[(b, c)].wrong.values() if v > 0) for c in cols] for b in rows]
    total = len(next(iter(runs.values())).wrong)
    return rows, cols, counts, total


def clone_figure(runs: Mapping[tuple[str, str], ProbeRun], setups: Iterable[str]) -> Any:
    """Both behaviours under each setup (iterator and load format), at once: parameters
    corrupted of all, and the clones made."""
    import plotly.graph_objects as go

    from loadkit_notebooks.viz import base_figure

    rows, cols, counts, total = clone_grid(runs, setups)
    text = [
        [
            (f"{n} of {total} corrupted" if n else f"all {total} exact")
            + f"<br>{plural(runs[(b, c)].clones, 'clone')}"
            for n, c in zip(row, cols, strict=True)
        ]
        for b, row in zip(rows, counts, strict=True)
    ]
    fig = base_figure("Parameters with wrong values, and clones made, per setup", height=330)
    fig.add_trace(
        go.Heatmap(
            z=counts,
            x=cols,
            y=rows,
            text=text,
            texttemplate="%{text}",
            textfont={"size": 15},
            zmin=0,
            zmax=total,
            colorscale=[[0, "#e8f4ea"], [1, "#d1495b"]],
            showscale=False,
            xgap=4,
            ygap=4,
            hovertemplate="%{y}, %{x}: %{text}<extra></extra>",
        )
    )
    fig.update_layout(yaxis_autorange="reversed", xaxis_side="top", margin_t=130)
    return fig


def clone_table(runs: Mapping[tuple[str, str], ProbeRun], setups: Iterable[str]) -> str:
    """The grid as text: corrupted parameters and clones per behaviour and setup."""
    rows, cols, counts, total = clone_grid(runs, setups)
    cells = [
        [
            b,
            *(
                f"{n} of {total}, {plural(runs[(b, c)].clones, 'clone')}"
                for n, c in zip(row, cols, strict=True)
            ),
        ]
        for b, row in zip(rows, counts, strict=True)
    ]
    return table(cells, header=["corrupted", *cols], align="l" + "r" * len(cols))


# --- full scale, on the meta device -------------------------------------------------------------


def full_scale_figure(runs: Mapping[str, ProbeRun], axes: tuple[int, float], layers: int) -> Any:
    """Both behaviours on one chart: what is held as clones against keys read, beside what was
    read, on a log axis (new's one small clone is a line of its own, not the x axis).

    ``axes``: keys and bytes of the full layout, so every slider position shares the axes.
    """
    import math

    import plotly.graph_objects as go

    from loadkit_notebooks.viz import BEHAVIOUR_COLOURS, base_figure

    some = next(iter(runs.values()))
    xs = [e["read"] for e in some.events]
    read, acc = [], 0
    for e in some.events:
        acc += e["nbytes"]
        read.append(round(acc / MiB, 4))
    keys, total = axes
    low = min(r.cloned_bytes for r in runs.values() if r.cloned_bytes) / MiB
    fig = base_figure(
        f"Full scale on paper (meta device) [{layers} text layer{'s' if layers != 1 else ''}]",
        height=420,
        xaxis={"title": "keys read from the checkpoint", "range": [0, keys * 1.02]},
        yaxis={
            "title": "MiB (log scale)",
            "type": "log",
            "range": [math.log10(low) - 0.5, math.log10(total / MiB) + 0.3],
        },
    )
    fig.add_trace(
        go.Scatter(
            name="read from the checkpoint",
            x=xs,
            y=read,
            mode="lines",
            line={"color": "#8d99ae", "width": 6},
            opacity=0.35,
        )
    )
    for b, r in runs.items():
        ys = [round(max(e["cloned_bytes"], 1) / MiB, 6) for e in r.events]
        fig.add_trace(
            go.Scatter(
                name=f"{b}: held as clones",
                x=[e["read"] for e in r.events],
                y=ys,
                mode="lines",
                line={"color": BEHAVIOUR_COLOURS[b], "width": 2.5},
            )
        )
        clones = f"{r.clones} clone{'s' if r.clones != 1 else ''}"
        fig.add_annotation(  # above the line's end, inside the plot
            x=xs[-1],
            y=math.log10(ys[-1]),
            text=f"<b>{b}</b>: {clones}, {format_bytes(r.cloned_bytes)}",
            showarrow=False,
            xanchor="right",
            yanchor="bottom",
            yshift=3,
            font={"color": BEHAVIOUR_COLOURS[b], "size": 13},
        )
    return fig


def full_scale_view(
    runs: Callable[[int], Mapping[str, ProbeRun]], *, value: int = 35, maximum: int = 35
) -> Any:
    """An IntSlider over the text layers of the full-scale layout and the chart it redraws;
    ``runs(layers)`` is the notebook's (each behaviour's run at that many text layers)."""
    import ipywidgets as widgets

    from loadkit_notebooks.chart import Chart, Panel

    runs = functools.cache(runs)
    full = runs(maximum)
    some = next(iter(full.values()))
    axes = (some.tensors, float(some.total_bytes))
    chart = Chart(full_scale_figure(runs(value), axes, value))
    slider = widgets.IntSlider(
        value=value, min=1, max=maximum, description="text layers", continuous_update=False
    )

    def redraw(change: dict[str, Any]) -> None:
        n = change["new"]
        chart.draw(full_scale_figure(runs(n), axes, n))

    slider.observe(redraw, names="value")
    panel = Panel(slider, chart, chart=chart)
    panel.slider = slider
    return panel


def chart_endpoints(fig: Any) -> str:
    """Where each trace ends: a short, comparable summary of a long chart."""
    fig = getattr(fig, "fig", fig)
    lines = [f"title: {fig.layout.title.text}"]
    for tr in fig.data:
        end = format_bytes(round(tr.y[-1] * MiB))
        lines.append(f"{tr.name}: {len(tr.x)} keys read, ends at {end}")
    return "\n".join(lines)
