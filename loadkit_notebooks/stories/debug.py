"""Notebook 04's pictures of an inspect report: keys coloured by their fate, the fix, the tables.

The notebook inspects in a function of its own (``inspect(checkpoint, model, mapper)``, which
calls ``inspect_checkpoint``); ``DebugPanel`` takes that function and calls it again whenever a
box changes, and everything else here draws the ``InspectReport`` it returns. Paths are shown
relative to the working directory, so the notebook prints the same text in every checkout.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadkit.fmt import WIDTH, format_bytes, table, wrap
from loadkit_inspect import InspectReport
from loadkit_inspect.loaders import LoaderVerdict
from loadkit_inspect.models import BUILTIN, FROM_CONFIG
from loadkit_notebooks.fates import (
    BRANCH,
    FATE_COLOURS,
    FATE_WORDS,
    INDEX_OUTLINE,
    LEFT_OUT,
    MISSING,
    NOT_CHECKED,
    is_problem,
    tint,
    worst,
)
from loadkit_notebooks.show import pre
from loadkit_notebooks.stories import DATA_DIR

DATA = DATA_DIR
HEADER_ONLY = "(header only)"
# Preferred first: the pooling-probe checkpoint shows the old/new verdicts side by side.
PREFERRED = ("gemma4_like", "plamo2/untied.safetensors", "nemotron_h")
# Which built-in model reads which data/ folder.
MODEL_FOR_FOLDER = {
    "gemma4_like": "gemma4-like",
    "plamo2": "plamo2",
    "nemotron_h": "nemotron-h",
    "llama_like": "llama-like",
}
# The notebook's function: (checkpoint, model picked, mapper JSON) -> the report.
Inspect = Callable[[str, str, str], InspectReport]


def shown_path(path: str | os.PathLike[str]) -> str:
    """``path`` relative to the working directory (the notebook's), for stable output."""
    return os.path.relpath(path)


def data_checkpoints() -> list[str]:
    """Every checkpoint under data/ (files, and folders of shards), relative, sorted.

    data/big/ (benchmark checkpoints, not committed) is left out.
    """
    found: set[Path] = set()
    for f in DATA.rglob("*.safetensors"):
        if "big" in f.relative_to(DATA).parts:
            continue
        index = f.parent / "model.safetensors.index.json"
        found.add(f.parent if index.exists() else f)
    return sorted(shown_path(p) for p in found)


def start(checkpoint: str | None, model: str | None) -> tuple[str, str]:
    """The notebook's parameters, defaults filled in: ``checkpoint`` None is the first of the
    kit's own checkpoints; ``model`` None is the model that reads it (``model_for``)."""
    if checkpoint is None:
        path, default = default_checkpoint()
        return path, default if model is None else model
    return str(checkpoint), model_for(str(checkpoint)) if model is None else model


def default_checkpoint() -> tuple[str, str]:
    """``(checkpoint, model)``: the first present of ``PREFERRED`` with its built-in model."""
    paths = data_checkpoints()
    for want in PREFERRED:
        for p in paths:
            rel = Path(p).resolve().relative_to(DATA).as_posix()
            if rel == want or rel.startswith(want + "/"):
                return p, model_for(p)
    if not paths:
        raise FileNotFoundError(f"no checkpoints under {DATA}: run python data/generate.py")
    return paths[0], model_for(paths[0])


def model_for(path: str) -> str:
    """The model that reads a checkpoint: ``hf`` when a ``config.json`` lies beside it (a
    Hugging Face checkpoint), the built-in one for data/'s checkpoints, else header only."""
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    if (folder / "config.json").is_file():
        return "hf"
    try:
        top = p.resolve().relative_to(DATA).parts[0]
    except ValueError:
        return HEADER_ONLY
    return MODEL_FOR_FOLDER.get(top, HEADER_ONLY)


def model_choices() -> list[str]:
    """Suggestions for the model field (it takes any spec: ``package.module:callable``,
    ``hf:PATH``...)."""
    return [HEADER_ONLY, *FROM_CONFIG, *BUILTIN]


# --- the fates of the keys -----------------------------------------------------------------------


SET_ASIDE = ("skipped", "ignored", "dropped by mapper")  # fates a rule gives on purpose


def key_fates(report: InspectReport) -> dict[str, str]:
    """Checkpoint key -> its fate in the simulated load (a ``Status`` word), in checkpoint
    order; every key is ``header only`` when the report has no model. A key set aside on
    purpose whose own tensor is then missing is ``LEFT_OUT``: the cause, in a warning colour."""
    fates = {k.name: str(k.status) for k in report.load.keys} if report.load else {}
    missing = {_tail(m.name) for m in report.load.missing} if report.load else set()
    out = {t.name: fates.get(t.name, NOT_CHECKED) for t in report.checkpoint.tensors}
    for name, fate in out.items():
        if fate in SET_ASIDE and _tail(name) in missing:
            out[name] = LEFT_OUT
    return out


def _tail(name: str) -> str:
    """A name without its first component: a key and the model tensor it would fill differ
    there when a prefix rule renames it (``transformer.h.0...`` and ``model.h.0...``).

    >>> _tail("transformer.h.0.attn.c_attn.bias"), _tail("lm_head")
    ('h.0.attn.c_attn.bias', 'lm_head')
    """
    return name.split(".", 1)[-1]


def fate_counts(report: InspectReport) -> dict[str, int]:
    """How many keys met each fate, and how many model tensors no key filled (``missing``)."""
    counts: dict[str, int] = {}
    for fate in key_fates(report).values():
        counts[fate] = counts.get(fate, 0) + 1
    if report.load is not None and report.load.missing:
        counts[MISSING] = len(report.load.missing)
    return {f: counts[f] for f in FATE_COLOURS if f in counts}


WEIGHT = 4  # the area of a box that matters, in ordinary keys' boxes
LINE = 18  # characters: a longer dotted label is broken after its dots
PATHBAR = 24  # pixels: the zoomed path's bar, drawn above the boxes (not over the legend)


def _breakable(label: str, width: int = LINE) -> str:
    """A long dotted label on several lines, broken only after a dot (never inside a word).

    >>> _breakable("model.layers.layers.1.mlp.down_proj.weight")
    'model.layers.<br>layers.1.mlp.<br>down_proj.weight'
    """
    lines, line = [], ""
    for part in label.split("."):
        piece = part if not line else "." + part
        if line and len(line) + len(piece) > width:
            lines.append(line + ".")
            line = part
        else:
            line += piece
    return "<br>".join([*lines, line])


@dataclass
class _Node:
    children: dict[str, _Node] = field(default_factory=dict)
    leaf: tuple[str, str, str, str] | None = None  # (full name, fate, hover, index problem)


@dataclass
class _Columns:
    ids: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)
    values: list[int] = field(default_factory=list)
    colours: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    customdata: list[list[str]] = field(default_factory=list)  # [hover, fate, full name]
    outline: list[str] = field(default_factory=list)  # a key an index problem names: dark


def _grow(items: list[tuple[str, str, str, str]]) -> _Node:
    root = _Node()
    for item in items:
        node = root
        for part in item[0].split("."):
            node = node.children.setdefault(part, _Node())
        if node.children:  # a name that is also a prefix of others: a box of its own
            node = node.children.setdefault("(itself)", _Node())
        node.leaf = item
    return root


def _emit(
    node: _Node, label: str, path: str, parent: str, cols: _Columns, *, merge: bool = True
) -> dict[str, int]:
    """Add ``node`` as a box under ``parent`` (with ``merge``, a chain of single children is
    one box: ``model.language_model``) and every box below it; returns the fates below it,
    counted. Ids are dotted paths under the root's label, so none collides."""
    while merge and node.leaf is None and len(node.children) == 1:
        (part, node), *_ = node.children.items()
        label, path = f"{label}.{part}", f"{path}.{part}"
    node_id = f"{parent}/{label}" if parent else label
    row = len(cols.ids)
    cols.ids.append(node_id)
    cols.labels.append(label)
    cols.parents.append(parent)
    if node.leaf is not None and not node.children:
        name, fate, detail, index = node.leaf
        # One box per key (a 64-byte norm shows as well as an embedding); a box that matters
        # (a problem, a key an index problem names) larger, so its label stays readable.
        cols.values.append(WEIGHT if is_problem(fate) or index else 1)
        cols.labels[-1] = _breakable(label)
        cols.colours.append(FATE_COLOURS[fate])
        said = [fate] if is_problem(fate) else []
        cols.text.append("<br>".join(said + ([f"index: {index}"] if index else [])))
        cols.customdata.append([f"{name}<br>{fate}: {detail}", fate, name])
        cols.outline.append(INDEX_OUTLINE if index else "white")
        return {fate: 1}
    cols.values.append(0)
    cols.outline.append("white")
    cols.colours.append(BRANCH)
    cols.text.append("")
    cols.customdata.append(["", "", ""])
    below: dict[str, int] = {}
    for part, child in node.children.items():
        at = len(cols.ids)
        deeper = f"{path}.{part}" if path else part
        # A branch of the picture's own ("(missing: ...)") keeps its label: never merged.
        fates = _emit(child, part, deeper, node_id, cols, merge=not part.startswith("("))
        for fate, n in fates.items():
            below[fate] = below.get(fate, 0) + n
        cols.values[row] += cols.values[at]
    bad = worst(list(below))
    cols.colours[row] = tint(FATE_COLOURS[bad]) if bad and parent else BRANCH
    cols.text[row] = ", ".join(
        f"{below[f]} {f}" for f in FATE_COLOURS if f in below and is_problem(f)
    )
    counted = ", ".join(f"{n} {f}" for f, n in below.items())
    cols.customdata[row] = [f"{path or label}<br>{counted}", "", ""]
    return below


def _detail(report: InspectReport) -> dict[str, str]:
    """Checkpoint key -> what the hover says of its fate (the rule, the parameter, the shapes)."""
    out: dict[str, str] = {}
    if report.load is None:
        return out
    for k in report.load.keys:
        out[k.name] = k.rule or (f"-> {k.target}" if k.target else "") or (k.message or "")
    for u in report.load.unexpected:
        out[u.name] = "nearest model name " + (u.suggestions[0] if u.suggestions else "-")
    for s in report.load.shape_mismatches:
        out[s.name] = f"checkpoint {list(s.weight_shape)}, model {list(s.param_shape or ())}"
    return out


def fate_columns(report: InspectReport) -> _Columns:
    """The treemap's columns: the key tree, one box per key coloured by its fate, and the
    model tensors no key filled in a branch of their own."""
    fates, detail = key_fates(report), _detail(report)
    index = {p.key: p.kind for p in report.checkpoint.problems if p.key is not None}
    keys = [
        (t.name, fates[t.name], f"{detail.get(t.name, '')}<br>{t.dtype} {list(t.shape)}, "
         f"{format_bytes(t.nbytes)}", index.get(t.name, ""))
        for t in report.checkpoint.tensors
    ]  # fmt: skip
    missing = report.load.missing if report.load is not None else []
    tree = _grow(keys)
    if missing:
        never = [(m.name, MISSING, f"{m.dtype} {list(m.shape)}", "") for m in missing]
        tree.children["(missing: model tensors no key filled)"] = _grow(never)
    top = "(checkpoint and missing tensors)" if missing else "(checkpoint)"
    cols = _Columns()
    _emit(tree, top, "", "", cols, merge=False)
    return cols


def _legend(report: InspectReport) -> str:
    """A line (or two) saying what each colour in the picture means, with counts."""
    counts = fate_counts(report)
    entries = [
        f'<span style="color:{FATE_COLOURS[f]}">\u25a0</span> {n} {FATE_WORDS[f]}'
        for f, n in counts.items()
    ]
    lines = ["   ".join(entries[i : i + 3]) for i in range(0, len(entries), 3)]
    lines.insert(0, f"<b>{_verdict(report)}</b>")
    notes = []
    if any(is_problem(f) for f in counts):
        notes.append("a paler box holds a problem somewhere inside (click it to zoom in)")
    named = {p.key for p in report.checkpoint.problems if p.key is not None}
    if named:
        notes.append(f"outlined: {len(named)} keys an index problem names (listed below)")
    if notes:
        lines.append("; ".join(notes))
    return "<br>".join(lines)


def _title(report: InspectReport) -> str:
    c = report.checkpoint
    return f"{shown_path(c.path)}: {len(c.tensors)} tensors, {format_bytes(c.total_bytes)}"


def _verdict(report: InspectReport) -> str:
    if report.clean is None or report.model is None:
        return "header only (no model)"
    if report.loaders and len(report.loaders) > 1:  # --model hf: each loader's own verdict
        each = ", ".join(f"{v.label}: {_said(v)}" for v in report.loaders.values())
        if report.load is None:  # vLLM's class is not modelled: no load to colour
            return f"{each} (colours: no vLLM load simulated)"
        return f"{report.model.cls}, {each} (colours: the load into {report.model.cls})"
    said = "loads cleanly" if report.clean else "would NOT load"
    return f"{_label(report)}{said} into {report.model.cls}"


def _said(verdict: LoaderVerdict) -> str:
    """A loader's verdict in a few words (``LoaderVerdict.phrase`` without its reasons)."""
    if not verdict.checked:
        return "not checked"
    if verdict.clean:
        return "loads cleanly"
    if verdict.quiet:  # vLLM's most dangerous outcome: no error, tensors left unfilled
        return "loads WITHOUT AN ERROR, tensors left unfilled"
    # transformers' own outcomes: it returns the model with warnings, or raises
    words = {"warns": "loads with warnings", "raises": "raises", "unknown": "not judged"}
    return words.get(verdict.outcome, "would NOT load")


def _label(report: InspectReport) -> str:
    """The one selected loader and the version it answers for: ``vllm 0.34.0: ``."""
    if report.loaders and len(report.selected_loaders) == 1:
        return f"{report.loaders[report.selected_loaders[0]].label}: "
    return ""


def treemap_figure(report: InspectReport) -> Any:
    """The key tree, one box per key coloured by its fate (problems in warning colours), the
    missing model tensors in a branch of their own, a legend above; bytes in the hover."""
    import plotly.graph_objects as go

    cols = fate_columns(report)
    legend = _legend(report)
    fig = go.Figure(
        go.Treemap(
            ids=cols.ids,
            labels=cols.labels,
            parents=cols.parents,
            values=cols.values,
            branchvalues="total",
            marker={
                "colors": cols.colours,
                # One width for every box: a width per box draws NaN paths when a box is zoomed
                # (plotly), so an outline stands out by its colour alone.
                "line": {"color": cols.outline, "width": 2.5},
            },
            text=cols.text,
            texttemplate="%{label}<br><b>%{text}</b>",
            customdata=cols.customdata,
            hovertemplate="%{customdata[0]}<extra></extra>",
            maxdepth=-1,
            sort=True,  # largest first: a lone key beside a big branch is a box, not a sliver
        )
    )
    rows = legend.count("<br>") + 1
    fig.update_layout(
        title={
            "text": _title(report),
            "x": 0.01,
            "xanchor": "left",
            "y": 1,
            "yref": "container",
            "yanchor": "top",
            "pad": {"t": 12},
            "font": {"size": 15},
        },
        annotations=[
            {
                "text": legend,
                "x": 0,
                "y": 1,
                "xref": "paper",
                "yref": "paper",
                "xanchor": "left",
                "yanchor": "bottom",
                "yshift": PATHBAR,  # above the zoomed path's bar
                "align": "left",
                "showarrow": False,
                "font": {"size": 13},
            }
        ],
        # PATHBAR: room above the boxes for the path plotly shows once a box is zoomed into
        margin={"t": 40 + 19 * rows + PATHBAR, "l": 0, "r": 0, "b": 0},
        height=440 + 19 * rows + PATHBAR,
    )
    return fig


def error_figure() -> Any:
    """What the chart shows when the inspector stopped: no keys at all (the previous
    checkpoint's picture would be a wrong answer), and a title that points at the error, which
    the panel prints once, below the picture."""
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.update_layout(
        title={
            "text": "no picture: the inspector stopped (its error is below)",
            "x": 0.01,
            "xanchor": "left",
        },
        xaxis={"visible": False},
        yaxis={"visible": False},
        template="plotly_white",
        margin={"t": 50, "l": 10, "r": 10, "b": 10},
        height=80,
    )
    return fig


def treemap_data(fig: Any, top: int = 12) -> str:
    """The picture as plain text: its title, the legend, and the boxes in a problem colour."""
    import re

    lines = [f"title: {fig.layout.title.text}"]
    for note in fig.layout.annotations:
        text = re.sub(r"<[^>]+>", "", note.text.replace("<br>", "\n")).replace("\u25a0 ", "")
        lines += [f"  {line}" for line in html.unescape(text).split("\n")]
    if not fig.data:
        return wrap("\n".join(lines))
    (trace,) = fig.data
    bad = [(c[2], c[1]) for c in trace.customdata if c[1] and is_problem(c[1])]
    lines.append(f"boxes: {len(trace.ids)}; keys and tensors in a problem colour: {len(bad)}")
    lines += [f"  {fate}: {name}" for name, fate in bad[:top]]
    if len(bad) > top:
        lines.append(f"  ... {len(bad) - top} more")
    return wrap("\n".join(lines))


# --- tables --------------------------------------------------------------------------------------


def probe_table(report: InspectReport) -> str:
    """The pooling probe under old and new, side by side."""
    if report.probe is None and report.model is not None and report.load is None:
        return "pooling probe: not run (the vllm column is not checked)"
    if report.probe is None:
        return "pooling probe: needs a model"
    rows = []
    for b, v in report.probe.items():
        share = v.walked_bytes / v.forwarded_bytes if v.forwarded_bytes else 0.0
        rows.append(
            [
                b,
                repr(v.prefix) if v.hit else "no hit",
                f"#{v.hit_index} {v.hit_key}" if v.hit else "-",
                v.walked,
                format_bytes(v.walked_bytes) + (" (clones)" if v.cloned else ""),
                f"{share:.0%}",
            ]
        )
    return table(
        rows, header=["probe", "prefix", "hit at", "held", "bytes held", "of ckpt"], rule=True
    )


def mismatch_tables(report: InspectReport, limit: int = 12) -> str:
    """Unexpected and missing names (with the nearest names), shape and dtype mismatches."""
    load = report.load
    if load is None and report.model is None:
        return "mismatches: needs a model"
    if load is None:  # vLLM's class is not modelled: the verdicts say why
        return _verdict_line(report)
    parts = []

    def add(title: str, header: list[str], rows: list[list[Any]]) -> None:
        parts.append(f"{title} ({len(rows)})")
        if rows:
            parts.append(table(rows[:limit], header=header, rule=True))
            if len(rows) > limit:
                parts.append(f"... {len(rows) - limit} more")

    add(
        "unexpected checkpoint names",
        ["checkpoint key", "nearest model name"],  # one: the report lists the others
        [[u.name, u.suggestions[0] if u.suggestions else "-"] for u in load.unexpected],
    )
    add(
        "missing: model tensors never filled",
        ["model tensor", "shape", "nearest unused key"],
        [[m.name, list(m.shape), ", ".join(m.suggestions) or "-"] for m in load.missing],
    )
    add(
        "shape mismatches",
        ["checkpoint key", "model tensor", "checkpoint shape", "model shape"],
        [
            [s.name, s.param, list(s.weight_shape), list(s.param_shape or ())]
            for s in load.shape_mismatches
        ],
    )
    add(
        "dtype casts, by (from, to)",
        ["from", "to", "tensors", "incompatible", "e.g."],
        [
            [g.from_dtype, g.to_dtype, len(g.keys), g.incompatible, g.keys[0]]
            for g in load.cast_groups()
        ],
    )
    parts.append(_verdict_line(report))
    return "\n".join(parts)


def _verdict_line(report: InspectReport) -> str:
    """The verdict, as the command's last line says it (``--model hf``: each loader's, the one
    not checked included)."""
    said = "loads cleanly" if report.clean else "would NOT load: " + "; ".join(report.problems())
    verdict = _label(report) + said
    if report.loaders and len(report.loaders) > 1:  # --model hf: each loader's own verdict
        from loadkit_inspect.loaders import headline

        verdict = headline(report.stated_verdicts)
    return wrap(f"verdict: {verdict} (exit {report.exit_status})")


def _blocks(report: InspectReport, limit: int = 20) -> dict[str, str]:
    """The report's text (``report.render``) by section, keyed by its first word."""
    return {b.split(maxsplit=1)[0]: b for b in report.render(limit=limit).split("\n\n") if b}


def fix_text(report: InspectReport, width: int = WIDTH) -> str:
    """The suggested fix in the report's own words (the ``--mapper`` flag to paste on the
    command line), and the JSON to paste into the panel's mapper box; empty without one."""
    if report.fix is None:
        return ""
    block = _blocks(report)["suggested"]
    if not report.fix.suggestions:  # said in words only: nothing to paste
        return wrap(block, width)
    paste = json.dumps(report.fix.mapper)
    return wrap(f"{block}\n  mapper box (notebook): {paste}", width)


def index_text(report: InspectReport, width: int = WIDTH) -> str:
    """The index problems in the report's own words; empty when the index has none."""
    if not report.checkpoint.problems:
        return ""
    lines = _blocks(report)["checkpoint"].split("\n")
    first = next(i for i, line in enumerate(lines) if line.startswith("  index problems"))
    return wrap("\n".join(line[2:] for line in lines[first:]), width)


def report_sections(
    report: InspectReport, *names: str, limit: int = 20, verdict: bool = True, width: int = WIDTH
) -> str:
    """The named sections of the report's text (``"model"``, ``"mapper"``, ``"load"``...) in
    the order named, and its verdict; lines longer than ``width`` folded (``fmt.wrap``)."""
    blocks = _blocks(report, limit)
    keep = [blocks[n] for n in names if n in blocks]
    if verdict:
        keep.append(blocks["verdict:"])
    return wrap("\n\n".join(keep), width)


# --- the panel ---------------------------------------------------------------------------------


class DebugPanel:
    """A path box, a model picker and a mapper box; each change calls the notebook's
    ``inspect(checkpoint, model, mapper)`` again and redraws the picture and the text. A button
    pastes the suggested fix into the mapper box (so the fix is tried as a user would)."""

    def __init__(self, inspect: Inspect, path: str, model: str = HEADER_ONLY) -> None:
        import ipywidgets as widgets

        from loadkit_notebooks.chart import Chart, Panel

        self.inspect = inspect
        wide = {"width": "70%"}
        self.path = widgets.Text(
            value=path, description="checkpoint", continuous_update=False, layout=wide
        )
        # Free text with suggestions: any --model spec works, not only the ones listed.
        self.model = widgets.Combobox(
            value=model,
            options=model_choices(),
            ensure_option=False,
            description="model",
            placeholder="hf, a built-in, package.module:callable, or (header only)",
            continuous_update=False,
            layout=wide,
        )
        self.mapper = widgets.Text(
            value="",
            description="mapper",
            placeholder='optional JSON rules, e.g. {"orig_to_new_prefix": {"model.": ""}}',
            continuous_update=False,
            layout=wide,
        )
        self.paste_fix = widgets.Button(
            description="paste the suggested fix into the mapper box",
            layout={"width": "auto", "align_self": "flex-start", "margin": "2px 0 2px 90px"},
        )
        self.paste_fix.on_click(self._paste_fix)
        # An HTML <pre>, not an Output widget: nbconvert cannot execute Output widgets without
        # storing widget state, and notebooks here are committed without it.
        self.output = widgets.HTML()
        self.error: str | None = None
        self.report: InspectReport | None = None
        self.chart = Chart(error_figure())
        for w in (self.path, self.model, self.mapper):
            w.observe(self._refresh, names="value")
        self._refresh()
        self.widget = Panel(
            self.path,
            self.model,
            self.mapper,
            self.paste_fix,
            self.chart,
            self.output,
            chart=self.chart,
        )

    @property
    def figure(self) -> Any:
        """The picture the panel shows now."""
        return self.chart.fig

    def _refresh(self, change: dict[str, Any] | None = None) -> None:
        from loadkit.errors import LoadkitError

        try:
            self.report = self.inspect(self.path.value, self.model.value, self.mapper.value)
            self.error = None
            self.chart.draw(treemap_figure(self.report))
        except LoadkitError as exc:  # bad input: say so, and show no stale picture
            self.report, self.error = None, str(exc)
            self.chart.draw(error_figure())
        fix = self.report.fix if self.report is not None else None
        self.paste_fix.disabled = fix is None or not fix.suggestions
        self.output.value = pre(self.summary())

    def _paste_fix(self, button: Any = None) -> None:
        if self.report is not None and self.report.fix is not None:
            self.mapper.value = json.dumps(self.report.fix.mapper)

    def summary(self) -> str:
        """What the panel shows below the picture, as text: the suggested fix and the index
        problems first (when there are any), then the probe, the mismatches, the verdict."""
        if self.report is None:
            return f"error: {self.error}"
        parts = [fix_text(self.report), index_text(self.report)]
        parts += [probe_table(self.report), mismatch_tables(self.report)]
        return "\n\n".join(p for p in parts if p)
