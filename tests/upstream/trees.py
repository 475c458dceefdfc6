"""Generated module trees: one spec, built once per side with that side's loaders.

A node has parameters (each with a default or custom ``weight_loader``), persistent and
non-persistent buffers, children, and maybe a ``load_weights`` of its own: ``"auto"`` hands its
group to its side's ``AutoWeightsLoader``; ``"partial"`` loads the first ``take`` names it is given
that are its own direct tensors and returns them; ``"none"`` does the same and returns ``None``.
A node may instead be an ``nn.BatchNorm1d`` (running stats load like parameters). A tree may tie
a parameter into a second module under the name ``tied``. Every tensor starts from values that
depend only on its position, so both builds start equal.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import torch
from hypothesis import strategies as st
from torch import nn

from upstream.common import Side, exact_values, rare

TENSOR_NAMES = ["weight", "bias", "scale", "A", "D"]
CHILD_NAMES = ["model", "layers", "0", "1", "mlp", "norm", "lm_head"]
LOADERS = ["default", "default", "default", "scale2", "composed", "offset", "refuses"]
BATCHNORM_TENSORS = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    kind: str = "param"  # "param", "buffer" (persistent) or "buffer-np" (non-persistent)
    loader: str = "default"
    dtype: torch.dtype = torch.float32
    pad: int = 0  # rows of padding after the checkpoint's (a "padded" loader never writes them)

    @property
    def ckpt_shape(self) -> tuple[int, ...]:
        """The checkpoint tensor's shape: the tensor's, less its padding rows."""
        return (self.shape[0] - self.pad, *self.shape[1:]) if self.pad else self.shape


@dataclass(frozen=True)
class NodeSpec:
    name: str
    tensors: tuple[TensorSpec, ...] = ()
    children: tuple[NodeSpec, ...] = ()
    own: str | None = None  # None, "auto", "partial", "none"
    take: int = 0
    batchnorm: int = 0  # > 0: an nn.BatchNorm1d of this size instead
    embedding: bool = False  # a word embedding (the side's VocabEmbedding class)


@dataclass(frozen=True)
class TreeSpec:
    root: NodeSpec
    ties: tuple[tuple[str, str], ...] = ()  # (parameter, module that also holds it as "tied")

    def nodes(self) -> list[tuple[str, NodeSpec]]:
        out = []

        def walk(node: NodeSpec, path: str) -> None:
            out.append((path, node))
            for c in node.children:
                walk(c, join(path, c.name))

        walk(self.root, "")
        return out

    def tensors(self) -> list[tuple[str, TensorSpec]]:
        """Every tensor by qualified name (tied aliases included, batchnorm stats included)."""
        out = []
        for path, node in self.nodes():
            if node.batchnorm:
                for n in BATCHNORM_TENSORS:
                    shape = () if n == "num_batches_tracked" else (node.batchnorm,)
                    kind = "param" if n in ("weight", "bias") else "buffer"
                    dtype = torch.int64 if n == "num_batches_tracked" else torch.float32
                    out.append((join(path, n), TensorSpec(n, shape, kind, dtype=dtype)))
            for t in node.tensors:
                out.append((join(path, t.name), t))
        by_name = dict(out)
        for source, module in self.ties:
            out.append((join(module, "tied"), by_name[source]))
        return out

    def own_loader_paths(self) -> list[str]:
        return [p for p, n in self.nodes() if n.own and p]


def layer_path(class_name: str) -> str:
    """The module path a ``build`` class name stands for (upstream's logs name classes)."""
    path = class_name.removeprefix("Node_")
    return "" if path == "root" else path.replace("__", ".")


def join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


# --- strategies ----------------------------------------------------------------------------------


@st.composite
def tensor_specs(draw, names, *, buffers: bool = True, padding: bool = False):
    """``padding``: some parameters get rows the checkpoint does not have (``weight_loader_numel``
    says how many elements it fills), loaded by a loader that writes only the checkpoint rows."""
    out = []
    for name in names:
        kind = "param"
        if buffers:
            kind = draw(st.sampled_from(["param", "param", "param", "buffer", "buffer-np"]))
        shape = draw(st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple))
        loader = draw(st.sampled_from(LOADERS)) if kind == "param" else "default"
        if loader == "refuses" and not draw(rare(12)):
            loader = "default"
        dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.bfloat16]))
        pad = 0
        if padding and kind == "param" and draw(rare(3)):
            pad, loader = draw(st.integers(1, 2)), "padded"
            shape = (shape[0] + pad, *shape[1:])
        out.append(TensorSpec(name, shape, kind, loader, dtype, pad))
    return tuple(out)


@st.composite
def node_specs(
    draw, name="", depth=0, *, max_depth=3, own_loaders=True, batchnorm=True, padding=False
):
    if depth and batchnorm and draw(rare(10)):
        return NodeSpec(name, batchnorm=draw(st.integers(1, 3)))
    tnames = draw(st.lists(st.sampled_from(TENSOR_NAMES), unique=True, max_size=3))
    tensors = draw(tensor_specs(tnames, padding=padding))
    children: list[NodeSpec] = []
    if depth < max_depth:
        free = [c for c in CHILD_NAMES if c not in tnames]
        cnames = draw(st.lists(st.sampled_from(free), unique=True, max_size=3 - depth))
        for c in cnames:
            children.append(
                draw(
                    node_specs(
                        c,
                        depth + 1,
                        max_depth=max_depth,
                        own_loaders=own_loaders,
                        batchnorm=batchnorm,
                        padding=padding,
                    )
                )
            )
    own = None
    if depth and own_loaders:
        own = draw(st.sampled_from([None, None, None, "auto", "partial", "none"]))
    return NodeSpec(name, tensors, tuple(children), own, draw(st.integers(0, 4)))


def _as_embeddings(node: NodeSpec, path: str, paths: set[str]) -> NodeSpec:
    """``node`` with the modules at ``paths`` made word embeddings."""
    children = tuple(_as_embeddings(c, join(path, c.name), paths) for c in node.children)
    return replace(node, children=children, embedding=path in paths and not node.batchnorm)


@st.composite
def tree_specs(draw, *, ties: bool = True, ties_p: int = 5, embeddings: bool = False, **kw):
    """Trees; ``embeddings``: some modules are word embeddings, and a tie, when there is one,
    is most often between two of them (the tied head vLLM 0.29.0 skips unasked)."""
    spec = TreeSpec(draw(node_specs(**kw)))
    params = [(q, t) for q, t in spec.tensors() if t.kind == "param"]
    modules = [p for p, n in spec.nodes() if not n.batchnorm]
    if ties and params and draw(rare(ties_p)):
        source = draw(st.sampled_from([q for q, _ in params]))
        owner = source.rpartition(".")[0]
        others = [m for m in modules if m != owner]
        if others:
            spec = TreeSpec(spec.root, ((source, draw(st.sampled_from(others))),))
    if embeddings and modules:
        marked = set(draw(st.lists(st.sampled_from(modules), max_size=2)))
        for source, module in spec.ties:
            if draw(st.integers(0, 3)):  # three in four ties: both ends word embeddings
                marked |= {source.rpartition(".")[0], module}
        spec = TreeSpec(_as_embeddings(spec.root, "", marked), spec.ties)
    return spec


# --- building ------------------------------------------------------------------------------------


def param_loader(kind: str, side: Side):
    default = side.default_weight_loader
    if kind == "default":
        return None
    if kind == "scale2":

        def scale2(param, loaded_weight):
            default(param, loaded_weight * 2)

        return scale2
    if kind == "composed":
        return side.composed_weight_loader(default, lambda x: -x)
    if kind == "offset":

        def offset(param, loaded_weight):
            param.data.copy_(loaded_weight + 1)  # no shape check of its own

        return offset
    if kind == "padded":

        def padded(param, loaded_weight):
            param.data.narrow(0, 0, loaded_weight.shape[0]).copy_(loaded_weight)

        return padded
    if kind == "refuses":

        def refuses(param, loaded_weight):
            raise RuntimeError(
                f"this loader refuses a weight of shape {tuple(loaded_weight.shape)}"
            )

        return refuses
    raise KeyError(kind)


def _own_load_weights(kind: str, take: int, side: Side, path: str, received: list):
    def seen(weights):
        for name, w in weights:
            received.append((path, name))
            yield name, w

    if kind == "auto":

        def load_weights(self, weights):
            return side.AutoWeightsLoader(self).load_weights(seen(weights))

        return load_weights

    def load_weights(self, weights):
        loaded = set()
        if take == 0:
            return loaded if kind == "partial" else None
        for i, (name, w) in enumerate(seen(weights)):
            t = self._parameters.get(name)
            if t is None:
                t = self._buffers.get(name)
            if t is not None:
                getattr(t, "weight_loader", side.default_weight_loader)(t, w)
                loaded.add(name)
            if i + 1 >= take:
                break
        return loaded if kind == "partial" else None

    return load_weights


def build(spec: TreeSpec, side: Side) -> nn.Module:
    """The module tree of ``spec`` with ``side``'s loaders; ``root.received`` logs what every
    own ``load_weights`` was handed, as (module path, name)."""
    seq = itertools.count()
    received: list[tuple[str, str]] = []

    def make(node: NodeSpec, path: str) -> nn.Module:
        name = "Node_" + (path.replace(".", "__") or "root")  # unique: logs name layers by class
        if node.batchnorm:
            bn = type(name, (nn.BatchNorm1d,), {})(node.batchnorm)
            with torch.no_grad():
                for n in BATCHNORM_TENSORS:
                    t = getattr(bn, n)
                    t.copy_(exact_values(tuple(t.shape), next(seq), t.dtype).abs())
            return bn
        attrs = {}
        if node.own:
            attrs["load_weights"] = _own_load_weights(node.own, node.take, side, path, received)
        cls = type(name, (side.VocabEmbedding if node.embedding else nn.Module,), attrs)
        module = cls()
        for t in node.tensors:
            value = exact_values(t.shape, next(seq), t.dtype)
            if t.kind == "param":
                p = nn.Parameter(value, requires_grad=False)
                loader = param_loader(t.loader, side)
                if loader is not None:
                    p.weight_loader = loader
                if t.pad:  # as vLLM 0.31.0's unquantized MoE weights declare it
                    p.weight_loader_numel = math.prod(t.ckpt_shape)
                module.register_parameter(t.name, p)
            else:
                module.register_buffer(t.name, value, persistent=t.kind == "buffer")
        for c in node.children:
            module.add_module(c.name, make(c, join(path, c.name)))
        return module

    root = make(spec.root, "")
    for source, owner in spec.ties:
        root.get_submodule(owner).register_parameter("tied", root.get_parameter(source))
    root.received = received
    return root
