"""Scenarios behind ``notebooks/01_pooling_probe.ipynb``: the pooling prefix probe, old and new.

Every scenario loads for real: the committed Gemma4-like checkpoint read through
``open_checkpoint(...).weights(reuse_buffer=True)`` (a streaming, buffer-reusing iterator),
the adapter of ``loadkit.pooling.adapter``, clones counted by ``CloneCounter``. The full-scale
scenario runs the same adapter over meta tensors, so its GiB are counted, never allocated.
"""

from __future__ import annotations

import dataclasses
import functools
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, cast

import torch

from loadkit.checkpoint.reader import open_checkpoint
from loadkit.checkpoint.writer import save_in_order
from loadkit.demo.scenario import Record, Series, run_behaviours
from loadkit.demo.show import Table
from loadkit.demo.stories import DATA_DIR
from loadkit.errors import LoadkitError
from loadkit.fmt import format_bytes, table
from loadkit.loading.counting import CloneCounter
from loadkit.loading.weight_loaders import loader_of
from loadkit.models import gemma4 as g4
from loadkit.pooling.adapter import Forward, ProbeRecord, as_pooling_model
from loadkit.pooling.probe import probe_verdict
from loadkit.vocab import BEHAVIOURS, check_behaviour

GiB = 2**30
MODEL = g4.Gemma4ForConditionalGeneration
CHECKPOINT = DATA_DIR / "gemma4_like" / "model.safetensors"  # data/generate.py writes it


def _short(path: str) -> str:
    """Paths inside the repository, relative to it: notebook outputs must not depend on where
    the repository lies."""
    return path.replace(f"{DATA_DIR.parent}/", "")


def _watched(
    stream: Iterable[tuple[str, torch.Tensor]], counter: CloneCounter, events: list[dict[str, Any]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Pass ``stream`` through, noting after each key how many clones exist so far.

    The note is taken when the consumer asks for the next key, so it includes what the probe
    (or the parent loader) did with this one.
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


@dataclasses.dataclass
class _Load:
    """One load through the pooling adapter, with what was seen on the way."""

    config: g4.Gemma4Config
    model: g4.Gemma4ForConditionalGeneration
    loaded: set[str]
    probe: ProbeRecord
    events: list[dict[str, Any]]
    clones: int
    cloned_bytes: int


def _load(
    behaviour: str,
    weights: Iterable[tuple[str, torch.Tensor]],
    config: g4.Gemma4Config,
    *,
    clone: bool = True,
    forward: Forward = "original",
    meta: bool = False,
) -> _Load:
    b = check_behaviour(behaviour)
    cls = as_pooling_model(MODEL, behaviour=b, clone=clone, forward=forward)
    if meta:
        with torch.device("meta"):
            model = cls(config)
    else:
        model = cls(config)
    events: list[dict[str, Any]] = []
    with CloneCounter() as counter:
        loaded = model.load_weights(_watched(weights, counter, events))
    record = cast(ProbeRecord, model.probe_record)  # set by the adapter's load_weights
    return _Load(config, model, loaded, record, events, counter.count, counter.cloned_bytes)


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters()) | dict(model.named_buffers())


def wrong_values(model: torch.nn.Module, truth: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per parameter, the percentage of its values that differ from the checkpoint."""
    state = _state(model)
    return {n: 100.0 * (state[n] != t).float().mean().item() for n, t in truth.items()}


def _truth(path: Path, config: g4.Gemma4Config) -> dict[str, torch.Tensor]:
    # A plain (not buffer-reusing) read: each tensor its own memory.
    return g4.expected_parameters(config, dict(open_checkpoint(path).weights()))


def _prefix(p: str | None) -> str:
    return "none (no hit)" if p is None else repr(p)


def _hit(probe: ProbeRecord) -> str:
    return "-" if probe.hit_key is None else f"#{probe.hit_index} {probe.hit_key}"


# --- the bug on the committed checkpoint (the main toggle) --------------------------------------


def probe_run(
    behaviour: str = "new", *, checkpoint: str | Path | None = None, clone: bool = True
) -> Record:
    """Load the Gemma4-like checkpoint through the pooling adapter, from a buffer-reusing stream.

    Series: cumulative clones and cloned bytes, as percentages of the checkpoint, against keys
    read from the checkpoint. Outcome: what the probe found and what it cost.
    """
    path = Path(checkpoint or CHECKPOINT)
    ck = open_checkpoint(path)
    config = g4.config_from_checkpoint(ck.tensors)
    run = _load(behaviour, ck.weights(reuse_buffer=True), config, clone=clone)
    rec = Record(behaviour, events=run.events)
    n, total = len(ck), ck.total_bytes
    clones = rec.series.setdefault("tensors cloned (% of checkpoint)", Series([], []))
    nbytes = rec.series.setdefault("bytes cloned (% of checkpoint)", Series([], []))
    clones.text, nbytes.text = [], []
    for e in run.events:
        label = f"{e['clones']} clones, {format_bytes(e['cloned_bytes'])}, after {e['key']}"
        clones.x.append(e["read"])
        clones.y.append(round(100 * e["clones"] / n, 2))
        clones.text.append(label)
        nbytes.x.append(e["read"])
        nbytes.y.append(round(100 * e["cloned_bytes"] / total, 2))
        nbytes.text.append(label)
    wrong = wrong_values(run.model, _truth(path, config))
    exact = sum(1 for v in wrong.values() if v == 0)
    rec.outcome = {
        "prefix found": _prefix(run.probe.prefix),
        "hit at key": _hit(run.probe),
        "keys walked by the probe": run.probe.walked,
        "clones": run.clones,
        "cloned": format_bytes(run.cloned_bytes),
        "checkpoint tensors": n,
        "checkpoint size": format_bytes(total),
        "parameters loaded": len(run.loaded),
        "values exact": f"{exact} of {len(wrong)}",
    }
    return rec


def main_records() -> dict[str, Record]:
    """The records the notebook's main old/new toggle swaps between."""
    return run_behaviours(probe_run)


def main_figure(record: Record) -> Any:
    """The main chart for one behaviour's record; axes fixed, so old and new compare by eye."""
    from loadkit.demo.viz import figure

    keys = len(record.events)
    return figure(
        record,
        title="Pooling probe on the Gemma4-like checkpoint: what is held as clones, key by key",
        xaxis="keys read from the checkpoint",
        yaxis="% of the checkpoint cloned",
        layout={"yaxis_range": [0, 105], "xaxis_range": [0.5, keys + 0.5], "height": 400},
    )


def main_view(records: dict[str, Record] | None = None) -> Any:
    """The old/new toggle over ``main_records()`` and the chart it redraws (starts on old)."""
    from loadkit.demo.viz import record_view

    return record_view(records or main_records(), main_figure)


# --- why the probe exists -----------------------------------------------------------------------


def layouts_table() -> Table:
    """The probe's verdict (header-only, ``probe_verdict``) for three checkpoint layouts."""
    config = g4.Gemma4Config()
    with torch.device("meta"):
        causal = {n for n, _ in g4.Gemma4ForCausalLM(config).named_parameters()}
        full = MODEL(config)
    full_params = {n for n, _ in full.named_parameters()}
    layout = g4.checkpoint_layout(config)
    item = torch.tensor([], dtype=config.torch_dtype).element_size()

    def keys(old: str, new: str) -> list[tuple[str, int]]:
        sizes = [(n.replace(old, new, 1), item * _numel(s)) for n, s in layout]
        return sorted(sizes)

    cases = [
        ("saved from *ForCausalLM", "model.embed_tokens.weight", causal, None, "model."),
        ("saved from *Model (headless)", "embed_tokens.weight", causal, None, ""),
        (
            "Gemma4: model.language_model.*",
            "model.language_model.embed_tokens.weight",
            full_params,
            full.hf_to_vllm_mapper,
            g4.TEXT_CKPT,
        ),
    ]
    rows: list[tuple[str, ...]] = []
    for label, first, params, mapper, new_prefix in cases:
        ks = keys(g4.TEXT_CKPT, new_prefix)
        cells = []
        for b in BEHAVIOURS:
            v = probe_verdict(ks, params, mapper=mapper, behaviour=b)
            cells.append(f"{_prefix(v.prefix)}, {v.walked} of {v.total_keys}")
        assert ks[0][0] == first
        rows.append((label, first, *cells))
    head = ("checkpoint", "first key", "old: prefix, keys walked", "new: prefix, keys walked")
    return Table(head, rows)


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


# --- the buffer-reuse hazard --------------------------------------------------------------------


def buffer_reuse_demo(held: int = 3) -> Record:
    """Hold the first ``held`` tensors of a buffer-reusing stream, with and without clones."""
    path = CHECKPOINT
    ck = open_checkpoint(path)
    truth = dict(ck.weights())
    views, clones = [], []
    for i, (name, t) in enumerate(ck.weights(reuse_buffer=True)):
        if i == held:
            break
        views.append((name, t))
        clones.append((name, t.clone()))
    rec = Record("buffer reuse")
    rec.outcome = {
        "held views share one buffer": len({t.untyped_storage().data_ptr() for _, t in views}) == 1,
    }
    for name, t in views:
        rec.outcome[f"view  {name}: equals checkpoint"] = torch.equal(t, truth[name])
    for name, t in clones:
        rec.outcome[f"clone {name}: equals checkpoint"] = torch.equal(t, truth[name])
    return rec


# --- clone protection on/off --------------------------------------------------------------------


def clone_protection_records() -> dict[str, Record]:
    """For clone protection on and off: per parameter, % of values wrong after the load."""
    path = CHECKPOINT
    ck = open_checkpoint(path)
    config = g4.config_from_checkpoint(ck.tensors)
    truth = _truth(path, config)
    records = {}
    for clone in (True, False):
        rec = Record("clone on" if clone else "clone off")
        for b in ("old", "new"):
            run = _load(b, ck.weights(reuse_buffer=True), config, clone=clone)
            wrong = wrong_values(run.model, truth)
            names = [n.removeprefix(g4.TEXT_PARAM) for n in wrong]
            rec.series[b] = Series(names, [round(v, 1) for v in wrong.values()], mode="bar")
            bad = [n for n, v in wrong.items() if v > 0]
            rec.outcome[f"{b}: keys held by the probe"] = run.probe.walked
            rec.outcome[f"{b}: parameters corrupted"] = f"{len(bad)} of {len(wrong)}"
            intact = [n.removeprefix(g4.TEXT_PARAM) for n, v in wrong.items() if v == 0]
            rec.outcome[f"{b}: intact"] = intact if len(intact) <= 3 else f"{len(intact)}"
        records[rec.behaviour] = rec
    return records


def corrupted_grid(records: dict[str, Record]) -> tuple[list[str], list[str], list[list[int]], int]:
    """Rows (behaviours), columns (clone on / off), corrupted parameters per cell, parameters."""
    cols = list(records)
    rows = ["old", "new"]
    counts, total = [], 0
    for b in rows:
        row = []
        for c in cols:
            bad, total = (
                int(v) for v in records[c].outcome[f"{b}: parameters corrupted"].split(" of ")
            )
            row.append(bad)
        counts.append(row)
    return rows, cols, counts, total


def clone_figure(records: dict[str, Record]) -> Any:
    """Both behaviours with clone protection on and off, at once: parameters corrupted of all."""
    import plotly.graph_objects as go

    from loadkit.demo.viz import base_figure

    rows, cols, counts, total = corrupted_grid(records)
    text = [
        [f"{n} of {total} corrupted" if n else f"all {total} exact" for n in row] for row in counts
    ]
    fig = base_figure(
        "Loading from a buffer-reusing stream: parameters with wrong values", height=300
    )
    fig.add_trace(
        go.Heatmap(
            z=counts,
            x=cols,
            y=rows,
            text=text,
            texttemplate="%{text}",
            textfont={"size": 16},
            zmin=0,
            zmax=total,
            colorscale=[[0, "#e8f4ea"], [1, "#d1495b"]],
            showscale=False,
            xgap=4,
            ygap=4,
            hovertemplate="%{y}, %{x}: %{text}<extra></extra>",
        )
    )
    fig.update_layout(yaxis_autorange="reversed", xaxis_side="top", margin_t=110)
    return fig


def clone_table(records: dict[str, Record]) -> str:
    """The 2x2 as text: corrupted parameters per behaviour, clone protection on and off."""
    rows, cols, counts, total = corrupted_grid(records)
    cells = [[r, *(f"{n} of {total}" for n in row)] for r, row in zip(rows, counts, strict=True)]
    return table(cells, header=["corrupted", *cols], align="l" + "r" * len(cols))


# --- full scale, on the meta device -------------------------------------------------------------


def full_scale_run(behaviour: str = "new", num_hidden_layers: int = 35) -> Record:
    """The same adapter over the upstream-size layout, on meta tensors (nothing allocated)."""
    config = g4.full_scale_config(num_hidden_layers)
    weights = g4.make_checkpoint(config, device="meta")
    run = _load(behaviour, weights.items(), config, meta=True)
    rec = Record(behaviour, events=run.events)
    total = sum(t.numel() * t.element_size() for t in weights.values())
    header = probe_verdict(
        [(n, t.numel() * t.element_size()) for n, t in weights.items()],
        {n for n, _ in run.model.named_parameters()},
        mapper=run.model.hf_to_vllm_mapper,
        behaviour=check_behaviour(behaviour),
    )
    rec.outcome = {
        "checkpoint tensors": len(weights),
        "checkpoint size": format_bytes(total),
        "prefix found": _prefix(run.probe.prefix),
        "hit at key": _hit(run.probe),
        "keys walked by the probe": run.probe.walked,
        "clones": run.clones,
        "cloned": format_bytes(run.cloned_bytes),
        "header-only verdict agrees": header == run.probe.verdict(),
    }
    return rec


def full_scale_records(num_hidden_layers: int = 35) -> dict[str, Record]:
    return run_behaviours(full_scale_run, num_hidden_layers=num_hidden_layers)


def full_scale_figure(records: dict[str, Record], num_hidden_layers: int = 35) -> Any:
    """Both behaviours on one chart: GiB held as clones against keys read, beside the GiB read.

    The GiB read is a grey area under the lines (old's clones follow its edge exactly); the axes
    are those of the full 35-layer layout, so the slider's smaller layouts compare by eye.
    """
    import plotly.graph_objects as go

    from loadkit.demo.viz import BEHAVIOUR_COLOURS, base_figure

    some = next(iter(records.values()))
    xs = [e["read"] for e in some.events]
    read, acc = [], 0
    for e in some.events:
        acc += e["nbytes"]
        read.append(round(acc / GiB, 4))
    keys, gib = _full_axes()
    fig = base_figure(
        f"Full scale on paper (meta device) [{_layers(num_hidden_layers)}]",
        height=400,
        xaxis={"title": "keys read from the checkpoint", "range": [0, keys]},
        yaxis={"title": "GiB", "range": [0, gib * 1.05]},
    )
    fig.add_trace(
        go.Scatter(
            name="read from the checkpoint",
            x=xs,
            y=read,
            mode="lines",
            fill="tozeroy",
            line={"color": "#b8c0cc", "width": 0},
            fillcolor="rgba(184, 192, 204, 0.45)",
        )
    )
    dash = {"old": "dash"}  # old lies on the edge of the area: dashed, both stay visible
    for b, r in records.items():
        ys = [round(e["cloned_bytes"] / GiB, 4) for e in r.events]
        fig.add_trace(
            go.Scatter(
                name=f"{b}: held as clones",
                x=[e["read"] for e in r.events],
                y=ys,
                mode="lines",
                line={
                    "color": BEHAVIOUR_COLOURS[b],
                    "width": 3,
                    "dash": dash.get(b, "solid"),
                },
            )
        )
    return fig


@functools.cache
def _full_axes() -> tuple[int, float]:
    """Keys and GiB of the full 35-layer layout: the chart's axes at every slider position."""
    config = g4.full_scale_config(35)
    weights = g4.make_checkpoint(config, device="meta")
    total = sum(t.numel() * t.element_size() for t in weights.values())
    return len(weights), total / GiB


def _layers(n: int) -> str:
    return f"{n} text layers"


def full_scale_view(records: dict[str, Record] | None = None, *, value: int = 35) -> Any:
    """An IntSlider over the text layers of the full-scale layout and the chart it redraws."""
    import ipywidgets as widgets

    from loadkit.demo.chart import Chart, Panel

    chart = Chart(full_scale_figure(records or full_scale_records(value), value))
    slider = widgets.IntSlider(
        value=value, min=1, max=35, description="text layers", continuous_update=False
    )

    def redraw(change: dict[str, Any]) -> None:
        n = change["new"]
        chart.draw(full_scale_figure(full_scale_records(n), n))

    slider.observe(redraw, names="value")
    panel = Panel(slider, chart, chart=chart)
    panel.slider = slider
    return panel


def chart_endpoints(fig: Any) -> str:
    """Where each trace ends: a short, comparable summary of a long chart."""
    fig = getattr(fig, "fig", fig)
    lines = [f"title: {fig.layout.title.text}"]
    for tr in fig.data:
        lines.append(f"{tr.name}: {len(tr.x)} keys read, ends at {tr.y[-1]:.3f} GiB")
    return "\n".join(lines)


# --- the fix, and its two traps -----------------------------------------------------------------


def attention_first_order(config: g4.Gemma4Config) -> list[str]:
    """Layer 0's q/k/v/o first, then the rest in file order: a stream whose probe must hold
    packed weights (q_proj, k_proj, v_proj) before it hits."""
    first = [f"{g4.TEXT_CKPT}layers.0.self_attn.{p}_proj.weight" for p in "qkvo"]
    return first + [n for n, _ in g4.checkpoint_layout(config) if n not in first]


def held_packed_run(behaviour: str = "new") -> Record:
    """Packed weights held before the hit: they are clones without ``shard_id``, forwarded
    under their original names; the parent maps them and tags its own copies."""
    config = g4.Gemma4Config()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = g4.make_checkpoint(config)
        ordered = {n: ckpt[n] for n in attention_first_order(config)}
        path = save_in_order(Path(tmp) / "attention-first.safetensors", ordered)
        run = _load(behaviour, open_checkpoint(path).weights(reuse_buffer=True), config)
        wrong = wrong_values(run.model, _truth(path, config))
    qkv = f"{g4.TEXT_PARAM}layers.0.self_attn.qkv_proj.weight"
    rec = Record(behaviour)
    rec.outcome = {
        "held before the hit": [n.removeprefix(g4.TEXT_CKPT) for n in run.probe.walked_names[:-1]]
        if run.probe.hit
        else f"{run.probe.walked} (no hit)",
        "hit at key": _hit(run.probe),
        "layer 0 qkv_proj exact": wrong[qkv] == 0,
        "values exact": f"{sum(1 for v in wrong.values() if v == 0)} of {len(wrong)}",
    }
    return rec


def trap_mapping_twice() -> Record:
    """The rejected design: map the stream in the probe, forward mapped names."""
    packing = dataclasses.replace(g4.Gemma4Config(), packing_in_mapper=True)
    mapper = g4.hf_to_vllm_mapper_for(packing)
    name = f"{g4.TEXT_CKPT}layers.0.mlp.up_proj.weight"
    once = mapper.map_name(name)
    assert once is not None
    rec = Record("forward mapped names")
    rec.outcome = {
        "checkpoint name": name,
        "mapped once": once,
        "mapped twice": mapper.map_name(once),
    }
    ck = open_checkpoint(CHECKPOINT)
    for label, config in (
        ("prefix-only mapper (Gemma4)", g4.Gemma4Config()),
        ("packing mapper", packing),
    ):
        try:
            run = _load("new", ck.weights(reuse_buffer=True), config, forward="mapped")
            result = f"loaded {len(run.loaded)} parameters"
        except LoadkitError as exc:
            result = f"{type(exc).__name__}: {_short(str(exc))}"
        rec.outcome[f"{label}, mapped names forwarded"] = result
    return rec


def trap_clone_drops_shard_id() -> Record:
    """``apply()`` tags a packed weight with ``shard_id``; ``clone()`` does not copy it."""
    config = dataclasses.replace(g4.Gemma4Config(), packing_in_mapper=True)
    model = MODEL(config)
    name = f"{g4.TEXT_CKPT}layers.0.self_attn.q_proj.weight"
    weight = dict(open_checkpoint(CHECKPOINT).weights())[name]
    [(mapped, tagged)] = list(model.hf_to_vllm_mapper.apply([(name, weight)]))
    clone = tagged.clone()
    param = model.get_parameter(mapped)
    rec = Record("clone after apply()")
    rec.outcome = {
        "mapped name": mapped,
        "shard_id after apply()": getattr(tagged, "shard_id", None),
        "shard_id of its clone()": getattr(clone, "shard_id", None),
    }
    loader = loader_of(param)
    try:
        loader(param, clone)
        rec.outcome["loading the clone"] = "ok"
    except LoadkitError as exc:
        rec.outcome["loading the clone"] = f"{type(exc).__name__}: {exc}"
    loader(param, tagged)
    rows = param.shape[0]
    filled = int((param != 0).any(dim=1).sum())
    rec.outcome["loading the tagged tensor"] = f"ok: {filled} of {rows} rows of qkv_proj filled"
    return rec
