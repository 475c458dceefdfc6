"""Notebook 00's (the tour's) pictures: names side by side, traces, the walk, the ledger's flows.

The tour defines its model (``TinyHybrid``), writes its checkpoint and loads it in its own cells;
the functions here draw what those leave: a checkpoint's names against a model's, each name
through a mapper, the tree ``AutoWeightsLoader`` walks, which loader each parameter asks for, one
name's journey, and where every name went (a Sankey, coloured by fate as notebook 04 colours keys).
"""

from __future__ import annotations

import itertools
from collections.abc import Collection
from typing import Any, cast

from torch import nn

from loadkit.checkpoint import Checkpoint
from loadkit.fmt import WIDTH, table, wrap
from loadkit.loading import LoadLedger, loader_of
from loadkit.mapper import WeightsMapper
from loadkit.terms import Status
from loadkit_inspect.report import LayoutNode, build_layout
from loadkit_notebooks.fates import FATE_COLOURS


def side_by_side(ck: Checkpoint, model: nn.Module) -> str:
    """Checkpoint names and model names in two columns: how little they have in common."""
    left = list(ck.tensors)
    right = [n for n, _ in model.named_parameters()]
    pairs = itertools.zip_longest(left, right, fillvalue="")
    common = sorted(set(left) & set(right))
    text = table(list(pairs), header=("checkpoint", "model"), rule=True)
    return f"{text}\n\nnames in common: {common or 'none'}"


def trace_table(mapper: WeightsMapper, names: list[str]) -> str:
    """Each name through the mapper: the rules that fired, in order, and the result."""
    rows = []
    width = max(len(n) for n in names)
    for name in names:
        t = mapper.trace(name)
        rules = " then ".join(f"{s.stage} {s.rule!r}" for s in t.steps) or "(no rule)"
        result = "DROPPED" if t.result is None else t.result
        shard = f"  [shard {t.shard_id!r}]" if t.shard_id is not None else ""
        rows.append(f"{name.ljust(width)}  {rules}\n{' ' * width}  -> {result}{shard}")
    return "\n".join(rows)


def walk_picture(mapper: WeightsMapper, names: list[str], skipped: Collection[str] = ()) -> str:
    """The tree ``AutoWeightsLoader`` walks: the mapped names, split at their dots, with how
    many names go down each branch. A name the mapper drops, or one of ``skipped`` (the
    loader's ``aliased_params``: names of a tied word embedding after its first), never enters
    the walk (the loader sets it aside first): those are said after the tree."""
    mapped = mapper.apply_list(names)
    walked = [m for m in mapped if m not in skipped]
    root = build_layout((m, 0, "") for m in walked)
    lines: list[str] = []

    def visit(node: LayoutNode, depth: int) -> None:
        for child in node.children.values():
            count = f"  ({child.tensors} names)" if child.tensors > 1 else ""
            lines.append("  " * depth + child.name + count)
            visit(child, depth + 1)

    visit(root, 0)
    aside = [m for m in mapped if m not in walked]
    if aside:
        lines.append(f"(skipped before the walk, tied-embedding aliases: {', '.join(aside)})")
    return "\n".join(lines)


def loader_table(model: nn.Module) -> str:
    """Which loader each parameter asks for."""
    rows = []
    for name, p in model.named_parameters():
        fn = loader_of(p)
        rows.append((name, getattr(fn, "__qualname__", fn)))
    return table(rows)


def journey(
    name: str, ck: Checkpoint, model: nn.Module, ledger: LoadLedger, width: int = WIDTH
) -> str:
    """One checkpoint name from the header to the parameter it ends in, through ``model``'s
    ``hf_to_vllm_mapper`` (lines longer than ``width`` folded, ``fmt.wrap``)."""
    info = ck.tensors[name]
    mapper = cast(WeightsMapper, model.hf_to_vllm_mapper)
    t = mapper.trace(name)
    lines = [f"checkpoint  {name}: {info.dtype} {list(info.shape)}, {info.nbytes} bytes"]
    for s in t.steps:
        lines.append(f"mapper      {s.stage} {s.rule!r}: {s.before} -> {s.after}")
    if not t.steps:
        lines.append("mapper      no rule fires: the name stays")
    if t.shard_id is not None:
        lines.append(f"            shard id {t.shard_id!r} travels with the tensor")
    entry = next(e for e in ledger.entries if e.name == name)
    if entry.status == Status.SKIPPED:  # set aside by a skip rule before the walk reaches it
        lines.append(f"walk        none: {entry.mapped} is skipped before the walk")
    elif entry.mapped is not None:
        lines.append("walk        " + " -> ".join(entry.mapped.split(".")))
    if entry.target is not None:
        param = model.get_parameter(entry.target)
        fn = loader_of(param)
        lines.append(f"loader      {getattr(fn, '__qualname__', fn)}(param, loaded_weight)")
    lines.append(f"ledger      {entry.status} {entry.detail}".rstrip())
    return wrap("\n".join(lines), width)


def sankey_columns(ledger: LoadLedger) -> dict[str, list[Any]]:
    """Checkpoint prefix -> fate -> model module, counted in names: a Sankey's columns."""
    flows: dict[tuple[str, str], int] = {}
    for e in ledger.entries:
        source = "ckpt: " + e.name.split(".")[0]
        fate = e.status
        flows[(source, fate)] = flows.get((source, fate), 0) + 1
        if e.target:
            into = "model: " + ".".join(e.target.split(".")[:2])
            flows[(fate, into)] = flows.get((fate, into), 0) + 1
    labels = list(dict.fromkeys(x for pair in flows for x in pair))
    index = {label: i for i, label in enumerate(labels)}
    return {
        "labels": labels,
        "source": [index[a] for a, _ in flows],
        "target": [index[b] for _, b in flows],
        "value": list(flows.values()),
    }


SOURCE, TARGET = "#8a9bb0", "#5c6b7a"  # checkpoint prefixes and model modules: no fate


def _node_colour(label: str) -> str:
    if label.startswith("ckpt: "):
        return SOURCE
    if label.startswith("model: "):
        return TARGET
    return FATE_COLOURS[label]


def _column(label: str) -> float:
    return 0.001 if label.startswith("ckpt: ") else 0.999 if label.startswith("model: ") else 0.5


def _rows(cols: dict[str, list[Any]]) -> list[float]:
    """Each node's centre in its column (0 top, 1 bottom): the nodes stacked in the order they
    come, each as tall as the names through it, a gap between them."""
    labels = cols["labels"]
    through = [0] * len(labels)
    for side in ("source", "target"):
        for i, v in zip(cols[side], cols["value"], strict=True):
            through[i] = max(through[i], v)
    out = [0.0] * len(labels)
    for column in {_column(x) for x in labels}:
        mates = [i for i, x in enumerate(labels) if _column(x) == column]
        total = sum(through[i] for i in mates)
        gap = 0.12 * total
        span = total + gap * (len(mates) - 1)
        top = 0.0
        for i in mates:
            out[i] = (top + through[i] / 2) / span
            top += through[i] + gap
    return out


def _link_colour(colour: str) -> str:
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r}, {g}, {b}, 0.35)"


def sankey_figure(ledger: LoadLedger) -> Any:
    """Checkpoint prefix -> fate -> model module. The fates have notebook 04's colours (only a
    fate that stops a load is a warning colour); each flow takes its fate's colour."""
    import plotly.graph_objects as go

    cols = sankey_columns(ledger)
    labels = cols["labels"]
    fate_of_link = [
        labels[t] if not labels[t].startswith("model: ") else labels[s]
        for s, t in zip(cols["source"], cols["target"], strict=True)
    ]
    fig = go.Figure(
        go.Sankey(
            node={
                "label": labels,
                "pad": 18,
                "color": [_node_colour(x) for x in labels],
                # Three columns, fates in the middle (plotly would push a fate with no flow
                # onwards to the right edge, among the model's modules).
                "x": [_column(x) for x in labels],
                "y": _rows(cols),
                "line": {"color": "white", "width": 1},
            },
            link={
                "source": cols["source"],
                "target": cols["target"],
                "value": cols["value"],
                "color": [_link_colour(FATE_COLOURS[f]) for f in fate_of_link],
            },
        )
    )
    fig.update_layout(
        title={
            "text": "Where every checkpoint name went: checkpoint prefix -> fate -> model module",
            "x": 0.01,
            "xanchor": "left",
        },
        height=360,
        margin={"l": 20, "r": 20, "t": 50, "b": 20},
    )
    return fig


def sankey_data(ledger: LoadLedger) -> str:
    cols = sankey_columns(ledger)
    labels = cols["labels"]
    return "\n".join(
        f"{labels[s]} -> {labels[t]}: {v}"
        for s, t, v in zip(cols["source"], cols["target"], cols["value"], strict=True)
    )
