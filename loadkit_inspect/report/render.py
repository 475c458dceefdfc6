"""The text rendering of an ``InspectReport``: sections in order, long lists capped.

Torch-free, like the report itself.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from loadkit.checkpoint.dtypes import DTYPES
from loadkit.errors import printable
from loadkit.fmt import format_bytes, plural, table
from loadkit_inspect.casts import kind

if TYPE_CHECKING:
    from loadkit.pooling.probe import ProbeRecord
    from loadkit_inspect.fixes.fix import NotOffered, SuggestedFix
    from loadkit_inspect.fixes.suggest import Rule
    from loadkit_inspect.loaders import LoaderVerdict
    from loadkit_inspect.mapper_trace import MapperReport
    from loadkit_inspect.report.layout import LayoutNode
    from loadkit_inspect.report.records import LoadReport, Missing, ModelSummary, Unexpected
    from loadkit_inspect.report.summary import CheckpointSummary
    from loadkit_inspect.simulate.from_pretrained import FromPretrained
    from loadkit_inspect.sources.resolve import Source
    from loadkit_inspect.tensor_parallel.plan import TPReport


class Report(Protocol):
    """What the renderer reads of a report (``report.InspectReport``)."""

    checkpoint: CheckpointSummary
    mapper: MapperReport | None
    model: ModelSummary | None
    probe: dict[str, ProbeRecord] | None
    load: LoadReport | None
    fix: SuggestedFix | None
    tensor_parallel: TPReport | None
    strict_index: bool
    loaders: dict[str, LoaderVerdict] | None
    selected_loaders: tuple[str, ...]
    from_pretrained: FromPretrained | None
    not_offered: NotOffered | None

    @property
    def folded_layout(self) -> LayoutNode: ...

    @property
    def clean(self) -> bool | None: ...

    def problems(self) -> list[str]: ...


def _names(names: list[str]) -> str:
    return ", ".join(printable(n) for n in names)


def _capped(rows: list[str], total: int, limit: int, indent: str = "    ") -> list[str]:
    out = rows[:limit]
    if total > limit and not out:  # --limit 0: the count alone, no "more" than nothing
        out.append(f"{indent}{plural(total, 'row')}, none shown (--json lists them all)")
    elif total > limit:
        out.append(f"{indent}... {total - limit} more (--json lists them all)")
    return out


def _source(source: Source | None) -> list[str]:
    """The lines saying what a repo id resolved to, or what reading a URL's headers cost."""
    if source is None or source.kind == "path":
        return []
    if source.snapshot is not None:
        s = source.snapshot
        lines = [
            f"  from the Hugging Face cache: {printable(s.repo_id)}, commit {printable(s.commit)}"
        ]
        if s.revision != s.commit:  # a branch, a tag or a short hash: which commit it named
            lines = [
                f"  from the Hugging Face cache: {printable(s.repo_id)}, "
                f"revision {printable(s.revision)}",
                f"    commit {printable(s.commit)}",
            ]
        if s.note:
            lines.append(f"    ({printable(s.note)})")
        if s.lacks:
            lines.append(f"    the snapshot lacks {_names(list(s.lacks))} (an incomplete download)")
        return lines
    f = source.fetched
    assert f is not None
    share = f" ({100 * f.bytes / f.size:.3g}%)" if f.size else ""
    return [
        f"  header-only over HTTP: {f.requests} requests, {f.bytes} bytes fetched "
        f"({format_bytes(f.bytes)}) of {format_bytes(f.size)}{share}"
    ]


def _checkpoint(r: Report, limit: int) -> list[str]:
    c = r.checkpoint
    n = len(c.tensors)
    held = [s for s in c.files if s.tensors is not None]
    total, size = sum(s.tensors or 0 for s in held), sum(s.nbytes for s in held)
    lines = [
        f"checkpoint  {printable(c.path)}",
        *_source(c.source),
        f"  {plural(len(c.files), 'file')}, {plural(total, 'tensor')}, {format_bytes(size)}",
    ]
    if (total, size) != (n, c.total_bytes):  # a key in two files, a file no loader reads
        lines.append(
            f"  vllm reads {plural(n, 'tensor')} ({format_bytes(c.total_bytes)}) of them: the "
            "files it reads, one copy of each key (the layout below)"
        )
    lines.append(
        "  dtypes  "
        + ", ".join(
            f"{d} {plural(k, 'tensor')} ({format_bytes(b)})" for d, (k, b) in c.dtypes.items()
        )
    )
    if len(c.files) > 1 or os.path.isdir(c.path) or c.path.endswith(".json"):  # a remote index
        lines += _file_rows(c, limit)
    lines += _reads(c)
    if c.problems:
        lines += _index_problems(c, limit)
    return lines


def _file_rows(c: CheckpointSummary, limit: int) -> list[str]:
    """Every file with the tensors its header holds, and (where the loaders part ways) the
    loaders that read it."""
    split = len({s.read_by for s in c.files}) > 1 or any(not s.read_by for s in c.files)
    split = split and bool(c.loader_files)
    rows = []
    for s in c.files:
        count = (
            "cannot be read"
            if s.tensors is None
            else f"{s.tensors:>6} {'tensor' if s.tensors == 1 else 'tensors'}"
        )
        row = [printable(os.path.basename(s.file)), count, format_bytes(s.nbytes)]
        if split:
            row.append(", ".join(s.read_by) if s.read_by else "read by no loader")
        rows.append(tuple(row))
    align = "llr" + ("l" if split else "")
    shown = table(rows, align=align, indent="    ", min_widths=(0, 0, 10, 0)[: len(align)])
    head = "  files" + ("  (with the loaders that read each)" if split else "")
    return [head, *_capped(shown.splitlines(), len(rows), limit)]


def _reads(c: CheckpointSummary) -> list[str]:
    """Which files each loader reads, chosen as it chooses them, or what it raises instead."""
    choices = c.loader_files
    if not choices or not any(x.how or x.raises for x in choices.values()):
        return []  # one file: what both read
    said = {}
    readable = len([s for s in c.files if s.tensors is not None])
    for loader, x in choices.items():
        if x.raises is not None:
            said[loader] = f"no file: it raises {x.raises.text()}"
            continue
        files = ", ".join(printable(f) for f in x.files[:3])
        files += f" and {len(x.files) - 3} more" if len(x.files) > 3 else ""
        if len(x.files) > 1 and len(x.files) == readable == len(c.files):
            files = "both files" if len(x.files) == 2 else f"all {len(x.files)} files"
        said[loader] = files + (f" ({x.how})" if x.how else "")
    if len(set(said.values())) == 1:
        return [f"  read by {' and '.join(said)}: {next(iter(said.values()))}"]
    return [f"  {loader} reads {what}" for loader, what in said.items()]


_SEVERITY = {"fails": 0, "inconsistent": 1, "note": 2}


def _index_problems(c: CheckpointSummary, limit: int) -> list[str]:
    """Index problems grouped by kind, shard and what they say (one missing shard of 52 keys is
    one row), those that stop the load first, at most ``limit`` rows."""
    failing, inconsistent = len(c.failing), len(c.inconsistent)
    notes = len(c.problems) - failing - inconsistent
    # a folder without an index has problems of its files (a key in two, one unreadable)
    head = f"  {'index' if c.index else 'file'} problems ({failing + inconsistent})"
    if failing:
        head += f": {failing} stop the load (a loader raises)"
        head += f", {inconsistent} inconsistent (these alone would not)" if inconsistent else ""
    elif inconsistent:
        head += f": loads; {'the index is' if c.index else 'the files are'} inconsistent"
    else:
        head += ": none"
    lines = [head + (f"; {plural(notes, 'note')}" if notes else "")]
    groups: dict[tuple[int, str, str, tuple[str, ...]], list[str | None]] = {}
    for p in c.problems:
        key = (_SEVERITY.get(p.severity, 1), p.kind, p.message, p.found_in)
        groups.setdefault(key, []).append(p.key)
    rows = []
    for (_, what_kind, message, _), keys in sorted(groups.items(), key=lambda kv: kv[0][:2]):
        named = [k for k in keys if k is not None]
        if len(keys) == 1:
            what = f"'{printable(named[0])}': " if named else ""
            rows.append(f"    {what_kind}: {what}{printable(message)}")
            continue
        shown = _names(named[:3]) + (f", ... ({len(named)} in all)" if len(named) > 3 else "")
        rows.append(
            f"    {what_kind}, {plural(len(keys), 'key')}, each: {printable(message)}"
            f"\n      {shown}"
        )
    return lines + _capped(rows, len(rows), limit)


def _mapper(r: Report, limit: int) -> list[str]:
    m = r.mapper
    assert m is not None
    renamed = len(m.traces) - len(m.dropped)
    lines = [
        f"mapper  ({m.source}): {plural(renamed, 'key')} renamed, {len(m.dropped)} dropped, "
        f"{m.unchanged} unchanged"
    ]
    if m.note:
        lines.append(f"  note: {printable(m.note)}")
    for again in m.rematches:
        lines.append(
            f"  warning: stacked rule {again.then!r} matches inside the output of stacked rule "
            f"{again.first!r} (vLLM 0.28.0 tries every stacked rule in turn): "
            f"{printable(again.name)} -> {printable(str(again.result))}"
        )
        lines.append(
            "           this mapper maps it once (behaviour='new')"
            if m.behaviour == "new"
            else f"           try {again.then!r} before {again.first!r}, or WeightsMapper(..., "
            "behaviour='new')"
        )
    for use in m.rules:
        # each rule once, as written: a renaming's label already says what it writes
        rule = f"{use.stage:<8} '{printable(use.rule)}'"
        if use.stage != "renaming":
            target = use.target if not isinstance(use.target, str) else f"'{use.target}'"
            rule += f" -> {'drop' if use.target is None else printable(str(target))}"
        lines.append(f"  {rule}: fired for {plural(use.fired, 'key')}")
        if use.origin:
            lines.append(f"           {printable(use.origin)}")
        if use.example:
            before, after = use.example
            shown = "dropped" if after is None else printable(after)
            lines.append(f"           e.g. {printable(before)} -> {shown}")
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
        lines.append(f"  config  {printable(str(b['config']))}")
    if b.get("wrapper_reason"):
        lines.append(f"  wrapper {b.get('wrapper')}: {b['wrapper_reason']}")
    skips = [f"skip_prefixes {b['skip_prefixes']}"] if b.get("skip_prefixes") else []
    skips += [f"skip_substrs {b['skip_substrs']}"] if b.get("skip_substrs") else []
    if skips:
        lines.append("  " + "; ".join(skips))
    return lines


def _verdict(probe: ProbeRecord) -> str:
    everything = probe.walked == probe.forwarded and probe.forwarded
    whole = " = the whole checkpoint" if everything else ""
    cost = f"clones {plural(probe.clones, 'tensor')} ({format_bytes(probe.cloned_bytes)}{whole})"
    if not probe.hit:
        walks = plural(probe.forwarded, "key")
        return f"no hit: walks all {walks}, {cost}; names forwarded unprefixed"
    hit = printable(str(probe.hit_key))
    return f"prefix {probe.prefix!r} found at key #{probe.hit_index} '{hit}': {cost}"


def _fix(fix: SuggestedFix, limit: int) -> list[str]:
    n = len(fix.suggestions)
    these = "this rule" if n == 1 else "these rules"
    if n:
        lines = [
            f"suggested fix  ({plural(n, 'mapper rule')} {'explains' if n == 1 else 'explain'} "
            f"{plural(fix.explains, 'renamed key')}; the load was simulated again with {these})"
        ]
    else:
        lines = ["suggested fix  (in words: no mapper rule can express it)"]
    for sh in fix.shifts:
        lines.append(f"  {printable(sh.words())}")
        why = sh.why_no_rules
        lines.append(
            f"    {plural(len(sh.numbers), 'regex rule')}, one per number"
            if why is None
            else f"    no rule: {why}"
        )
    rows = []
    for s in fix.suggestions:
        key, tensor = s.pairs[0] if s.pairs else ("", "")
        example = f", e.g. {printable(key)} -> {printable(tensor)}" if s.pairs else ""
        rows.append(
            f"  {s.rule.stage} {s.rule.old!r} -> {s.rule.new!r}: {plural(len(s.pairs), 'key')}"
            f"{example}"
        )
    lines += _capped(rows, len(rows), limit, "  ")
    lines += _refused(fix.rejected, limit, "  ")
    if not n:
        return lines
    return lines + _fix_flag(fix, these, limit)


def _refused(rejected: list[tuple[Rule, str]], limit: int, indent: str) -> list[str]:
    """One line per rule considered and refused: the rule, and why."""
    rows = [
        f"{indent}not offered: {rule.stage} {rule.old!r} -> {rule.new!r}: {printable(why)}"
        for rule, why in rejected
    ]
    return _capped(rows, len(rows), limit, indent)


def _fix_flag(fix: SuggestedFix, these: str, limit: int) -> list[str]:
    """The ``--mapper`` to paste, and what the load does with it."""
    lines = [f"  {fix.flag}"]
    if not fix.complete:
        lines.append(
            "  (the mapper given has rules JSON cannot hold: add these rules to it; the flag "
            "alone would drop them)"
        )
    if fix.other_loaders:
        others = ", ".join(fix.other_loaders)
        lines.append(
            f"  (mapper rules are vLLM's: {others} loads by its own rules, so the flag selects "
            "--loader vllm)"
        )
    if fix.proven:
        lines.append(
            f"  would load cleanly with {these}" + (" (vllm)" if fix.other_loaders else "")
        )
        lines.append(
            "  (proven: the second load is clean, every shape matches, numbered siblings keep "
            "their places)"
        )
    elif fix.scrambled:
        lines.append(f"  NOT proven: {'; '.join(printable(r.words()) for r in fix.scrambled)}")
    elif fix.result.clean:
        vllm = " (vllm)" if fix.other_loaders else ""
        lines.append(f"  would load cleanly with {these}{vllm}, but NOT proven:")
    else:
        lines.append(f"  with {these} it would still NOT load: {_problems(fix.result.problems())}")
    if fix.ambiguous:
        lines.append(
            "  shapes cannot tell these tensors apart: with a key in another of them the load "
            "would be as clean; the names alone chose (check each)"
        )
        rows = [f"    {printable(a.words())}" for a in fix.ambiguous]
        lines += _capped(rows, len(rows), limit)
    return lines


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
        shown = _names(g.keys[:3]) + (f", ... ({n} in all)" if n > 3 else "")
        rows.append(
            f"    {plural(n, 'tensor')} {g.from_dtype} -> {g.to_dtype}{verdict}{note}"
            f"\n      {shown}"
        )
    return rows


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


def _load(
    load: LoadReport,
    root: str,
    limit: int,
    fix: SuggestedFix | None,
    majority: str | None,
    loader: str = "",
) -> list[str]:
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
    explained = fix.explained_keys() if fix else {}
    by_fix = fix.explained_tensors() if fix else set()
    unexpected = [u for u in load.unexpected if not (fix and u.looked_up in explained)]
    lines += _section(
        "unexpected names",
        _unexpected_rows(unexpected[:limit]),  # 200,000 of them: only the shown ones spelled
        len(load.unexpected),
        limit,
        len(load.unexpected) - len(unexpected),
        listed=len(unexpected),
    )
    missing = [m for m in load.missing if m.name not in by_fix]
    lines += _section(
        "missing: model tensors never filled",
        _missing_rows(missing[:limit]),
        len(load.missing),
        limit,
        len(load.missing) - len(missing),
        listed=len(missing),
    )
    lines += _section("shape mismatches", _mismatch_rows(load), len(load.shape_mismatches), limit)
    lines += _section(
        "dtype casts, by (from, to)", _cast_rows(load, majority), len(load.dtype_casts), limit
    )
    if load.errors:
        rows = [f"    {printable(e.name)}: {printable(e.message or '')}" for e in load.errors]
        lines += _section("load errors", rows, len(load.errors), limit)
    lines += _other_keys(load, limit)
    return lines + [f"  note: {printable(n)}" for n in load.notes]


def _section(
    title: str, rows: list[str], total: int, limit: int, fixed: int = 0, listed: int | None = None
) -> list[str]:
    """A titled list of the load section, capped at ``limit`` rows; ``fixed`` of the ``total``
    are explained by the suggested fix (and left out of ``rows``); ``listed``: how many rows
    there are when ``rows`` holds only the first ``limit`` of them."""
    head = f"  {title} ({total})" + ("" if total else ": none")
    if fixed:
        head += f": {fixed} explained by the suggested fix, above"
        head += "" if fixed == total else "; the others:"
    return [head, *_capped(rows, len(rows) if listed is None else listed, limit)]


def _unexpected_rows(unexpected: list[Unexpected]) -> list[str]:
    return [
        f"    {printable(u.name)}"
        + (f"  {list(u.shape)} {u.dtype}" if u.shape is not None else "")
        + (f"  (looked up as '{printable(u.looked_up)}')" if u.looked_up != u.name else "")
        + (f"\n      nearest: {_names(u.suggestions)}" if u.suggestions else "")
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
        + (f"\n      renamed? unused key: {_names(m.suggestions)}" if m.suggestions else "")
        for m in missing
    ]


def _shapes(checkpoint: Sequence[int], model: Sequence[int] | None) -> str:
    """A shape mismatch in one order everywhere, the checkpoint's first (as the file reads):
    ``checkpoint [128, 32], model [32, 128] (transposed?)``."""
    shown = f"checkpoint {list(checkpoint)}, model {list(model) if model is not None else '?'}"
    flipped = model is not None and len(model) == 2 and tuple(checkpoint) == tuple(model)[::-1]
    return shown + (" (transposed?)" if flipped else "")


def _mismatch_rows(load: LoadReport) -> list[str]:
    return [
        f"    {printable(s.name)} -> {printable(str(s.param))}: "
        f"{_shapes(s.weight_shape, s.param_shape)}"
        for s in load.shape_mismatches
    ]


def _other_keys(load: LoadReport, limit: int) -> list[str]:
    """Keys disposed of by a rule are many and alike (a rotary buffer per layer): one row per
    status and rule, with a count and the first keys."""
    from loadkit.terms import Status  # here: only a report with a model lists keys' fates

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
        shown = _names(names[:2]) + (f", ... ({len(names)} in all)" if len(names) > 2 else "")
        # at the 4 columns every section's rows start at; the keys under it as a row's details
        rows.append(f"    {len(names)} {status}: {printable(reason)}\n      {shown}")
    return _section("other keys, not loaded", rows, total, limit)


def _headline(r: Report) -> str | None:
    """Every selected loader's verdict side by side, for a model with more than one loader
    (one line per loader when they do not fit on one)."""
    if not r.loaders or len(r.loaders) < 2:
        return None
    from loadkit.fmt import WIDTH, wrap
    from loadkit_inspect.loaders import headline

    verdicts = [r.loaders[n] for n in r.selected_loaders]
    line = printable(headline(verdicts))
    if len(line) + len("verdict: ") <= WIDTH:
        return line
    return "\n".join(wrap(printable(v.phrase())) for v in verdicts)


def _transformers(fp: FromPretrained, limit: int, verdict: LoaderVerdict | None) -> list[str]:
    """The ``transformers`` loader's section: what ``from_pretrained`` would do, in its own
    terms (its ``verdict``, ``--strict-index`` included, when the report has one), the files it
    reads, and its load report's lists."""
    label = f"transformers {fp.transformers_version}"
    said = verdict.phrase() if verdict is not None else f"{label}: outcome {fp.outcome}"
    lines = [f"transformers  {fp.cls}.from_pretrained, simulated on the meta device", f"  {said}"]
    lines += _transformers_files(fp)
    error = fp.error
    if error is not None:
        lines.append(f"  raises {printable(error.error)}: {printable(error.message)}")
        if fp.raised is not None:
            lines.append(
                "  (before it loads a tensor; the lists below are what it would report once it "
                "reads the folder's readable weights)"
            )
    if fp.renamed:
        rows = [f"    {printable(k)} -> {printable(v)}" for k, v in fp.renamed.items()]
        lines.append(f"  keys transformers renames ({len(rows)})")
        lines += _capped(rows, len(rows), limit)
    for title, names in (
        ("UNEXPECTED: checkpoint keys it leaves unused", list(fp.unexpected)),
        ("MISSING: model tensors newly initialised at random", list(fp.missing)),
    ):
        lines.append(f"  {title} ({len(names)})" + ("" if names else ": none"))
        lines += _capped([f"    {printable(n)}" for n in names], len(names), limit)
    for title, names in (
        ("missing, allowed by --allow-missing (still initialised at random)", list(fp.allowed)),
        ("unexpected, taken by the skip and ignore rules", list(fp.ignored)),
    ):
        if names:
            lines.append(f"  {title} ({len(names)})")
            lines += _capped([f"    {printable(n)}" for n in names], len(names), limit)
    raises = "" if fp.ignore_mismatched_sizes else ": from_pretrained raises"
    lines.append(
        f"  MISMATCH: shapes that differ ({len(fp.mismatched)})"
        + ((raises if fp.mismatched else "") or ("" if fp.mismatched else ": none"))
    )
    rows = [
        f"    {printable(m.name)}  {_shapes(m.checkpoint_shape, m.model_shape)}"
        for m in fp.mismatched
    ]
    lines += _capped(rows, len(rows), limit)
    for e in fp.errors:
        lines.append(f"  error: {printable(e)}")
    return lines


def _transformers_files(fp: FromPretrained) -> list[str]:
    """The files ``from_pretrained`` reads, and the folder's weight files it never opens."""
    files = fp.files
    if files is None:
        return []
    how = f" ({files.how})" if files.how and files.files else ""
    lines = [f"  reads {_some(files.files) if files.files else 'no file'}{how}"]
    if files.unread:
        lines.append(f"  never reads {_some(files.unread)}")
    return lines


def _some(names: Sequence[str], shown: int = 5) -> str:
    """The first ``shown`` names, and how many more."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return _names(list(names[:shown])) + more


def render_report(r: Report, *, limit: int = 20, max_depth: int | None = None) -> str:
    """The report as text: the sections in order, each list capped at ``limit`` rows."""
    lines: list[str] = []
    head = _headline(r)
    if head is not None:  # which loaders would load it, before anything else
        lines += [head, ""]
    if r.fix is not None:  # the answer first: the rule that fixes the load
        lines += [*_fix(r.fix, limit), ""]
    elif r.not_offered is not None:  # or the rules considered, and why none is offered
        lines += [*_refused(r.not_offered.rejected, limit, ""), ""]
    lines += _checkpoint(r, limit)
    lines += ["", *_layout(r, limit, max_depth)]
    if r.mapper is not None:
        lines += ["", *_mapper(r, limit)]
    if r.model is not None:
        lines += ["", *_model(r.model)]
    if r.probe is not None:
        lines += [
            "",
            "pooling probe  (each key walked is cloned until prefix + name is a parameter)",
        ]
        lines += [f"  {b:<4} {_verdict(v)}" for b, v in r.probe.items()]
    if r.load is not None and r.model is not None:
        dtypes = r.checkpoint.dtypes
        major = max(dtypes, key=lambda d: dtypes[d][0]) if dtypes else None
        majority = _torch_name(major) if major else None
        # With two loaders this section is vLLM's: say so (the transformers one follows).
        loader = "vllm loader: " if head is not None else ""
        lines += ["", *_load(r.load, r.model.cls, limit, r.fix, majority, loader)]
    if r.from_pretrained is not None:
        verdict = (r.loaders or {}).get("transformers")
        lines += ["", *_transformers(r.from_pretrained, limit, verdict)]
    if r.tensor_parallel is not None:
        lines += ["", *(printable(line) for line in r.tensor_parallel.render(limit))]
    return "\n".join([*lines, "", *_warnings(r), *_final_verdict(r, head)])


def _warnings(r: Report) -> list[str]:
    """Patterns of the load rules that matched nothing: said last, by the verdict they leave
    unchanged."""
    unmatched = r.load.unmatched_patterns if r.load is not None else []
    return [f"warning: {printable(u.message())}" for u in unmatched]


def _layout(r: Report, limit: int, max_depth: int | None) -> list[str]:
    lines = ["layout  (numbered siblings folded into {a-b})"]
    odd = list(r.folded_layout.odd_ones())
    if odd:
        lines.append(f"  folded siblings that differ ({len(odd)}):")
        rows = [f"    {printable(n.path)}: {_odd(n)}" for n in odd]
        lines += _capped(rows, len(rows), limit)
    tree = r.folded_layout.render(max_depth=max_depth)
    return lines + ["  " + row for row in tree.splitlines()]


def _model(m: ModelSummary) -> list[str]:
    own = "its own load_weights" if m.has_own_load_weights else "AutoWeightsLoader"
    lines = [
        f"model  {printable(m.spec)}: {m.cls}, {plural(m.parameters, 'tensor')}, "
        f"{format_bytes(m.nbytes)} (built on meta: no memory used); loads with {own}",
    ]
    return lines + (_backend(m.backend) if m.backend else [])


def _final_verdict(r: Report, head: str | None) -> list[str]:
    """The last line(s): the verdict and the exit status; ``head``: the loaders' headline."""
    inconsistent = len(r.checkpoint.inconsistent)
    strict = r.strict_index and inconsistent
    index = ""
    if inconsistent and not strict and not r.checkpoint.failing:
        index = (
            f"; the index is inconsistent ({plural(inconsistent, 'problem')} above; loaders "
            "read the files it names, not its list of keys)"
            if r.checkpoint.index
            else f"; the files are inconsistent ({plural(inconsistent, 'problem')} above; "
            "loaders read every copy of a key, the last one stays)"
        )
    if r.clean is None and (r.checkpoint.failing or strict):
        return [
            f"verdict: {_disagree(r.checkpoint)}: {_problems(r.problems())}; no model given, so "
            "names were not matched (exit 1)"
        ]
    if r.clean is None:
        return [
            f"verdict: headers valid{index}; no model given, so names were not matched (exit 0)"
        ]
    if head is not None or r.clean:  # each loader's column says its own problems
        return _loads(r, head, index)
    lines = [f"verdict: would NOT load: {_problems(r.problems())} (exit 1)"]
    if r.fix is not None and r.fix.proven:
        lines.append("         (it would load cleanly with the suggested fix, at the top)")
    return lines


def _disagree(c: CheckpointSummary) -> str:
    return "the index disagrees with its shards" if c.index else "the files cannot all be read"


def _loads(r: Report, head: str | None, index: str) -> list[str]:
    """The verdict when the selected loaders say it loads (or, with ``head``, each loader's)."""
    tp = r.tensor_parallel
    where = ""
    if tp is not None and not tp.ok:  # vLLM's refusal: its column says it
        pass
    elif tp is not None and tp.simulated:
        where = f" on each of {tp.tp} ranks"
    elif tp is not None:  # nothing was loaded per rank: say what was checked
        where = (
            f" (tp={tp.tp}: the config's head counts and vocabulary split checked; "
            "no rank simulated)"
        )
    if head is None:
        return [f"verdict: would load cleanly{where}{index} (exit 0)"]
    status = f"(exit {0 if r.clean else 1})"
    said = f"{where}{index}".removeprefix("; ").strip()
    if "\n" in head:  # one loader a line, under the word "verdict"
        rows = [*("  " + row for row in head.splitlines()), f"  {said} {status}".rstrip()]
        return ["verdict:", *rows] if said else ["verdict:", *rows[:-1], f"  {status}"]
    return [f"verdict: {head}{where}{index} {status}"]


def _odd(node: LayoutNode) -> str:
    parts = [v.text(usual=True) for v in node.variants]
    if node.missing_in:
        parts.append(f"missing in {_names(node.missing_in)}")
    if node.only_in:
        parts.append(f"only in {_names(node.only_in)} (of {node.of})")
    return "; ".join(parts)


def _problems(problems: list[str]) -> str:
    return "; ".join(printable(p) for p in problems)


def _torch_name(safetensors_dtype: str) -> str:
    return DTYPES[safetensors_dtype][0] if safetensors_dtype in DTYPES else safetensors_dtype
