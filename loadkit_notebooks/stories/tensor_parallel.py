"""The tensor-parallel story (notebook 05): charts of the runs the notebook launches.

The notebook's own ``launch(tp)`` calls ``loadkit.executor.launcher.run_tensor_parallel`` on
``data/llama_like/model.safetensors`` (8 query heads over 2 kv heads, vocabulary 100 padded to
128) with three jobs (every bug fixed, the gguf-plugin rank bug old, the kv-replication bug old)
and returns job name -> run. Every function here takes that ``launch`` and only draws what it
returns; the widgets call it again on a click (the notebook caches it per ``tp``). The tp=1 run
is the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from loadkit.executor import BUGS, Job, TPRun
from loadkit.fmt import wrap
from loadkit.parallel import CopyRecord
from loadkit.terms import check_behaviour
from loadkit_inspect.tensor_parallel import render_row_map, row_map
from loadkit_notebooks.scenario import Record, Series, outcome_table
from loadkit_notebooks.viz import Explorer

# The notebook's function: tp -> {job name: run} (job names as ``Job.for_bug`` gives them).
Launch = Callable[[int], dict[str, TPRun]]
TPS = (1, 2, 4)
BEHAVIOURS = ("old", "new")
ATOL = 1e-5  # tensor parallelism reorders sums; the dyadic weights keep the values close
BUG_SHORT = {"gguf-rank": "gguf-plugin #103", "kv-replication": "vLLM #2379"}

# The keys the row map shows: layer 0 (the others split alike) and the vocabulary tables.
L0 = "model.layers.0."
SHOWN = (
    f"{L0}self_attn.q_proj.weight",
    f"{L0}self_attn.k_proj.weight",
    f"{L0}self_attn.v_proj.weight",
    f"{L0}self_attn.o_proj.weight",
    f"{L0}mlp.gate_proj.weight",
    f"{L0}mlp.up_proj.weight",
    f"{L0}mlp.down_proj.weight",
    f"{L0}input_layernorm.weight",
    "model.embed_tokens.weight",
    "lm_head.weight",
)


def short(key: str) -> str:
    return key.removeprefix(L0).removeprefix("model.").removesuffix(".weight")


def job_name(bug: str, behaviour: str) -> str:
    return "new" if behaviour == "new" else Job.for_bug(bug, check_behaviour(behaviour)).name


def run_for(launch: Launch, bug: str, behaviour: str, tp: int) -> TPRun:
    return launch(tp)[job_name(bug, behaviour)]


def reference(launch: Launch) -> TPRun:
    return launch(1)["new"].raise_for_errors()


def reference_logits(launch: Launch) -> np.ndarray:
    """tp=1's logits (a run without errors always has them)."""
    logits = reference(launch).logits
    assert logits is not None
    return logits


# --- what the charts show ---------------------------------------------------------------------


@dataclass
class Columns:
    """The heatmap's columns: one per checkpoint row (or column) of each shown key, and a gap
    of ``GAP`` empty columns between keys."""

    labels: list[str]  # per column: "q_proj row 17", or "" in a gap
    starts: dict[str, int]  # key -> first column index
    sizes: dict[str, int]  # key -> rows (or columns) along the split axis
    axes: dict[str, str]  # key -> "rows" or "cols"


GAP = 3


def columns(launch: Launch) -> Columns:
    """The columns, from a tp=2 run (where every split shows its axis: row-parallel keys are
    split along their columns)."""
    fixed = run_for(launch, "gguf-rank", "new", 2)
    entries = {e.key: e for e in row_map([r.records for r in fixed.ranks])}
    labels: list[str] = []
    starts, sizes, axes = {}, {}, {}
    for key in SHOWN:
        if labels:
            labels += [""] * GAP
        e = entries[key]
        starts[key], sizes[key], axes[key] = len(labels), e.size, e.axis
        labels += [f"{short(key)} {e.axis[:-1]} {i}" for i in range(e.size)]
    return Columns(labels, starts, sizes, axes)


def held_matrix(run: TPRun, cols: Columns) -> list[list[int | None]]:
    """``z[rank][column]``: 1 where the rank holds that checkpoint row (or column), 0 where it
    does not, ``None`` in the gaps between keys. Read from the copies the rank's loaders made."""
    z = [[0 if label else None for label in cols.labels] for _ in run.ranks]
    for rank, result in enumerate(run.ranks):
        for rec in result.records:
            if rec.key is None:  # a fill: no checkpoint rows
                continue
            span = rec.span_along(cols.axes.get(rec.key, "rows"))
            if rec.key not in cols.starts or span is None:
                continue
            if not 0 <= span[0] <= span[1] <= cols.sizes[rec.key]:
                raise ValueError(f"{rec.key}: span {span} outside its {cols.sizes[rec.key]} cells")
            base = cols.starts[rec.key]
            for i in range(*span):
                z[rank][base + i] = 1
    return z


# Cell values of the row map: each rank's rows compared with what the same rank holds under the
# fix (the "new" run at the same tp; a comparison of two real runs, no sharding formula).
NOT_HELD, HELD, WRONG, MISSING = 0, 1, 2, 3
CELL_STYLE = {
    NOT_HELD: ("not this rank's", "#eef0f2"),
    HELD: ("held, as under the fix", "#2e86ab"),
    WRONG: ("held, but not this rank's share", "#d1495b"),
    MISSING: ("this rank's share, not loaded", "#edae49"),
}


def cell_matrix(run: TPRun, fixed: TPRun, cols: Columns) -> list[list[int | None]]:
    """``run``'s row map against ``fixed``'s, cell by cell (``CELL_STYLE``'s codes)."""
    out = []
    for got, want in zip(held_matrix(run, cols), held_matrix(fixed, cols), strict=True):
        line: list[int | None] = []
        for g, w in zip(got, want, strict=True):
            if g is None or w is None:  # the gaps between keys: the same cells in both
                line.append(None)
            else:
                line.append({(1, 1): HELD, (1, 0): WRONG, (0, 1): MISSING}.get((g, w), NOT_HELD))
        out.append(line)
    return out


STATUS = {  # what a rank's status means, in a chart's labels
    "ok": "ok",
    "load error": "load failed",
    "skipped": "forward skipped",  # it loaded, but another rank did not: no forward ran
    "forward error": "forward failed",
    "died": "died",
    "killed": "killed",
}


def rank_label(result: Any) -> str:
    """``rank 1``, or ``rank 2: load failed`` for a rank that did not finish as ``ok``."""
    if result.status == "ok":
        return f"rank {result.rank}"
    return f"rank {result.rank}: {STATUS.get(result.status, result.status)}"


def _rows_series(
    run: TPRun, fixed: TPRun, cols: Columns, prefix: str = ""
) -> tuple[list[str], list[list[int | None]], list[list[str]]]:
    ranks = [prefix + rank_label(r) for r in run.ranks]
    codes = cell_matrix(run, fixed, cols)
    text = [
        [
            f"{rank}: {label}<br>{CELL_STYLE[c][0]}" if c is not None else ""
            for label, c in zip(cols.labels, line, strict=True)
        ]
        for rank, line in zip(ranks, codes, strict=True)
    ]
    return ranks, codes, text


def rows_record(launch: Launch, bug: str, tp: int, behaviour: str) -> Record:
    """The main toggle's record: the row map of ``bug`` at ``tp`` under ``behaviour``."""
    run, fixed = run_for(launch, bug, behaviour, tp), run_for(launch, bug, "new", tp)
    cols = columns(launch)
    ranks, codes, text = _rows_series(run, fixed, cols)
    rec = Record(behaviour)
    rec.series["checkpoint rows"] = Series(
        x=list(range(len(cols.labels))), y=ranks, mode="heatmap", z=codes, text=text
    )
    rec.outcome = {"bug": bug, "tp": tp, "columns": cols, **outcome(launch, run)}
    return rec


def contrast_record(launch: Launch, bug: str, tp: int) -> Record:
    """Old and new in one row map: each rank's line under ``"old"``, then under ``"new"``."""
    old, new = run_for(launch, bug, "old", tp), run_for(launch, bug, "new", tp)
    cols = columns(launch)
    y: list[str] = []
    z: list[list[int | None]] = []
    text: list[list[str]] = []
    for behaviour, run in (("old", old), ("new", new)):
        ranks, codes, cells = _rows_series(run, new, cols, prefix=f"{behaviour} · ")
        y, z, text = y + ranks, z + codes, text + cells
    rec = Record("old and new")
    rec.series["checkpoint rows"] = Series(
        x=list(range(len(cols.labels))), y=y, mode="heatmap", z=z, text=text
    )
    rec.outcome = {"bug": bug, "tp": tp, "columns": cols}
    return rec


def records(launch: Launch, bug: str, tp: int) -> dict[str, Record]:
    """old and new: what the main toggle swaps between for ``bug`` at ``tp``."""
    return {b: rows_record(launch, bug, tp, b) for b in BEHAVIOURS}


def main_records(launch: Launch) -> dict[str, Record]:
    """Where the notebook's widgets start (and end Run All): the gguf-plugin bug at tp=2, old."""
    return records(launch, "gguf-rank", 2)


def _discrete_scale() -> list[list[Any]]:
    codes = sorted(CELL_STYLE)
    scale: list[list[Any]] = []
    for i, code in enumerate(codes):
        colour = CELL_STYLE[code][1]
        scale += [[i / len(codes), colour], [(i + 1) / len(codes), colour]]
    return scale


def rows_figure(record: Record) -> Any:
    """The row map of a ``records()`` record: ranks down, checkpoint rows across (layer 0's
    weights and the vocabulary tables), coloured by how they compare with the fix."""
    import plotly.graph_objects as go

    from loadkit_notebooks.viz import base_figure

    s = record.series["checkpoint rows"]
    bug, tp, cols = record.outcome["bug"], record.outcome["tp"], record.outcome["columns"]
    fig = base_figure(
        f"Checkpoint rows each rank holds, tp={tp}, {BUG_SHORT[bug]} [{record.behaviour}]",
        height=230 + 42 * len(s.y),
        margin={"l": 20, "r": 20, "t": 120, "b": 95},
        xaxis={
            "tickmode": "array",
            "tickvals": [st + (cols.sizes[k] - 1) / 2 for k, st in cols.starts.items()],
            "ticktext": [short(k).rpartition(".")[2] for k in cols.starts],
            "tickangle": -30,
            "showgrid": False,
            "zeroline": False,
            "range": [-1, len(cols.labels)],
            "title": {
                "text": "checkpoint rows of layer 0 and the vocabulary tables "
                "(columns for o_proj, down_proj)"
            },
        },
        yaxis={"autorange": "reversed", "showgrid": False, "automargin": True},
    )
    n = len(CELL_STYLE)
    fig.add_trace(
        go.Heatmap(
            name="checkpoint rows",
            x=s.x,
            y=s.y,
            z=s.z,
            text=s.text,
            hovertemplate="%{text}<extra></extra>",
            colorscale=_discrete_scale(),
            zmin=-0.5,
            zmax=n - 0.5,
            showscale=False,
            xgap=0,
            ygap=4,
        )
    )
    for label, colour in CELL_STYLE.values():  # a legend for the heatmap's colours
        fig.add_trace(
            go.Scatter(
                name=label,
                x=[None],
                y=[None],
                mode="markers",
                marker={"symbol": "square", "size": 13, "color": colour},
                hoverinfo="skip",
            )
        )
    return fig


# One colour per rank in the counters chart.
RANK_COLOURS = ("#2e86ab", "#edae49", "#8e6c8a", "#4c9f70")


def layer_label(layer: str) -> str:
    """``model.layers.0.self_attn.qkv_proj`` -> ``0.qkv_proj``; ``model.norm`` -> ``norm``."""
    name = layer.removeprefix("model.").removeprefix("layers.")
    for part in (".self_attn.", ".mlp."):
        name = name.replace(part, ".")
    return name


def _share(got: int, want: int) -> float:
    """``got`` as a percentage of ``want`` (100 when both are 0)."""
    return 100.0 if want == 0 else 100.0 * got / want


def counters_figure(launch: Launch, bug: str, tp: int, behaviour: str) -> Any:
    """Elements each rank copied into each layer (its loaded-element counter) as a share of
    what the same rank copies under the fix, ranks side by side. Normalised because the raw
    counts differ between ranks under the fix too: the last rank's share of the padded
    vocabulary holds padding rows, which nothing is loaded into."""
    import plotly.graph_objects as go

    from loadkit_notebooks.viz import base_figure

    run, fixed = run_for(launch, bug, behaviour, tp), run_for(launch, bug, "new", tp)
    layers = list(reference(launch).ranks[0].loaded_per_layer)
    differ = [
        str(r.rank)
        for r, f in zip(run.ranks, fixed.ranks, strict=True)
        if r.loaded_per_layer != f.loaded_per_layer
    ]
    verdict = (
        "every rank as under the fix"
        if not differ
        else f"rank {', '.join(differ)} not as under the fix"
    )
    fig = base_figure(
        f"Elements each rank loaded, per layer, tp={tp}: {verdict} [{behaviour}]",
        height=450,
        barmode="group",
        bargap=0.2,
        xaxis={"tickangle": -40, "title": None},
        yaxis={"title": "% of the same rank under the fix", "range": [0, 110]},
        margin={"l": 70, "r": 20, "t": 90, "b": 175},
    )
    fig.add_annotation(
        text="100% = as many elements as the same rank copies under the fix (raw counts differ "
        "between ranks even then:<br>the last rank's share of the padded vocabulary is "
        "partly padding, which nothing is loaded into)",
        xref="paper",
        yref="paper",
        x=0,
        y=-0.62,
        xanchor="left",
        yanchor="top",
        showarrow=False,
        align="left",
        font={"size": 11, "color": "#555"},
    )
    for r, (result, fix) in enumerate(zip(run.ranks, fixed.ranks, strict=True)):
        got = [result.loaded_per_layer.get(layer, 0) for layer in layers]
        want = [fix.loaded_per_layer.get(layer, 0) for layer in layers]
        fig.add_trace(
            go.Bar(
                name=rank_label(result),
                x=[layer_label(layer) for layer in layers],
                y=[_share(g, w) for g, w in zip(got, want, strict=True)],
                customdata=[[g, w] for g, w in zip(got, want, strict=True)],
                hovertemplate="%{x}: %{customdata[0]} of %{customdata[1]} elements<extra>"
                + rank_label(result)
                + "</extra>",
                marker_color=RANK_COLOURS[r % len(RANK_COLOURS)],
            )
        )
    return fig


AGREE_COLOURS = {"equal": "#2e86ab", "differs": "#d1495b"}


def logits_figure(launch: Launch, bug: str, tp: int, behaviour: str) -> Any:
    """The last position's logits over the vocabulary: tp=1's line, this run's points coloured
    by whether each equals tp=1's (within ``ATOL``); a run without logits says why."""
    import plotly.graph_objects as go

    from loadkit_notebooks.viz import base_figure

    run = run_for(launch, bug, behaviour, tp)
    ref = reference_logits(launch)
    said = outcome(launch, run)["logits"]
    if run.logits is not None:  # the title counts the logits the chart plots: the last position's
        said = logits_verdict(run.logits[-1], ref[-1])
    fig = base_figure(
        f"Logits at the last position, tp={tp} against tp=1: {said} [{behaviour}]",
        height=340,
        xaxis={"title": "token id"},
        yaxis={"title": "logit"},
    )
    vocab = list(range(ref.shape[-1]))
    fig.add_trace(
        go.Scatter(
            name="tp=1",
            x=vocab,
            y=[float(v) for v in ref[-1]],
            mode="lines",
            line={"color": "#6c757d", "width": 2},
        )
    )
    if run.logits is None:
        by_status: dict[str, list[str]] = {}
        for r in run.ranks:
            by_status.setdefault(STATUS.get(r.status, r.status), []).append(str(r.rank))
        fig.add_annotation(
            text=f"no tp={tp} logits: "
            + "; ".join(f"rank {', '.join(rs)}: {what}" for what, rs in by_status.items())
            + "<br>(a rank that loaded skips the forward when another rank's load failed)",
            xref="paper",
            yref="paper",
            x=0.5,
            y=0.5,
            showarrow=False,
            bgcolor="#fbe3e6",
            bordercolor=AGREE_COLOURS["differs"],
            font={"size": 13},
        )
        return fig
    last = run.logits[-1]
    close = np.isclose(last, ref[-1], atol=ATOL)
    for kind, mask in (("equal", close), ("differs", ~close)):
        ids = [i for i in vocab if mask[i]]
        if ids:
            fig.add_trace(
                go.Scatter(
                    name=f"tp={tp}, {'equal to' if kind == 'equal' else 'differs from'} tp=1",
                    x=ids,
                    y=[float(last[i]) for i in ids],
                    mode="markers",
                    marker={"color": AGREE_COLOURS[kind], "size": 6},
                )
            )
    return fig


def logits_verdict(logits: np.ndarray, ref: np.ndarray) -> str:
    """Whether ``logits`` equal tp=1's ``ref`` (within ``ATOL``), counted over every logit given.

    >>> logits_verdict(np.zeros((2, 3)), np.array([[0, 0, 1], [0, 0, 0.0]]))
    'DIFFER at 1 of 6 logits'
    """
    close = np.isclose(logits, ref, atol=ATOL)
    if close.all():
        return f"equal within {ATOL:g} ({close.size} logits)"
    return f"DIFFER at {int((~close).sum())} of {close.size} logits"


def outcome(launch: Launch, run: TPRun) -> dict[str, Any]:
    ref = reference_logits(launch)
    out: dict[str, Any] = {"ranks": " ".join(r.status for r in run.ranks)}
    if run.logits is None:
        failed = [str(r.rank) for r in run.ranks if r.status == "load error"]
        out["logits"] = f"none: rank {', '.join(failed)} failed to load"
        out["next token = tp=1's"] = "-"
    else:
        out["logits"] = logits_verdict(run.logits, ref)
        agree = int((run.logits.argmax(-1) == ref.argmax(-1)).sum())
        out["next token = tp=1's"] = f"{agree} of {len(ref)} positions"
    out["elements loaded"] = " ".join(str(sum(r.loaded_per_layer.values())) for r in run.ranks)
    return out


# --- text for the notebook (what nbval compares) -----------------------------------------------


def row_map_text(run: TPRun, keys: tuple[str, ...] = SHOWN) -> str:
    """The rows each rank of ``run`` holds, as text (``render_row_map``'s table)."""
    failed = {r.rank: r.error or r.status for r in run.ranks if r.status == "load error"}
    entries = [e for e in row_map([r.records for r in run.ranks]) if e.key in keys]
    head = f"[{run.job.name}, tp={run.tp}]"
    return head + "\n" + render_row_map(entries, failed=failed)


def summary(launch: Launch, runs: dict[str, TPRun]) -> str:
    """``runs`` (behaviour -> run) side by side: ranks, logits, next tokens, elements."""
    return outcome_table({b: Record(b, outcome=outcome(launch, run)) for b, run in runs.items()})


def errors_text(run: TPRun) -> str:
    """What went wrong on each rank, each error once: a rank that skipped its forward because
    others failed to load names them (their errors follow, in full)."""
    failed = [str(r.rank) for r in run.ranks if r.status == "load error"]
    lines = []
    for r in run.ranks:
        if r.status == "ok":
            continue
        if r.status == "skipped" and failed:
            lines.append(
                f"rank {r.rank}: skipped: no forward (rank {', '.join(failed)} failed to load)"
            )
        else:
            lines.append(wrap(f"rank {r.rank}: {r.status}: {r.error}", hang=4))
    return "\n".join(lines) or "no errors"


def held_text(records: list[CopyRecord]) -> str:
    """The checkpoint rows (or columns) each copy a rank's loader made took, and where they went
    in the parameter (layer 0's names, short): what one rank's loader call did, a line a copy.

    >>> held_text([CopyRecord("weight", "w", (0, 4), None, (4, 8), None, 16, (8, 4))])
    'w rows 4-7 -> weight rows 0-3'
    """
    lines = []
    for r in records:
        held = r.held
        if held is None or r.param_rows is None:
            continue
        axis, (start, stop) = held
        at = f"{r.param_rows[0]}-{r.param_rows[1] - 1}"
        key = short(r.key or "")
        lines.append(f"{key} {axis} {start}-{stop - 1} -> {short(r.param)} rows {at}")
    return "\n".join(lines) or "no copy"


def cells_text(record: Record) -> str:
    """The row map's cells per rank, counted by kind (what the heatmap shows, as text)."""
    lines = []
    series = record.series["checkpoint rows"]
    assert series.z is not None  # a heatmap
    for rank, row in zip(series.y, series.z, strict=True):
        counts = {code: sum(1 for c in row if c == code) for code in (HELD, WRONG, MISSING)}
        lines.append(
            f"  {rank}: {counts[HELD]} rows as under the fix, {counts[WRONG]} not its share, "
            f"{counts[MISSING]} of its share not loaded"
        )
    return "\n".join(lines)


# --- the widgets ------------------------------------------------------------------------------


def _layout(ex: Explorer) -> tuple[Any, ...]:
    """Three outputs for one cell: the toggles with the row map, the counters, the logits."""
    import ipywidgets as widgets

    from loadkit_notebooks.chart import Panel

    row = widgets.HBox([ex.tp, ex.bug])
    return (Panel(ex.toggle, row, ex.rows, chart=ex.rows), ex.counters, ex.logits)


def _describe(ex: Explorer) -> str:
    """What the widgets show, as text (what nbval compares)."""
    bug, tp, b = ex.bug.value, int(ex.tp.value), ex.toggle.value
    return "\n".join(
        [
            f"[bug {bug}, tp {tp}, {b}]",
            f"rows: {ex.rows.fig.layout.title.text}",
            cells_text(ex.records[b]),
            f"counters: {ex.counters.fig.layout.title.text}",
            f"logits: {ex.logits.fig.layout.title.text}",
        ]
    )


def explorer(launch: Launch) -> Explorer:
    """Build the widgets over the notebook's ``launch``: behaviour (the main toggle), tp and bug;
    the row map (``rows``), the counters and the logits follow all three. They start on
    ``main_records(launch)`` (gguf-rank, tp=2, old)."""
    import ipywidgets as widgets

    from loadkit_notebooks.chart import Chart

    bug0, tp0, b0 = "gguf-rank", 2, "old"
    recs = main_records(launch)
    rows = Chart(rows_figure(recs[b0]))
    counters = Chart(counters_figure(launch, bug0, tp0, b0))
    logits = Chart(logits_figure(launch, bug0, tp0, b0))
    toggle = widgets.ToggleButtons(options=list(recs), value=b0, description="behaviour")
    tp = widgets.ToggleButtons(options=[str(t) for t in TPS], value=str(tp0), description="tp")
    bug = widgets.ToggleButtons(options=list(BUGS), value=bug0, description="bug")
    for w in (tp, bug):
        w.style.button_width = "auto"

    def refresh(_: Any = None) -> None:
        b, t = toggle.value, int(tp.value)
        rows.draw(rows_figure(recs[b]))
        counters.draw(counters_figure(launch, bug.value, t, b))
        logits.draw(logits_figure(launch, bug.value, t, b))

    def rebuild(_: Any = None) -> None:
        recs.update(records(launch, bug.value, int(tp.value)))
        refresh()

    toggle.observe(refresh, names="value")
    tp.observe(rebuild, names="value")
    bug.observe(rebuild, names="value")
    parts = {"launch": launch, "tp": tp, "bug": bug, "rows": rows}
    parts |= {"counters": counters, "logits": logits}
    return Explorer(recs, toggle, parts, layout=_layout, describe=_describe)
