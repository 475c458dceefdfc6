"""From what the passes recorded to the load section of the report: each key's fate, then the
model tensors never filled, then the pairing of leftovers (``loadkit_inspect.fixes.renames``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from loadkit.checkpoint import TensorInfo
from loadkit.errors import ShapeMismatchError
from loadkit.fmt import plural
from loadkit.loading import loadable_tensors, qualname
from loadkit.mapper import WeightsMapper, rule_text
from loadkit.terms import Status
from loadkit_inspect.casts import is_incompatible
from loadkit_inspect.fixes.renames import Named, Nearest, pair_renames
from loadkit_inspect.options import LoadRules
from loadkit_inspect.patterns import CheckpointSpelling, unmatched_patterns
from loadkit_inspect.report.records import (
    DtypeCast,
    KeyOutcome,
    LoadReport,
    Missing,
    ModelSummary,
    ShapeMismatch,
    Unexpected,
)
from loadkit_inspect.simulate.observer import Fate
from loadkit_inspect.simulate.recording import Call
from loadkit_inspect.simulate.run import Simulation


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``'float32'``."""
    return str(dtype).removeprefix("torch.")


def model_summary(model: nn.Module, spec: str) -> ModelSummary:
    tensors = loadable_tensors(model)
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    describe = getattr(model, "backend_info", None)  # a model built from a config says how
    return ModelSummary(
        spec,
        type(model).__name__,
        len(tensors),
        nbytes,
        callable(getattr(model, "load_weights", None)),
        pooling=bool(getattr(model, "is_pooling_model", False)),
        backend=describe() if callable(describe) else None,
    )


@dataclass
class _Tally:
    """What the keys filled, broke and cast, gathered while each key is classified."""

    keys: list[KeyOutcome] = field(default_factory=list)
    mismatches: list[ShapeMismatch] = field(default_factory=list)
    errors: list[KeyOutcome] = field(default_factory=list)
    casts: list[DtypeCast] = field(default_factory=list)
    unexpected: list[Unexpected] = field(default_factory=list)
    filled: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)


def _failed_call(name: str, mapped: str | None, bad: list[Call], tally: _Tally) -> None:
    c = bad[0]
    tally.failed.update(x.param for x in bad)
    msg = str(c.error).split("\n", 1)[0]
    if isinstance(c.error, ShapeMismatchError):  # name the parameter and the key
        msg = str(c.error.with_name(c.param, f"checkpoint key '{name}'"))
    if isinstance(c.error, ShapeMismatchError) or c.param_shape != c.weight_shape:
        tally.keys.append(KeyOutcome(name, Status.SHAPE_MISMATCH, mapped, c.param, message=msg))
        tally.mismatches.append(ShapeMismatch(name, c.param, c.param_shape, c.weight_shape, msg))
    else:
        out = KeyOutcome(name, Status.LOAD_ERROR, mapped, c.param, message=msg)
        tally.keys.append(out)
        tally.errors.append(out)


def _loaded_by_calls(name: str, mapped: str | None, calls: list[Call], tally: _Tally) -> None:
    targets = list(dict.fromkeys(c.param for c in calls))
    tally.filled.update(targets)
    tally.keys.append(KeyOutcome(name, Status.LOADED, mapped, ", ".join(targets)))
    for c in calls:
        if c.weight_dtype != c.param_dtype:
            src, dst = dtype_name(c.weight_dtype), dtype_name(c.param_dtype)
            tally.casts.append(DtypeCast(name, c.param, src, dst, is_incompatible(src, dst)))


def _classify(
    info: TensorInfo,
    sim: Simulation,
    fate: Fate | None,
    mapped: str | None,
    calls: list[Call],
    written: list[str],
    tally: _Tally,
) -> None:
    """File one checkpoint key under exactly one fate (first match wins, most telling first)."""
    name, root = info.name, sim.observer.root_name
    if name in sim.excluded:
        return _left_out(info, sim, tally)
    bad = [c for c in calls if c.error is not None] if calls else calls
    if bad:
        return _failed_call(name, mapped, bad, tally)
    if fate and fate.status == Status.UNEXPECTED:
        looked_up, reason = sim.observer.rejected[name]
        # The walk tests the user's ignore rules where it found nothing (``cls`` for every
        # ``cls.*`` key); they also match the key's whole name, in either spelling.
        ignored = sim.observer.rules.ignored(name, mapped, looked_up)
        if ignored and sim.observer.used:
            tally.keys.append(KeyOutcome(name, Status.IGNORED, mapped, rule=ignored))
            return
        tally.keys.append(KeyOutcome(name, Status.UNEXPECTED, mapped, message=reason))
        u = Unexpected(name, looked_up, reason, shape=info.shape, dtype=info.dtype)
        tally.unexpected.append(u)
        return
    if fate and fate.status in (Status.SKIPPED, Status.IGNORED, Status.MAPPER_DROPPED):
        tally.keys.append(KeyOutcome(name, fate.status, mapped, rule=fate.rule))
        return
    if calls:
        return _loaded_by_calls(name, mapped, calls, tally)
    if fate and fate.status == Status.LOADED:
        tally.keys.append(KeyOutcome(name, Status.LOADED, mapped, fate.target))
        return
    if written:  # loaded by a path that bypassed weight_loader
        targets = list(dict.fromkeys(written))
        tally.filled.update(targets)
        tally.keys.append(KeyOutcome(name, Status.LOADED, mapped, ", ".join(targets)))
        return
    if (fate and fate.status == Status.DELEGATED) or name in sim.final.pulled:
        by = fate.target if fate and fate.status == Status.DELEGATED else root
        message = f"taken by {by}.load_weights; no parameter load seen for it"
        tally.keys.append(KeyOutcome(name, Status.DELEGATED, mapped, by, message=message))
        return
    message = "never read by the loader"
    if not sim.complete:
        message = "not simulated: the simulation stopped early"
    tally.keys.append(KeyOutcome(name, Status.UNCONSUMED, mapped, message=message))


def _left_out(info: TensorInfo, sim: Simulation, tally: _Tally) -> None:
    """A key a pass left out (it failed the model's ``load_weights``): as the passes filed it."""
    out = sim.excluded[info.name]
    tally.keys.append(out)
    if out.status == Status.LOAD_ERROR:
        tally.errors.append(out)
    if info.name in sim.unexpected:
        u = sim.unexpected[info.name]
        u.shape, u.dtype = info.shape, info.dtype
        tally.unexpected.append(u)


def _suggest(
    tally: _Tally, missing: list[Missing], infos: Sequence[TensorInfo], model_names: list[str]
) -> list[str]:
    """Pair leftovers (unused keys, tensors never filled); nearest names for unexpected ones.
    Returns notes on any search that was shortened."""
    wanted = [Named(m.name, m.name, m.numel, m.shape) for m in missing]
    pairs: dict[str, str] = {}
    if wanted:  # nothing missing (a model without tensors, say): no key to pair
        by_key = {t.name: t for t in infos}
        names = set(model_names)
        # a key whose load failed under a name the model has is no rename: its error says why
        unused = [
            Named(k.mapped or k.name, k.name, by_key[k.name].numel, by_key[k.name].shape)
            for k in tally.keys
            if k.status == Status.UNEXPECTED
            or (k.status == Status.LOAD_ERROR and (k.mapped or k.name) not in names)
        ]
        pairs = pair_renames(unused, wanted) if unused else {}
    for m in missing:
        m.suggestions = [pairs[m.name]] if m.name in pairs else []
    paired = {key: param for param, key in pairs.items()}
    if not tally.unexpected:
        return []
    nearest = Nearest(model_names, len(tally.unexpected))
    for u in tally.unexpected:
        first = [paired[u.name]] if u.name in paired else []
        u.suggestions = list(dict.fromkeys(first + nearest(u.looked_up)))[:3]
    if nearest.shortened:
        return [
            f"{plural(nearest.shortened, 'unexpected name')} "
            f"{'shares' if nearest.shortened == 1 else 'share'} no name parts with any model "
            "tensor; "
            f"comparing each with all {len(model_names)} names would take too long, so they "
            "have no nearest names"
        ]
    return []


def _dropped_keys(keys: list[KeyOutcome], mapper: WeightsMapper, missing: list[Missing]) -> None:
    """A missing tensor whose checkpoint key a mapper rule dropped (GPT-2's ``attn.bias`` regex
    drops ``c_attn.bias`` too, as vLLM 0.28.0 does): which key, and which rule."""
    wanted = {m.name: m for m in missing}
    less: dict[tuple[str, str], WeightsMapper] = {}  # one mapper per dropping rule
    for k in keys:
        if not wanted or k.status != Status.MAPPER_DROPPED:
            continue
        step = mapper.trace(k.name).dropped_by
        if step is None:
            continue
        if (step.stage, step.rule) not in less:
            less[(step.stage, step.rule)] = mapper.without(step.stage, step.rule)
        m = wanted.pop(str(less[(step.stage, step.rule)].map_name(k.name)), None)
        if m is not None:
            m.dropped_key, m.dropped_by = k.name, rule_text(step.stage, step.rule)


def _missing(name: str, tensor: torch.Tensor, allowed: str | None) -> Missing:
    return Missing(name, tuple(tensor.shape), dtype_name(tensor.dtype), allowed=allowed)


def assemble(
    tensors: dict[str, torch.Tensor],
    infos: Sequence[TensorInfo],
    sim: Simulation,
    mapper: WeightsMapper | None,
    rules: LoadRules,
) -> LoadReport:
    """The load section: every key's fate, missing tensors, mismatches, casts, suggestions."""
    entries, by_name = list(tensors), tensors
    calls: dict[str, list[Call]] = {}
    for call in sim.final.calls:
        calls.setdefault(call.key or "", []).append(call)
    written: dict[str, list[str]] = {}  # key -> tensors written while it was being loaded
    for tensor, key in sim.final.writes:
        written.setdefault(key or "", []).append(tensor)
    fates = sim.observer.fates()

    tally = _Tally()
    for info in infos:
        fate = fates.get(info.name)
        if fate is not None:
            mapped = fate.mapped
        else:
            mapped = mapper.map_name(info.name) if mapper is not None else info.name
        got = calls.get(info.name, [])
        _classify(info, sim, fate, mapped, got, written.get(info.name, []), tally)

    # Written by any path, and what the run's ledgers say a child's load_weights loaded.
    tally.filled.update(t for t, _ in sim.final.writes)
    for path, ledger in sim.observer.ledgers:
        tally.filled.update(
            qualname(path, p.name) for p in ledger.params.values() if p.status == Status.LOADED
        )
    unfilled = [n for n in entries if n not in tally.filled and n not in tally.failed]
    spelled: dict[str, list[str]] = {}  # missing tensor -> checkpoint names it would come from
    if rules.allow_missing:
        spelling = CheckpointSpelling(((k.name, k.mapped) for k in tally.keys), mapper)
        spelled = {n: spelling.names(n) for n in unfilled}
    missing = [_missing(n, by_name[n], rules.allowed(n, *spelled.get(n, ()))) for n in unfilled]
    if mapper is not None:
        _dropped_keys(tally.keys, mapper, missing)
    notes = _suggest(tally, missing, infos, entries)
    unmatched = unmatched_patterns(rules, tally.keys, missing, spelled)
    filled = sum(n in tally.filled and n not in tally.failed for n in entries)
    return LoadReport(
        tally.keys, missing, tally.unexpected, tally.mismatches, tally.casts, tally.errors,
        len(entries), filled, sim.runs, sim.complete, sim.failure, notes=notes, rules=rules,
        unmatched_patterns=unmatched,
    )  # fmt: skip
