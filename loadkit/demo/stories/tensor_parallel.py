"""The tensor-parallel story (notebook 05): one checkpoint, 1, 2 or 4 real rank processes.

Every run loads ``data/llama_like/model.safetensors`` (8 query heads over 2 kv heads, vocabulary
100 padded to 128) on ``tp`` processes joined by ``torch.distributed`` (gloo on loopback), three
jobs per launch: every bug fixed, the gguf-plugin rank bug old, the kv-replication bug old. A
launch is made once per ``tp`` and kept for the kernel's life (``launch``), so the widgets switch
between results without starting processes again. The tp=1 run is the reference.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from loadkit.demo.scenario import Record, Series
from loadkit.demo.stories import DATA_DIR
from loadkit.parallel.launcher import run_tensor_parallel
from loadkit.parallel.results import BUGS, Job, TPRun
from loadkit.parallel.rowmap import render_row_map, row_map

CHECKPOINT = DATA_DIR / "llama_like" / "model.safetensors"
TPS = (1, 2, 4)
BEHAVIOURS = ("old", "new")
JOBS = (Job(), *(Job.for_bug(bug, "old") for bug in BUGS))
ATOL = 1e-5  # tensor parallelism reorders sums; the dyadic weights keep the values close
BUG_TITLES = {
    "gguf-rank": "vllm-gguf-plugin #103: the rank from kwargs.get('tp_rank', 0)",
    "kv-replication": "vLLM #2379: kv heads not replicated when tp > kv heads",
}

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


@functools.cache
def launch(tp: int) -> dict[str, TPRun]:
    """Every job on ``tp`` real processes, once per kernel: job name -> run."""
    runs = run_tensor_parallel(CHECKPOINT, tp, JOBS)
    return {run.job.name: run for run in runs}


def job_name(bug: str, behaviour: str) -> str:
    return "new" if behaviour == "new" else Job.for_bug(bug, behaviour).name


def run_for(bug: str, behaviour: str, tp: int) -> TPRun:
    return launch(tp)[job_name(bug, behaviour)]


def reference() -> TPRun:
    return launch(1)["new"].raise_for_errors()


# --- what the charts show ---------------------------------------------------------------------


@dataclass
class Columns:
    """The heatmap's columns: one per checkpoint row (or column) of each shown key, and a gap
    of ``GAP`` empty columns between keys."""

    labels: list[str]  # per column: "q_proj row 17", or "" in a gap
    starts: dict[str, int]  # key -> first column index
    sizes: dict[str, int]  # key -> rows (or columns) along the split axis


GAP = 3


@functools.cache
def columns() -> Columns:
    entries = {e.key: e for e in row_map([r.records for r in _reference_ranks()])}
    labels: list[str] = []
    starts, sizes = {}, {}
    for key in SHOWN:
        if labels:
            labels += [""] * GAP
        starts[key], sizes[key] = len(labels), entries[key].size
        e = entries[key]
        labels += [f"{short(key)} {e.axis[:-1]} {i}" for i in range(e.size)]
    return Columns(labels, starts, sizes)


def _reference_ranks():
    return reference().ranks


def held_matrix(run: TPRun) -> list[list[int | None]]:
    """``z[rank][column]``: 1 where the rank holds that checkpoint row, 0 where it does not,
    ``None`` in the gaps between keys."""
    cols = columns()
    z = [[0 if label else None for label in cols.labels] for _ in run.ranks]
    for rank, result in enumerate(run.ranks):
        for rec in result.records:
            held = rec.held
            if rec.key not in cols.starts or held is None:
                continue
            a, b = held[1]
            base = cols.starts[rec.key]
            for i in range(a, b):
                z[rank][base + i] = 1
    return z


def rows_record(run: TPRun, behaviour: str) -> Record:
    cols = columns()
    rec = Record(behaviour)
    ranks = [f"rank {r}" for r in range(run.tp)]
    rec.series["checkpoint rows held"] = Series(
        x=list(range(len(cols.labels))),
        y=ranks,
        mode="heatmap",
        z=held_matrix(run),
        text=[[f"{rank}, {label}" if label else "" for label in cols.labels] for rank in ranks],
        style={
            "hovertemplate": "%{text}<extra></extra>",
            "colorscale": [[0, "#f2f2f2"], [1, "#1f5fa8"]],
            "showscale": False,
            "zmin": 0,
            "zmax": 1,
            "xgap": 0,
            "ygap": 3,
        },
    )
    rec.outcome = outcome(run)
    return rec


def counters_record(run: TPRun, behaviour: str) -> Record:
    """Elements each rank copied into each layer (module), one bar set per rank."""
    rec = Record(behaviour)
    layers = list(_reference_ranks()[0].loaded_per_layer)
    for r, result in enumerate(run.ranks):
        rec.series[f"rank {r}"] = Series(
            x=[layer.removeprefix("model.") for layer in layers],
            y=[result.loaded_per_layer.get(layer, 0) for layer in layers],
            mode="bar",
        )
    return rec


def logits_record(run: TPRun, behaviour: str) -> Record:
    """The last position's logits over the vocabulary: tp=1 against this run."""
    rec = Record(behaviour)
    ref = reference().logits[-1]
    vocab = list(range(len(ref)))
    rec.series["tp=1"] = Series(vocab, [float(v) for v in ref], mode="lines")
    if run.logits is not None:
        rec.series[f"tp={run.tp}"] = Series(
            vocab, [float(v) for v in run.logits[-1]], mode="markers"
        )
    return rec


def outcome(run: TPRun) -> dict[str, Any]:
    ref = reference().logits
    out: dict[str, Any] = {"ranks": " ".join(r.status for r in run.ranks)}
    if run.logits is None:
        failed = [str(r.rank) for r in run.ranks if r.status == "load error"]
        out["logits"] = f"none: rank(s) {', '.join(failed)} failed to load"
        out["next token = tp=1's"] = "-"
    else:
        same = bool(np.allclose(run.logits, ref, atol=ATOL))
        out["logits"] = f"equal to tp=1 within {ATOL:g}" if same else "DIFFER from tp=1"
        agree = int((run.logits.argmax(-1) == ref.argmax(-1)).sum())
        out["next token = tp=1's"] = f"{agree} of {len(ref)} positions"
    out["elements loaded"] = " ".join(
        str(sum(r.loaded_per_layer.values())) for r in run.ranks
    )
    return out


def records(bug: str, tp: int, chart: str = "rows") -> dict[str, Record]:
    make = {"rows": rows_record, "counters": counters_record, "logits": logits_record}[chart]
    return {b: make(run_for(bug, b, tp), b) for b in BEHAVIOURS}


def main_records() -> dict[str, Record]:
    """What the notebook's main toggle starts with: the gguf-plugin bug at tp=2, the row map."""
    return records("gguf-rank", 2)


# --- text for the notebook (what nbval compares) -----------------------------------------------


def row_map_text(bug: str, behaviour: str, tp: int, keys: tuple[str, ...] = SHOWN) -> str:
    run = run_for(bug, behaviour, tp)
    failed = {r.rank: r.error for r in run.ranks if r.status == "load error"}
    entries = [e for e in row_map([r.records for r in run.ranks]) if e.key in keys]
    head = f"[{bug} {behaviour}, tp={tp}]"
    return head + "\n" + render_row_map(entries, failed=failed)


def summary(bug: str, tp: int) -> str:
    from loadkit.demo.scenario import outcome_table

    return outcome_table({b: Record(b, outcome=outcome(run_for(bug, b, tp))) for b in BEHAVIOURS})


def errors_text(bug: str, behaviour: str, tp: int) -> str:
    run = run_for(bug, behaviour, tp)
    return "\n".join(run.errors) or "no errors"


# --- the widgets ------------------------------------------------------------------------------


@dataclass
class Explorer:
    toggle: Any
    tp: Any
    bug: Any
    rows: Any
    counters: Any
    logits: Any
    box: Any

    def state(self) -> str:
        return f"bug={self.bug.value} tp={self.tp.value} behaviour={self.toggle.value}"


def _rows_layout(tp: int) -> dict[str, Any]:
    cols = columns()
    return {
        "height": 200 + 45 * tp,
        "xaxis": {
            "tickmode": "array",
            "tickvals": [s + (cols.sizes[k] - 1) / 2 for k, s in cols.starts.items()],
            "ticktext": [short(k).rpartition(".")[2] for k in cols.starts],
            "tickangle": -35,
            "showgrid": False,
            "zeroline": False,
            "title": {"text": "checkpoint rows (columns for o_proj, down_proj), layer 0"},
        },
        "yaxis": {"autorange": "reversed", "showgrid": False},
        "margin": {"b": 120},
    }


def explorer() -> Explorer:
    """The widgets: behaviour (the main toggle), tp and bug; three charts follow them."""
    import ipywidgets as widgets

    from loadkit.demo.viz import behaviour_toggle, figure, show_record

    state = {"bug": "gguf-rank", "tp": 2}
    recs = records(state["bug"], state["tp"])
    rows = figure(
        recs["old"],
        title="checkpoint rows each rank holds (layer 0, vocabulary tables)",
        layout=_rows_layout(state["tp"]),
    )
    counters = figure(
        records(state["bug"], state["tp"], "counters")["old"],
        title="elements loaded per layer, per rank",
        yaxis="elements copied from the checkpoint",
        layout={"barmode": "group", "height": 380, "xaxis": {"tickangle": -40}},
    )
    logits = figure(
        records(state["bug"], state["tp"], "logits")["old"],
        title="logits at the last position: tp=1 against this run",
        xaxis="token id",
        yaxis="logit",
        layout={"height": 340},
    )

    def follow(record: Record) -> None:
        b = record.behaviour
        show_record(counters, records(state["bug"], state["tp"], "counters")[b])
        show_record(logits, records(state["bug"], state["tp"], "logits")[b])

    toggle = behaviour_toggle(recs, rows, on_change=follow)
    tp = widgets.ToggleButtons(options=[str(t) for t in TPS], value="2", description="tp")
    bug = widgets.ToggleButtons(options=list(BUGS), value="gguf-rank", description="bug")

    def rebuild(_: Any = None) -> None:
        state["bug"], state["tp"] = bug.value, int(tp.value)
        recs.update(records(state["bug"], state["tp"]))  # the main toggle reads this same dict
        with rows.batch_update():
            rows.update_layout(**_rows_layout(state["tp"]))
        show_record(rows, recs[toggle.value])
        follow(recs[toggle.value])

    tp.observe(rebuild, names="value")
    bug.observe(rebuild, names="value")
    box = widgets.VBox([toggle, tp, bug, rows, counters, logits])
    return Explorer(toggle, tp, bug, rows, counters, logits, box)


def explorer_data(ex: Explorer) -> str:
    """The three charts as text (what nbval compares in place of the widgets)."""
    lines = [ex.state(), f"rows title: {ex.rows.layout.title.text}"]
    for tr in ex.rows.data:
        held = [sum(v or 0 for v in row) for row in tr.z]
        lines.append(f"  {tr.name}: y={list(tr.y)} held per rank={held}")
    lines.append(f"counters title: {ex.counters.layout.title.text}")
    for tr in ex.counters.data:
        lines.append(f"  {tr.name}: total {sum(tr.y)}")
    lines.append(f"logits title: {ex.logits.layout.title.text}")
    lines.append(f"  series: {[tr.name for tr in ex.logits.data]}")
    return "\n".join(lines)
