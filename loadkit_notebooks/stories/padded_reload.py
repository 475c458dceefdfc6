"""Notebook 07's pictures: padded weights under layerwise reload, release by release (bug 6), and
what the direct reload keeps.

The notebook runs every reload itself (``record_metadata_for_reloading``,
``initialize_layerwise_reload`` with a release's keywords, ``load_weights``,
``finalize_layerwise_reload``, ``reload_log``); ``PaddedRun.of`` reads what a run left (the log,
the padding of one expert, the logits) and the functions here draw it. The explorer takes the
notebook's function and calls it again when the version toggle asks for another release.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from loadkit.fmt import table
from loadkit.reload import ReloadStep
from loadkit_notebooks.viz import Explorer

VERSION_COLOURS = {"0.30.0": "#d1495b", "0.31.0": "#edae49", "0.34.0": "#2e86ab"}
PAD_RANGE = 2.0  # the heatmap's colour scale: the checkpoint's values and the stale pattern fit


def _short(name: str) -> str:
    return name.removeprefix("model.")


@dataclass
class LayerCount:
    """One layer at the end of a reload: what it counted against its total, and what finalised
    it (``"count reached total"`` or ``"finalize_layerwise_reload"``)."""

    layer: str
    counted: int
    total: int
    finalised_by: str


@dataclass
class PaddedRun:
    """What one layerwise reload of the padded model did."""

    version: str
    layers: list[LayerCount]
    pad: list[list[float]]  # one expert's w13_weight, rows x hidden
    pad_rows: list[int]  # which of those rows are padding
    logits_differ: int
    logits_total: int
    differ_per_token: list[int]
    max_error: float
    partly_loaded: list[str]
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        model: Any,
        steps: Sequence[ReloadStep],
        *,
        version: str,
        logits: torch.Tensor,
        reference: torch.Tensor,
        partly_loaded: list[str],
        caught: list[Any],  # warnings.catch_warnings(record=True)
    ) -> PaddedRun:
        """Read a finished reload: ``steps`` is ``reload_log(model)``, ``logits`` the reloaded
        model's on the prompt, ``reference`` a fresh load's."""
        c = model.config
        w13 = model.model.layers[0].experts.w13_weight.detach()[0]
        ip, i = c.intermediate_padded, c.intermediate_size
        differ = logits != reference
        return cls(
            version=version,
            layers=layer_counts(steps),
            pad=[[float(v) for v in row] for row in w13],
            pad_rows=[r for r in range(2 * ip) if r % ip >= i],
            logits_differ=int(differ.sum()),
            logits_total=logits.numel(),
            differ_per_token=[int(n) for n in differ.sum(-1)],
            max_error=float((logits - reference).abs().max()),
            partly_loaded=[_short(n) for n in partly_loaded],
            warnings=[f"{w.category.__name__}: {w.message}" for w in caught],
        )

    def pad_values(self) -> list[float]:
        """Every value in the padding rows, in order."""
        return [v for r in self.pad_rows for v in self.pad[r]]


def layer_counts(steps: Sequence[ReloadStep]) -> list[LayerCount]:
    """Each layer's final count, total and what finalised it, in the order the layers came."""
    last: dict[str, ReloadStep] = {}
    finalised: dict[str, str] = {}
    for s in steps:
        if not s.dropped:
            last[s.layer] = s
        if s.finalised:
            finalised[s.layer] = s.reason
    return [
        LayerCount(_short(name), s.running, s.total, finalised.get(name, "-"))
        for name, s in last.items()
    ]


# The notebook's reload: reload(version) -> PaddedRun.
Reload = Callable[[str], PaddedRun]


def versions_text(runs: Mapping[str, PaddedRun]) -> str:
    """The releases side by side: how the experts counted, what finalised them, what the
    padding reads, and the forward pass against a fresh load."""
    header = ("", *runs)
    rows = [
        ("experts counted / total", *(_experts(r, "count") for r in runs.values())),
        ("experts finalised by", *(_experts(r, "by") for r in runs.values())),
        ("layers left partly loaded", *(str(len(r.partly_loaded)) for r in runs.values())),
        ("padding reads", *(_pad_words(r) for r in runs.values())),
        ("logits unlike a fresh load", *(_logits(r) for r in runs.values())),
    ]
    return table(rows, header=header, align="l" + "r" * len(runs))


def _experts(run: PaddedRun, what: str) -> str:
    experts = [c for c in run.layers if c.layer.endswith(".experts")]
    if what == "count":
        return ", ".join(f"{c.counted}/{c.total}" for c in experts)
    words = {"count reached total": "its count", "finalize_layerwise_reload": "finalize"}
    return ", ".join(sorted({words.get(c.finalised_by, c.finalised_by) for c in experts}))


def _pad_words(run: PaddedRun) -> str:
    values = run.pad_values()
    if all(v == 0 for v in values):
        return "zeros"
    shown = sorted(set(values))
    return f"stale ({shown[0]:g} to {shown[-1]:g})"


def _logits(run: PaddedRun) -> str:
    if not run.logits_differ:
        return f"0/{run.logits_total} (identical)"
    return f"{run.logits_differ}/{run.logits_total}, max {run.max_error:.3g}"


def count_figure(run: PaddedRun) -> Any:
    """Each layer's count at the end of the reload as a share of its total: the experts' bars
    stop at 75% when the padding is counted (0.30.0) and are finalised only by finalize."""
    import plotly.graph_objects as go

    from loadkit_notebooks.viz import base_figure

    fig = base_figure(
        f"Each layer's count against its total, by vLLM's rules (hatched: left to finalize) "
        f"[{run.version}]",
        height=380,
        yaxis={"title": "% of the layer's total", "range": [0, 115], "dtick": 25},
        xaxis={"title": None, "tickangle": -30},
        margin={"l": 70, "r": 30, "t": 70, "b": 110},
        showlegend=False,
    )
    fig.add_hline(y=100, line={"color": "#343a40", "width": 1.5, "dash": "dash"}, layer="below")
    late = [c.finalised_by == "finalize_layerwise_reload" for c in run.layers]
    fig.add_trace(
        go.Bar(
            x=[c.layer for c in run.layers],
            y=[100 * c.counted / c.total for c in run.layers],
            marker={
                "color": ["#d1495b" if x else "#4c9f70" for x in late],
                "pattern": {"shape": ["/" if x else "" for x in late]},
            },
            text=[f"{c.counted}/{c.total}" for c in run.layers],
            textposition="outside",
            customdata=[[c.finalised_by] for c in run.layers],
            hovertemplate="%{x}: %{text} elements<br>finalised by %{customdata[0]}<extra></extra>",
        )
    )
    return fig


def pad_figure(run: PaddedRun) -> Any:
    """Layer 0's ``w13_weight`` for expert 0: every row, the padding rows outlined."""
    import plotly.graph_objects as go

    from loadkit_notebooks.viz import base_figure

    rows = list(range(len(run.pad)))
    half = len(rows) // 2
    fig = base_figure(
        f"layers.0 w13_weight, expert 0: padding rows {_spans(run.pad_rows)} read "
        f"{_pad_words(run).split(' ')[0]} [{run.version}]",
        height=420,
        xaxis={"title": "hidden"},
        yaxis={
            "title": f"row (gate 0-{half - 1}, up {half}-{2 * half - 1})",
            "autorange": "reversed",
        },
    )
    fig.add_trace(
        go.Heatmap(
            z=run.pad,
            y=rows,
            zmin=-PAD_RANGE,
            zmax=PAD_RANGE,
            colorscale="RdBu",
            colorbar={"title": "value"},
            hovertemplate="row %{y}, column %{x}: %{z}<extra></extra>",
        )
    )
    for start, stop in _runs(run.pad_rows):
        fig.add_shape(
            type="rect",
            x0=-0.5,
            x1=len(run.pad[0]) - 0.5,
            y0=start - 0.5,
            y1=stop + 0.5,
            line={"color": "#212529", "width": 2, "dash": "dot"},
        )
    return fig


def _runs(rows: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive row numbers as (first, last) pairs."""
    out: list[tuple[int, int]] = []
    for r in rows:
        if out and out[-1][1] == r - 1:
            out[-1] = (out[-1][0], r)
        else:
            out.append((r, r))
    return out


def _spans(rows: Sequence[int]) -> str:
    return " and ".join(f"{a}-{b}" for a, b in _runs(rows))


def forward_figure(run: PaddedRun) -> Any:
    """Per prompt position, how many logits differ from a fresh load of the same checkpoint."""
    import plotly.graph_objects as go

    from loadkit_notebooks.viz import base_figure

    positions = list(range(len(run.differ_per_token)))
    vocab = run.logits_total // max(len(positions), 1)
    fig = base_figure(
        f"Logits unlike a fresh load's, per prompt position: {run.logits_differ}/"
        f"{run.logits_total} [{run.version}]",
        height=300,
        xaxis_title="prompt position",
        yaxis={"title": f"logits (of {vocab})", "range": [0, vocab * 1.05]},
    )
    fig.add_trace(
        go.Bar(
            x=positions,
            y=run.differ_per_token,
            marker_color=VERSION_COLOURS.get(run.version, "#8d99ae"),
        )
    )
    return fig


def _layout(ex: Explorer) -> tuple[Any, ...]:
    """Three outputs for one cell: the toggle with the counts, the padding, the logits."""
    from loadkit_notebooks.chart import Panel

    return Panel(ex.toggle, ex.counts, chart=ex.counts), ex.pad, ex.logits


def _describe(ex: Explorer) -> str:
    """Everything the widgets show, as text (what nbval compares)."""
    run = ex.reload(ex.toggle.value)
    experts = [c for c in run.layers if c.layer.endswith(".experts")]
    return "\n".join(
        [
            f"[vLLM {run.version}]",
            *(f"  {c.layer}: {c.counted}/{c.total}, by {c.finalised_by}" for c in experts),
            f"  padding reads {_pad_words(run)}; logits unlike a fresh load's: {_logits(run)}",
        ]
    )


def explorer(reload: Reload, versions: Sequence[str]) -> Explorer:
    """Build the toggle and charts over the notebook's ``reload(version)`` (called once per
    version, then remembered): each layer's count against its total (``counts``), one expert's
    ``w13_weight`` with its padding outlined (``pad``), the logits unlike a fresh load's
    (``logits``). They start on the first version."""
    import ipywidgets as widgets

    from loadkit_notebooks.chart import Chart

    reload = functools.cache(reload)
    first = reload(versions[0])
    counts, pad = Chart(count_figure(first)), Chart(pad_figure(first))
    logits = Chart(forward_figure(first))
    toggle = widgets.ToggleButtons(options=list(versions), value=versions[0], description="vLLM")

    def refresh(_: Any = None) -> None:
        run = reload(toggle.value)
        counts.draw(count_figure(run))
        pad.draw(pad_figure(run))
        logits.draw(forward_figure(run))

    toggle.observe(refresh, names="value")
    parts = {"reload": reload, "counts": counts, "pad": pad, "logits": logits}
    return Explorer({}, toggle, parts, layout=_layout, describe=_describe)


# --- the two modes side by side: an update that does not send D ---------------------------------


@dataclass
class ModeOutcome:
    """What one reload mode made of an update without some parameters."""

    mode: str
    values: dict[str, list[float]]  # the parameters the update left out, after the reload
    before: dict[str, list[float]]  # the same, before it
    warnings: list[str]


def mode_outcome(
    mode: str, model: Any, names: Sequence[str], before: Mapping[str, torch.Tensor], caught: list
) -> ModeOutcome:
    """Read a reload in ``mode`` of an update without ``names``: their values after and before,
    and the warning classes it raised."""

    def values(t: torch.Tensor) -> list[float]:
        return [float(v) for v in t.detach().flatten()]

    return ModeOutcome(
        mode,
        {n: values(model.get_parameter(n)) for n in names},
        {n: values(before[n]) for n in names},
        sorted({w.category.__name__ for w in caught}),
    )


def modes_text(outcomes: Sequence[ModeOutcome]) -> str:
    """One block per mode: what each left-out parameter reads, against its value before."""
    lines = []
    for o in outcomes:
        lines.append(f"[{o.mode}] warnings: {', '.join(o.warnings) or 'none'}")
        for name, now in o.values.items():
            kept = "kept its old value" if now == o.before[name] else "overwritten"
            shown = ", ".join(f"{v:g}" for v in now)
            lines.append(f"  {_short(name)} = [{shown}]  ({kept})")
    return "\n".join(lines)


def plan_text(plan: Any) -> str:
    """A load plan's summary: names per kind with their bytes, and each fallback's reason."""
    lines = [
        f"{kind}: {n} names, {nbytes} bytes" for kind, (n, nbytes) in plan.summary().items() if n
    ]
    for reason, names in plan.fallbacks().items():
        lines.append(f"fallback ({len(names)}): {reason}: e.g. {names[0]}")
    return "\n".join(lines)
