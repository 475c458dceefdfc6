"""AutoWeightsLoader against upstream's: generated module trees, checkpoints and rules."""

from __future__ import annotations

import copy

import torch
from hypothesis import given
from hypothesis import strategies as st

from loadkit.errors import (
    NestedWeightError,
    ShapeMismatchError,
    UnknownNameError,
    WeightLoadError,
)
from loadkit.loading.auto_loader import BIAS_RULE
from loadkit.loading.ledger import LOADED, UNCONSUMED
from upstream.common import (
    PROPERTY,
    Counted,
    Difference,
    all_tensors,
    exact_values,
    loadkit_side,
    rare,
    record,
    run,
    same_tensor,
    upstream_side,
)
from upstream.trees import TreeSpec, build, join, tree_specs

ROTARY = "rotary_emb.inv_freq"


@st.composite
def checkpoints(draw, spec: TreeSpec):
    """(name, shape, dtype) entries: most of the model's tensors, some unexpected names."""
    loadable = [(q, t) for q, t in spec.tensors() if t.kind != "buffer-np"]
    entries = []
    for q, t in loadable:
        if draw(rare(8)):
            continue  # missing from the checkpoint
        shape = t.shape
        if draw(rare(40)):
            shape = (*shape, 2)  # does not fit
        dtype = (
            t.dtype
            if t.dtype == torch.int64
            else draw(
                st.sampled_from([torch.float32, torch.float32, torch.bfloat16, torch.float16])
            )
        )
        entries.append((q, shape, dtype))
        if draw(rare(25)):
            entries.append((q, shape, dtype))  # the same name twice
    modules = [p for p, n in spec.nodes() if not n.batchnorm]
    params = [q for q, t in spec.tensors() if t.kind == "param"]
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["bias", "bias", "rotary", "extra", "nested", "top", "np"]))
        if kind in ("extra", "nested", "top", "np") and not draw(rare(8)):
            kind = draw(st.sampled_from(["bias", "rotary"]))
        module = draw(st.sampled_from(modules))
        if kind == "bias":
            # Unexpected under a module: ignored by upstream's ".bias" rule (unless that module
            # has a bias). A top-level "bias" has no dot: it raises, so it is drawn rarely.
            inner = [m for m in modules if m]
            if inner and not draw(rare(10)):
                module = draw(st.sampled_from(inner))
            name = join(module, "bias") if inner or draw(rare(10)) else join(module, ROTARY)
        elif kind == "rotary":
            name = join(module, ROTARY)
        elif kind == "extra":
            name = join(module, "extra")
        elif kind == "nested":
            owner = draw(st.sampled_from(params)) if params else "nowhere"
            name = join(owner, draw(st.sampled_from(["extra", "bias"])))
        elif kind == "np":
            np = [q for q, t in spec.tensors() if t.kind == "buffer-np"]
            name = draw(st.sampled_from(np)) if np else join(module, ROTARY)
        else:
            name = "nowhere.weight"
        entries.insert(draw(st.integers(0, len(entries))), (name, (2,), torch.float32))
    order = draw(st.sampled_from(["model", "model", "sorted", "shuffled"]))
    if order == "sorted":
        entries.sort(key=lambda e: e[0])
    elif order == "shuffled":
        entries = draw(st.permutations(entries))
    return entries


@st.composite
def rule_lists(draw, spec: TreeSpec):
    modules = [p for p, _ in spec.nodes() if p]
    tnames = sorted({q.rpartition(".")[2] for q, _ in spec.tensors()})

    def maybe(strategy):
        return draw(st.one_of(st.none(), strategy)) if draw(rare(3)) else None

    pick_modules = (
        st.lists(st.sampled_from(modules).map(lambda m: m + "."), max_size=1)
        if (modules)
        else st.just([])
    )
    return {
        "skip_prefixes": maybe(pick_modules),
        "skip_substrs": maybe(st.lists(st.sampled_from(tnames or ["x"]), max_size=1)),
        "ignore_unexpected_prefixes": maybe(pick_modules),
        "ignore_unexpected_suffixes": maybe(
            st.lists(st.sampled_from([".extra", "extra"]), max_size=1)
        ),
    }


@st.composite
def cases(draw):
    spec = draw(tree_specs())
    entries = draw(checkpoints(spec))
    lists = draw(rule_lists(spec))
    mapped = draw(st.booleans()) and draw(st.booleans())
    return spec, entries, lists, mapped


def _mapper(side, mapped):
    if not mapped:
        return None
    return side.WeightsMapper(
        orig_to_new_prefix={"ckpt.": ""}, orig_to_new_substr={".dropme": None}
    )


def _error_deviation(u: BaseException, k: BaseException) -> str | None:
    text = str(u)
    if isinstance(k, UnknownNameError) and type(u) is ValueError:
        if text.startswith(f"There is no module or parameter named {k.name!r} "):
            return "error-messages"
    if isinstance(k, NestedWeightError) and type(u) is ValueError:
        if text.startswith(f"Attempted to load nested weight {k.name!r} "):
            return "error-messages"
    if isinstance(k, ShapeMismatchError) and isinstance(u, AssertionError):
        if f"({torch.Size(k.weight_shape)})" in text and f"({torch.Size(k.param_shape)})" in text:
            return "errors"
    if isinstance(k, WeightLoadError) and k.__cause__ is not None:
        cause = k.__cause__
        if type(cause) is type(u) and str(cause) == str(u):
            return "errors"
    return None


def load_both(up, spec, entries, lists, mapped):
    results = {}
    for side in (upstream_side(up), loadkit_side()):
        model = build(spec, side)
        given_lists = copy.deepcopy(lists)
        stream = Counted(
            (("ckpt." if mapped else "") + name, exact_values(shape, 100 + i, dtype))
            for i, (name, shape, dtype) in enumerate(entries)
        )
        loader = side.AutoWeightsLoader(model, **given_lists)
        out = run(lambda: loader.load_weights(stream, mapper=_mapper(side, mapped)))  # noqa: B023
        results[side.name] = (out, model, stream.pulled, given_lists, loader)
    return results


def compare(results, lists) -> list[Difference]:
    (u, u_model, u_pulled, u_lists, _), (k, k_model, k_pulled, k_lists, _) = (
        results["upstream"],
        results["loadkit"],
    )
    diffs: list[Difference] = []
    if u.raised or k.raised:
        if not (u.raised and k.raised):
            diffs.append(Difference(f"upstream {u.describe()}; loadkit {k.describe()}"))
        elif type(u.error) is not type(k.error):
            dev = _error_deviation(u.error, k.error)
            diffs.append(Difference(f"upstream {u.describe()}; loadkit {k.describe()}", dev))
    elif u.value != k.value:
        diffs.append(
            Difference(
                f"returned sets differ: only upstream {sorted(u.value - k.value)}, "
                f"only loadkit {sorted(k.value - u.value)}"
            )
        )
    if u_pulled != k_pulled:
        diffs.append(
            Difference(f"names pulled from the stream: upstream {u_pulled}, loadkit {k_pulled}")
        )
    if u_model.received != k_model.received:
        diffs.append(
            Difference(
                f"own load_weights were handed: upstream {u_model.received}, "
                f"loadkit {k_model.received}"
            )
        )
    ut, kt = all_tensors(u_model), all_tensors(k_model)
    for name in ut:
        if not same_tensor(ut[name], kt[name]):
            diffs.append(Difference(f"tensor {name}: upstream {ut[name]}, loadkit {kt[name]}"))
    diffs += _ledger_problems(results["loadkit"][4], k)
    if u_lists != k_lists:
        dev = "caller-lists" if k_lists == lists else None
        diffs.append(
            Difference(f"caller's lists after: upstream {u_lists}, loadkit {k_lists}", dev)
        )
    return diffs


def _ledger_problems(loader, outcome) -> list[Difference]:
    """After a load that went through, the ledger must account for every name it was given."""
    if outcome.raised:
        return []
    out = []
    for e in loader.ledger.entries:
        if e.status == UNCONSUMED:
            out.append(Difference(f"ledger: {e.name!r} unconsumed after a complete load"))
        if e.status == LOADED and e.target not in outcome.value:
            out.append(Difference(f"ledger: {e.name!r} loaded into {e.target!r}, not returned"))
        if e.rule == BIAS_RULE and not (e.mapped or "").rpartition(".")[0]:
            out.append(Difference(f"ledger: {e.name!r} ignored by the .bias rule without a dot"))
    return out


@PROPERTY
@given(case=cases())
def test_auto_weights_loader_like_upstream(up, case):
    spec, entries, lists, mapped = case
    up.log.clear()
    results = load_both(up, spec, entries, lists, mapped)
    record("AutoWeightsLoader", compare(results, lists))
