"""Shard tracking of the packed tensor-parallel layers against vLLM 0.34.0's own methods.

vLLM 0.34.0's ``StackedColumnParallelLinear`` (``layers/linear.py``: the base of
``MergedColumnParallelLinear`` and ``QKVParallelLinear``) records which shards each parameter
received (``validate_shard_id(shard_id, param)``) and names the ones a load never filled
(``pop_missing_shards()``), which ``track_weights_loading`` reports as ``"{name}.{shard}"``. The
layers themselves need a GPU build of vLLM; their tracking needs none. The harness compiles those
classes from the wheel's source with only the tracking methods in their bodies
(``validate_shard_id``, ``pop_missing_shards``, ``_get_shard_size_mapping``, the stacked
``__init__``), on a stand-in base class, and gives each the sizes of a loadkit layer built for
one rank of a simulated group. A generated sequence of loads (shard ids valid, ``None``, a tuple,
unknown; into the weight or the bias; or into a parameter of no layer) runs on both: whether each
call raises, and what ``pop_missing_shards`` returns afterwards and the second time.
"""

from __future__ import annotations

import ast

import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from loadkit.errors import ShardIdError
from loadkit.parallel import MergedColumnParallelLinear, QKVParallelLinear
from loadkit.parallel.state import stand_in_group, use_group
from upstream.common import PROPERTY, Difference, record, run
from upstream.harness import _compile

CLASSES = {
    "StackedColumnParallelLinear": ("__init__", "validate_shard_id", "pop_missing_shards"),
    "MergedColumnParallelLinear": ("validate_shard_id", "_get_shard_size_mapping"),
    "QKVParallelLinear": ("_get_shard_size_mapping",),
}


_COMPILED: dict[str, dict[str, type]] = {}


def upstream_layers(up) -> dict[str, type]:
    """The three classes, their tracking methods compiled from the wheel's ``linear.py`` (once
    per version)."""
    if up.version not in _COMPILED:
        _COMPILED[up.version] = _compile_layers(up)
    return _COMPILED[up.version]


def _compile_layers(up) -> dict[str, type]:
    path = up.src / "vllm" / "model_executor" / "layers" / "linear.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    body = []
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name in CLASSES:
            keep = CLASSES[stmt.name]
            stmt.body = [f for f in stmt.body if isinstance(f, ast.FunctionDef) and f.name in keep]
            missing = set(keep) - {f.name for f in stmt.body}
            assert not missing, (stmt.name, missing)
            body.append(stmt)
    assert len(body) == len(CLASSES)

    class ColumnParallelLinear(nn.Module):  # the stand-in base: holds what a test gives it
        def __init__(self, *args, **kwargs):
            super().__init__()

    namespace = {"ColumnParallelLinear": ColumnParallelLinear, "Any": object}
    namespace.update(Parameter=nn.Parameter, torch=torch)
    exec(_compile(ast.Module(body=body, type_ignores=[]), path, up.root), namespace)
    return {name: namespace[name] for name in CLASSES}


def _twin(up, ours: nn.Module) -> nn.Module:
    """Upstream's class for ``ours``, with its sizes and parameters (the same objects)."""
    cls = upstream_layers(up)[type(ours).__name__]
    theirs = cls()
    for attr in ("tp_size", "tp_rank", "output_sizes", "shard_ids", "num_heads", "num_kv_heads",
                 "head_size", "v_head_size"):  # fmt: skip
        if hasattr(ours, attr):
            setattr(theirs, attr, getattr(ours, attr))
    for name, p in ours.named_parameters(recurse=False):
        theirs.register_parameter(name, p)
    return theirs


@st.composite
def layers(draw):
    tp = draw(st.sampled_from([1, 2, 4]))
    rank = draw(st.integers(0, tp - 1))
    bias = draw(st.booleans())
    with use_group(stand_in_group(rank, tp)):
        if draw(st.booleans()):
            sizes = draw(st.lists(st.sampled_from([4, 8, 12]), min_size=2, max_size=3))
            return MergedColumnParallelLinear(4, sizes, bias=bias, params_dtype=torch.float32)
        heads = draw(st.sampled_from([4, 8]))
        kv = draw(st.sampled_from([1, 2, 4, heads]))
        v_head = draw(st.sampled_from([None, 2]))
        return QKVParallelLinear(
            8, 2, heads, kv, bias=bias, params_dtype=torch.float32, v_head_size=v_head
        )


@st.composite
def loads(draw, layer):
    ids = list(layer.shard_ids)
    extra = [None, "z", 7] + ([(0, 1), (1, 0)] if isinstance(ids[0], int) else [("q", "k")])
    params = [n for n, _ in layer.named_parameters(recurse=False)] + ["elsewhere"]
    steps = st.tuples(st.sampled_from(params), st.sampled_from(ids * 3 + extra))
    return draw(st.lists(steps, max_size=6))


def _compare_call(u, k, what: str, shard) -> Difference | None:
    """One ``validate_shard_id`` call on both sides; ``None`` when they agree."""
    if u.raised == k.raised and not (u.raised and type(u.error) is not type(k.error)):
        return None
    text = f"{what}: upstream {u.describe()}, loadkit {k.describe()}"
    if isinstance(shard, tuple) and not u.raised and isinstance(k.error, ShardIdError):
        return Difference(text, "shard-tuple")  # a span of merged shards: refused here
    if u.raised and isinstance(k.error, ShardIdError) and type(u.error) is ValueError:
        return Difference(text, "errors")  # loadkit's ValueError names the layer
    return Difference(text)


@PROPERTY
@given(data=st.data())
def test_shard_tracking_like_upstream(up, data):
    ours = data.draw(layers())
    theirs = _twin(up, ours)
    stray = nn.Parameter(torch.zeros(1), requires_grad=False)  # no layer's parameter
    diffs: list[Difference] = []
    spans = False  # a tuple upstream took: its record then holds shards loadkit refused
    for name, shard in data.draw(loads(ours)):
        param = stray if name == "elsewhere" else getattr(ours, name)
        u = run(lambda: theirs.validate_shard_id(shard, param))  # noqa: B023
        k = run(lambda: ours.validate_shard_id(shard, param))  # noqa: B023
        diff = _compare_call(u, k, f"{name} {shard!r}", shard)
        if diff is not None:
            spans |= diff.deviation == "shard-tuple"
            diffs.append(diff)
    for when in ("after the loads", "popped again"):
        u_missing, k_missing = theirs.pop_missing_shards(), ours.pop_missing_shards()
        if u_missing != k_missing:
            dev = "shard-tuple" if spans else None
            diffs.append(Difference(f"{when}: upstream {u_missing}, loadkit {k_missing}", dev))
    record("shard tracking (StackedColumnParallelLinear)", diffs, type(ours).__name__)


def test_the_harness_runs_the_wheels_methods(up):
    cls = upstream_layers(up)["StackedColumnParallelLinear"]
    assert cls.pop_missing_shards.__code__.co_filename.endswith("layers/linear.py")
    with use_group(stand_in_group(1, 2)):
        layer = QKVParallelLinear(8, 2, 4, 2, bias=False, params_dtype=torch.float32)
    twin = _twin(up, layer)
    twin.validate_shard_id("q", layer.weight)
    assert twin.pop_missing_shards() == ["weight.k", "weight.v"]
