"""What every differential property shares: the two sides, the stream both load, outcomes and
their differences, and the tally.

A property builds the same case twice, once from upstream's definitions and once from loadkit's,
runs both, and lists every difference it sees. A difference either matches one of the deviations
in ``DEVIATIONS`` (each is a row of the table in docs/fidelity.md and is pinned by a test in
``test_deviations.py``), checked by a classifier for exactly that situation, or it is
unexplained: then the example fails (unless ``LOADKIT_UPSTREAM_CENSUS=1``, which only counts,
to measure how far apart the two are).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from loadkit.errors import NestedWeightError, ShapeMismatchError, UnknownNameError, WeightLoadError

EXAMPLES = int(os.environ.get("LOADKIT_UPSTREAM_EXAMPLES", "1000"))
CENSUS = os.environ.get("LOADKIT_UPSTREAM_CENSUS") == "1"

# Every property runs this many examples, derandomized (the tests/conftest.py profile).
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, database=None)

# Each deliberate deviation: a short id -> its row in docs/fidelity.md, in short.
DEVIATIONS = {
    "caller-lists": "the caller's skip/ignore lists are never changed",
    "dtype-log": "no log line for a weight of another dtype than its parameter",
    "embedding-class": "an nn.Embedding is a vocabulary embedding for the tied-alias skip",
    "shard-tuple": "a tuple shard id (a span of a merged layer's shards) is refused",
    "errors": "errors are loadkit.errors ValueErrors naming parameter, key and shapes",
    "error-messages": "an unknown name lists the nearest names, not every parameter",
    "mapper-build": "bad mapper rules fail when the mapper is built",
    "stacked-none": "a stacked rule may map to None (drop)",
    "str-regex": "orig_to_new_regex keys may be strings",
    "stale-fill": "before 0.34.0, reload fills what no load wrote with a chosen value",
    "bias-on-meta": "reload puts a parameter named bias on meta like any other",
    "late-load": "reload drops every load for a finalised layer",
    "tied-reload": "reload refuses tied parameters",
    "counter-broadcast": "copy counting accepts broadcasting copies",
    "failed-load": "reload does not replay a load whose loader raised",
    "bn-stats": "BatchNorm running statistics reload through AutoWeightsLoader",
}


@dataclass(frozen=True)
class Side:
    """One implementation of the loading surface."""

    name: str
    WeightsMapper: Any
    AutoWeightsLoader: Any
    default_weight_loader: Callable
    composed_weight_loader: Callable
    VocabEmbedding: Any  # the class AutoWeightsLoader takes for a word embedding


def loadkit_side(*, skip_lists: bool = False) -> Side:
    """loadkit's surface; ``skip_lists``: with vLLM 0.28.0's skip-list ``AutoWeightsLoader``
    (bug 2's, ``loadkit.models.plamo2.skips``)."""
    import loadkit
    from loadkit.loading.tensors import VocabEmbedding
    from loadkit.models.plamo2.skips import AutoWeightsLoaderWithSkips

    return Side(
        "loadkit",
        loadkit.WeightsMapper,
        AutoWeightsLoaderWithSkips if skip_lists else loadkit.AutoWeightsLoader,
        loadkit.default_weight_loader,
        loadkit.composed_weight_loader,
        VocabEmbedding,
    )


def upstream_side(up) -> Side:
    return Side(
        "upstream",
        up.WeightsMapper,
        up.AutoWeightsLoader,
        up.default_weight_loader,
        up.composed_weight_loader,
        up.module("model_executor.layers.vocab_parallel_embedding").VocabParallelEmbedding,
    )


def sides(up, *, skip_lists: bool = False) -> tuple[Side, Side]:
    """Upstream's side, then loadkit's: the order every property runs them in (``skip_lists``:
    loadkit's skip-list loader, for vLLM 0.28.0)."""
    return upstream_side(up), loadkit_side(skip_lists=skip_lists)


# --- outcomes ----------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What a call did: its value, or the exception it raised."""

    value: Any = None
    error: BaseException | None = None

    @property
    def raised(self) -> bool:
        return self.error is not None

    def describe(self) -> str:
        if self.error is None:
            return f"returned {self.value!r}"
        return f"raised {type(self.error).__name__}: {self.error}"


def run(fn: Callable[[], Any]) -> Outcome:
    try:
        return Outcome(value=fn())
    except Exception as exc:  # the comparison decides which exceptions are equivalent
        return Outcome(error=exc)


class Counted:
    """An iterator over ``items`` that counts how many were pulled (laziness is compared)."""

    def __init__(self, items: Iterable[Any]) -> None:
        self._it = iter(items)
        self.pulled = 0

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        item = next(self._it)
        self.pulled += 1
        return item


def stream(
    entries: Iterable[tuple[str, tuple[int, ...], torch.dtype]], prefix: str = ""
) -> Counted:
    """A checkpoint stream of ``entries`` (name, shape, dtype), each name after ``prefix``, each
    value ``exact_values`` seeded by its position: the same stream for both sides."""
    return Counted(
        (prefix + name, exact_values(shape, 100 + i, dtype))
        for i, (name, shape, dtype) in enumerate(entries)
    )


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shape, dtype and values, NaN where the other has NaN."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_meta or b.is_meta:  # left on meta by a reload that failed: no values to compare
        return a.is_meta == b.is_meta
    a, b = a.detach(), b.detach()
    if a.is_floating_point():
        nan_a, nan_b = a.isnan(), b.isnan()
        return torch.equal(nan_a, nan_b) and torch.equal(a[~nan_a], b[~nan_b])
    return torch.equal(a, b)


def all_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer under every name (tied names too)."""
    out = {n: p.detach() for n, p in model.named_parameters(remove_duplicate=False)}
    out.update({n: b.detach() for n, b in model.named_buffers(remove_duplicate=False)})
    return out


@st.composite
def rare(draw, p: int = 30) -> bool:
    """True about once in ``p`` draws: inputs that only show a documented deviation stay rare.

    A middle value, not 0: hypothesis draws the ends of a range far more often than 1 in ``p``.
    """
    return draw(st.integers(0, p - 1)) == p // 2


def exact_values(shape: tuple[int, ...], seed: int, dtype: torch.dtype) -> torch.Tensor:
    """Distinct small multiples of 1/8: exact in every float dtype the tests use."""
    n = 1
    for d in shape:
        n *= d
    flat = (torch.arange(n, dtype=torch.float64) * 3 + seed * 17) % 251 - 125
    return (flat / 8).reshape(shape).to(dtype)


class CopyTrace(TorchDispatchMode):
    """Every ``aten.copy_`` as (destination shape, source shape): the tests' own counter."""

    def __init__(self) -> None:
        super().__init__()
        self.copies: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.copy_.default:
            self.copies.append((tuple(args[0].shape), tuple(args[1].shape)))
        return func(*args, **(kwargs or {}))


# --- differences and the tally ------------------------------------------------------------------


@dataclass
class Difference:
    what: str
    deviation: str | None = None  # a DEVIATIONS key when this difference is a documented one

    def __post_init__(self) -> None:
        if self.deviation is not None and self.deviation not in DEVIATIONS:
            raise KeyError(self.deviation)


def error_deviation(u: BaseException, k: BaseException) -> str | None:
    """The deviation that explains upstream raising ``u`` where loadkit raised ``k``, if any:
    loadkit's error classes for upstream's bare ones, and its shorter unknown-name messages."""
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


def raised_differences(
    u: Outcome,
    k: Outcome,
    classify: Callable[[BaseException, BaseException], str | None] = error_deviation,
    what: str = "",
) -> list[Difference]:
    """Where either side raised: a difference unless both raised the same exception type;
    different types may be a deviation ``classify`` names. Nothing when neither raised (the
    caller compares values then). ``what`` labels the call in the message."""
    if not (u.raised or k.raised):
        return []
    text = f"{what}upstream {u.describe()}; loadkit {k.describe()}"
    if not (u.raised and k.raised):
        return [Difference(text)]
    assert u.error is not None and k.error is not None
    if type(u.error) is not type(k.error):
        return [Difference(text, classify(u.error, k.error))]
    return []


def tensor_differences(
    u_model: torch.nn.Module,
    k_model: torch.nn.Module,
    classify: Callable[[str, torch.Tensor, torch.Tensor], str | None] = lambda n, u, k: None,
) -> list[Difference]:
    """Every tensor (``all_tensors``) whose values differ between the two models; ``classify``
    (name, upstream's, loadkit's) may name the deviation that explains it."""
    ut, kt = all_tensors(u_model), all_tensors(k_model)
    return [
        Difference(
            f"tensor {name}: upstream {ut[name]}, loadkit {kt[name]}",
            classify(name, ut[name], kt[name]),
        )
        for name in ut
        if not same_tensor(ut[name], kt[name])
    ]


@dataclass
class PropertyTally:
    run: int = 0
    identical: int = 0
    documented: int = 0  # differed only by documented deviations
    unexplained: int = 0
    by_deviation: dict[str, int] = field(default_factory=dict)
    first_unexplained: list[str] = field(default_factory=list)
    first_documented: list[str] = field(default_factory=list)


TALLY: dict[str, PropertyTally] = {}


def record(prop: str, diffs: list[Difference], context: str = "") -> None:
    """Count one example of ``prop``; fail it on an unexplained difference (unless census)."""
    t = TALLY.setdefault(prop, PropertyTally())
    t.run += 1
    unexplained = [d for d in diffs if d.deviation is None]
    if not diffs:
        t.identical += 1
    elif not unexplained:
        t.documented += 1
        if len(t.first_documented) < int(os.environ.get("LOADKIT_UPSTREAM_SHOW_DOCUMENTED", "0")):
            t.first_documented.append("; ".join(d.what for d in diffs)[:400])
    else:
        t.unexplained += 1
        if len(t.first_unexplained) < int(os.environ.get("LOADKIT_UPSTREAM_SHOW", "5")):
            text = "; ".join(d.what for d in unexplained) + (f" [{context}]" if context else "")
            width = int(os.environ.get("LOADKIT_UPSTREAM_WIDTH", "400"))
            t.first_unexplained.append(text if len(text) < width else text[:width] + " ...")
    for dev in sorted({d.deviation for d in diffs if d.deviation}):
        t.by_deviation[dev] = t.by_deviation.get(dev, 0) + 1
    if unexplained and not CENSUS:
        raise AssertionError(
            f"loadkit and vLLM differ ({prop}):\n" + "\n".join(f"- {d.what}" for d in unexplained)
        )


def tally_table() -> str:
    lines = [
        "| property | examples run | identical | differing only by documented deviations "
        "| unexplained |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for prop, t in sorted(TALLY.items()):
        devs = ", ".join(f"{k} {v}" for k, v in sorted(t.by_deviation.items()))
        lines.append(
            f"| {prop} | {t.run} | {t.identical} | {t.documented}"
            + (f" ({devs})" if devs else "")
            + f" | {t.unexplained} |"
        )
    return "\n".join(lines)


def tally_json() -> str:
    return json.dumps({k: vars(v) for k, v in sorted(TALLY.items())}, indent=1)
