"""The model sections of an inspect report: plain records (dataclasses), their JSON and their
text, torch-free.

``ModelSummary`` and ``LoadReport`` (each checkpoint key's fate, and what went wrong) are filled
in by ``loadkit_inspect.simulate``, which needs torch; the header sections are in
``loadkit_inspect.report.summary``.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from loadkit.errors import printable
from loadkit.fmt import format_bytes, plural
from loadkit.terms import CLEAN_STATUSES, KEY_STATUSES, Status
from loadkit_inspect.casts import kind
from loadkit_inspect.options import LoadRules
from loadkit_inspect.report.text import capped, joined_names, shapes

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

    def render(self) -> list[str]:
        """The model section's text: what was built, and how it loads."""
        own = "its own load_weights" if self.has_own_load_weights else "AutoWeightsLoader"
        lines = [
            f"model  {printable(self.spec)}: {self.cls}, {plural(self.parameters, 'tensor')}, "
            f"{format_bytes(self.nbytes)} (built on meta: no memory used); loads with {own}",
        ]
        return lines + (_backend(self.backend) if self.backend else [])


def _backend(b: dict[str, Any]) -> list[str]:
    """A model built from a Hugging Face config: what transformers built, and why this wrapper."""
    lines = [
        f"  transformers {b.get('transformers_version', '?')} built "
        f"{b.get('transformers_class')} (model_type {b.get('model_type')!r}) as self.model",
    ]
    if b.get("config"):
        lines.append(f"  config  {printable(str(b['config']))}")
    if b.get("wrapper_reason"):
        lines.append(f"  wrapper {b.get('wrapper')}: {b['wrapper_reason']}")
    return lines


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


# --- the load section's text ------------------------------------------------------------------


def render_load(
    load: LoadReport,
    limit: int,
    *,
    explained_keys: Collection[str] = (),
    explained_tensors: Collection[str] = (),
    majority: str | None = None,
    loader: str = "",
) -> list[str]:
    """The load section's text, each list capped at ``limit`` rows. The unexpected keys and
    missing tensors a suggested fix explains are said to be, and left out of the lists;
    ``majority``: the checkpoint's most common dtype (as torch names it); ``loader``: the
    loader the section is about (``"vllm loader: "`` beside another loader's section)."""
    c = load.counts()
    passes = plural(load.runs, "pass", "passes")
    lines = [
        f"load  ({loader}simulated on the meta device, {passes})",
        f"  checkpoint {plural(len(load.keys), 'key')}: "
        + ", ".join(f"{n} {s}" for s, n in c.items() if n),
        _model_counts(load),
    ]
    if not load.complete:
        lines.append("  stopped early: too many failing names; the rest was not simulated")
    if load.failure:
        lines.append(f"  load failed: {printable(load.failure)}")
    unexpected = [u for u in load.unexpected if u.looked_up not in explained_keys]
    lines += _titled(
        "unexpected names",
        _unexpected_rows(unexpected[:limit]),  # 200,000 of them: only the shown ones spelled
        len(load.unexpected),
        limit,
        len(load.unexpected) - len(unexpected),
        listed=len(unexpected),
    )
    missing = [m for m in load.missing if m.name not in explained_tensors]
    lines += _titled(
        "missing: model tensors never filled",
        _missing_rows(missing[:limit]),
        len(load.missing),
        limit,
        len(load.missing) - len(missing),
        listed=len(missing),
    )
    lines += _titled("shape mismatches", _mismatch_rows(load), len(load.shape_mismatches), limit)
    casts = _cast_rows(load, majority)
    lines += _titled("dtype casts, by (from, to)", casts, len(load.dtype_casts), limit)
    if load.errors:
        rows = [f"    {printable(e.name)}: {printable(e.message or '')}" for e in load.errors]
        lines += _titled("load errors", rows, len(load.errors), limit)
    lines += _other_keys(load, limit)
    return lines + [f"  note: {printable(n)}" for n in load.notes]


def _model_counts(load: LoadReport) -> str:
    """Every model tensor counted once: filled, missing, or its key's load raised."""
    allowed = len(load.missing) - len(load.failing_missing)
    mismatched, errored = load.failed_tensors()
    return (
        f"  model {plural(load.model_tensors, 'tensor')}: {load.filled} filled, "
        f"{len(load.missing)} missing"
        + (f" ({allowed} allowed by --allow-missing)" if allowed else "")
        + (f", {mismatched} mismatched" if mismatched else "")
        + (f", {plural(errored, 'load error')}" if errored else "")
    )


def _titled(
    title: str, rows: list[str], total: int, limit: int, fixed: int = 0, listed: int | None = None
) -> list[str]:
    """A titled list of the load section, capped at ``limit`` rows; ``fixed`` of the ``total``
    are explained by the suggested fix (and left out of ``rows``); ``listed``: how many rows
    there are when ``rows`` holds only the first ``limit`` of them."""
    head = f"  {title} ({total})" + ("" if total else ": none")
    if fixed:
        head += f": {fixed} explained by the suggested fix, above"
        head += "" if fixed == total else "; the others:"
    return [head, *capped(rows, len(rows) if listed is None else listed, limit)]


def _unexpected_rows(unexpected: list[Unexpected]) -> list[str]:
    return [
        f"    {printable(u.name)}"
        + (f"  {list(u.shape)} {u.dtype}" if u.shape is not None else "")
        + (f"  (looked up as '{printable(u.looked_up)}')" if u.looked_up != u.name else "")
        + (f"\n      nearest: {joined_names(u.suggestions)}" if u.suggestions else "")
        + f"\n      {printable(u.message)}"
        for u in unexpected
    ]


def _missing_rows(missing: list[Missing]) -> list[str]:
    return [
        f"    {printable(m.name)}  {list(m.shape)} {m.dtype}"
        + (f"  (allowed by --allow-missing {m.allowed!r})" if m.allowed else "")
        + (
            f"\n      its key {printable(m.dropped_key)} was dropped by {printable(m.dropped_by)}"
            if m.dropped_key and m.dropped_by
            else ""
        )
        + (f"\n      renamed? unused key: {joined_names(m.suggestions)}" if m.suggestions else "")
        for m in missing
    ]


def _mismatch_rows(load: LoadReport) -> list[str]:
    return [
        f"    {printable(s.name)} -> {printable(str(s.param))}: "
        f"{shapes(s.weight_shape, s.param_shape)}"
        for s in load.shape_mismatches
    ]


def _cast_rows(load: LoadReport, majority: str | None) -> list[str]:
    rows = []
    for g in load.cast_groups():
        n = len(g.keys)
        verdict = ""
        if g.incompatible:
            verdict = "  INCOMPATIBLE"
        elif load.rules.strict_dtype:
            verdict = "  fails (--strict-dtype)"
        notes = []
        if kind(g.from_dtype) == "int" and kind(g.to_dtype) == "float":
            notes.append("integers into a float parameter")
        if majority is not None and g.from_dtype != majority:
            notes.append(f"unlike the checkpoint's {majority} tensors")
        note = f"  ({'; '.join(notes)})" if notes else ""
        shown = joined_names(g.keys[:3]) + (f", ... ({n} in all)" if n > 3 else "")
        rows.append(
            f"    {plural(n, 'tensor')} {g.from_dtype} -> {g.to_dtype}{verdict}{note}"
            f"\n      {shown}"
        )
    return rows


def _other_keys(load: LoadReport, limit: int) -> list[str]:
    """Keys disposed of by a rule are many and alike (a rotary buffer per layer): one row per
    status and rule, with a count and the first keys."""
    groups: dict[tuple[str, str], list[str]] = {}
    for k in load.keys:
        if k.status in (Status.LOADED, Status.UNEXPECTED, Status.SHAPE_MISMATCH, Status.LOAD_ERROR):
            continue
        reason = k.rule or (f"-> {k.target}" if k.target else "") or k.message or ""
        groups.setdefault((k.status, reason), []).append(k.name)
    if not groups:
        return []
    total = sum(len(v) for v in groups.values())
    rows = []
    for (status, reason), names in groups.items():
        shown = joined_names(names[:2]) + (f", ... ({len(names)} in all)" if len(names) > 2 else "")
        # at the 4 columns every section's rows start at; the keys under it as a row's details
        rows.append(f"    {len(names)} {status}: {printable(reason)}\n      {shown}")
    return _titled("other keys, not loaded", rows, total, limit)
