"""What every differential property shares: the two sides, outcomes, and the tally.

A property builds the same case twice, once from upstream's definitions and once from loadkit's,
runs both, and lists every difference it sees. A difference either matches one of the deviations
in ``DEVIATIONS`` (each is a row of the README table and is pinned by a test in
``test_deviations.py``), checked by a classifier for exactly that situation, or it is unexplained:
then the example fails (unless ``LOADKIT_UPSTREAM_CENSUS=1``, which only counts, to measure how
far apart the two are).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import settings

EXAMPLES = int(os.environ.get("LOADKIT_UPSTREAM_EXAMPLES", "1000"))
CENSUS = os.environ.get("LOADKIT_UPSTREAM_CENSUS") == "1"

# Every property runs this many examples, derandomized (the tests/conftest.py profile).
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, database=None)

# Each deliberate deviation: a short id -> the README row's first column.
DEVIATIONS = {
    "caller-lists": "the caller's skip/ignore lists are never changed",
    "errors": "errors are loadkit.errors ValueErrors naming parameter, key and shapes",
    "error-messages": "an unknown name lists the nearest names, not every parameter",
    "mapper-build": "bad mapper rules fail when the mapper is built",
    "stacked-none": "a stacked rule may map to None (drop)",
    "str-regex": "orig_to_new_regex keys may be strings",
    "nan-fill": "reload fills what no load reached with NaN, not uninitialised memory",
    "bias-on-meta": "reload puts a parameter named bias on meta like any other",
    "late-load": "reload drops every load for a finalised layer",
    "tied-reload": "reload refuses tied parameters",
    "counter-broadcast": "copy counting accepts broadcasting copies",
}


@dataclass(frozen=True)
class Side:
    """One implementation of the loading surface."""

    name: str
    WeightsMapper: Any
    AutoWeightsLoader: Any
    default_weight_loader: Callable
    composed_weight_loader: Callable


def loadkit_side() -> Side:
    import loadkit

    return Side(
        "loadkit",
        loadkit.WeightsMapper,
        loadkit.AutoWeightsLoader,
        loadkit.default_weight_loader,
        loadkit.composed_weight_loader,
    )


def upstream_side(up) -> Side:
    return Side(
        "upstream",
        up.WeightsMapper,
        up.AutoWeightsLoader,
        up.default_weight_loader,
        up.composed_weight_loader,
    )


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


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shape, dtype and values, NaN where the other has NaN."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
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


# --- differences and the tally ------------------------------------------------------------------


@dataclass
class Difference:
    what: str
    deviation: str | None = None  # a DEVIATIONS key when this difference is a documented one

    def __post_init__(self) -> None:
        if self.deviation is not None and self.deviation not in DEVIATIONS:
            raise KeyError(self.deviation)


@dataclass
class PropertyTally:
    run: int = 0
    identical: int = 0
    documented: int = 0  # differed only by documented deviations
    unexplained: int = 0
    by_deviation: dict[str, int] = field(default_factory=dict)
    first_unexplained: list[str] = field(default_factory=list)


TALLY: dict[str, PropertyTally] = {}


def record(prop: str, diffs: list[Difference]) -> None:
    """Count one example of ``prop``; fail it on an unexplained difference (unless census)."""
    t = TALLY.setdefault(prop, PropertyTally())
    t.run += 1
    unexplained = [d for d in diffs if d.deviation is None]
    if not diffs:
        t.identical += 1
    elif not unexplained:
        t.documented += 1
    else:
        t.unexplained += 1
        if len(t.first_unexplained) < 5:
            t.first_unexplained.append("; ".join(d.what for d in unexplained))
    for dev in sorted({d.deviation for d in diffs if d.deviation}):
        t.by_deviation[dev] = t.by_deviation.get(dev, 0) + 1
    if unexplained and not CENSUS:
        raise AssertionError(
            "loadkit and vLLM 0.28.0 differ:\n" + "\n".join(f"- {d.what}" for d in unexplained)
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
