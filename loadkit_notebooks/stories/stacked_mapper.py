"""Notebook 06's pictures: the stacked mapper stage, old and new, on the vision tower (bug 5).

The notebook makes every call (the mappers, ``trace`` and ``map_name_with_shard`` on each key,
the loads, ``vision_tower.qkv_rows``); this module only draws what those calls returned:

- ``mapping_chart(traces)``: every checkpoint key, its mapped name and shard id, old and new side
  by side, red where a stacked rule matched inside another rule's output;
- ``load_record(...)`` and ``rows_figure(record)``: which rows of each ``qkv_proj.weight`` hold
  which projection after a load (or none, when the load failed);
- ``explorer(records)``: the old/new toggle over those records, with the load's outcome in words.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from loadkit.fmt import wrap
from loadkit.mapper import MapTrace, stacked_rematches
from loadkit_notebooks.scenario import Record, Series
from loadkit_notebooks.show import Table
from loadkit_notebooks.stories import DATA_DIR
from loadkit_notebooks.viz import Explorer

CHECKPOINT = DATA_DIR / "vision_tower" / "model.safetensors"  # the committed checkpoint

# Mapping chart: one cell per key and behaviour.
UNCHANGED, MAPPED, REMATCHED = 0, 1, 2
MAPPING_COLOURS = ["#eeeeee", "#9ecae1", "#d1495b"]
# Rows chart: what a row of qkv_proj.weight holds.
HOLDS = {"q": 0, "k": 1, "v": 2, None: 3}
HOLD_COLOURS = ["#2e86ab", "#3bb273", "#edae49", "#bdbdbd"]
NOT_LOADED = "not loaded"


def short(name: str | None) -> str:
    """A name without the tower's common prefix (``vision_model.``, ``encoder.``)."""
    if name is None:
        return "dropped"
    return name.removeprefix("vision_model.").removeprefix("encoder.")


def _code(trace: MapTrace) -> int:
    if stacked_rematches(trace):
        return REMATCHED
    return MAPPED if any(s.stage == "stacked" for s in trace.steps) else UNCHANGED


def _cell(trace: MapTrace) -> str:
    shard = "" if trace.shard_id is None else f"  shard {trace.shard_id}"
    return f"{short(trace.result)}{shard}"


def _tail(trace: MapTrace) -> str:
    # The layer prefix never changes: the last two components say what the rule did.
    tail = "dropped" if trace.result is None else ".".join(trace.result.split(".")[-2:])
    return tail if trace.shard_id is None else f"{tail}, {trace.shard_id}"


def _discrete(colours: Sequence[str]) -> list[list[Any]]:
    """A plotly colour scale giving each integer 0..n-1 its own colour."""
    n = len(colours)
    scale: list[list[Any]] = []
    for i, c in enumerate(colours):
        scale += [[i / n, c], [(i + 1) / n, c]]
    return scale


def mapping_figure(traces: Mapping[str, Mapping[str, MapTrace]]) -> Any:
    """The keys a stacked rule touched (rows) under each behaviour (columns): the mapped name and
    shard id in the cell, blue where one rule fired, red where a rule re-matched another's
    output; one last grey row for every other key (no stacked rule fires: the same name both
    ways). ``traces`` is behaviour -> checkpoint key -> ``mapper.trace(key)``."""
    from loadkit_notebooks.viz import base_figure

    behaviours = list(traces)
    every = list(traces[behaviours[0]])
    keys = [k for k in every if any(_code(traces[b][k]) != UNCHANGED for b in behaviours)]
    z = [[_code(traces[b][k]) for b in behaviours] for k in keys]
    text = [[_cell(traces[b][k]) for b in behaviours] for k in keys]
    rows = [short(k) for k in keys]
    others = len(every) - len(keys)
    if others:
        rows.append(f"{others} other keys")
        z.append([UNCHANGED] * len(behaviours))
        text.append(["no stacked rule: unchanged"] * len(behaviours))
    rematched = {b: sum(_code(t) == REMATCHED for t in traces[b].values()) for b in behaviours}
    counts = ", ".join(f"{b}: {n}" for b, n in rematched.items())
    fig = base_figure(
        f"The keys a stacked rule maps: red where a rule matched another's output ({counts})",
        height=130 + 24 * len(rows),
        margin={"l": 300, "r": 20, "t": 60, "b": 30},
    )
    import plotly.graph_objects as go

    fig.add_trace(
        go.Heatmap(
            name="mapped name",
            x=behaviours,
            y=rows,
            z=z,
            text=text,
            texttemplate="%{text}",
            textfont={"size": 11},
            hovertemplate="%{y} -> %{text}<extra>%{x}</extra>",
            colorscale=_discrete(MAPPING_COLOURS),
            zmin=-0.5,
            zmax=len(MAPPING_COLOURS) - 0.5,
            showscale=False,
            xgap=2,
            ygap=1,
        )
    )
    fig.update_yaxes(autorange="reversed", tickfont={"size": 11})
    fig.update_xaxes(side="top", tickfont={"size": 13})
    return fig


def mapping_chart(traces: Mapping[str, Mapping[str, MapTrace]]) -> Any:
    """``mapping_figure`` as a live chart with its picture (for a notebook cell)."""
    from loadkit_notebooks.chart import Chart

    return Chart(mapping_figure(traces))


def mapping_table(traces: Mapping[str, Mapping[str, MapTrace]]) -> Table:
    """The keys a stacked rule touched under some behaviour: mapped name and shard id each way,
    and which rule re-matched which (empty when none did)."""
    behaviours = list(traces)
    keys = list(traces[behaviours[0]])
    rows = []
    for k in keys:
        ts = [traces[b][k] for b in behaviours]
        if not any(s.stage == "stacked" for t in ts for s in t.steps):
            continue
        again = "; ".join(f"{r.then} after {r.first}" for t in ts for r in stacked_rematches(t))
        rows.append([short(k), *(_tail(t) for t in ts), again or "-"])
    left = len(keys) - len(rows)
    notes = [f"{left} other keys: no stacked rule fires, the same name both ways"]
    header = ("checkpoint key", *(f"{b}: name, shard" for b in behaviours), "re-matched")
    return Table(header, rows, notes)


# --- the load ------------------------------------------------------------------------------------


def load_record(
    behaviour: str,
    rows: Mapping[str, Sequence[str | None]],
    error: BaseException | None,
    loaded: set[str] | None,
    *,
    refused: Sequence[str] | None = None,
) -> Record:
    """One load's outcome: ``rows`` is ``vision_tower.qkv_rows(model, checkpoint)`` after it,
    ``error`` what ``load_weights`` raised (or None), ``loaded`` what it returned, ``refused``
    what vLLM 0.34.0's ``track_weights_loading`` then refuses (``loadkit.loading.track``)."""
    params = list(rows)
    depth = max(len(r) for r in rows.values())
    z = [[HOLDS[_shard(rows[p][i])] for p in params] for i in range(depth)]
    text = [[rows[p][i] or NOT_LOADED for p in params] for i in range(depth)]
    x = [short(p).removesuffix(".self_attn.qkv_proj.weight") for p in params]
    record = Record(behaviour)
    record.series["qkv_proj.weight rows"] = Series(
        x, list(range(depth)), mode="heatmap", z=z, text=text
    )
    held = {s: sum(_shard(r) == s for p in params for r in rows[p]) for s in ("q", "k", "v")}
    in_order = all(
        list(rows[p]) == [f"{s} {j}" for s in "qkv" for j in range(depth // 3)] for p in params
    )
    record.outcome = {
        "load": "failed" if error else f"returned {len(loaded or ())} parameter names",
        "qkv_proj rows holding q / k / v": f"{held['q']} / {held['k']} / {held['v']}",
        "qkv_proj rows not loaded": sum(r is None for p in params for r in rows[p]),
        "every row in its place": in_order,
    }
    if error is not None:
        record.outcome["error"] = f"{type(error).__name__}: {_first_sentence(error)}"
    if refused is not None:
        shown = ", ".join(short(r) for r in refused[:4]) + (", ..." if len(refused) > 4 else "")
        record.outcome["vLLM 0.34.0's check after the load"] = (
            f"refuses it: missing {shown}" if refused else "passes"
        )
    return record


def _shard(label: str | None) -> str | None:
    return None if label is None else label.split()[0]


def _first_sentence(error: BaseException) -> str:
    text = str(error)
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def runs(labels: Sequence[str]) -> list[tuple[int, int, str]]:
    """Consecutive rows holding consecutive rows of one projection: ``(first, last, label)``.

    >>> runs(["q 0", "q 1", "k 0", "not loaded", "not loaded"])
    [(0, 1, 'q 0-1'), (2, 2, 'k 0'), (3, 4, 'not loaded')]
    """
    spans: list[list[Any]] = []  # [first, last, shard or label, first row, last row]
    for i, label in enumerate(labels):
        shard, _, row = label.partition(" ")
        j = int(row) if row.isdigit() else None
        if j is None:
            shard = label
        if spans:
            prev = spans[-1]
            same = prev[2] == shard and prev[1] == i - 1
            if same and (j is None or prev[4] == j - 1):
                prev[1], prev[4] = i, j
                continue
        spans.append([i, i, shard, j, j])
    return [
        (a, b, shard if lo is None else f"{shard} {lo}" + (f"-{hi}" if hi != lo else ""))
        for a, b, shard, lo, hi in spans
    ]


def rows_figure(record: Record) -> Any:
    """Each row of every ``qkv_proj.weight`` (a column per layer), coloured by the projection it
    holds: q blue, k green, v amber, grey not loaded; each run of rows is labelled with the
    checkpoint rows it holds (``q 0-15``: rows 0 to 15 of ``q_proj.weight``)."""
    from loadkit_notebooks.viz import figure

    s = record.series["qkv_proj.weight rows"]
    held = record.outcome["qkv_proj rows holding q / k / v"]
    failed = " (the load failed)" if "error" in record.outcome else ""
    fig = figure(
        record,
        title=f"Rows of qkv_proj.weight after the load: q / k / v = {held}{failed}",
        xaxis="layer",
        yaxis="row of qkv_proj.weight",
        layout={"height": 480},
    )
    fig.update_traces(
        colorscale=_discrete(HOLD_COLOURS),
        zmin=-0.5,
        zmax=len(HOLD_COLOURS) - 0.5,
        showscale=False,
        hovertemplate="%{x} row %{y}: %{text}<extra></extra>",
        xgap=4,
        ygap=1,
    )
    assert s.text is not None
    third = len(s.text) // 3  # rows 0.., third.., 2*third..: where q, k and v belong
    for col, x in enumerate(s.x):
        for first, last, label in runs([row[col] for row in s.text]):
            shown = label if label == NOT_LOADED else f"{label[0]}_proj rows {label[2:]}"
            slots = "qkv"[first // third : last // third + 1] if third else "qkv"
            if label == NOT_LOADED and len(slots) < 3:  # name the part no tensor filled
                shown = " and ".join(f"{p}_proj" for p in slots) + " rows: never filled"
            fig.add_annotation(
                x=x,
                y=(first + last) / 2,
                text=shown,
                showarrow=False,
                font={"size": 13},
                bgcolor="rgba(255,255,255,0.85)",
            )
    fig.update_yaxes(autorange="reversed")
    return fig


def outcome_html(record: Record) -> str:
    """The load's outcome in a few lines of HTML (under the chart)."""
    import html

    items = "".join(
        f"<li><b>{html.escape(k)}</b>: {html.escape(str(v))}</li>"
        for k, v in record.outcome.items()
    )
    return f"<ul style='margin:0'>{items}</ul>"


def _describe(ex: Explorer) -> str:
    """What the toggle shows now, as text (for nbval and the reader without a kernel)."""
    record = ex.records[ex.toggle.value]
    return "\n".join([f"chart: {ex.chart.fig.layout.title.text}", record.summary()])


def explorer(records: Mapping[str, Record], start: str = "old") -> Explorer:
    """The toggle over ``records`` (behaviour -> ``load_record``), starting on ``start``: the
    rows chart it redraws (``chart``) and the outcome it rewrites (``outcome``)."""
    import ipywidgets as widgets

    from loadkit_notebooks.viz import record_view

    recs = dict(records)
    outcome = widgets.HTML(outcome_html(recs[start]))
    view = record_view(
        recs,
        rows_figure,
        start=start,
        on_change=lambda r: setattr(outcome, "value", outcome_html(r)),
    )
    parts = {"view": view, "chart": view.chart, "outcome": outcome}

    def layout(ex: Explorer) -> tuple[Any, ...]:
        return (view.panel(outcome, text=ex.state()),)

    return Explorer(recs, view.toggle, parts, layout=layout, describe=_describe)


def wrapped(text: str) -> str:
    """``text`` folded to the notebooks' width (error messages are long), the committed data's
    folder written ``data/`` (the same on every checkout).

    >>> wrapped(f"in {DATA_DIR}/vision_tower/model.safetensors")
    'in data/vision_tower/model.safetensors'
    """
    return wrap(text.replace(f"{DATA_DIR}/", "data/"))
