"""The load section of an inspect report: each checkpoint key's fate, and what went wrong.

Filled in by ``loadkit.inspection.simulate`` (which needs torch); these plain records do not, so
a report can be rendered and serialised anywhere. Imported only when a model is inspected.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Fates of a checkpoint key in a simulated load; the first five are the ledger's own words.
LOADED = "loaded"
SKIPPED = "skipped"
IGNORED = "ignored"
DROPPED = "dropped by mapper"
DELEGATED = "delegated"
UNCONSUMED = "unconsumed"
UNEXPECTED = "unexpected"
SHAPE_MISMATCH = "shape mismatch"
LOAD_ERROR = "load error"
CLEAN_STATUSES = (LOADED, SKIPPED, IGNORED, DROPPED, DELEGATED)
KEY_STATUSES = (*CLEAN_STATUSES, UNCONSUMED, UNEXPECTED, SHAPE_MISMATCH, LOAD_ERROR)


@dataclass
class ModelSummary:
    spec: str
    cls: str
    parameters: int  # parameters and persistent buffers, tied names counted once
    nbytes: int
    has_own_load_weights: bool
    # What a model built from a config says about itself (``--model hf``: the wrapper, the
    # transformers class, why that wrapper); ``None`` for other models.
    backend: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "class": self.cls,
            "tensors": self.parameters,
            "bytes": self.nbytes,
            "own_load_weights": self.has_own_load_weights,
            "backend": self.backend,
        }


@dataclass
class KeyOutcome:
    """The fate of one checkpoint key in the simulated load."""

    name: str
    status: str
    mapped: str | None = None  # the name after the mapper (what the loader looked up)
    target: str | None = None  # the parameter it filled, or the module it was handed to
    rule: str | None = None  # the skip/ignore/mapper rule that disposed of it
    message: str | None = None


@dataclass
class Unexpected:
    name: str  # checkpoint key
    looked_up: str  # the name the model was asked for (mapped, possibly re-prefixed)
    message: str
    suggestions: list[str] = field(default_factory=list)  # nearest model tensors


@dataclass
class Missing:
    name: str  # model parameter or persistent buffer
    shape: tuple[int, ...]
    dtype: str
    suggestions: list[str] = field(default_factory=list)  # nearest unused checkpoint keys


@dataclass
class ShapeMismatch:
    name: str  # checkpoint key
    param: str | None
    param_shape: tuple[int, ...] | None
    weight_shape: tuple[int, ...]
    message: str


@dataclass
class DtypeCast:
    name: str  # checkpoint key
    param: str
    from_dtype: str
    to_dtype: str
    incompatible: bool  # float into an integer/bool parameter, or integer into bool


@dataclass
class LoadReport:
    keys: list[KeyOutcome]
    missing: list[Missing]
    unexpected: list[Unexpected]
    shape_mismatches: list[ShapeMismatch]
    dtype_casts: list[DtypeCast]
    errors: list[KeyOutcome]  # keys whose load raised something other than a shape mismatch
    model_tensors: int
    filled: int
    runs: int  # simulated passes (one more per name that stopped a pass)
    complete: bool = True  # False: too many failing names, the rest was not simulated
    failure: str | None = None  # the load raised with no key to blame (after the last weight)

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(KEY_STATUSES, 0)
        for k in self.keys:
            out[k.status] = out.get(k.status, 0) + 1
        return out

    @property
    def clean(self) -> bool:
        return (
            self.complete
            and self.failure is None
            and all(k.status in CLEAN_STATUSES for k in self.keys)
            and not self.missing
            and not any(c.incompatible for c in self.dtype_casts)
        )

    def problems(self) -> list[str]:
        c = self.counts()
        out = [f"{c[s]} {s}" for s in (UNEXPECTED, SHAPE_MISMATCH, LOAD_ERROR, UNCONSUMED) if c[s]]
        if self.missing:
            out.append(f"{len(self.missing)} model tensor(s) never filled")
        bad = sum(d.incompatible for d in self.dtype_casts)
        if bad:
            out.append(f"{bad} incompatible dtype cast(s)")
        if not self.complete:
            out.append("simulation stopped early")
        if self.failure is not None:
            out.append(self.failure)
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "clean": self.clean,
            "problems": self.problems(),
            "counts": {
                "checkpoint": self.counts(),
                "model": {
                    "tensors": self.model_tensors,
                    "filled": self.filled,
                    "missing": len(self.missing),
                },
            },
            "keys": [_drop_none(vars(k)) for k in self.keys],
            "unexpected": [vars(u) for u in self.unexpected],
            "missing": [{**vars(m), "shape": list(m.shape)} for m in self.missing],
            "shape_mismatches": [
                {
                    **vars(s),
                    "param_shape": None if s.param_shape is None else list(s.param_shape),
                    "weight_shape": list(s.weight_shape),
                }
                for s in self.shape_mismatches
            ],
            "dtype_casts": [vars(d) for d in self.dtype_casts],
            "errors": [_drop_none(vars(e)) for e in self.errors],
            "runs": self.runs,
            "complete": self.complete,
            "failure": self.failure,
        }


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}
