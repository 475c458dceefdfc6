"""Notebook 02's pictures of the Plamo2 loaders (vLLM #41699): what each load left.

The notebook loads for real in a function of its own (``Plamo2ForCausalLM(config,
behaviour=...)``, ``load_weights`` over ``make_checkpoint``'s tensors as the committed file
streams them) and hands the loaded models here. ``reference_state`` computes the correct values
independently of the loaders (parameter by parameter, with the ``in_proj`` order from explicit
index arithmetic); the functions here compare and draw.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from loadkit import dyadic_uniform
from loadkit.fmt import WIDTH, wrap
from loadkit.loading import LoadLedger, ledger_of
from loadkit.models.plamo2 import (
    FINAL_NORM_TESTS,
    NameStep,
    Plamo2Config,
    Plamo2ForCausalLM,
    RMSNorm,
    checkpoint_name,
    rms_norm,
)
from loadkit.terms import Status
from loadkit_notebooks.scenario import Record, Series
from loadkit_notebooks.show import Table

Weights = Sequence[tuple[str, torch.Tensor]]


@dataclasses.dataclass
class Loaded:
    """One load as the notebook ran it: the model and what its ``load_weights`` returned."""

    behaviour: str
    model: Any  # Plamo2ForCausalLM
    returned: set[str] | None


# --- the correct values, computed without the loaders -------------------------------------------


def in_proj_source_rows(config: Plamo2Config) -> list[int]:
    """For each row of the loaded ``in_proj.weight``, the checkpoint row it comes from.

    Loaded rows are all gate rows (head by head), then all hidden-state rows. In the checkpoint,
    head ``h`` owns rows ``[h * 2d, (h + 1) * 2d)``: its gate half first, then its hidden half.
    """
    d, heads = config.hidden_size_per_head, config.mamba_num_heads
    rows = []
    for half in (0, 1):  # 0: gate, 1: hidden states
        for h in range(heads):
            for j in range(d):
                rows.append(h * 2 * d + half * d + j)
    return rows


# Offsets by the module a norm weight belongs to (the checkpoint stores weight - offset).
_NORM_OFFSET_BY_MODULE = {
    "pre_mixer_norm": 1.0,
    "post_mixer_norm": 1.0 / 5,
    "pre_mlp_norm": 1.0,
    "post_mlp_norm": 1.0 / (5**1.5),
}


def reference_state(model: Plamo2ForCausalLM, weights: Weights) -> dict[str, torch.Tensor]:
    """The correct value of every parameter of ``model`` (``named_parameters`` names, tied ones
    once), from the checkpoint's ``weights``."""
    ckpt = dict(weights)
    config = model.config
    rows = torch.tensor(in_proj_source_rows(config))
    out = {}
    for name, _ in model.named_parameters():
        w = ckpt[checkpoint_name(name)].clone()
        module = name.rsplit(".", 2)[-2]
        if name.endswith(".mixer.in_proj.weight"):
            w = w[rows]
        elif name.endswith(".mixer.A"):
            w = -torch.exp(w.float())
        elif name == "model.norm.weight":
            w = w + 1.0
        elif module in _NORM_OFFSET_BY_MODULE:
            w = w + _NORM_OFFSET_BY_MODULE[module]
        out[name] = w
    return out


# --- measuring ------------------------------------------------------------------------------------


def deviations(
    model: torch.nn.Module, reference: Mapping[str, torch.Tensor]
) -> dict[str, tuple[float, float]]:
    """Per parameter: (max |loaded - correct|, mean signed loaded - correct)."""
    out = {}
    for name, p in model.named_parameters():
        d = (p.detach().float() - reference[name].float()).double()
        out[name] = (d.abs().max().item(), d.mean().item())
    return out


def norm_forward_deltas(
    model: nn.Module, reference: Mapping[str, torch.Tensor], seed: int = 0, tokens: int = 4
) -> dict[str, float]:
    """Per RMSNorm: max |norm(x) - correct norm(x)| on a fixed seeded input ``x``.

    Each norm runs its own forward with the loaded weight; the correct output uses the same
    ``rms_norm`` with the correct weight. Inputs are drawn in module order from one generator.
    """
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, module in model.named_modules():
        if not isinstance(module, RMSNorm):
            continue
        x = dyadic_uniform((tokens, *module.weight.shape), gen)
        with torch.no_grad():
            got = module(x)
        want = rms_norm(x, reference[f"{name}.weight"], module.eps)
        out[name] = (got - want).abs().max().item()
    return out


def outcome(loaded: Loaded, reference: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """What one load got wrong, and what its accounting saw."""
    devs = deviations(loaded.model, reference)
    norms = norm_forward_deltas(loaded.model, reference)
    wrong = [n for n, (worst, _) in devs.items() if worst]
    ledger = ledger_of(loaded.model)
    returned = loaded.returned
    return {
        "parameters": len(devs),
        "wrong parameters": len(wrong),
        "wrong": {n: round(devs[n][1], 6) for n in wrong},
        "max |deviation|": max(w for w, _ in devs.values()),
        "norm outputs changed": sum(1 for v in norms.values() if v),
        "max |norm output delta|": max(norms.values()),
        "ledger never loaded": len(ledger.never_loaded) if ledger else "-",
        "load_weights returned": "None" if returned is None else f"set of {len(returned)} names",
    }


def summary(loaded: Loaded, reference: Mapping[str, torch.Tensor]) -> str:
    """``outcome`` as aligned lines under the behaviour's name."""
    return Record(loaded.behaviour, outcome=outcome(loaded, reference)).summary()


def deviation_map(loads: Mapping[str, Loaded], reference: Mapping[str, torch.Tensor]) -> Record:
    """Every parameter under every behaviour: the signed shift of a wrong parameter, else 0.

    One series per behaviour (x: parameter names, y: mean signed loaded - correct where the
    parameter is wrong, 0 where it is exact): the heatmap's columns.
    """
    record = Record("every loader")
    for behaviour, loaded in loads.items():
        devs = deviations(loaded.model, reference)
        shifts = [mean if worst else 0.0 for worst, mean in devs.values()]
        record.series[behaviour] = Series(list(devs), [round(v, 6) for v in shifts], mode="bar")
    return record


def forward_record(loads: Mapping[str, Loaded], reference: Mapping[str, torch.Tensor]) -> Record:
    """Per RMSNorm, per behaviour: max |output - correct output| on the fixed input."""
    record = Record("all behaviours")
    for behaviour, loaded in loads.items():
        for norm, delta in norm_forward_deltas(loaded.model, reference).items():
            record.add_point(behaviour, norm, delta, mode="bar")
    return record


# --- names as each level sees them --------------------------------------------------------------


def _what(step: NameStep) -> str:
    parts = []
    if step.renamed != step.received:
        parts.append("renamed")
    if step.reordered:
        parts.append("in_proj reordered")
    if step.offset is not None:
        parts.append(f"+{step.offset:.4g}")
    return ", ".join(parts) or "as is"


def delegation_table(loaded: Loaded, *, limit: int = 0) -> Table:
    """Each checkpoint name, the loader that handled it, the name that loader saw, and the result.

    Read from the load: the root's ledger (who got which name) and the steps the loader that
    converted the name recorded. ``limit`` > 0 keeps the first rows and names how many more.
    """
    behaviour, model = loaded.behaviour, loaded.model
    ledger = ledger_of(model)
    assert ledger is not None
    steps = iter(model.load_trace if behaviour == "old" else model.model.load_trace)
    rows = []
    for entry in ledger.entries:
        if behaviour == "old":
            level = "Plamo2ForCausalLM.load_weights"
        elif entry.status == Status.DELEGATED:
            level = "Plamo2Model.load_weights"
        else:
            level = "AutoWeightsLoader, walked"
        if behaviour == "old" or entry.status == Status.DELEGATED:
            step = next(steps)
            seen, result, what = step.received, step.loaded or "-", _what(step)
        else:
            seen, result, what = entry.name, entry.target or "-", entry.detail
        rows.append((entry.name, level, seen, result, what))
    head = ("checkpoint name", "handled by", "name it sees", "parameter (its naming)", "done")
    shown = rows[:limit] if limit else rows
    more = [f"... {len(rows) - limit} more"] if limit and len(rows) > limit else []
    return Table(head, shown, more)


def delegation_picture(loaded: Loaded, *, examples: int = 2, width: int = WIDTH) -> str:
    """The load as a tree: which level got which names, spelled as that level saw them.

    Read from the load: the root ledger (what the walk did with each first name component) and
    the names ``Plamo2Model.load_weights`` actually received. Lines longer than ``width`` are
    folded (``fmt.wrap``).
    """
    return wrap(_delegation_lines(loaded, examples), width)


def _delegation_lines(loaded: Loaded, examples: int) -> str:
    behaviour, model = loaded.behaviour, loaded.model
    ledger = ledger_of(model)
    assert ledger is not None

    def eg(names: list[str]) -> str:
        shown = ", ".join(f"'{n}'" for n in names[:examples])
        return shown + (", ..." if len(names) > examples else "")

    names = [e.name for e in ledger.entries]
    if behaviour == "old":
        steps = model.load_trace
        return "\n".join(
            [
                f"Plamo2ForCausalLM.load_weights (its own loop) gets {len(names)} names: "
                f"{eg(names)}",
                "    renames, reorders in_proj, adds norm offsets, finds each parameter by its "
                "full name in dict(self.named_parameters())",
                f"    final norm: {FINAL_NORM_TESTS['old'][0]} -> "
                + ", ".join(f"'{s.renamed}'" for s in steps if s.final_norm_test),
            ]
        )
    skip = "['lm_head.']" if model.config.tie_word_embeddings else "None"
    lines = [
        f"Plamo2ForCausalLM.load_weights -> AutoWeightsLoader(self, skip_prefixes={skip}) "
        f"gets {len(names)} names: {eg(names)}",
    ]
    skipped = [e.name for e in ledger.entries if e.status == Status.SKIPPED]
    if skipped:
        lines.append(f"├── skipped before the walk: {eg(skipped)}")
    walked = [e for e in ledger.entries if e.status == Status.LOADED]
    if walked:
        lines.append(
            "├── 'lm_head' -> lm_head (Linear, no load_weights): walked down to its parameter: "
            + ", ".join(f"'{e.name}' -> {e.target}" for e in walked)
        )
    inner = [s.received for s in model.model.load_trace]
    final = [s.renamed for s in model.model.load_trace if s.final_norm_test]
    lines += [
        f"└── 'model' -> model (Plamo2Model has load_weights): gets its {len(inner)} names with "
        f"'model.' stripped: {eg(inner)}",
        "        its own loop: renames, reorders in_proj, adds norm offsets, finds each parameter "
        "in dict(Plamo2Model.named_parameters())",
        f"        final norm: {FINAL_NORM_TESTS[behaviour][0]} -> "
        + (", ".join(f"'{n}'" for n in final) or "matches nothing"),
    ]
    return "\n".join(lines)


def final_norm_test_table(loads: Mapping[str, Loaded], weights: Weights) -> Table:
    """For every name with ``norm`` in it: the name each loader saw and its final-norm answer.

    Answers come from the loaders' own recorded steps; ``(+x)`` means a per-layer norm rule
    matched first (the final-norm test is never asked for those).
    """
    traces: dict[str, dict[str, NameStep]] = {}
    for b, loaded in loads.items():
        model = loaded.model
        traces[b] = {
            s.received if b == "old" else f"model.{s.received}": s
            for s in (model.load_trace if b == "old" else model.model.load_trace)
        }
    names = [n for n, _ in weights if "norm" in n]

    def answer(b: str, n: str) -> str:
        step = traces[b][n]
        if step.final_norm_test is None:
            return f"(+{step.offset:.3g})"
        return "+1.0" if step.final_norm_test else "no"

    head = [
        "checkpoint name",
        "seen at root",
        "seen in Plamo2Model",
        *(f"{b}: {FINAL_NORM_TESTS[b][0]}" for b in loads),
    ]
    rows = [
        [n, traces["old"][n].renamed, traces["new"][n].renamed, *(answer(b, n) for b in loads)]
        for n in names
    ]
    return Table(head, rows)


# --- the ledger, old and new side by side --------------------------------------------------------


def _ledger(model: nn.Module) -> LoadLedger:
    ledger = ledger_of(model)
    assert ledger is not None, "the load left no ledger"
    return ledger


def _ledger_summary(ledger: LoadLedger) -> tuple[str, str]:
    c = ledger.counts()
    ck = ", ".join(f"{n} {s}" for s, n in c["checkpoint"].items() if n)
    pm = ", ".join(f"{n} {s}" for s, n in c["model"].items() if n)
    return f"{len(ledger.entries)}: {ck}", f"{len(ledger.params)}: {pm}"


def ledger_side_by_side(old: Loaded, new: Loaded) -> Table:
    """The old and the new loader's ledgers over one checkpoint, one parameter per row."""
    ledgers = {"old": _ledger(old.model), "new": _ledger(new.model)}
    returned = {
        x.behaviour: "None" if x.returned is None else f"set of {len(x.returned)} names"
        for x in (old, new)
    }
    lo, ln = ledgers["old"], ledgers["new"]
    loaded = {b: {p.name for p in lg.params_with(Status.LOADED)} for b, lg in ledgers.items()}
    rows = [
        ("checkpoint names", _ledger_summary(lo)[0], _ledger_summary(ln)[0]),
        ("model tensors", _ledger_summary(lo)[1], _ledger_summary(ln)[1]),
        ("load_weights returned", returned["old"], returned["new"]),
    ]
    for name, p_old in lo.params.items():
        p_new = ln.params[name]
        o = ", ".join(p_old.sources) or p_old.status
        n = ", ".join(p_new.sources) or (f"via {p_new.via}" if p_new.via else p_new.status)
        alias = f" (= {', '.join(p_old.aliases)})" if p_old.aliases else ""
        rows.append((name + alias, o, n))
    for e_old, e_new in zip(lo.entries, ln.entries, strict=True):
        if Status.SKIPPED in (e_old.status, e_new.status):
            rows.append((f"checkpoint {e_old.name}", f"skipped: {e_old.rule}", e_new.rule or ""))
    conclusion = (
        f"same parameters loaded: {loaded['old'] == loaded['new']}; "
        f"never loaded: old {lo.never_loaded}, new {ln.never_loaded}"
    )
    return Table(("", "old", "new"), rows, [conclusion])


# --- the tied lm_head ---------------------------------------------------------------------------


def lm_head_record(cases: Mapping[str, Any], embed: torch.Tensor, head: torch.Tensor) -> Record:
    """Tied models (one per case) loaded from a checkpoint that carries ``lm_head.weight``:
    what each embedding holds against the checkpoint's ``embed`` and ``head`` tensors.

    Series: per case, max |embedding - checkpoint embedding|; events: the ledger's word on
    ``lm_head.weight`` and where the embedding came from.
    """
    record = Record("tied, lm_head.weight in the checkpoint")
    for case, model in cases.items():
        ledger = ledger_of(model)
        assert ledger is not None
        got = model.model.embed_tokens.weight.detach()
        entry = next(e for e in ledger.entries if e.name == "lm_head.weight")
        record.add_point(
            "max |embedding - checkpoint embedding|",
            case,
            (got - embed).abs().max().item(),
            mode="bar",
        )
        record.events.append(
            {
                "case": case,
                "lm_head.weight": f"{entry.status} {entry.detail}".strip(),
                "embedding == checkpoint lm_head.weight": torch.equal(got, head),
                "embedding == checkpoint embed_tokens": torch.equal(got, embed),
                "embed_tokens sources": ledger.params["model.embed_tokens.weight"].sources,
                "lm_head is embed_tokens": model.lm_head.weight is model.model.embed_tokens.weight,
            }
        )
    return record


def lm_head_table(record: Record) -> str:
    lines = []
    for ev in record.events:
        lines.append(ev["case"])
        lines += [f"    {k}: {v}" for k, v in ev.items() if k != "case"]
    return "\n".join(lines)


# --- the in_proj reorder ------------------------------------------------------------------------


def in_proj_labels(config: Plamo2Config, loaded_rows: Sequence[int]) -> tuple[list[str], list[str]]:
    """Row labels of ``in_proj.weight`` before (checkpoint) and after (loaded) the reorder.

    ``loaded_rows``: for each loaded row, the checkpoint row it holds, as the notebook read it
    back from a load of rows that carry their own number.
    """
    d = config.hidden_size_per_head

    def label(row: int) -> str:
        h, r = divmod(row, 2 * d)
        half, j = divmod(r, d)
        return f"h{h} {'gate' if half == 0 else 'x'}{j}"

    before = [label(r) for r in range(2 * config.mamba_num_heads * d)]
    return before, [label(int(r)) for r in loaded_rows]


def in_proj_figure(config: Plamo2Config, loaded_rows: Sequence[int]) -> Any:
    """Heatmap: row by row, which head (colour) and which half (text) before and after."""
    import plotly.graph_objects as go

    before, after = in_proj_labels(config, loaded_rows)
    z = [[int(s.split()[0][1:]) for s in row] for row in (before, after)]
    # Cell text: head over half and index ("h1<br>g2": head 1, gate row 2), compact enough for
    # narrow cells; the hover repeats it in full.
    short = [
        [s.replace(" gate", "<br>g").replace(" x", "<br>x") for s in row] for row in (before, after)
    ]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(range(len(before))),
            y=["checkpoint row", "loaded row"],
            text=short,
            customdata=[before, after],
            texttemplate="%{text}",
            colorscale="Viridis",
            showscale=False,  # the cell text names the head
            hovertemplate="row %{x}: %{customdata}<extra>%{y}</extra>",
        )
    )
    from loadkit_notebooks.viz import BASE_LAYOUT

    fig.update_layout(BASE_LAYOUT)
    fig.update_layout(
        title_text="in_proj.weight rows: per head [gate, x] -> all gates, then all x",
        xaxis_title="row index",
        yaxis_autorange="reversed",  # checkpoint on top, loaded below
        height=300,
        margin_l=120,
    )
    return fig


# --- widgets --------------------------------------------------------------------------------------


def _short(name: str) -> str:
    if name in ("model.norm", "model.norm.weight"):
        return name.removeprefix("model.") + " (final)"
    return name.removeprefix("model.").replace("layers.layers.", "layers.")


def behaviour_heatmap(record: Record, *, title: str, unit: str, signed: bool) -> Any:
    """Rows: the series' x (parameters or norms) that differ under some behaviour, then one row
    for all the others (exact under every behaviour); columns: behaviours; empty cells exact.

    Column labels say how many rows differ ("all exact" when none), so no behaviour looks empty;
    the chart stays a screen high however many rows are exact.
    """
    import plotly.graph_objects as go

    from loadkit_notebooks.viz import base_figure

    behaviours = list(record.series)
    names = list(next(iter(record.series.values())).x)
    full = [[record.series[b].y[i] for b in behaviours] for i in range(len(names))]
    shown = [i for i, row in enumerate(full) if any(row)]
    others = len(names) - len(shown)
    rows = [_short(names[i]) for i in shown]
    z = [full[i] for i in shown]
    if others:
        rows.append(f"{others} others: exact everywhere")
        z.append([0.0] * len(behaviours))
    labels = []
    for b in behaviours:
        bad = sum(1 for v in record.series[b].y if v)
        labels.append(f"{b}<br>{f'{bad} wrong' if bad else 'all exact'}")
    text = [[(f"{v:+.3g}" if signed else f"{v:.3g}") if v else "" for v in row] for row in z]
    top = max((abs(v) for row in z for v in row), default=0.0) or 1.0
    scale = (
        [[0, "#2e86ab"], [0.5, "#f1f4f7"], [1, "#d1495b"]]
        if signed
        else [[0, "#f1f4f7"], [1, "#d1495b"]]
    )
    fig = base_figure(title, height=200 + 34 * len(rows))
    fig.add_trace(
        go.Heatmap(
            z=z,
            x=labels,
            y=rows,
            text=text,
            texttemplate="%{text}",
            textfont={"size": 14},
            zmin=-top if signed else 0,
            zmax=top,
            colorscale=scale,
            showscale=False,
            xgap=3,
            ygap=3,
            hovertemplate="%{y}<br>%{x}<br>" + unit + ": %{z}<extra></extra>",
        )
    )
    fig.update_layout(yaxis_autorange="reversed", xaxis_side="top", margin_t=130, margin_l=230)
    return fig


def deviation_figure(record: Record) -> Any:
    """``deviation_map``'s heatmap: the wrong parameters by behaviour, signed shifts in cells."""
    return behaviour_heatmap(
        record,
        title="Wrong parameters after each loader (loaded - correct)",
        unit="loaded - correct",
        signed=True,
    )


def forward_figure(record: Record) -> Any:
    """Per RMSNorm and behaviour, max |output - correct output|: ``forward_record`` as a map."""
    return behaviour_heatmap(
        record,
        title="RMSNorm outputs on a fixed input: max |output - correct output|",
        unit="max |delta|",
        signed=False,
    )


def lm_head_figure(record: Record) -> Any:
    """One bar per case: how far the tied embedding ends from the checkpoint's embedding."""
    import plotly.graph_objects as go

    from loadkit_notebooks.viz import base_figure

    (series,) = record.series.values()
    fig = base_figure(
        "Tied embedding after loading a checkpoint that carries lm_head.weight",
        height=300,
        xaxis_title="max |embedding - checkpoint embedding|",
        margin_l=330,
        yaxis_ticksuffix="   ",
    )
    fig.add_trace(
        go.Bar(
            x=series.y,
            y=series.x,
            orientation="h",
            text=[f"{v:.3g}: overwritten" if v else "exact" for v in series.y],
            textposition="outside",
            marker_color=["#d1495b" if v else "#4c9f70" for v in series.y],
            cliponaxis=False,
        )
    )
    fig.update_layout(yaxis_autorange="reversed", xaxis_range=[0, max(series.y) * 1.4 or 1])
    return fig
