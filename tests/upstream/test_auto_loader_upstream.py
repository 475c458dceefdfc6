"""AutoWeightsLoader against upstream's: generated module trees, checkpoints and rules.

Two properties: loadkit's ``AutoWeightsLoader`` against vLLM 0.34.0's (skips are mapper rules to
``None``; tied word-embedding aliases skipped unasked; the rotary mapper), and the skip-list
loader bug 2's story keeps (``loadkit.models.plamo2.skips``) against vLLM 0.28.0's, whose
``skip_prefixes`` / ``skip_substrs`` it is."""

from __future__ import annotations

import copy

import torch
from hypothesis import given
from hypothesis import strategies as st

from loadkit.loading.auto_loader import BIAS_RULE
from loadkit.terms import Status
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
def cases(draw, *, skip_lists: bool):
    """A tree, its checkpoint, the loader's lists and the mapper's drops. vLLM 0.28.0
    (``skip_lists``) takes ``skip_prefixes`` / ``skip_substrs``; 0.34.0 the same skips as mapper
    rules to ``None`` (``drops``), and word embeddings whose tied aliases it skips unasked."""
    spec = draw(tree_specs(embeddings=not skip_lists, ties_p=3 if not skip_lists else 5))
    entries = draw(checkpoints(spec))
    lists = draw(rule_lists(spec))
    drops = {"prefix": lists.pop("skip_prefixes"), "substr": lists.pop("skip_substrs")}
    if skip_lists:
        lists.update(skip_prefixes=drops["prefix"], skip_substrs=drops["substr"])
        drops = {"prefix": None, "substr": None}
    mapped = draw(st.booleans()) and draw(st.booleans())
    return spec, entries, lists, (mapped, drops)


def _mapper(side, how):
    mapped, drops = how
    prefix = {"ckpt.": ""} if mapped else {}
    substr = {".dropme": None} if mapped else {}
    prefix.update(dict.fromkeys(drops["prefix"] or ()))
    substr.update(dict.fromkeys(drops["substr"] or ()))
    if not (prefix or substr):
        return None
    return side.WeightsMapper(orig_to_new_prefix=prefix, orig_to_new_substr=substr)


def load_both(up, spec, entries, lists, how, *, skip_lists: bool = False):
    results = {}
    for side in sides(up, skip_lists=skip_lists):
        model = build(spec, side)
        given_lists = copy.deepcopy(lists)
        weights = stream(entries, "ckpt." if how[0] else "")
        loader = side.AutoWeightsLoader(model, **given_lists)
        out = run(lambda: loader.load_weights(weights, mapper=_mapper(side, how)))  # noqa: B023
        results[side.name] = (out, model, weights.pulled, given_lists, loader)
    return results


def compare(results, lists) -> list[Difference]:
    (u, u_model, u_pulled, u_lists, _), (k, k_model, k_pulled, k_lists, _) = (
        results["upstream"],
        results["loadkit"],
    )
    diffs = raised_differences(u, k)
    if not (u.raised or k.raised) and u.value != k.value:
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
    diffs += tensor_differences(u_model, k_model)
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
        if e.status == Status.UNCONSUMED:
            out.append(Difference(f"ledger: {e.name!r} unconsumed after a complete load"))
        if e.status == Status.LOADED and e.target not in outcome.value:
            out.append(Difference(f"ledger: {e.name!r} loaded into {e.target!r}, not returned"))
        if e.rule == BIAS_RULE and not (e.mapped or "").rpartition(".")[0]:
            out.append(Difference(f"ledger: {e.name!r} ignored by the .bias rule without a dot"))
    return out


def _aliases(results) -> list[Difference]:
    """Both loaders take the same names for tied-embedding aliases."""
    u = getattr(results["upstream"][4], "aliased_params", {})
    k = results["loadkit"][4].aliased_params
    return [] if u == k else [Difference(f"aliased_params: upstream {u}, loadkit {k}")]


@PROPERTY
@given(case=cases(skip_lists=False))
def test_auto_weights_loader_like_upstream(up, case):
    spec, entries, lists, how = case
    up.log.clear()
    results = load_both(up, spec, entries, lists, how)
    record("AutoWeightsLoader", compare(results, lists) + _aliases(results))


@PROPERTY
@given(case=cases(skip_lists=True))
def test_skip_list_loader_like_vllm_0_28_0(up_old, case):
    """bug 2's skip-list loader (``skip_prefixes`` / ``skip_substrs``) is vLLM 0.28.0's."""
    spec, entries, lists, how = case
    up_old.log.clear()
    results = load_both(up_old, spec, entries, lists, how, skip_lists=True)
    record("AutoWeightsLoader with skip lists (vLLM 0.28.0)", compare(results, lists))
