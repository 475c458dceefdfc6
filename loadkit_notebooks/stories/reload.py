"""Notebook 03's pictures of a layerwise reload: what the reload log and the reloaded model show.

The notebook runs the reload itself (``record_metadata_for_reloading``,
``initialize_layerwise_reload``, the model's ``load_weights``, ``finalize_layerwise_reload``,
``reload_log``) in a function of its own; ``ReloadRun.of`` reads what that run left (the log,
every parameter's values, the storage pointers, the logits) and the functions here draw it. The
explorer takes the notebook's function and calls it again when a widget asks for another order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from loadkit.fmt import table
from loadkit.loading import ledger_of
from loadkit.reload import ReloadStep
from loadkit_notebooks.scenario import Record, Series
from loadkit_notebooks.viz import Explorer

MIXERS = "mamba mixers"
ORDER_LABELS = {
    "d-last": "D last (A_log, dt_bias, D)",
    "d-first": "D first (D, A_log, dt_bias)",
    "shuffled": "shuffled by layer",
}

LOADED, DROPPED, NAN, KEPT = "loaded", "dropped → NaN", "NaN (not loaded)", "kept (not in update)"
# What a dropped parameter reads, per fill (loadkit.reload.layer.Fill).
FILL_WORDS = {"nan": "NaN", "zero": "zeros", "stale": "stale memory"}
FILL_LABELS = {
    "stale": "stale memory (torch.empty: vLLM 0.33.0 and earlier, a fixed pattern here)",
    "nan": "NaN (loadkit's visible marker)",
    "zero": "zeros (vLLM 0.34.0)",
}
STATUSES = (LOADED, DROPPED, NAN, KEPT)


def _short(name: str) -> str:
    return name.removeprefix("model.")


@dataclass
class ReloadRun:
    """What one reload did to the live model."""

    behaviour: str
    order: str
    steps: list[ReloadStep]
    status: dict[str, str]  # parameter (short name) -> one of STATUSES
    blocks: list[str]  # "layers.0 (M)", ...
    pointers_kept: bool
    logits_nan: int  # NaN logits out of logits_total
    logits_total: int
    nan_per_token: list[int]  # NaN logits at each prompt position (of vocab_size)
    differ_per_token: list[int]  # logits not equal to the fresh load's, at each position
    max_error: float  # largest |logit - fresh load's logit| where not NaN
    partly_loaded: list[str]
    ledger_never_loaded: int  # what AutoWeightsLoader's ledger saw: drops happen below it
    warnings: list[str] = field(default_factory=list)
    fill: str = "nan"  # what the reload filled materialised tensors with
    logits_differ: int = 0  # logits not equal to the fresh load's (NaN counts as differing)
    dropped_values: dict[str, list[float]] = field(default_factory=dict)  # what a drop reads

    @classmethod
    def of(
        cls,
        model: Any,
        steps: list[ReloadStep],
        *,
        behaviour: str,
        order: str,
        fill: str = "nan",
        logits: torch.Tensor,
        reference: torch.Tensor,
        storage: Mapping[str, int],
        partly_loaded: list[str],
        caught: list[Any],  # warnings.catch_warnings(record=True)
    ) -> ReloadRun:
        """Read a finished reload: ``steps`` is ``reload_log(model)``, ``logits`` the reloaded
        model's on the prompt, ``reference`` a fresh load's, ``storage`` the parameters'
        ``data_ptr()`` before the reload."""
        dropped = {f"{s.layer}.{s.parameter}" for s in steps if s.dropped}
        counted = {f"{s.layer}.{s.parameter}" for s in steps if not s.dropped and s.parameter}
        status, dropped_values = {}, {}
        for name, p in model.named_parameters():
            if name in dropped:
                status[_short(name)] = DROPPED
                dropped_values[_short(name)] = [float(v) for v in p.detach().flatten()]
            elif bool(torch.isnan(p).any()):
                status[_short(name)] = NAN
            else:
                status[_short(name)] = LOADED if name in counted else KEPT
        finite = ~torch.isnan(logits)
        ledger = ledger_of(model)
        pattern = model.config.hybrid_override_pattern
        return cls(
            behaviour=behaviour,
            order=order,
            steps=steps,
            status=status,
            blocks=[f"layers.{i} ({k})" for i, k in enumerate(pattern)],
            pointers_kept=all(p.data_ptr() == storage[n] for n, p in model.named_parameters()),
            logits_nan=int((~finite).sum()),
            logits_total=logits.numel(),
            nan_per_token=[int(n) for n in (~finite).sum(-1)],
            differ_per_token=[int(n) for n in (~(logits == reference)).sum(-1)],
            max_error=(
                float((logits[finite] - reference[finite]).abs().max()) if finite.any() else 0.0
            ),
            partly_loaded=[_short(n) for n in partly_loaded],
            ledger_never_loaded=len(ledger.never_loaded) if ledger is not None else -1,
            warnings=[f"{w.category.__name__}: {w.message}" for w in caught],
            fill=fill,
            logits_differ=int((~(logits == reference)).sum()),
            dropped_values=dropped_values,
        )

    def layer_names(self, pick: str = MIXERS) -> list[str]:
        """Layers (modules with direct parameters) the chart shows for a picker choice."""
        layers = list(dict.fromkeys(s.layer for s in self.steps))
        if pick == MIXERS:
            return [n for n in layers if n.endswith(".mixer")]
        block = pick.split(" ")[0]
        return [n for n in layers if _short(n).startswith(block + ".")]


# The notebook's reload: reload(behaviour, order) -> ReloadRun.
Reload = Callable[[str, str], ReloadRun]


def counter_record(run: ReloadRun, pick: str = MIXERS) -> Record:
    """Chart series: each chosen layer's running count per load step, totals, finals, drops."""
    rec = Record(run.behaviour)
    layers = run.layer_names(pick)
    totals: dict[str, list] = {"x": [], "y": []}
    for layer in layers:
        own = [s for s in run.steps if s.layer == layer and s.parameter]
        for s in own:
            rec.add_point(_short(layer), s.step, s.running)
        rec.series[_short(layer)].text = [
            f"{s.parameter} {'dropped' if s.dropped else f'+{s.counted}'}" for s in own
        ]
        totals["x"] += [own[0].step, own[-1].step, None]
        totals["y"] += [own[0].total, own[0].total, None]
    rec.series["total"] = Series(totals["x"][:-1], totals["y"][:-1], mode="lines")
    chosen = set(layers)
    for label, pick_step in (
        ("finalised", lambda s: s.finalised),
        ("dropped (excessive)", lambda s: s.dropped),
    ):
        hits = [s for s in run.steps if s.layer in chosen and pick_step(s)]
        rec.series[label] = Series(
            [s.step for s in hits],
            [s.running for s in hits],
            mode="markers",
            text=[f"{_short(s.layer)}.{s.parameter}" for s in hits],
        )
    rec.events = [asdict(s) | {"layer": _short(s.layer)} for s in run.steps]
    rec.outcome = outcome(run)
    return rec


def outcome(run: ReloadRun) -> dict[str, Any]:
    """The findings of a run, for the side-by-side table."""
    dropped = [n for n, s in run.status.items() if s == DROPPED]
    return {
        "order": run.order,
        "loads counted": sum(1 for s in run.steps if s.parameter and not s.dropped),
        "layers finalised": sum(1 for s in run.steps if s.finalised),
        "loads dropped": len(dropped),
        "dropped": ", ".join(dropped) or "-",
        "NaN parameters": sum(1 for s in run.status.values() if s in (DROPPED, NAN)),
        "NaN logits": f"{run.logits_nan}/{run.logits_total}",
        "max |logit - fresh|": run.max_error if run.logits_nan < run.logits_total else "all NaN",
        "live storage kept": run.pointers_kept,
        "ledger: never loaded": run.ledger_never_loaded,
    }


def records(reload: Reload, order: str = "d-last", pick: str = MIXERS) -> dict[str, Record]:
    """Old and new records for one checkpoint order and layer choice (``reload``: the
    notebook's function)."""
    return {b: counter_record(reload(b, order), pick) for b in ("old", "new")}


def main_records(reload: Reload) -> dict[str, Record]:
    """Exactly what the notebook's main toggle starts with: order "d-last", the mamba mixers."""
    return records(reload, "d-last", MIXERS)


def status_grid(run: ReloadRun) -> tuple[list[str], list[str], list[list[int]], list[list[str]]]:
    """Rows (blocks), columns (parameter names within a block), status codes and cell labels.

    Codes index ``STATUSES``; -1 marks a parameter the block does not have.
    """
    rows = [b.split(" ")[0] for b in run.blocks]
    cols: list[str] = []
    for name in run.status:
        if name.startswith("layers."):
            rest = name.split(".", 2)[2]
            if rest not in cols:
                cols.append(rest)
    codes, labels = [], []
    for r in rows:
        states = [run.status.get(f"{r}.{c}") for c in cols]
        codes.append([STATUSES.index(s) if s else -1 for s in states])
        labels.append([s or "" for s in states])
    return rows, cols, codes, labels


def grid_text(run: ReloadRun) -> str:
    """The status grid as text: only the cells that are not plainly loaded."""
    rows, cols, _, labels = status_grid(run)
    lines = [f"[{run.behaviour}, {run.order}] parameters not loaded as sent:"]
    dropped = f"dropped → {FILL_WORDS[run.fill]}"
    for r, row in zip(rows, labels, strict=True):
        bad = [
            f"{c}: {dropped if s == DROPPED else s}"
            for c, s in zip(cols, row, strict=True)
            if s and s != LOADED
        ]
        if bad:
            lines.append(f"  {r}: " + "; ".join(bad))
    if len(lines) == 1:
        lines.append("  none: every parameter holds the value it was sent")
    return "\n".join(lines)


def layer_steps(run: ReloadRun, layer: str) -> str:
    """One layer's steps as a table (layer given without the "model." prefix)."""
    header = ("step", "parameter", "counted", "running", "total", "event")
    rows = [
        (s.step, s.parameter or "-", s.counted, s.running, s.total, _event(s))
        for s in run.steps
        if _short(s.layer) == layer
    ]
    return table(rows, header=header, align="rlrrrl")


def _event(step: ReloadStep) -> str:
    return "DROPPED" if step.dropped else ("finalised" if step.finalised else "")


def forward_text(run: ReloadRun) -> str:
    """The verdict on the logits of the reloaded model, against a fresh load of the update."""
    head = f"[{run.behaviour}, {run.order}] forward on {len(run.nan_per_token)} tokens: "
    if run.logits_nan == run.logits_total:
        return head + f"NaN logits (all {run.logits_total})"
    verdict = "NaN logits" if run.logits_nan else "finite logits"
    return head + (
        f"{verdict} ({run.logits_nan}/{run.logits_total} NaN), "
        f"max |logit - fresh load| = {run.max_error:.3g}"
    )


# --- the counter view: each call's share of its layer, old and new side by side -----------------

# One colour per legend entry, the same in every view: a parameter filled by one call has its
# own colour; the calls into a packed parameter (qkv_proj's three shards, "weight #1" ...) get
# three shades of another, so no two entries of one legend share a colour.
PARAM_COLOURS: dict[str, str | list[str]] = {
    "A": "#e07a5f",
    "dt_bias": "#3d5a80",
    "D": "#81b29a",
    "weight": "#f2a541",
    "weight #": ["#6a4c93", "#9c7fc4", "#cdb8e6"],
    "bias": "#98c1d9",
}
Y_RANGE = [0, 160]  # % of the layer total: old's overshoot and drops stay in view in every order


@dataclass
class Share:
    """One weight-loader call as a share of its layer: where its bar segment starts and ends."""

    layer: str  # short name
    behaviour: str
    label: str  # parameter, with the call number when a parameter takes several calls
    parameter: str
    base: float  # % of the layer total before this call
    size: float  # % this call added (for a dropped call: what it would have added)
    counted: int
    dropped: bool
    finalised: bool


def shares(run: ReloadRun, pick: str = MIXERS, sizes: ReloadRun | None = None) -> list[Share]:
    """Every call into the chosen layers, in order, as % of its layer's total.

    A dropped call counted nothing; its segment shows what it would have added, taken from
    ``sizes`` (a "new" run of the same order, where nothing is dropped).
    """
    out = []
    would = {}
    if sizes is not None:
        seen: dict[tuple[str, str], int] = {}
        for s in sizes.steps:
            if s.parameter:
                k = seen[(s.layer, s.parameter)] = seen.get((s.layer, s.parameter), 0) + 1
                would[(s.layer, s.parameter, k)] = s.counted
    for layer in run.layer_names(pick):
        own = [s for s in run.steps if s.layer == layer and s.parameter]
        calls: dict[str, int] = {}
        running = 0
        for s in own:
            k = calls[s.parameter] = calls.get(s.parameter, 0) + 1
            many = sum(1 for o in own if o.parameter == s.parameter) > 1
            counted = would.get((layer, s.parameter, k), 0) if s.dropped else s.counted
            out.append(
                Share(
                    layer=_short(layer),
                    behaviour=run.behaviour,
                    label=f"{s.parameter} #{k}" if many else s.parameter,
                    parameter=s.parameter,
                    base=100 * running / s.total,
                    size=100 * counted / s.total,
                    counted=s.counted,
                    dropped=s.dropped,
                    finalised=s.finalised,
                )
            )
            running += counted
    return out


def _colour(share: Share) -> str:
    if "#" in share.label:  # one of several calls into one parameter
        shades = PARAM_COLOURS.get(f"{share.parameter} #", ["#adb5bd"])
        k = int(share.label.split("#")[1]) - 1
        return shades[min(k, len(shades) - 1)]
    colour = PARAM_COLOURS.get(share.parameter, "#adb5bd")
    return colour if isinstance(colour, str) else colour[0]


def counter_figure(old: ReloadRun, new: ReloadRun, pick: str = MIXERS) -> Any:
    """Per layer, old and new side by side: each call's share of the layer total, stacked in
    arrival order. 100% finalises the layer; a call after that is dropped (hatched, annotated).
    """
    segments = shares(old, pick, new) + shares(new, pick, new)
    fig = _counter_base(new.order, pick)
    kept = [s for s in segments if not s.dropped]
    for label in dict.fromkeys(s.label for s in kept):
        fig.add_trace(_share_bar(label, [s for s in kept if s.label == label]))
    dropped = [s for s in segments if s.dropped]
    if dropped:
        fig.add_trace(_dropped_bar(dropped, new.fill))
    return fig


def _counter_base(order: str, pick: str) -> Any:
    """The counter view's empty figure: axes in % of the layer total, the total's line."""
    from loadkit_notebooks.viz import base_figure

    fig = base_figure(
        f"Each call's share of its layer, old and new [{ORDER_LABELS[order]}; {pick}]",
        height=440,
        barmode="overlay",
        bargap=0.25,
        yaxis={"title": "% of the layer's elements counted", "range": Y_RANGE, "dtick": 25},
        xaxis={"title": None},
        legend_title_text="call",
    )
    # Below the bars: it shows between them and never strikes through a segment's label.
    fig.add_hline(y=100, line={"color": "#343a40", "width": 1.5, "dash": "dash"}, layer="below")
    ticks = list(range(0, Y_RANGE[1], 25))
    fig.update_yaxes(
        tickvals=ticks, ticktext=[f"{t}%" if t != 100 else "total 100%" for t in ticks]
    )
    return fig


def _share_bar(label: str, part: list[Share]) -> Any:
    """The segments of one legend entry (a parameter, or one call into a packed one)."""
    import plotly.graph_objects as go

    return go.Bar(
        name=label,
        x=[[s.layer for s in part], [s.behaviour for s in part]],
        y=[s.size for s in part],
        base=[s.base for s in part],
        marker={"color": _colour(part[0]), "line": {"color": "white", "width": 1}},
        customdata=[[s.counted] for s in part],
        text=[f"{label} +{s.counted}" for s in part],
        textposition="inside",
        insidetextanchor="middle",
        hovertemplate="%{x}<br>" + label + ": +%{customdata[0]} elements"
        " (%{y:.0f}% of the layer)<extra></extra>",
    )


def _dropped_bar(dropped: list[Share], fill: str) -> Any:
    """The calls dropped after their layer was finalised: hatched, what they would have added."""
    import plotly.graph_objects as go

    word = FILL_WORDS[fill]
    return go.Bar(
        name=f"dropped → {word}",
        x=[[s.layer for s in dropped], [s.behaviour for s in dropped]],
        y=[s.size for s in dropped],
        base=[s.base for s in dropped],
        marker={
            "color": "rgba(209, 73, 91, 0.15)",
            "line": {"color": "#d1495b", "width": 2},
            "pattern": {"shape": "/", "fgcolor": "#d1495b"},
        },
        text=[f"{s.parameter} dropped → {word}" for s in dropped],
        textposition="outside",
        textfont={"color": "#d1495b", "size": 13},
        constraintext="none",
        cliponaxis=False,
        hovertemplate="%{x}<br>%{text}<extra></extra>",
    )


def counter_text(old: ReloadRun, new: ReloadRun, pick: str = MIXERS) -> str:
    """The counter view as text, one line per layer and behaviour (what nbval compares)."""
    segments = shares(old, pick, new) + shares(new, pick, new)
    lines = []
    for layer in dict.fromkeys(s.layer for s in segments):
        for b in ("old", "new"):
            own = [s for s in segments if s.layer == layer and s.behaviour == b]
            kept = [s for s in own if not s.dropped]
            parts = " + ".join(f"{s.label} {s.size:.0f}%" for s in kept)
            total = sum(s.size for s in kept)
            drops = "".join(f"; {s.parameter} dropped → NaN" for s in own if s.dropped)
            lines.append(f"{layer:<24} {b}: {parts} = {total:.0f}%{drops}")
    return "\n".join(lines)


# --- what a dropped parameter reads: one run per fill ---------------------------------------------


def fill_text(runs: Mapping[str, ReloadRun]) -> str:
    """One line per fill: what the first dropped parameter reads, and the logits against a
    fresh load (``runs``: fill -> a run of the same behaviour and order)."""
    lines = []
    for fill, run in runs.items():
        name, values = next(iter(run.dropped_values.items()), ("-", []))
        shown = ", ".join("nan" if v != v else f"{v:g}" for v in values)
        logits = (
            f"{run.logits_nan}/{run.logits_total} logits NaN"
            if run.logits_nan
            else f"logits finite, {run.logits_differ}/{run.logits_total} differ from a fresh load"
        )
        lines.append(f"[{run.behaviour}, fill {fill}] {name} = [{shown}]")
        lines.append(f"    {logits}")
    return "\n".join(lines)


def fill_figure(runs: Mapping[str, ReloadRun]) -> Any:
    """Per prompt position, how many logits differ from a fresh load, one bar per fill; the
    part that is NaN is drawn hatched. Every fill breaks every logit: only NaN shows it."""
    import plotly.graph_objects as go

    from loadkit_notebooks.viz import base_figure

    first = next(iter(runs.values()))
    positions = list(range(len(first.nan_per_token)))
    vocab = first.logits_total // max(len(positions), 1)
    fig = base_figure(
        f"Logits unlike a fresh load's, per position, by fill [{first.behaviour}, {first.order}]",
        height=340,
        barmode="group",
        xaxis_title="prompt position",
        yaxis={"title": f"logits (of {vocab})", "range": [0, vocab * 1.05]},
        legend_title_text="fill",
    )
    for fill, run in runs.items():
        nan = run.nan_per_token
        differ = run.differ_per_token
        fig.add_trace(
            go.Bar(
                name=FILL_LABELS.get(fill, fill),
                x=positions,
                y=differ,
                marker={
                    "color": FILL_COLOURS.get(fill, "#adb5bd"),
                    "pattern": {"shape": "/" if any(nan) else ""},
                },
                customdata=[[n] for n in nan],
                hovertemplate="position %{x}: %{y} differ (%{customdata[0]} NaN)<extra></extra>",
            )
        )
    return fig


FILL_COLOURS = {"stale": "#8d99ae", "nan": "#d1495b", "zero": "#edae49"}


# --- the behaviour's consequences: every parameter's fate, the logits ----------------------------

_COLOURS = {-1: "#f2f2f2", 0: "#4c9f70", 1: "#d1495b", 2: "#edae49", 3: "#8d99ae"}


def grid_figure(run: ReloadRun) -> Any:
    """A heatmap of every parameter's fate, block by block."""
    import plotly.graph_objects as go

    from loadkit_notebooks.viz import base_figure

    rows, cols, codes, labels = status_grid(run)
    scale = []
    keys = sorted(_COLOURS)
    for i, k in enumerate(keys):  # a discrete colour scale over codes -1..3
        lo, hi = i / len(keys), (i + 1) / len(keys)
        scale += [[lo, _COLOURS[k]], [hi, _COLOURS[k]]]
    fig = base_figure(
        f"Every parameter after the reload: green loaded, red NaN (its load dropped) "
        f"[{run.behaviour}]",
        height=330,
        margin={"l": 80, "r": 20, "t": 70, "b": 110},
        xaxis_tickangle=-30,
    )
    fig.add_trace(
        go.Heatmap(
            z=codes,
            x=cols,
            y=rows,
            text=[[("NaN" if c == 1 else "") for c in row] for row in codes],  # fits a cell
            customdata=labels,
            texttemplate="%{text}",
            textfont={"color": "white", "size": 11},
            hovertemplate="%{y}.%{x}: %{customdata}<extra></extra>",
            zmin=-1.5,
            zmax=3.5,
            colorscale=scale,
            showscale=False,
            xgap=2,
            ygap=2,
        )
    )
    fig.update_layout(yaxis_autorange="reversed")
    return fig


def forward_figure(run: ReloadRun) -> Any:
    """Per prompt token, how many of its logits are finite and how many NaN."""
    import plotly.graph_objects as go

    from loadkit_notebooks.viz import base_figure

    positions = list(range(len(run.nan_per_token)))
    vocab = run.logits_total // max(len(positions), 1)
    fig = base_figure(
        forward_text(run),
        height=280,
        barmode="stack",
        xaxis_title="prompt position",
        yaxis={"title": "logits", "range": [0, vocab]},
    )
    fig.add_trace(
        go.Bar(
            name="finite",
            x=positions,
            y=[vocab - n for n in run.nan_per_token],
            marker_color=_COLOURS[0],
        )
    )
    fig.add_trace(go.Bar(name="NaN", x=positions, y=run.nan_per_token, marker_color=_COLOURS[1]))
    return fig


def toggle_figure(record: Record, reload: Reload) -> Any:
    """What the behaviour toggle draws for a record of ``main_records(reload)``: the grid."""
    return grid_figure(reload(record.behaviour, record.outcome["order"]))


def _layout(ex: Explorer) -> tuple[Any, ...]:
    """Three outputs for one cell: the counter view, the toggle with the grid, the logits."""
    from loadkit_notebooks.chart import Panel

    return (
        Panel(widgets_row(ex.order, ex.picker), ex.counter, chart=ex.counter),
        Panel(ex.toggle, ex.grid, chart=ex.grid),
        ex.logits,
    )


def _describe(ex: Explorer) -> str:
    """Everything the widgets show, as text (what nbval compares)."""
    run = ex.reload(ex.toggle.value, ex.order.value)
    old, new = ex.reload("old", ex.order.value), ex.reload("new", ex.order.value)
    return "\n".join(
        [
            f"[order {ex.order.value}, layers {ex.picker.value}, {ex.toggle.value}]",
            counter_text(old, new, ex.picker.value),
            grid_text(run),
            forward_text(run),
        ]
    )


def widgets_row(*children: Any) -> Any:
    import ipywidgets as widgets

    return widgets.HBox(list(children))


def explorer(reload: Reload) -> Explorer:
    """Build the widgets over the notebook's ``reload(behaviour, order)`` (called once per
    behaviour and order, then remembered): order and layer pickers with the counter view, the
    behaviour toggle with the status grid and the logits. They start on
    ``main_records(reload)`` (old, d-last, mamba mixers)."""
    import ipywidgets as widgets

    from loadkit_notebooks.chart import Chart

    reload = functools.cache(reload)
    recs = main_records(reload)
    old, new = reload("old", "d-last"), reload("new", "d-last")
    counter = Chart(counter_figure(old, new, MIXERS))
    grid = Chart(grid_figure(old))
    logits = Chart(forward_figure(old))
    order = widgets.Dropdown(
        options=[(label, key) for key, label in ORDER_LABELS.items()],
        value="d-last",
        description="order",
    )
    picker = widgets.Dropdown(options=[MIXERS, *old.blocks], value=MIXERS, description="layers")
    toggle = widgets.ToggleButtons(options=list(recs), value="old", description="behaviour")

    def refresh(_: Any = None) -> None:
        run = reload(toggle.value, order.value)
        grid.draw(grid_figure(run))
        logits.draw(forward_figure(run))

    def rebuild(_: Any = None) -> None:
        recs.update(records(reload, order.value, picker.value))
        pair = reload("old", order.value), reload("new", order.value)
        counter.draw(counter_figure(*pair, picker.value))
        refresh()

    toggle.observe(refresh, names="value")
    order.observe(rebuild, names="value")
    picker.observe(rebuild, names="value")
    parts = {"reload": reload, "order": order, "picker": picker, "counter": counter}
    parts |= {"grid": grid, "logits": logits}
    return Explorer(recs, toggle, parts, layout=_layout, describe=_describe)
