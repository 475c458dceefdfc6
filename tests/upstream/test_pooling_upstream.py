"""The pooling adapter's prefix probe against vLLM 0.34.0's ``_create_pooling_model_cls``: where
it stops, what it holds (clones only under a load format whose iterator may reuse buffers), what
it forwards, and the loader it falls back on (with the model's mapper, since 0.29.0)."""

from __future__ import annotations

import types

import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import loadkit
from upstream.common import (
    PROPERTY,
    Difference,
    raised_differences,
    rare,
    record,
    run,
    sides,
    stream,
    tensor_differences,
)
from upstream.trees import TreeSpec, build, tree_specs


class CloneTrace(TorchDispatchMode):
    """Every ``aten.clone``, as the numel it copied."""

    def __init__(self) -> None:
        super().__init__()
        self.clones: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.clone.default:
            self.clones.append(args[0].numel())
        return func(*args, **(kwargs or {}))


def model_class(spec: TreeSpec, side, *, own_load: bool, mapper_rules):
    """A generative model class over ``spec``'s tree, constructible as vLLM builds models."""

    def __init__(self, *, vllm_config=None, prefix=""):
        torch.nn.Module.__init__(self)
        inner = build(spec, side)
        for name, child in inner.named_children():
            self.add_module(name, child)
        for name, p in inner._parameters.items():
            self.register_parameter(name, p)
        for name, b in inner._buffers.items():
            self.register_buffer(name, b, persistent=name not in inner._non_persistent_buffers_set)
        self.pooler = "its own pooler"  # the adapter keeps a model's pooler (none is built)
        self.forwarded = []

    attrs = {"__init__": __init__}
    if mapper_rules is not None:
        attrs["hf_to_vllm_mapper"] = side.WeightsMapper(**mapper_rules)
    if own_load:

        def load_weights(self, weights):
            def seen(ws):
                for name, w in ws:
                    self.forwarded.append(name)
                    yield name, w

            mapper = getattr(self, "hf_to_vllm_mapper", None)
            return side.AutoWeightsLoader(self).load_weights(seen(weights), mapper=mapper)

        attrs["load_weights"] = load_weights
    return type("DemoForCausalLM", (torch.nn.Module,), attrs)


@st.composite
def cases(draw):
    spec = draw(tree_specs(own_loaders=False, ties=False, max_depth=2))
    names = [q for q, t in spec.tensors() if t.kind != "buffer-np"]
    shapes = {q: t.shape for q, t in spec.tensors()}
    dtypes = {q: t.dtype for q, t in spec.tensors()}
    layout = draw(st.sampled_from(["as-is", "as-is", "without-model", "mapped"]))
    inner = [q for q in names if q.startswith("model.")]
    if layout == "without-model" and inner:
        names = inner  # a checkpoint saved from the inner *Model: only its names, unprefixed
    elif layout == "without-model":
        layout = "as-is"
    entries = []
    for q in names:
        if draw(rare(10)):
            continue
        ck = q
        if layout == "without-model":
            ck = q.removeprefix("model.")
        elif layout == "mapped":
            ck = "ckpt." + q
        entries.append((ck, shapes[q], dtypes[q]))
    # A checkpoint that only matches after mapping: the model's own load_weights applies
    # hf_to_vllm_mapper, and since vLLM 0.29.0 so does the probe's fallback loader.
    own_load = draw(st.booleans())
    mapper_rules = None
    if layout == "mapped" or draw(rare(3)):
        mapper_rules = {
            "orig_to_new_prefix": {"ckpt.": ""},
            "orig_to_new_substr": {".dropme": None},
        }
    # Keys the model does not have, in front: the probe walks (and clones) past them. Rarely
    # one that nothing skips or drops: then both loaders raise once the probe is done.
    droppable = ["x.dropme", "ckpt.x.dropme"] if mapper_rules else []
    junk = ["rotary_emb.inv_freq", *droppable]
    for _ in range(draw(st.integers(0, 3))):
        name = "vision.weight" if draw(rare(15)) else draw(st.sampled_from(junk))
        entries.insert(draw(st.integers(0, min(2, len(entries)))), (name, (2,), torch.float32))
    # vLLM's --load-format: owned tensors (no clone), or a format whose iterator may reuse them
    load_format = draw(st.sampled_from(["auto", "safetensors", "fastsafetensors", "dummy"]))
    return spec, entries, own_load, mapper_rules, load_format


@PROPERTY
@given(case=cases())
def test_pooling_probe_like_upstream(up, case):
    spec, entries, own_load, mapper_rules, load_format = case
    results = {}
    vllm_config = types.SimpleNamespace(load_config=types.SimpleNamespace(load_format=load_format))
    for side in sides(up):
        cls = model_class(spec, side, own_load=own_load, mapper_rules=mapper_rules)
        pooling = (
            up.pooling_class(cls)
            if side.name == "upstream"
            else loadkit.as_pooling_model(cls, load_format=load_format)
        )
        model = pooling(vllm_config=vllm_config)
        weights = stream(entries)
        with CloneTrace() as clones:
            out = run(lambda: model.load_weights(weights))  # noqa: B023
        results[side.name] = (out, model, weights.pulled, clones.clones)
    (u, u_model, u_pulled, u_clones), (k, k_model, k_pulled, k_clones) = (
        results["upstream"],
        results["loadkit"],
    )
    diffs = raised_differences(u, k)
    if not (u.raised or k.raised) and u.value != k.value:
        diffs.append(Difference(f"returned {sorted(u.value)} vs {sorted(k.value)}"))
    if u_clones != k_clones:
        diffs.append(Difference(f"clones (numel each): upstream {u_clones}, loadkit {k_clones}"))
    if u_pulled != k_pulled:
        diffs.append(Difference(f"pulled: upstream {u_pulled}, loadkit {k_pulled}"))
    if u_model.forwarded != k_model.forwarded:
        diffs.append(
            Difference(f"forwarded: upstream {u_model.forwarded}, loadkit {k_model.forwarded}")
        )
    diffs += tensor_differences(u_model, k_model)
    record("pooling probe", diffs)
