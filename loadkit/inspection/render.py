"""The text rendering of an ``InspectReport``: sections in order, long lists capped.

Torch-free, like the report itself.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from loadkit.errors import printable
from loadkit.inspection.layout import fmt_bytes

if TYPE_CHECKING:
    from loadkit.inspection.inspector import InspectReport, LoadReport
    from loadkit.pooling.probe import ProbeVerdict


def _names(names: list[str]) -> str:
    return ", ".join(printable(n) for n in names)


def _capped(rows: list[str], total: int, limit: int, indent: str = "    ") -> list[str]:
    out = rows[:limit]
    if total > limit:
        out.append(f"{indent}... {total - limit} more (--json lists them all)")
    return out


def _checkpoint(r: InspectReport) -> list[str]:
    c = r.checkpoint
    n = len(c.tensors)
    lines = [
        f"checkpoint  {printable(c.path)}",
        f"  {len(c.files)} file(s), {n} tensors, {fmt_bytes(c.total_bytes)}",
        "  dtypes  "
        + ", ".join(f"{d} {k} tensors ({fmt_bytes(b)})" for d, (k, b) in c.dtypes.items()),
    ]
    if len(c.files) > 1 or os.path.isdir(c.path):
        names = [printable(os.path.basename(s.file)) for s in c.files]
        width = max(map(len, names), default=0)
        lines.append("  shards")
        lines += [
            f"    {name.ljust(width)}  {s.tensors:>6} tensors  {fmt_bytes(s.nbytes):>10}"
            for name, s in zip(names, c.files, strict=True)
        ]
    return lines


def _mapper(r: InspectReport, limit: int) -> list[str]:
    m = r.mapper
    assert m is not None
    renamed = len(m.traces) - len(m.dropped)
    lines = [
        f"mapper  ({m.source}): {renamed} keys renamed, {len(m.dropped)} dropped, "
        f"{m.unchanged} unchanged"
    ]
    if m.note:
        lines.append(f"  note: {printable(m.note)}")
    for use in m.rules:
        target = "drop" if use.target is None else repr(use.target)
        keys = "key" if use.fired == 1 else "keys"
        lines.append(f"  {use.stage:<8} {use.rule!r} -> {target}: fired for {use.fired} {keys}")
        if use.origin:
            lines.append(f"           {use.origin}")
        if use.example:
            before, after = (printable(str(x)) for x in use.example)
            lines.append(f"           e.g. {before} -> {after}")
    if m.dropped:
        lines.append(f"  dropped keys ({len(m.dropped)})")
        rows = [f"    {printable(k)}  ({printable(rule)})" for k, rule in m.dropped]
        lines += _capped(rows, len(rows), limit)
    return lines


def _backend(b: dict[str, Any]) -> list[str]:
    """A model built from a Hugging Face config: what transformers built, and why this wrapper."""
    lines = [
        f"  transformers {b.get('transformers_version', '?')} built "
        f"{b.get('transformers_class')} (model_type {b.get('model_type')!r}) as self.model",
    ]
    if b.get("config"):
        lines.append(f"  config  {b['config']}")
    if b.get("wrapper_reason"):
        lines.append(f"  wrapper {b.get('wrapper')}: {b['wrapper_reason']}")
    skips = [f"skip_prefixes {b['skip_prefixes']}"] if b.get("skip_prefixes") else []
    skips += [f"skip_substrs {b['skip_substrs']}"] if b.get("skip_substrs") else []
    if skips:
        lines.append("  " + "; ".join(skips))
    return lines


def _verdict(v: ProbeVerdict) -> str:
    whole = " = the whole checkpoint" if v.walked == v.total_keys and v.total_keys else ""
    noun = "tensor" if v.walked == 1 else "tensors"
    cost = f"clones {v.walked} {noun} ({fmt_bytes(v.cloned_bytes)}{whole})"
    if not v.hit:
        return f"no hit: walks all {v.total_keys} keys, {cost}; names forwarded unprefixed"
    return f"prefix {v.prefix!r} found at key #{v.hit_index} '{printable(str(v.hit_key))}': {cost}"


def _load(load: LoadReport, root: str, limit: int) -> list[str]:
    c = load.counts()
    passes = f"{load.runs} pass" + ("es" if load.runs != 1 else "")
    lines = [
        f"load  (simulated on the meta device, {passes})",
        f"  checkpoint {len(load.keys)} keys: " + ", ".join(f"{n} {s}" for s, n in c.items() if n),
        f"  model {load.model_tensors} tensors: {load.filled} filled, {len(load.missing)} missing",
    ]
    if not load.complete:
        lines.append("  stopped early: too many failing names; the rest was not simulated")
    if load.failure:
        lines.append(f"  load failed: {printable(load.failure)}")

    def section(title: str, rows: list[str], total: int) -> None:
        lines.append(f"  {title} ({total})" + ("" if total else ": none"))
        lines.extend(_capped(rows, len(rows), limit))

    section(
        "unexpected names",
        [
            f"    {printable(u.name)}"
            + (f"  (looked up as '{printable(u.looked_up)}')" if u.looked_up != u.name else "")
            + (f"\n      nearest: {_names(u.suggestions)}" if u.suggestions else "")
            + f"\n      {printable(u.message)}"
            for u in load.unexpected
        ],
        len(load.unexpected),
    )
    section(
        "missing: model tensors never filled",
        [
            f"    {printable(m.name)}  {list(m.shape)} {m.dtype}"
            + (f"\n      nearest unused keys: {_names(m.suggestions)}" if m.suggestions else "")
            for m in load.missing
        ],
        len(load.missing),
    )
    section(
        "shape mismatches",
        [
            f"    {printable(s.name)} -> {printable(s.param)}: parameter "
            f"{list(s.param_shape) if s.param_shape is not None else '?'}, "
            f"checkpoint {list(s.weight_shape)}"
            for s in load.shape_mismatches
        ],
        len(load.shape_mismatches),
    )
    section(
        "dtype casts",
        [
            f"    {printable(d.name)} -> {printable(d.param)}: {d.from_dtype} -> {d.to_dtype}"
            + ("  INCOMPATIBLE" if d.incompatible else "")
            for d in load.dtype_casts
        ],
        len(load.dtype_casts),
    )
    if load.errors:
        section(
            "load errors",
            [f"    {printable(e.name)}: {printable(e.message or '')}" for e in load.errors],
            len(load.errors),
        )
    # Keys disposed of by a rule are many and alike (a rotary buffer per layer): one row per
    # status and rule, with a count and the first keys.
    groups: dict[tuple[str, str], list[str]] = {}
    for k in load.keys:
        if k.status in ("loaded", "unexpected", "shape mismatch", "load error"):
            continue
        reason = k.rule or (f"-> {k.target}" if k.target else "") or k.message or ""
        groups.setdefault((k.status, reason), []).append(k.name)
    if groups:
        total = sum(len(v) for v in groups.values())
        rows = []
        for (status, reason), names in groups.items():
            shown = _names(names[:2]) + (f", ... ({len(names)} in all)" if len(names) > 2 else "")
            rows.append(f"    {len(names):>5} {status}: {printable(reason)}\n            {shown}")
        section("other keys, not loaded", rows, total)
    return lines


def render_report(r: InspectReport, *, limit: int = 20, max_depth: int | None = None) -> str:
    lines = _checkpoint(r)
    lines += ["", "layout  (numbered siblings folded into {a-b})"]
    tree = r.folded_layout.render(max_depth=max_depth)
    lines += ["  " + row for row in tree.splitlines()]
    if r.mapper is not None:
        lines += ["", *_mapper(r, limit)]
    if r.model is not None:
        m = r.model
        own = "its own load_weights" if m.has_own_load_weights else "AutoWeightsLoader"
        lines += [
            "",
            f"model  {printable(m.spec)}: {m.cls}, {m.parameters} tensors, {fmt_bytes(m.nbytes)} "
            f"(built on meta: no memory used); loads with {own}",
        ]
        if m.backend:
            lines += _backend(m.backend)
    if r.probe is not None:
        lines += [
            "",
            "pooling probe  (each key walked is cloned until prefix + name is a parameter)",
        ]
        lines += [f"  {b:<4} {_verdict(v)}" for b, v in r.probe.items()]
    if r.load is not None and r.model is not None:
        lines += ["", *_load(r.load, r.model.cls, limit)]
    lines.append("")
    if r.clean is None:
        lines.append("verdict: headers valid; no model given, so names were not matched (exit 0)")
    elif r.clean:
        lines.append("verdict: would load cleanly (exit 0)")
    else:
        assert r.load is not None
        problems = "; ".join(printable(p) for p in r.load.problems())
        lines.append(f"verdict: would NOT load: {problems} (exit 1)")
    return "\n".join(lines)
