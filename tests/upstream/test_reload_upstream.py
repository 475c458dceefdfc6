"""Layerwise reload against upstream's ``model_loader/reload`` package, release by release.

Both sides build the same model, record its metadata, open a reload, load a generated order of
weights through a driver, and finalise. Compared: the counting trace (each counted load as
(layer, running count, total), each finalisation, each excessive load dropped), which layers are
finalised or left untouched by ``finalize``, the final values, and that storage is kept.

The same cases run against three releases, loadkit taking each one's rules (``RULES``): 0.30.0
counts a padded weight's every element, 0.31.0 only its ``weight_loader_numel``, both leave
``torch.empty``'s memory where no load wrote; 0.34.0 zero-fills, loadkit's default. For the two
older ones torch fills uninitialised memory with NaN (``fill_uninitialized_memory`` under
deterministic algorithms, the largest value for integers) and loadkit runs with ``fill="nan"``,
so that where nothing was written compares too; loadkit's own stand-in for that memory
(``fill="stale"``) is a documented deviation.
"""

from __future__ import annotations

import ast
import contextlib
import re
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import loadkit
from loadkit.reload.layerwise import (
    AT_FINALIZE,
    ReloadStateError,
    UnloadedLayerWarning,
    reload_log,
)
from upstream.common import (
    PROPERTY,
    Difference,
    all_tensors,
    exact_values,
    loadkit_side,
    raised_differences,
    rare,
    record,
    run,
    tensor_differences,
    upstream_side,
)
from upstream.trees import build, layer_path, tree_specs

COUNT = re.compile(r"(\d+) / (\d+)")
# loadkit's keywords for each release's rules (docs/api.md, bug 3's table).
RULES = {
    "0.30.0": {"padding": "counted", "fill": "nan"},
    "0.31.0": {"padding": "excluded", "fill": "nan"},
    "0.34.0": {},
}


@st.composite
def cases(draw):
    spec = draw(tree_specs(own_loaders=False, max_depth=2, ties_p=12, padding=True))
    driver = draw(st.sampled_from(["held", "held", "fresh", "auto"]))
    tensors = spec.tensors()
    names = [q for q, t in tensors if t.kind != "buffer-np" or (driver != "auto" and draw(rare(4)))]
    order = []
    for q in names:
        if draw(rare(20)):
            continue  # not in this update
        order.append(q)
        if draw(rare(20)):
            order.append(q)  # loaded twice: the second may reach a finalised layer
    if draw(st.booleans()):
        order = draw(st.permutations(order))
    return spec, driver, order


def drive(model, side, driver, order, weights):
    """Load ``order`` into ``model`` as a model's ``load_weights`` would."""
    if driver == "auto":
        return side.AutoWeightsLoader(model).load_weights(
            iter(list(zip(order, weights, strict=True)))
        )
    held = None
    if driver == "held":  # looked up once, before loading, as most model loaders do
        held = dict(model.named_parameters(remove_duplicate=False))
        held.update(model.named_buffers(remove_duplicate=False))
    for name, w in zip(order, weights, strict=True):
        if held is not None:
            t = held[name]
        else:  # looked up at each load
            owner, _, leaf = name.rpartition(".")
            module = model.get_submodule(owner)
            t = module._parameters.get(leaf)
            if t is None:
                t = module._buffers[leaf]
        getattr(t, "weight_loader", side.default_weight_loader)(t, w)
    return None


def upstream_events(records):
    out = []
    for logger, _, msg in records:
        if not logger.endswith(".layerwise"):
            continue
        cls, _, rest = msg.partition(": ")
        m = COUNT.fullmatch(rest)
        if m:
            out.append(("count", layer_path(cls), int(m[1]), int(m[2])))
        else:
            kind = {
                "Excessive loading": "excessive",
                "Processed": "processed",
                "Delayed processing": "delayed",
                "Failed to load weights": "unloaded",
            }[rest]
            out.append((kind, layer_path(cls)))
    return out


def loadkit_events(steps):
    out = []
    for s in steps:
        if s.dropped:
            out.append(("excessive", s.layer))
        elif s.reason == AT_FINALIZE:
            out += [("delayed", s.layer), ("processed", s.layer)]
        else:
            out.append(("count", s.layer, s.running, s.total))
            if s.finalised:
                out.append(("processed", s.layer))
    return out


@contextlib.contextmanager
def uninitialised_memory_is_nan(on: bool):
    """torch.empty and friends fill NaN (the largest value for integers) while ``on``."""
    if not on:
        yield
        return
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


def run_upstream(up, spec, driver, order, weights):
    model = build(spec, upstream_side(up))
    before = {n: t.data_ptr() for n, t in all_tensors(model).items()}
    up.log.clear()
    with uninitialised_memory_is_nan(up.version != "0.34.0"):
        up.reload.record_metadata_for_reloading(model)
        up.reload.initialize_layerwise_reload(model)
        out = run(lambda: drive(model, upstream_side(up), driver, order, weights))
        load_events = upstream_events(up.log.records)
        up.log.clear()
        fin = run(lambda: up.reload.finalize_layerwise_reload(model, None))
        final_events = upstream_events(up.log.records)
    return model, before, out, fin, load_events, final_events


def run_loadkit(spec, driver, order, weights, rules):
    model = build(spec, loadkit_side())
    before = {n: t.data_ptr() for n, t in all_tensors(model).items()}
    loadkit.record_metadata_for_reloading(model)
    init = run(lambda: loadkit.initialize_layerwise_reload(model, **rules))
    if init.raised:
        return model, before, init, None, None, None, None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = run(lambda: drive(model, loadkit_side(), driver, order, weights))
        n_load = len(reload_log(model))
        fin = run(lambda: loadkit.finalize_layerwise_reload(model))
    steps = reload_log(model)
    untouched = []
    for w in caught:
        if w.category is UnloadedLayerWarning:
            untouched += ast.literal_eval(str(w.message).rpartition(": ")[2])
    final = loadkit_events(steps[n_load:]) + [("unloaded", n) for n in untouched]
    return model, before, init, out, fin, loadkit_events(steps[:n_load]), final


@pytest.mark.parametrize("version", list(RULES))
@PROPERTY
@given(case=cases())
def test_layerwise_reload_like_upstream(up_at, version, case):
    up = up_at(version)
    spec, driver, order = case
    shapes = dict(spec.tensors())
    weights = [
        exact_values(shapes[n].ckpt_shape, 200 + i, torch.float32).to(shapes[n].dtype)
        for i, n in enumerate(order)
    ]
    u_model, u_before, u_out, u_fin, u_load, u_final = run_upstream(
        up, spec, driver, order, [w.clone() for w in weights]
    )
    k_model, k_before, k_init, k_out, k_fin, k_load, k_final = run_loadkit(
        spec, driver, order, [w.clone() for w in weights], RULES[version]
    )
    if k_init.raised:
        dev = "tied-reload" if spec.ties and isinstance(k_init.error, ReloadStateError) else None
        record(f"layerwise reload, {version}", [Difference(f"loadkit {k_init.describe()}", dev)])
        return
    diffs = raised_differences(u_out, k_out, what="load: ")
    if not (u_out.raised or k_out.raised) and driver == "auto" and u_out.value != k_out.value:
        diffs.append(Difference(f"loaded sets: {sorted(u_out.value)} vs {sorted(k_out.value)}"))
    for fin, side in ((u_fin, "upstream"), (k_fin, "loadkit")):
        if fin.raised:
            diffs.append(Difference(f"{side} finalize {fin.describe()}"))
    # Upstream's AutoWeightsLoader hands BatchNorm running stats to the loader as detached
    # state_dict copies, which carry no reload wrapper: those loads are never counted.
    bn = {p for p, n in spec.nodes() if n.batchnorm} if driver == "auto" else set()
    if u_load != k_load:
        diffs += _trace_difference("load trace", u_load, k_load, bn)
    if sorted(u_final) != sorted(k_final):
        diffs += _trace_difference("finalize", sorted(u_final), sorted(k_final), bn)
    initial = all_tensors(build(spec, loadkit_side()))
    steps = reload_log(k_model)
    loaded = {(s.layer, s.parameter) for s in steps if not s.dropped and s.parameter}
    dropped = {(s.layer, s.parameter) for s in steps if s.dropped}

    def deviation(name, u, k):
        layer, _, leaf = name.rpartition(".")
        if (layer, leaf) in dropped:
            return "late-load"  # upstream wrote it into the live tensor; loadkit dropped it
        if layer in bn:
            return "bn-stats"  # the stats, and the layer finalised at another moment
        return _value_deviation(name, u, k, initial[name], loaded, RULES[version])

    diffs += tensor_differences(u_model, k_model, deviation)
    for model, before, side in ((u_model, u_before, "upstream"), (k_model, k_before, "loadkit")):
        moved = [n for n, t in all_tensors(model).items() if t.data_ptr() != before[n]]
        if moved:
            diffs.append(Difference(f"{side} replaced the storage of {moved}"))
    if u_out.raised and u_fin.raised and str(u_fin.error) == str(u_out.error) and not k_fin.raised:
        # Upstream buffered the load that raised and raised it again when finalising, leaving
        # that layer materialised but not copied back: everything after follows from that.
        diffs = [Difference(d.what, d.deviation or "failed-load") for d in diffs]
    context = f"driver {driver}, order {order}, spec {spec}"
    record(f"layerwise reload, {version}", diffs, context)


def _trace_difference(what, u_events, k_events, bn_layers) -> list[Difference]:
    """The documented reasons two traces differ, or one unexplained difference."""
    text = f"{what}: upstream {u_events}, loadkit {k_events}"
    devs = []
    if bn_layers:
        u_rest = [e for e in u_events if e[1] not in bn_layers]
        k_rest = [e for e in k_events if e[1] not in bn_layers]
        if (u_rest, k_rest) != (u_events, k_events):
            devs.append("bn-stats")
            u_events, k_events = u_rest, k_rest
    if u_events != k_events:
        # loadkit drops every load for a finalised layer (an "excessive" step); upstream drops
        # only those reaching a stand-in and writes the others into the live tensor, unlogged.
        i, extra = 0, 0
        for ev in k_events:
            if i < len(u_events) and u_events[i] == ev:
                i += 1
            elif ev[0] == "excessive":
                extra += 1
            else:
                return [Difference(text)]
        if i != len(u_events) or not extra:
            return [Difference(text)]
        devs.append("late-load")
    return [Difference(text, d) for d in devs] or [Difference(text)]


def _value_deviation(name, u, k, initial, loaded, rules) -> str | None:
    """Why a final value may differ: elements no load of this reload wrote, which loadkit filled.

    Upstream never moves a tensor named ``bias`` to meta, so those elements keep their old value
    there (all of them, or a padded bias's padding); before 0.34.0 torch fills an integer's
    uninitialised memory with its largest value where loadkit's ``fill="nan"`` writes 0."""
    layer, _, leaf = name.rpartition(".")
    if u.is_meta or k.is_meta:
        return None  # left on meta by a finalize that raised (the "failed-load" case below)
    differ = u != k
    if k.is_floating_point():
        differ &= ~(u.isnan() & k.isnan())
    nan = rules.get("fill") == "nan" and k.is_floating_point()
    filled = k[differ].isnan().all() if nan else (k[differ] == 0).all()
    if not differ.any() or not filled:
        return None
    if leaf == "bias" and torch.equal(u[differ], initial[differ]):
        return "bias-on-meta"  # upstream never moved it to meta: it keeps its old values
    if not k.is_floating_point() and rules.get("fill") == "nan" and (layer, leaf) not in loaded:
        return "stale-fill"
    return None
