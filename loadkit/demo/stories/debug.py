"""What notebook 04 (debug your checkpoint) calls: choices, the treemap, tables, the panel.

Everything here renders an ``InspectReport`` (``loadkit.inspection.report``); the notebook
only wires a path box and a model picker to it. Paths are shown relative to the working
directory, so the notebook prints the same text in every checkout.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadkit.demo.stories import DATA_DIR
from loadkit.fmt import WIDTH, format_bytes, table, wrap
from loadkit.inspection.inspector import inspect_checkpoint
from loadkit.inspection.layout import treemap_columns
from loadkit.inspection.report import InspectReport
from loadkit.models.registry import BUILTIN, FROM_CONFIG

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


def inspect(path: str, model: str | None, mapper: str | None = None) -> InspectReport:
    """The report, with the picker's "(header only)" meaning no model; the pooling probe's
    verdicts always (the panel teaches them, whether or not the model is a pooling one)."""
    spec = None if model in (None, "", HEADER_ONLY) else model
    return inspect_checkpoint(path, model=spec, mapper=mapper or None, probe=True)


# --- the treemap ---------------------------------------------------------------------------------


def treemap_trace(report: InspectReport, *, folded: bool = True) -> Any:
    import plotly.graph_objects as go

    tree = report.folded_layout if folded else report.layout
    cols = treemap_columns(tree)
    return go.Treemap(
        ids=cols["ids"],
        labels=cols["labels"],
        parents=cols["parents"],
        values=cols["values"],
        branchvalues="total",
        customdata=[
            [format_bytes(v), n] for v, n in zip(cols["values"], cols["tensors"], strict=True)
        ],
        hovertemplate="%{id}<br>%{customdata[0]} in %{customdata[1]} tensors<extra></extra>",
        maxdepth=4,
    )


def treemap_figure(report: InspectReport) -> Any:
    """The key tree by bytes (numbered siblings folded)."""
    import plotly.graph_objects as go

    fig = go.Figure(data=[treemap_trace(report)])
    fig.update_layout(
        title={"text": _title(report), "x": 0.01, "xanchor": "left"},
        margin={"t": 50, "l": 0, "r": 0, "b": 0},
        height=420,
    )
    return fig


def _title(report: InspectReport) -> str:
    c = report.checkpoint
    return f"{shown_path(c.path)}: {len(c.tensors)} tensors, {format_bytes(c.total_bytes)}"


def treemap_data(fig: Any, top: int = 8) -> str:
    """The treemap as plain text: its title, and the largest boxes of the first level with more
    than one box (single-child chains such as ``model.language_model`` are followed down)."""
    (trace,) = fig.data
    children: dict[str, list[tuple[int, str, str]]] = {}
    for node_id, label, parent, v in zip(
        trace.ids, trace.labels, trace.parents, trace.values, strict=True
    ):
        children.setdefault(parent, []).append((v, label, node_id))
    node, path = trace.ids[0], []
    while len(children.get(node, [])) == 1:
        _, label, node = children[node][0]
        path.append(label)
    boxes = sorted(children.get(node, []), key=lambda b: (-b[0], b[1]))
    lines = [f"title: {fig.layout.title.text}", f"nodes: {len(trace.ids)}"]
    lines.append(f"largest boxes under {'.'.join(path) or 'the checkpoint'}:")
    lines += [f"  {label}: {format_bytes(v)}" for v, label, _ in boxes[:top]]
    return "\n".join(lines)


# --- tables --------------------------------------------------------------------------------------


def probe_table(report: InspectReport) -> str:
    """The pooling probe under old and new, side by side."""
    if report.probe is None:
        return "pooling probe: needs a model"
    rows = []
    for b, v in report.probe.items():
        share = v.cloned_bytes / v.forwarded_bytes if v.forwarded_bytes else 0.0
        rows.append(
            [
                b,
                repr(v.prefix) if v.hit else "no hit",
                f"#{v.hit_index} {v.hit_key}" if v.hit else "-",
                v.walked,
                format_bytes(v.cloned_bytes),
                f"{share:.0%}",
            ]
        )
    return table(
        rows, header=["probe", "prefix", "hit at", "clones", "cloned", "of ckpt"], rule=True
    )


def mismatch_tables(report: InspectReport, limit: int = 12) -> str:
    """Unexpected and missing names (with the nearest names), shape and dtype mismatches."""
    load = report.load
    if load is None:
        return "mismatches: needs a model"
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
        "model tensors never filled",
        ["model tensor", "shape", "nearest unused key"],
        [[m.name, list(m.shape), ", ".join(m.suggestions) or "-"] for m in load.missing],
    )
    add(
        "shape mismatches",
        ["checkpoint key", "parameter", "parameter shape", "checkpoint shape"],
        [
            [s.name, s.param, list(s.param_shape or ()), list(s.weight_shape)]
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
    verdict = "loads cleanly" if report.clean else "would NOT load: " + "; ".join(report.problems())
    if report.loaders and len(report.loaders) > 1:  # --model hf: each loader's own verdict
        from loadkit.inspection.loaders import headline

        verdict = headline([report.loaders[n] for n in report.selected_loaders])
    parts.append(wrap(f"verdict: {verdict} (exit {report.exit_status})"))
    return "\n".join(parts)


# --- a broken copy, to have something to debug -------------------------------------------------


def broken_copy(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    rename: dict[str, str] | None = None,
    drop: Sequence[str] = (),
    reshape: dict[str, Sequence[int]] | None = None,
) -> str:
    """Write ``src`` (a file or folder) to the file ``dst`` with keys renamed, dropped or given
    another shape (zeros): the kind of export mistake the inspector is for. Returns ``dst``."""
    import torch
    from safetensors.torch import save_file

    from loadkit.checkpoint.reader import open_checkpoint

    rename, reshape = rename or {}, reshape or {}
    out = {}
    for name, tensor in open_checkpoint(src).weights():
        if name in drop:
            continue
        if name in reshape:
            tensor = torch.zeros(tuple(reshape[name]), dtype=tensor.dtype)
        out[rename.get(name, name)] = tensor.clone()
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    save_file(out, str(dst))
    return shown_path(dst)


# --- the panel ---------------------------------------------------------------------------------


class DebugPanel:
    """A path box, a model picker and a mapper box driving one treemap and the tables."""

    def __init__(self, path: str, model: str = HEADER_ONLY) -> None:
        import ipywidgets as widgets

        from loadkit.demo.chart import Chart, Panel

        self.path = widgets.Text(
            value=path, description="checkpoint", continuous_update=False, layout={"width": "70%"}
        )
        # Free text with suggestions: any --model spec works, not only the ones listed.
        self.model = widgets.Combobox(
            value=model,
            options=model_choices(),
            ensure_option=False,
            description="model",
            placeholder="hf, a built-in, package.module:callable, or (header only)",
            continuous_update=False,
            layout={"width": "70%"},
        )
        self.mapper = widgets.Text(
            value="",
            description="mapper",
            placeholder='optional JSON rules, e.g. {"orig_to_new_prefix": {"model.": ""}}',
            continuous_update=False,
            layout={"width": "70%"},
        )
        # An HTML <pre>, not an Output widget: nbconvert cannot execute Output widgets without
        # storing widget state, and notebooks here are committed without it.
        self.output = widgets.HTML()
        self.error: str | None = None
        self.report = self._inspect()
        self.chart = Chart(treemap_figure(self.report))
        for w in (self.path, self.model, self.mapper):
            w.observe(self._refresh, names="value")
        self._print()
        self.widget = Panel(
            self.path, self.model, self.mapper, self.chart, self.output, chart=self.chart
        )

    @property
    def figure(self) -> Any:
        """The treemap the panel shows now."""
        return self.chart.fig

    def _inspect(self) -> InspectReport:
        return inspect(self.path.value, self.model.value, self.mapper.value)

    def _refresh(self, change: dict[str, Any] | None = None) -> None:
        from loadkit.errors import LoadkitError

        try:
            self.report = self._inspect()
            self.error = None
            self.chart.draw(treemap_figure(self.report))
        except LoadkitError as exc:  # bad input: say so, keep the last good chart
            self.error = str(exc)
        self._print()

    def _print(self) -> None:
        self.output.value = f"<pre>{html.escape(self.summary())}</pre>"

    def summary(self) -> str:
        """What the panel shows below the treemap, as text."""
        if self.error:
            return f"error: {self.error}"
        return "\n\n".join([probe_table(self.report), mismatch_tables(self.report)])


# --- a Hugging Face checkpoint -------------------------------------------------------------------

# Tiny configs of two architectures transformers knows (four layers' worth of names, a few KB).
TINY_HF = {
    "llama": (
        "LlamaForCausalLM",
        "LlamaConfig",
        {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
         "num_attention_heads": 2, "vocab_size": 64},
    ),
    "gpt2": (
        "GPT2LMHeadModel",
        "GPT2Config",
        {"n_embd": 16, "n_layer": 2, "n_head": 2, "vocab_size": 64, "n_positions": 32,
         "bos_token_id": 0, "eos_token_id": 0},
    ),
}  # fmt: skip


def tiny_hf_checkpoint(folder: str | os.PathLike[str], arch: str = "llama", seed: int = 0) -> str:
    """A tiny ``arch`` model written by transformers' own ``save_pretrained`` (config.json and
    safetensors) into ``folder``; its values are seeded eighths. Returns the folder, relative."""
    import torch
    import transformers

    cls_name, config_name, kwargs = TINY_HF[arch]
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model = getattr(transformers, cls_name)(getattr(transformers, config_name)(**kwargs))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randint(-8, 8, p.shape, generator=g).to(p.dtype) / 8)
    model.save_pretrained(folder)
    return shown_path(folder)


def report_sections(
    report: InspectReport, *names: str, limit: int = 20, verdict: bool = True, width: int = WIDTH
) -> str:
    """The named sections of the report's text (``"model"``, ``"mapper"``, ``"load"``...) in
    the order named, and its verdict; lines longer than ``width`` folded (``fmt.wrap``)."""
    blocks = {b.split(maxsplit=1)[0]: b for b in report.render(limit=limit).split("\n\n") if b}
    keep = [blocks[n] for n in names if n in blocks]
    if verdict:
        keep.append(blocks["verdict:"])
    return wrap("\n\n".join(keep), width)
