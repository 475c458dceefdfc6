"""What notebook 00 (the tour) calls: a tiny hybrid model with every piece of the contract.

``TinyHybrid`` has the upstream shapes of the loading contract in a few tensors: Hugging Face
checkpoint names (``backbone.*``, ``A_log``, separate ``q_proj``/``k_proj``/``v_proj``, an
``mtp.*`` head the model does not have) that meet the model's names (``model.*``, ``A``, one packed
``qkv_proj``) only through its ``hf_to_vllm_mapper``; a parameter with its own ``weight_loader``
(``A = -exp(A_log)``, two copies); a packed parameter loaded shard by shard; a tied ``lm_head``
that must be skipped. Its mapper is NemotronH's, as upstream writes it.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from loadkit.checkpoint.reader import Checkpoint
from loadkit.demo.stories import DATA_DIR
from loadkit.fmt import WIDTH, table, wrap
from loadkit.inspection.layout import LayoutNode, build_layout
from loadkit.loading.auto_loader import AutoWeightsLoader
from loadkit.loading.counting import CopyCounter
from loadkit.loading.ledger import LoadLedger, ledger_of
from loadkit.loading.weight_loaders import (
    composed_weight_loader,
    default_weight_loader,
    loader_of,
    set_weight_attrs,
)
from loadkit.mapper import WeightsMapper
from loadkit.models._common import RMSNorm, packed_weight_loader, shard_rows
from loadkit.models.dyadic import dyadic_uniform
from loadkit.models.nemotron_h import NemotronHForCausalLM

HIDDEN, HEADS, VOCAB = 8, 2, 16
CHECKPOINT = DATA_DIR / "big" / "tour" / "tiny.safetensors"


class Mamba2Mixer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.in_proj = nn.Linear(HIDDEN, 2 * HIDDEN, bias=False)
        self.A = nn.Parameter(torch.zeros(HEADS))
        a_loader = composed_weight_loader(default_weight_loader, lambda a: -a.exp())
        set_weight_attrs(self.A, {"weight_loader": a_loader})
        self.D = nn.Parameter(torch.zeros(HEADS))


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv_proj = nn.Linear(HIDDEN, 3 * HIDDEN, bias=False)
        # q, k, v each load into their rows of one packed parameter: the shard id says which.
        rows = shard_rows({"q": HIDDEN, "k": HIDDEN, "v": HIDDEN})
        name = "model.layers.1.mixer.qkv_proj.weight"
        set_weight_attrs(self.qkv_proj.weight, {"weight_loader": packed_weight_loader(name, rows)})
        self.o_proj = nn.Linear(HIDDEN, HIDDEN, bias=False)


class Block(nn.Module):
    def __init__(self, mixer: nn.Module) -> None:
        super().__init__()
        self.norm = RMSNorm(HIDDEN)
        self.mixer = mixer


class Backbone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList([Block(Mamba2Mixer()), Block(Attention())])
        self.norm_f = RMSNorm(HIDDEN)


class TinyHybrid(nn.Module):
    # The NemotronH-like model's own mapper: the tour shows the rules a real model ships with.
    hf_to_vllm_mapper = NemotronHForCausalLM.hf_to_vllm_mapper

    def __init__(self) -> None:
        super().__init__()
        self.model = Backbone()
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)
        self.lm_head.weight = self.model.embed_tokens.weight  # tied

    def load_weights(self, weights: Any) -> set[str]:
        # Tied: lm_head.weight in the checkpoint would overwrite the shared embedding.
        loader = AutoWeightsLoader(self, skip_prefixes=["lm_head."])
        return loader.load_weights(weights, mapper=self.hf_to_vllm_mapper)


def checkpoint_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    """The Hugging Face side: what a published checkpoint of this model holds."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return dyadic_uniform(shape, g)  # the same bits on every machine

    t = {"backbone.embeddings.weight": r(VOCAB, HIDDEN)}
    t["backbone.layers.0.norm.weight"] = r(HIDDEN)
    t["backbone.layers.0.mixer.in_proj.weight"] = r(2 * HIDDEN, HIDDEN)
    t["backbone.layers.0.mixer.A_log"] = r(HEADS)
    t["backbone.layers.0.mixer.D"] = r(HEADS)
    t["backbone.layers.1.norm.weight"] = r(HIDDEN)
    for p in "qkvo":
        t[f"backbone.layers.1.mixer.{p}_proj.weight"] = r(HIDDEN, HIDDEN)
    t["backbone.norm_f.weight"] = r(HIDDEN)
    t["lm_head.weight"] = t["backbone.embeddings.weight"].clone()
    t["mtp.layers.0.weight"] = r(HIDDEN, HIDDEN)  # a multi-token-prediction head: dropped
    return t


def write_checkpoint(path: str | os.PathLike[str] = CHECKPOINT) -> str:
    """Write the checkpoint (safetensors stores names sorted); returns it relative to here."""
    from safetensors.torch import save_file

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file(checkpoint_tensors(), str(path))
    return os.path.relpath(path)


# --- the steps of the tour ------------------------------------------------------------------------


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


def walk_picture(mapper: WeightsMapper, names: list[str]) -> str:
    """The tree ``AutoWeightsLoader`` walks: the mapped names, split at their dots, with how
    many names go down each branch."""
    root = build_layout((m, 0, "") for m in mapper.apply_list(names))
    lines: list[str] = []

    def visit(node: LayoutNode, depth: int) -> None:
        for child in node.children.values():
            count = f"  ({child.tensors} names)" if child.tensors > 1 else ""
            lines.append("  " * depth + child.name + count)
            visit(child, depth + 1)

    visit(root, 0)
    return "\n".join(lines)


def load(path: str | os.PathLike[str]) -> tuple[TinyHybrid, LoadLedger, int]:
    """Load the checkpoint into a fresh model: (model, its ledger, copies counted)."""
    from loadkit.checkpoint.reader import open_checkpoint

    model = TinyHybrid()
    with CopyCounter() as copies:
        model.load_weights(open_checkpoint(path).weights())
    ledger = ledger_of(model)
    assert ledger is not None
    return model, ledger, copies.count


def loader_table(model: nn.Module) -> str:
    """Which loader each parameter asks for."""
    rows = []
    for name, p in model.named_parameters():
        fn = loader_of(p)
        rows.append((name, getattr(fn, "__qualname__", fn)))
    return table(rows)


def journey(
    name: str, ck: Checkpoint, model: TinyHybrid, ledger: LoadLedger, width: int = WIDTH
) -> str:
    """One checkpoint name from the header to the parameter it ends in (lines longer than
    ``width`` folded, ``fmt.wrap``)."""
    info = ck.tensors[name]
    mapper = model.hf_to_vllm_mapper
    t = mapper.trace(name)
    lines = [f"checkpoint  {name}: {info.dtype} {list(info.shape)}, {info.nbytes} bytes"]
    for s in t.steps:
        lines.append(f"mapper      {s.stage} {s.rule!r}: {s.before} -> {s.after}")
    if not t.steps:
        lines.append("mapper      no rule fires: the name stays")
    if t.shard_id is not None:
        lines.append(f"            shard id {t.shard_id!r} travels with the tensor")
    entry = next(e for e in ledger.entries if e.name == name)
    if entry.mapped is not None:
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


def sankey_figure(ledger: LoadLedger) -> Any:
    import plotly.graph_objects as go

    cols = sankey_columns(ledger)
    fig = go.Figure(
        go.Sankey(
            node={"label": cols["labels"], "pad": 18},
            link={"source": cols["source"], "target": cols["target"], "value": cols["value"]},
        )
    )
    fig.update_layout(
        title={"text": "Where every checkpoint name went", "x": 0.01, "xanchor": "left"},
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
