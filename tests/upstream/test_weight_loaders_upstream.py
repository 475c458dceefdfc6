"""default_weight_loader and composed_weight_loader against upstream's, and get_numel_loaded."""

from __future__ import annotations

import inspect

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import loadkit
from loadkit.errors import ShapeMismatchError
from upstream.common import (
    PROPERTY,
    CopyTrace,
    Difference,
    exact_values,
    loadkit_side,
    raised_differences,
    rare,
    record,
    run,
    same_tensor,
    sides,
    upstream_side,
)


@pytest.fixture(scope="session")
def up(up_old):
    """vLLM 0.28.0 for this module's properties until they move to 0.34.0 (issue 35)."""
    return up_old


DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
shapes = st.lists(st.integers(1, 3), max_size=3).map(tuple)


@st.composite
def param_and_weight(draw):
    """A parameter shape and a checkpoint shape: mostly equal, sometimes one element each way,
    rarely plainly different."""
    shape = draw(shapes)
    kind = draw(st.sampled_from(["same"] * 6 + ["one"] * 2 + ["other"]))
    if kind == "one":
        shape = draw(st.sampled_from([(), (1,), (1, 1)]))
        weight_shape = draw(st.sampled_from([(), (1,), (1, 1)]))
    elif kind == "other":
        weight_shape = draw(shapes.filter(lambda s: s != shape))
    else:
        weight_shape = shape
    return (
        shape,
        weight_shape,
        draw(st.sampled_from(DTYPES)),
        draw(st.sampled_from(DTYPES)),
        draw(st.integers(0, 50)),
    )


FNS = {
    "neg": lambda x: -x,
    "neg_exp": lambda x: -torch.exp(x.float()),
    "plus_one": lambda x: x + 1,
    "twice": lambda x: x * 2,
    "sum": lambda x: x.sum(),  # a scalar written back into every element (broadcast copy)
}


def _error_deviation(u, k, param_shape, weight_shape) -> str | None:
    """Upstream's bare AssertionError for a shape mismatch is loadkit's ShapeMismatchError."""
    if (
        isinstance(u, AssertionError)
        and isinstance(k, ShapeMismatchError)
        and k.param_shape == tuple(param_shape)
        and k.weight_shape == tuple(weight_shape)
    ):
        return "errors"
    return None


def _compare_load(up, prop, make_loader, case):
    shape, weight_shape, pdtype, wdtype, seed = case
    results = {}
    for side in sides(up):
        param = torch.nn.Parameter(exact_values(shape, seed, pdtype), requires_grad=False)
        weight = exact_values(weight_shape, seed + 1, wdtype)
        loader = make_loader(side)
        with CopyTrace() as trace:
            out = run(lambda: loader(param, weight))  # noqa: B023
        results[side.name] = (out, param.detach().clone(), trace.copies)
    (u, u_param, u_copies), (k, k_param, k_copies) = results["upstream"], results["loadkit"]
    diffs = raised_differences(u, k, lambda ue, ke: _error_deviation(ue, ke, shape, weight_shape))
    if not (u.raised or k.raised) and u.value != k.value:
        diffs.append(Difference(f"returned {u.value!r} vs {k.value!r}"))
    if not same_tensor(u_param, k_param):
        diffs.append(Difference(f"parameter after load: {u_param} vs {k_param}"))
    if u_copies != k_copies:
        diffs.append(Difference(f"copies: upstream {u_copies}, loadkit {k_copies}"))
    record(prop, diffs)


@PROPERTY
@given(case=param_and_weight())
def test_default_weight_loader_like_upstream(up, case):
    _compare_load(up, "default_weight_loader", lambda side: side.default_weight_loader, case)


@PROPERTY
@given(case=param_and_weight(), fn=st.sampled_from(sorted(FNS)))
def test_composed_weight_loader_like_upstream(up, case, fn):
    _compare_load(
        up,
        "composed_weight_loader",
        lambda side: side.composed_weight_loader(side.default_weight_loader, FNS[fn]),
        case,
    )


# --- get_numel_loaded ------------------------------------------------------------------------


def _loaders(side):
    default = side.default_weight_loader

    def narrow(param, loaded_weight, rows: int = 1):
        param.data[:rows].copy_(loaded_weight[:rows])

    def twice(param, loaded_weight):
        default(param, loaded_weight)
        default(param, loaded_weight)
        return "twice"

    def nothing(param, loaded_weight):
        return 7

    def elsewhere(param, loaded_weight, scratch=None):
        # Copies into a tensor that is not the parameter: still counted, then capped.
        scratch = torch.empty_like(loaded_weight) if scratch is None else scratch
        scratch.copy_(loaded_weight)
        scratch.copy_(loaded_weight)
        default(param, loaded_weight)

    def broadcast(param, loaded_weight):
        param.data.copy_(loaded_weight.reshape(-1)[0])

    return {
        "default": default,
        "composed": side.composed_weight_loader(default, lambda x: -x),
        "narrow": narrow,
        "twice": twice,
        "nothing": nothing,
        "elsewhere": elsewhere,
        "broadcast": broadcast,
    }


@st.composite
def counting_case(draw):
    kind = draw(st.sampled_from(["default", "composed", "narrow", "twice", "nothing", "elsewhere"]))
    if draw(rare(20)):
        kind = "broadcast"
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple))
    device = draw(st.sampled_from(["cpu", "meta"]))
    keyword = draw(st.booleans())  # param passed by keyword
    return kind, shape, device, keyword, draw(st.integers(0, 20))


@PROPERTY
@given(case=counting_case())
def test_get_numel_loaded_like_upstream(up, case):
    kind, shape, device, keyword, seed = case
    outcomes = {}
    for side, count in (
        (upstream_side(up), up.get_numel_loaded),
        (loadkit_side(), lambda f, a: loadkit.get_numel_loaded(f, a, behaviour="new")),
    ):
        loader = _loaders(side)[kind]
        param = torch.nn.Parameter(
            exact_values(shape, seed, torch.float32).to(device), requires_grad=False
        )
        weight = exact_values(shape, seed + 1, torch.float32).to(device)
        sig = inspect.signature(loader)
        args = sig.bind(param=param, loaded_weight=weight) if keyword else sig.bind(param, weight)
        args.apply_defaults()
        out = run(lambda: count(loader, args))  # noqa: B023
        outcomes[side.name] = (out, param.detach().clone())
    (u, u_param), (k, k_param) = outcomes["upstream"], outcomes["loadkit"]
    diffs: list[Difference] = []
    if u.raised or k.raised:
        if not (u.raised and k.raised and type(u.error) is type(k.error)):
            dev = (
                "counter-broadcast"
                if kind == "broadcast" and isinstance(u.error, AssertionError) and not k.raised
                else None
            )
            diffs.append(Difference(f"upstream {u.describe()}, loadkit {k.describe()}", dev))
    elif u.value != k.value:
        diffs.append(Difference(f"(numel, return): upstream {u.value}, loadkit {k.value}"))
    if device == "cpu" and not (u.raised or k.raised) and not same_tensor(u_param, k_param):
        diffs.append(Difference("parameter values differ"))
    record("get_numel_loaded", diffs)
