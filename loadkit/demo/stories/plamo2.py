"""The scenarios behind notebooks/02_plamo2_autoweightsloader.ipynb (vLLM #41699).

Every scenario loads the committed checkpoints in ``data/plamo2/`` into the model of
``loadkit.models.plamo2`` with one behaviour and measures the result against ``reference_state``:
the correct values computed independently of the loaders (parameter by parameter, with the
``in_proj`` order from explicit index arithmetic). Loaders add norm offsets in place, so
every load here is handed fresh copies (``fresh``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from loadkit.checkpoint.reader import open_checkpoint
from loadkit.demo.scenario import Record, Series, run_behaviours
from loadkit.demo.show import Table
from loadkit.demo.stories import DATA_DIR
from loadkit.errors import CheckpointError
from loadkit.fmt import WIDTH, wrap
from loadkit.loading.auto_loader import AutoWeightsLoader
from loadkit.loading.ledger import LoadLedger, ledger_of
from loadkit.models._common import RMSNorm, rms_norm
from loadkit.models.dyadic import dyadic_uniform
from loadkit.models.plamo2 import (
    BEHAVIOURS,
    FINAL_NORM_TESTS,
    NameStep,
    Plamo2Config,
    Plamo2ForCausalLM,
    checkpoint_name,
    config_from_checkpoint,
)
from loadkit.vocab import Status

DEVIATION = "max |loaded - correct|"
# The committed Plamo2 checkpoints (data/generate.py writes them), under data/.
DATA_FILES = {
    "untied": "plamo2/untied.safetensors",
    "tied": "plamo2/tied.safetensors",
    "tied-with-lm-head": "plamo2/tied-with-lm-head",
}
Weights = list[tuple[str, torch.Tensor]]

# --- checkpoints ----------------------------------------------------------------------------------


def data_path(kind: str) -> Path:
    """``data/plamo2/...`` for ``kind`` in ``"untied"``, ``"tied"``, ``"tied-with-lm-head"``."""
    path = DATA_DIR / DATA_FILES[kind]
    if not path.exists():
        raise CheckpointError(str(path), "missing: run `python data/generate.py` to write it")
    return path


def read_weights(kind: str) -> Weights:
    """The checkpoint's ``(name, tensor)`` pairs in stream order (shards by file name)."""
    return list(open_checkpoint(data_path(kind)).weights())


def config_of(kind: str) -> Plamo2Config:
    """The config inferred from the checkpoint header; ``tied-with-lm-head`` is tied by design."""
    config = config_from_checkpoint(open_checkpoint(data_path(kind)).tensors)
    if kind == "tied-with-lm-head":  # carries lm_head.weight, so inference says untied
        config = dataclasses.replace(config, tie_word_embeddings=True)
    return config


def fresh(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Copies of the weights: loaders add norm offsets in place."""
    return ((name, tensor.clone()) for name, tensor in weights)


def load(behaviour: str, config: Plamo2Config, weights: Weights) -> Plamo2ForCausalLM:
    model = Plamo2ForCausalLM(config, behaviour=behaviour)
    model.load_weights(fresh(weights))
    return model


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


def reference_state(config: Plamo2Config, weights: Weights) -> dict[str, torch.Tensor]:
    """The correct value of every parameter (``named_parameters`` names, tied ones once)."""
    ckpt = dict(weights)
    with torch.device("meta"):
        names = [n for n, _ in Plamo2ForCausalLM(config).named_parameters()]
    rows = torch.tensor(in_proj_source_rows(config))
    out = {}
    for name in names:
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
    model: Plamo2ForCausalLM, reference: Mapping[str, torch.Tensor], seed: int = 0, tokens: int = 4
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


def _kind(tied: bool) -> str:
    return "tied" if tied else "untied"


def deviation_record(behaviour: str, *, tied: bool = False) -> Record:
    """The main chart's record: per parameter, how far the loaded value is from the correct one."""
    kind = _kind(tied)
    config, weights = config_of(kind), read_weights(kind)
    reference = reference_state(config, weights)
    model = Plamo2ForCausalLM(config, behaviour=behaviour)
    returned = model.load_weights(fresh(weights))
    devs = deviations(model, reference)
    norms = norm_forward_deltas(model, reference)
    record = Record(behaviour)
    record.series[DEVIATION] = Series(
        x=list(devs),
        y=[worst for worst, _ in devs.values()],
        mode="bar",
        text=[f"{mean:+.4g}" if worst else "" for worst, mean in devs.values()],  # signed shift
    )
    wrong = [n for n, (worst, _) in devs.items() if worst]
    ledger = ledger_of(model)
    record.outcome = {
        "checkpoint": kind,
        "parameters": len(devs),
        "wrong parameters": len(wrong),
        "wrong": {n: round(devs[n][1], 6) for n in wrong},
        "max |deviation|": max(w for w, _ in devs.values()),
        "norm outputs changed": sum(1 for v in norms.values() if v),
        "max |norm output delta|": max(norms.values()),
        "ledger never loaded": len(ledger.never_loaded) if ledger else "-",
        "load_weights returned": "None" if returned is None else f"set of {len(returned)} names",
    }
    return record


def main_records(tied: bool = False) -> dict[str, Record]:
    """The records the notebook's behaviour toggle swaps between (one per behaviour)."""
    return run_behaviours(deviation_record, BEHAVIOURS, tied=tied)


def forward_record(*, tied: bool = False) -> Record:
    """Per RMSNorm, per behaviour: max |output - correct output| on the fixed input."""
    kind = _kind(tied)
    config, weights = config_of(kind), read_weights(kind)
    reference = reference_state(config, weights)
    record = Record("all behaviours")
    for behaviour in BEHAVIOURS:
        deltas = norm_forward_deltas(load(behaviour, config, weights), reference)
        for norm, delta in deltas.items():
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


def delegation_table(behaviour: str = "new", *, tied: bool = False, limit: int = 0) -> Table:
    """Each checkpoint name, the loader that handled it, the name that loader saw, and the result.

    Built from the real load: the root's ledger (who got which name) and the steps the loader
    that converted the name recorded. ``limit`` > 0 keeps the first rows and names how many more.
    """
    kind = _kind(tied)
    config, weights = config_of(kind), read_weights(kind)
    model = load(behaviour, config, weights)
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


def delegation_picture(
    behaviour: str = "new", *, tied: bool = False, examples: int = 2, width: int = WIDTH
) -> str:
    """The load as a tree: which level got which names, spelled as that level saw them.

    Drawn from a real load: the root ledger (what the walk did with each first name component)
    and the names ``Plamo2Model.load_weights`` actually received. Lines longer than ``width``
    are folded (``fmt.wrap``).
    """
    return wrap(_delegation_lines(behaviour, tied, examples), width)


def _delegation_lines(behaviour: str, tied: bool, examples: int) -> str:
    kind = _kind(tied)
    config, weights = config_of(kind), read_weights(kind)
    model = load(behaviour, config, weights)
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
    skip = "['lm_head.']" if config.tie_word_embeddings else "None"
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


def final_norm_test_table(*, tied: bool = False) -> Table:
    """For every name with ``norm`` in it: the name each loader saw and its final-norm answer.

    Answers come from the loaders' own recorded steps; ``offset`` means a per-layer norm rule
    matched first (the final-norm test is never asked for those).
    """
    kind = _kind(tied)
    config, weights = config_of(kind), read_weights(kind)
    traces: dict[str, dict[str, NameStep]] = {}
    for b in BEHAVIOURS:
        model = load(b, config, weights)
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
        *(f"{b}: {FINAL_NORM_TESTS[b][0]}" for b in BEHAVIOURS),
    ]
    rows = [
        [
            n,
            traces["old"][n].renamed,
            traces["new"][n].renamed,
            *(answer(b, n) for b in BEHAVIOURS),
        ]
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


def ledger_side_by_side(*, tied: bool = False, kind: str | None = None) -> Table:
    """The old and the new loader's ledgers over one checkpoint, one parameter per row."""
    kind = kind or _kind(tied)
    config, weights = config_of(kind), read_weights(kind)
    ledgers = {}
    returned = {}
    for b in ("old", "new"):
        model = Plamo2ForCausalLM(config, behaviour=b)
        got = model.load_weights(fresh(weights))
        returned[b] = "None" if got is None else f"set of {len(got)} names"
        ledgers[b] = _ledger(model)
    old, new = ledgers["old"], ledgers["new"]
    loaded = {b: {p.name for p in lg.params_with(Status.LOADED)} for b, lg in ledgers.items()}
    rows = [
        ("checkpoint names", *_ledger_summary(old)[:1], _ledger_summary(new)[0]),
        ("model tensors", _ledger_summary(old)[1], _ledger_summary(new)[1]),
        ("load_weights returned", returned["old"], returned["new"]),
    ]
    for name, p_old in old.params.items():
        p_new = new.params[name]
        o = ", ".join(p_old.sources) or p_old.status
        n = ", ".join(p_new.sources) or (f"via {p_new.via}" if p_new.via else p_new.status)
        alias = f" (= {', '.join(p_old.aliases)})" if p_old.aliases else ""
        rows.append((name + alias, o, n))
    for e_old, e_new in zip(old.entries, new.entries, strict=True):
        if Status.SKIPPED in (e_old.status, e_new.status):
            rows.append((f"checkpoint {e_old.name}", f"skipped: {e_old.rule}", e_new.rule or ""))
    conclusion = (
        f"same parameters loaded: {loaded['old'] == loaded['new']}; "
        f"never loaded: old {old.never_loaded}, new {new.never_loaded}"
    )
    return Table(("", "old", "new"), rows, [conclusion])


# --- the tied lm_head ---------------------------------------------------------------------------


LM_HEAD_CASES = (
    "old: skips tied lm_head.weight by name",
    "new: skip_prefixes=['lm_head.']",
    "new, skip_prefixes removed",
    "new, skip_prefixes removed, lm_head.weight first",
)


def lm_head_overwrite() -> Record:
    """Tied config, checkpoint carrying ``lm_head.weight`` (second shard): what the embedding holds.

    Series: per case, max |embedding - checkpoint embedding|. "skip_prefixes removed" is
    ``AutoWeightsLoader(model).load_weights(...)``: exactly the new ``load_weights`` without the
    skip. "lm_head.weight first" streams the same tensors in single-file order (the safetensors
    library writes tensors sorted by name, so ``lm_head.`` precedes ``model.``).
    """
    kind = "tied-with-lm-head"
    config, weights = config_of(kind), read_weights(kind)
    ckpt = dict(weights)
    embed, head = ckpt["model.embed_tokens.weight"], ckpt["lm_head.weight"]
    head_first = sorted(weights, key=lambda nw: nw[0] != "lm_head.weight")
    record = Record("tied, lm_head.weight in the checkpoint")
    for case in LM_HEAD_CASES:
        if case.startswith("old"):
            model = load("old", config, weights)
        elif "removed" not in case:
            model = load("new", config, weights)
        else:
            model = Plamo2ForCausalLM(config, behaviour="new")
            stream = head_first if case.endswith("first") else weights
            AutoWeightsLoader(model).load_weights(fresh(stream))
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


def in_proj_labels(config: Plamo2Config) -> tuple[list[str], list[str]]:
    """Row labels of ``in_proj.weight`` before (checkpoint) and after (loaded) the reorder.

    The "after" labels come from running the model's real loader on a checkpoint whose
    ``in_proj`` rows each hold their own checkpoint row number.
    """
    d, heads = config.hidden_size_per_head, config.mamba_num_heads

    def label(row: int) -> str:
        h, r = divmod(row, 2 * d)
        half, j = divmod(r, d)
        return f"h{h} {'gate' if half == 0 else 'x'}{j}"

    rows = 2 * heads * d
    before = [label(r) for r in range(rows)]
    model = Plamo2ForCausalLM(config, behaviour="new")
    layer = next(i for i in range(config.num_hidden_layers) if config.is_mamba(i))
    name = f"layers.layers.{layer}.mixer.in_proj.weight"
    tagged = torch.arange(rows, dtype=torch.float32)[:, None].expand(rows, config.hidden_size)
    model.model.load_weights([(name, tagged.clone())])
    loaded = dict(model.named_parameters())[f"model.{name}"].detach()[:, 0]
    after = [label(int(v)) for v in loaded.tolist()]
    return before, after


def in_proj_figure(config: Plamo2Config) -> Any:
    """Heatmap: row by row, which head (colour) and which half (text) before and after."""
    import plotly.graph_objects as go

    before, after = in_proj_labels(config)
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
    from loadkit.demo.viz import BASE_LAYOUT

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
    return name.removeprefix("model.").replace("layers.layers.", "layers.")


def deviation_map(tied: bool = False) -> Record:
    """Every parameter under every behaviour: the signed shift of a wrong parameter, else 0.

    One series per behaviour (x: parameter names, y: mean signed loaded - correct where the
    parameter is wrong, 0 where it is exact): the heatmap's columns.
    """
    record = Record(_kind(tied))
    for behaviour, rec in main_records(tied=tied).items():
        wrong = rec.outcome["wrong"]
        names = rec.series[DEVIATION].x
        record.series[behaviour] = Series(names, [wrong.get(n, 0.0) for n in names], mode="bar")
    return record


def deviation_maps() -> dict[str, Record]:
    """The heatmap's records, untied and tied: what the notebook's checkpoint toggle swaps."""
    return {r.behaviour: r for r in (deviation_map(False), deviation_map(True))}


def behaviour_heatmap(record: Record, *, title: str, unit: str, signed: bool) -> Any:
    """Rows: the series' x (parameters or norms); columns: behaviours; empty cells are exact.

    Column labels say how many rows differ ("all exact" when none), so no behaviour looks empty.
    """
    import plotly.graph_objects as go

    from loadkit.demo.viz import base_figure

    behaviours = list(record.series)
    rows = list(next(iter(record.series.values())).x)
    z = [[record.series[b].y[i] for b in behaviours] for i in range(len(rows))]
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
    fig = base_figure(title, height=170 + 24 * len(rows))
    fig.add_trace(
        go.Heatmap(
            z=z,
            x=labels,
            y=[_short(r) for r in rows],
            text=text,
            texttemplate="%{text}",
            zmin=-top if signed else 0,
            zmax=top,
            colorscale=scale,
            showscale=False,
            xgap=2,
            ygap=2,
            hovertemplate="%{y}<br>%{x}<br>" + unit + ": %{z}<extra></extra>",
        )
    )
    fig.update_layout(yaxis_autorange="reversed", xaxis_side="top", margin_t=130)
    return fig


def deviation_figure(record: Record) -> Any:
    """The heatmap of ``deviation_map``: 30 parameters by 4 behaviours, signed shifts in cells."""
    return behaviour_heatmap(
        record,
        title=f"Wrong parameters after each loader, by checkpoint [{record.behaviour}]",
        unit="loaded - correct",
        signed=True,
    )


def main_view() -> Any:
    """The checkpoint toggle (untied / tied) over ``deviation_maps()`` and its heatmap."""
    from loadkit.demo.viz import record_view

    return record_view(deviation_maps(), deviation_figure, description="checkpoint")


def forward_figure(record: Record) -> Any:
    """Per RMSNorm and behaviour, max |output - correct output|: ``forward_record()`` as a map."""
    return behaviour_heatmap(
        record,
        title="RMSNorm outputs on a fixed input: max |output - correct output|",
        unit="max |delta|",
        signed=False,
    )


def lm_head_figure(record: Record) -> Any:
    """One bar per case: how far the tied embedding ends from the checkpoint's embedding."""
    import plotly.graph_objects as go

    from loadkit.demo.viz import base_figure

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
