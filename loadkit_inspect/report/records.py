"""The model sections of an inspect report: plain records (dataclasses), torch-free.

``ModelSummary`` and ``LoadReport`` (each checkpoint key's fate, and what went wrong) are filled
in by ``loadkit_inspect.simulate``, which needs torch; the header sections are in
``loadkit_inspect.report.summary``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from loadkit.fmt import plural
from loadkit.terms import CLEAN_STATUSES, KEY_STATUSES, Status
from loadkit_inspect.options import LoadRules

# --- the model sections (filled in by the dry load) ----------------------------------------


@dataclass
class ModelSummary:
    spec: str
    cls: str
    parameters: int  # parameters and persistent buffers, tied names counted once
    nbytes: int
    has_own_load_weights: bool
    pooling: bool = False  # a pooling model (``is_pooling_model``): its loader probes a prefix
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
            "pooling": self.pooling,
            "backend": self.backend,
        }


@dataclass
class KeyOutcome:
    """The fate of one checkpoint key in the simulated load."""

    name: str
    status: Status
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
    shape: tuple[int, ...] | None = None  # the checkpoint tensor's
    dtype: str | None = None


@dataclass
class Missing:
    name: str  # model parameter or persistent buffer
    shape: tuple[int, ...]
    dtype: str
    suggestions: list[str] = field(default_factory=list)  # nearest unused checkpoint keys
    allowed: str | None = None  # the --allow-missing pattern that lets it stay unfilled
    # the checkpoint key that would have filled it, had a mapper rule not dropped it, and the rule
    dropped_key: str | None = None
    dropped_by: str | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


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
class CastGroup:
    """Every cast from one dtype into another: one line of the dtype summary."""

    from_dtype: str
    to_dtype: str
    incompatible: bool
    keys: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "from_dtype": self.from_dtype,
            "to_dtype": self.to_dtype,
            "tensors": len(self.keys),
            "incompatible": self.incompatible,
            "keys": self.keys,
        }


class UnmatchedPattern(NamedTuple):
    """A rule's pattern that matched no name it could apply to, in either spelling."""

    option: str  # the command-line flag: --skip-prefix, --allow-missing...
    rule: str  # the LoadRules field: skip_prefixes, allow_missing...
    pattern: str

    def message(self) -> str:
        over = {
            "skip_prefixes": "no checkpoint key (by its checkpoint name or its name after the "
            "mapper): it skips nothing",
            "ignore_unexpected_prefixes": _NO_PLACE,
            "ignore_unexpected_suffixes": _NO_PLACE,
            "allow_missing": "no missing model tensor (by its model name or the checkpoint name "
            "it would be loaded from): it allows nothing",
        }[self.rule]
        return f"{self.option} {self.pattern!r} matched {over}"

    def as_dict(self) -> dict[str, str]:
        return {
            "option": self.option,
            "rule": self.rule,
            "pattern": self.pattern,
            "message": self.message(),
        }


_NO_PLACE = (
    "no key the model has no place for (by its checkpoint name or its name after the mapper): "
    "it ignores nothing"
)


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
    notes: list[str] = field(default_factory=list)  # searches that were shortened, and why
    rules: LoadRules = field(default_factory=LoadRules)  # --allow-missing, --strict-dtype, ...
    # Patterns of ``rules`` that matched nothing, in either spelling: a warning, never a failure
    unmatched_patterns: list[UnmatchedPattern] = field(default_factory=list)

    @property
    def failing_missing(self) -> list[Missing]:
        """Missing tensors that no ``allow_missing`` pattern allows."""
        return [m for m in self.missing if m.allowed is None]

    def failed_tensors(self) -> tuple[int, int]:
        """Model tensors neither filled nor missing, because loading a key into them raised:
        ``(shape mismatch, other load error)``. With ``filled`` and ``missing`` they add up to
        ``model_tensors``."""
        failed = self.model_tensors - self.filled - len(self.missing)
        mismatched = min(failed, len({s.param for s in self.shape_mismatches if s.param}))
        return mismatched, failed - mismatched

    @property
    def failing_casts(self) -> list[DtypeCast]:
        """Casts that fail the load: incompatible ones, or all with ``strict_dtype``."""
        return [d for d in self.dtype_casts if d.incompatible or self.rules.strict_dtype]

    def cast_groups(self) -> list[CastGroup]:
        """The casts grouped by (from, to), largest group first."""
        groups: dict[tuple[str, str], CastGroup] = {}
        for d in self.dtype_casts:
            g = groups.setdefault(
                (d.from_dtype, d.to_dtype), CastGroup(d.from_dtype, d.to_dtype, d.incompatible)
            )
            g.keys.append(d.name)
        return sorted(groups.values(), key=lambda g: (-len(g.keys), g.from_dtype, g.to_dtype))

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = dict.fromkeys(KEY_STATUSES, 0)
        for k in self.keys:
            out[k.status] = out.get(k.status, 0) + 1
        return out

    @property
    def clean(self) -> bool:
        return self.clean_but_missing and not self.failing_missing

    @property
    def clean_but_missing(self) -> bool:
        """Clean, unless tensors are missing: every key placed, no cast refused, the load
        complete (a loader that does not check every tensor goes through)."""
        return (
            self.complete
            and self.failure is None
            and all(k.status in CLEAN_STATUSES for k in self.keys)
            and not self.failing_casts
        )

    def problems(self) -> list[str]:
        c = self.counts()
        out = [
            f"{c[s]} {s}"
            for s in (
                Status.UNEXPECTED,
                Status.SHAPE_MISMATCH,
                Status.LOAD_ERROR,
                Status.UNCONSUMED,
            )
            if c[s]
        ]
        if self.failing_missing:
            n = len(self.failing_missing)
            out.append(f"{plural(n, 'model tensor')} never filled")
        bad = sum(d.incompatible for d in self.dtype_casts)
        if bad:
            out.append(plural(bad, "incompatible dtype cast"))
        if self.rules.strict_dtype and len(self.dtype_casts) > bad:
            n = len(self.dtype_casts) - bad
            out.append(f"{plural(n, 'dtype cast')} (--strict-dtype)")
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
                    "missing_allowed": len(self.missing) - len(self.failing_missing),
                    "mismatched": self.failed_tensors()[0],
                    "load_error": self.failed_tensors()[1],
                },
            },
            "keys": [_drop_none(vars(k)) for k in self.keys],
            "unexpected": [
                {**vars(u), "shape": None if u.shape is None else list(u.shape)}
                for u in self.unexpected
            ],
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
            "dtype_summary": [g.as_dict() for g in self.cast_groups()],
            "errors": [_drop_none(vars(e)) for e in self.errors],
            "runs": self.runs,
            "complete": self.complete,
            "failure": self.failure,
            "notes": self.notes,
            "rules": self.rules.as_dict(),
            "unmatched_patterns": [u.as_dict() for u in self.unmatched_patterns],
        }


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}
