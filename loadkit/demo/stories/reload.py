"""The layerwise-reload story (notebook 03): a NemotronH-like model reloaded in place.

A run loads ``data/nemotron_h/initial.safetensors`` (seed 0), records the metadata, then reloads
``update-<order>.safetensors`` (seed 1, the "RL update") layerwise under one behaviour, through the
model's own ``load_weights``. It keeps the reload log, every parameter's fate, the live storage
pointers and the logits of a fixed prompt. Records turn a run into chart series for a chosen set
of layers; ``main_records()`` is what the notebook's old/new toggle swaps between.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from loadkit.checkpoint.reader import open_checkpoint
from loadkit.demo.scenario import Record, Series
from loadkit.demo.stories import DATA_DIR
from loadkit.errors import LoadkitError
from loadkit.loading.counting import CopyCounter, get_numel_loaded
from loadkit.loading.ledger import ledger_of
from loadkit.models.nemotron_h import ORDERS, NemotronHForCausalLM, config_from_checkpoint
from loadkit.reload.layerwise import (
    ReloadStep,
    finalize_layerwise_reload,
    initialize_layerwise_reload,
    record_metadata_for_reloading,
    reload_log,
)

DATA = DATA_DIR / "nemotron_h"
PROMPT = torch.tensor([3, 14, 15, 9, 26, 5, 35, 8])
MIXERS = "mamba mixers"
ORDER_LABELS = {
    "d-last": "D last (A_log, dt_bias, D)",
    "d-first": "D first (D, A_log, dt_bias)",
    "shuffled": "shuffled by layer",
}

LOADED, DROPPED, NAN, KEPT = "loaded", "dropped → NaN", "NaN (not loaded)", "kept (not in update)"
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
    max_error: float  # largest |logit - fresh load's logit| where not NaN
    partly_loaded: list[str]
    ledger_never_loaded: int  # what AutoWeightsLoader's ledger saw: drops happen below it
    warnings: list[str] = field(default_factory=list)

    def layer_names(self, pick: str = MIXERS) -> list[str]:
        """Layers (modules with direct parameters) the chart shows for a picker choice."""
        layers = list(dict.fromkeys(s.layer for s in self.steps))
        if pick == MIXERS:
            return [n for n in layers if n.endswith(".mixer")]
        block = pick.split(" ")[0]
        return [n for n in layers if _short(n).startswith(block + ".")]


def _model_and_initial() -> NemotronHForCausalLM:
    initial = open_checkpoint(DATA / "initial.safetensors")
    model = NemotronHForCausalLM(config_from_checkpoint(initial.tensors))
    model.load_weights(initial.weights())
    return model


@functools.lru_cache(maxsize=3)
def _fresh_logits(order: str) -> torch.Tensor:
    """Logits of a model loaded from the update the ordinary way (no reload): the reference."""
    model = _model_and_initial()
    model.load_weights(open_checkpoint(DATA / f"update-{order}.safetensors").weights())
    return model(PROMPT)


@functools.lru_cache(maxsize=8)
def run_reload(behaviour: str = "new", order: str = "d-last") -> ReloadRun:
    """Reload the update in ``order`` into a running model under ``behaviour`` (cached)."""
    if order not in ORDERS:
        raise LoadkitError(f"order must be one of {ORDERS}, not {order!r}")
    model = _model_and_initial()
    record_metadata_for_reloading(model)
    pointers = {n: p.data_ptr() for n, p in model.named_parameters()}
    update = open_checkpoint(DATA / f"update-{order}.safetensors")
    initialize_layerwise_reload(model, behaviour=behaviour)  # type: ignore[arg-type]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.load_weights(update.weights())
        partly = finalize_layerwise_reload(model)
    steps = reload_log(model)
    dropped = {f"{s.layer}.{s.parameter}" for s in steps if s.dropped}
    counted = {f"{s.layer}.{s.parameter}" for s in steps if not s.dropped and s.parameter}
    status = {}
    for name, p in model.named_parameters():
        if name in dropped:
            status[_short(name)] = DROPPED
        elif bool(torch.isnan(p).any()):
            status[_short(name)] = NAN
        else:
            status[_short(name)] = LOADED if name in counted else KEPT
    logits, ref = model(PROMPT), _fresh_logits(order)
    finite = ~torch.isnan(logits)
    pattern = model.config.hybrid_override_pattern
    return ReloadRun(
        behaviour=behaviour,
        order=order,
        steps=steps,
        status=status,
        blocks=[f"layers.{i} ({k})" for i, k in enumerate(pattern)],
        pointers_kept=all(p.data_ptr() == pointers[n] for n, p in model.named_parameters()),
        logits_nan=int((~finite).sum()),
        logits_total=logits.numel(),
        nan_per_token=[int(n) for n in (~finite).sum(-1)],
        max_error=float((logits[finite] - ref[finite]).abs().max()) if finite.any() else 0.0,
        partly_loaded=[_short(n) for n in partly],
        ledger_never_loaded=len(ledger_of(model).never_loaded),
        warnings=[f"{w.category.__name__}: {w.message}" for w in caught],
    )


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


def records(order: str = "d-last", pick: str = MIXERS) -> dict[str, Record]:
    """Old and new records for one checkpoint order and layer choice."""
    return {b: counter_record(run_reload(b, order), pick) for b in ("old", "new")}


def main_records() -> dict[str, Record]:
    """Exactly what the notebook's main toggle starts with: order "d-last", the mamba mixers."""
    return records("d-last", MIXERS)


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
    for r, row in zip(rows, labels, strict=True):
        bad = [f"{c}: {s}" for c, s in zip(cols, row, strict=True) if s and s != LOADED]
        if bad:
            lines.append(f"  {r}: " + "; ".join(bad))
    if len(lines) == 1:
        lines.append("  none: every parameter holds the value it was sent")
    return "\n".join(lines)


def layer_steps(run: ReloadRun, layer: str) -> str:
    """One layer's steps as a table (layer given without the "model." prefix)."""
    lines = [f"{'step':>4}  {'parameter':<10} {'counted':>7} {'running':>7} {'total':>5}  event"]
    for s in run.steps:
        if _short(s.layer) == layer:
            event = "DROPPED" if s.dropped else ("finalised" if s.finalised else "")
            lines.append(
                f"{s.step:>4}  {s.parameter or '-':<10} {s.counted:>7} {s.running:>7} "
                f"{s.total:>5}  {event}"
            )
    return "\n".join(lines)


def forward_text(run: ReloadRun) -> str:
    """The verdict on the logits of the reloaded model, against a fresh load of the update."""
    head = f"[{run.behaviour}, {run.order}] forward on {len(PROMPT)} tokens: "
    if run.logits_nan == run.logits_total:
        return head + f"NaN logits (all {run.logits_total})"
    verdict = "NaN logits" if run.logits_nan else "finite logits"
    return head + (
        f"{verdict} ({run.logits_nan}/{run.logits_total} NaN), "
        f"max |logit - fresh load| = {run.max_error:.3g}"
    )


def composed_loader_copies() -> str:
    """How often A's composed loader copies, and what each behaviour counts for it."""
    from loadkit.models.nemotron_h import NemotronHForCausalLM as Model

    with torch.device("meta"):
        a = Model().model.layers[0].mixer.A
    a_log = torch.zeros(a.shape)
    lines = []
    with CopyCounter() as counter:
        a.weight_loader(a, a_log)
    lines.append(
        f"A has {a.numel()} elements; its composed loader made {counter.count} copies "
        f"writing {counter.copied_numel} elements"
    )
    for behaviour in ("old", "new"):
        bound = inspect.signature(a.weight_loader).bind(a, a_log)
        n, _ = get_numel_loaded(a.weight_loader, bound, behaviour=behaviour)  # type: ignore[arg-type]
        lines.append(f"get_numel_loaded(..., behaviour={behaviour!r}) -> {n}")
    return "\n".join(lines)


# --- the counter view: each call's share of its layer, old and new side by side -----------------

# One colour per parameter name, the same in every view; later calls into one parameter (the
# packed qkv_proj's shards) get the lighter shades.
PARAM_COLOURS = {
    "A": "#e07a5f",
    "dt_bias": "#3d5a80",
    "D": "#81b29a",
    "weight": ["#f2a541", "#f6c177", "#fadcaa"],
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
    colour = PARAM_COLOURS.get(share.parameter, "#adb5bd")
    if isinstance(colour, list):
        k = int(share.label.split("#")[1]) - 1 if "#" in share.label else 0
        return colour[min(k, len(colour) - 1)]
    return colour


def counter_figure(order: str = "d-last", pick: str = MIXERS) -> Any:
    """Per layer, old and new side by side: each call's share of the layer total, stacked in
    arrival order. 100% finalises the layer; a call after that is dropped (hatched, annotated).
    """
    import plotly.graph_objects as go

    from loadkit.demo.viz import base_figure

    new = run_reload("new", order)
    segments = shares(run_reload("old", order), pick, new) + shares(new, pick, new)
    fig = base_figure(
        f"Each call's share of its layer, old and new [{ORDER_LABELS[order]}; {pick}]",
        height=440,
        barmode="overlay",
        bargap=0.25,
        yaxis={"title": "% of the layer's elements counted", "range": Y_RANGE, "dtick": 25},
        xaxis={"title": None},
        legend_title_text="call",
    )
    fig.add_hline(y=100, line={"color": "#343a40", "width": 1.5, "dash": "dash"})
    ticks = list(range(0, Y_RANGE[1], 25))
    fig.update_yaxes(
        tickvals=ticks, ticktext=[f"{t}%" if t != 100 else "total 100%" for t in ticks]
    )
    for label in dict.fromkeys(s.label for s in segments if not s.dropped):
        part = [s for s in segments if s.label == label and not s.dropped]
        fig.add_trace(
            go.Bar(
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
        )
    dropped = [s for s in segments if s.dropped]
    if dropped:
        fig.add_trace(
            go.Bar(
                name="dropped → NaN",
                x=[[s.layer for s in dropped], [s.behaviour for s in dropped]],
                y=[s.size for s in dropped],
                base=[s.base for s in dropped],
                marker={
                    "color": "rgba(209, 73, 91, 0.15)",
                    "line": {"color": "#d1495b", "width": 2},
                    "pattern": {"shape": "/", "fgcolor": "#d1495b"},
                },
                text=[f"{s.parameter} dropped → NaN" for s in dropped],
                textposition="outside",
                textfont={"color": "#d1495b", "size": 13},
                constraintext="none",
                cliponaxis=False,
                hovertemplate="%{x}<br>%{text}<extra></extra>",
            )
        )
    return fig


def counter_text(order: str = "d-last", pick: str = MIXERS) -> str:
    """The counter view as text, one line per layer and behaviour (what nbval compares)."""
    new = run_reload("new", order)
    segments = shares(run_reload("old", order), pick, new) + shares(new, pick, new)
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


# --- the behaviour's consequences: every parameter's fate, the logits ----------------------------

_COLOURS = {-1: "#f2f2f2", 0: "#4c9f70", 1: "#d1495b", 2: "#edae49", 3: "#8d99ae"}


def grid_figure(run: ReloadRun) -> Any:
    """A heatmap of every parameter's fate, block by block."""
    import plotly.graph_objects as go

    from loadkit.demo.viz import base_figure

    rows, cols, codes, labels = status_grid(run)
    scale = []
    keys = sorted(_COLOURS)
    for i, k in enumerate(keys):  # a discrete colour scale over codes -1..3
        lo, hi = i / len(keys), (i + 1) / len(keys)
        scale += [[lo, _COLOURS[k]], [hi, _COLOURS[k]]]
    fig = base_figure(
        f"Every parameter after the reload: green loaded, red dropped → NaN [{run.behaviour}]",
        height=330,
        margin={"l": 80, "r": 20, "t": 70, "b": 110},
        xaxis_tickangle=-30,
    )
    fig.add_trace(
        go.Heatmap(
            z=codes,
            x=cols,
            y=rows,
            text=[[("dropped → NaN" if c == 1 else "") for c in row] for row in codes],
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

    from loadkit.demo.viz import base_figure

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


def toggle_figure(record: Record) -> Any:
    """What the behaviour toggle draws for a record of ``main_records()``: the status grid."""
    return grid_figure(run_reload(record.behaviour, record.outcome["order"]))


@dataclass
class Explorer:
    """The notebook's widgets, wired: order and layer pickers with the counter view; the
    behaviour toggle with the status grid and the logits."""

    records: dict[str, Record]
    toggle: Any
    order: Any
    picker: Any
    counter: Any  # Chart: old and new shares per layer (follows order and picker)
    grid: Any  # Chart: every parameter's fate (follows toggle and order)
    logits: Any  # Chart: finite / NaN logits per prompt token (follows toggle and order)

    def run(self) -> ReloadRun:
        return run_reload(self.toggle.value, self.order.value)

    def outputs(self) -> tuple[Any, Any, Any]:
        """Three outputs for one cell: the counter view, the toggle with the grid, the logits."""
        from loadkit.demo.chart import Panel

        return (
            Panel(widgets_row(self.order, self.picker), self.counter, chart=self.counter),
            Panel(self.toggle, self.grid, chart=self.grid),
            self.logits,
        )

    def state(self) -> str:
        """Everything the widgets show, as text (what nbval compares)."""
        run = self.run()
        return "\n".join(
            [
                f"[order {self.order.value}, layers {self.picker.value}, {self.toggle.value}]",
                counter_text(self.order.value, self.picker.value),
                grid_text(run),
                forward_text(run),
            ]
        )


def widgets_row(*children: Any) -> Any:
    import ipywidgets as widgets

    return widgets.HBox(list(children))


def explorer() -> Explorer:
    """Build the widgets; they start on ``main_records()`` (old, d-last, mamba mixers)."""
    import ipywidgets as widgets

    from loadkit.demo.chart import Chart

    recs = main_records()
    counter = Chart(counter_figure("d-last", MIXERS))
    grid = Chart(grid_figure(run_reload("old", "d-last")))
    logits = Chart(forward_figure(run_reload("old", "d-last")))
    order = widgets.Dropdown(
        options=[(label, key) for key, label in ORDER_LABELS.items()],
        value="d-last",
        description="order",
    )
    picker = widgets.Dropdown(
        options=[MIXERS, *run_reload("old", "d-last").blocks], value=MIXERS, description="layers"
    )
    toggle = widgets.ToggleButtons(options=list(recs), value="old", description="behaviour")

    def refresh(_: Any = None) -> None:
        run = run_reload(toggle.value, order.value)
        grid.draw(grid_figure(run))
        logits.draw(forward_figure(run))

    def rebuild(_: Any = None) -> None:
        recs.update(records(order.value, picker.value))
        counter.draw(counter_figure(order.value, picker.value))
        refresh()

    toggle.observe(refresh, names="value")
    order.observe(rebuild, names="value")
    picker.observe(rebuild, names="value")
    return Explorer(recs, toggle, order, picker, counter, grid, logits)
