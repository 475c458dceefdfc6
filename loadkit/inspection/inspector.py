"""``inspect_checkpoint``: where a checkpoint's names meet a model's names, before any load.

The report has sections, each present only when its inputs are:

- ``checkpoint`` and ``layout``: from the safetensors headers alone (files, dtypes, the key tree);
- ``mapper``: which ``WeightsMapper`` rule fired for which key, and which keys it drops;
- ``model``, ``probe`` and ``load``: with a model, built on the meta device. ``probe`` is the
  pooling adapter's prefix probe under ``"old"`` and ``"new"``; ``load`` is a simulated load
  (``loadkit.inspection.simulate``): every key's fate, missing and unexpected names with the
  nearest names, shape mismatches and dtype casts.

This module does not import torch: without a model the whole report is built from headers, and
torch (over a second to import) is only paid for when a model is asked for.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from loadkit.checkpoint.index import IndexProblem
from loadkit.checkpoint.reader import Checkpoint
from loadkit.checkpoint.sources import Source, open_source
from loadkit.errors import LoadkitError, MapperConfigError, printable
from loadkit.inspection.layout import LayoutNode, build_layout
from loadkit.inspection.options import LoadRules, pattern_problem
from loadkit.inspection.render import render_report
from loadkit.inspection.summary import CheckpointSummary, MapperReport, RuleUse, ShardSummary

TYPE_CHECKING = False  # typing's, without importing typing (see loadkit.checkpoint.record)
if TYPE_CHECKING:
    from typing import Any

    from torch import nn

    from loadkit.inspection.fix import SuggestedFix
    from loadkit.inspection.loaders import LoaderVerdict
    from loadkit.inspection.records import LoadReport, ModelSummary
    from loadkit.inspection.simulate.from_pretrained import FromPretrained
    from loadkit.inspection.tensor_parallel.plan import TPReport
    from loadkit.mapper import WeightsMapper
    from loadkit.pooling.probe import ProbeVerdict

# The mapper and the probe are imported where used: a plain layout report needs neither, and
# every module spared keeps `python -m loadkit inspect` close to the cost of reading the headers.
# For the same reason the report is a plain class, not a dataclass (see loadkit.inspection.summary).

SCHEMA_VERSION = 4  # docs/inspect.md, "The --json document", says what each version added
MAX_MAPPER_BYTES = 10_000_000  # a --mapper file (rules, not data)


def _verdict_dict(v: ProbeVerdict) -> dict[str, Any]:
    return {
        "hit": v.hit,
        "prefix": v.prefix,
        "hit_index": v.hit_index,
        "hit_key": v.hit_key,
        "clones": v.walked,
        "cloned_bytes": v.cloned_bytes,
        "total_keys": v.total_keys,
        "total_bytes": v.total_bytes,
    }


# --- the report ---------------------------------------------------------------------------------


class InspectReport:
    """The report: ``checkpoint`` (headers), and with a model ``model``, ``probe``, ``load``;
    ``mapper`` whenever a mapper is involved. ``render()`` is the CLI's text, ``to_json()`` its
    ``--json`` document."""

    def __init__(
        self,
        checkpoint: CheckpointSummary,
        mapper: MapperReport | None = None,
        model: ModelSummary | None = None,
        probe: dict[str, ProbeVerdict] | None = None,
        load: LoadReport | None = None,
        tensor_parallel: TPReport | None = None,
        fix: SuggestedFix | None = None,
        strict_index: bool = False,
        loaders: dict[str, LoaderVerdict] | None = None,
        selected_loaders: tuple[str, ...] = ("vllm",),
        from_pretrained: FromPretrained | None = None,
    ) -> None:
        self.checkpoint = checkpoint
        self.mapper = mapper
        self.model = model
        self.probe = probe
        self.load = load
        self.tensor_parallel = tensor_parallel
        self.fix = fix  # mapper rules that fix a systematic mismatch, proven by a second load
        self._layouts: dict[bool, LayoutNode] = {}
        self.strict_index = strict_index  # an inconsistent index fails (exit 1)
        # One verdict per loader ("vllm", and "transformers" for --model hf), those selected
        # by --loader deciding ``clean``; ``from_pretrained``: the transformers loader's lists.
        self.loaders = loaders
        self.selected_loaders = selected_loaders
        self.from_pretrained = from_pretrained

    def __repr__(self) -> str:
        c = self.checkpoint
        return f"<InspectReport {c.path}: {len(c.tensors)} tensors, clean={self.clean}>"

    def _layout(self, fold: bool) -> LayoutNode:
        if fold not in self._layouts:
            items = ((t.name, t.nbytes, t.dtype, t.shape) for t in self.checkpoint.tensors)
            self._layouts[fold] = build_layout(items, fold=fold)
        return self._layouts[fold]

    @property
    def layout(self) -> LayoutNode:
        """The key tree, one node per dotted prefix (built on first use)."""
        return self._layout(False)

    @property
    def folded_layout(self) -> LayoutNode:
        """The key tree with numbered siblings merged (``layers.{0-27}``): the report's view."""
        return self._layout(True)

    @property
    def clean(self) -> bool | None:
        """Would the checkpoint load cleanly into the model? ``None`` without a model."""
        if self.load is None:
            return None
        if self.loaders:
            return all(self.loaders[n].clean for n in self.selected_loaders)
        return self.load.clean and not self.checkpoint.failing

    @property
    def exit_status(self) -> int:
        """0: loads cleanly (or no model to load into: every tensor the index names can be read),
        an inconsistent index included (a key in another shard than it says, one it does not
        list, a wrong ``total_size``); 1: it would not, a tensor cannot be read, (with
        ``strict_index``) the index is inconsistent, or (with ``tp``) the ranks could not hold
        it."""
        tp_fails = self.tensor_parallel is not None and not self.tensor_parallel.ok
        strict = self.strict_index and bool(self.checkpoint.inconsistent)
        return 1 if self.clean is False or self.checkpoint.failing or tp_fails or strict else 0

    def problems(self) -> list[str]:
        """Short descriptions of what keeps the checkpoint from loading cleanly."""
        out = []
        if self.checkpoint.failing:
            n = len(self.checkpoint.failing)
            out.append(f"{n} index problem{'s' if n != 1 else ''} that stop the load")
        if self.strict_index and self.checkpoint.inconsistent:
            n = len(self.checkpoint.inconsistent)
            out.append(f"{n} index inconsistenc{'ies' if n != 1 else 'y'} (--strict-index)")
        if self.load is not None and "vllm" in self.selected_loaders:
            out += self.load.problems()
        if self.from_pretrained is not None and "transformers" in self.selected_loaders:
            out += [f"transformers: {p}" for p in self.from_pretrained.problems()]
        return out + (self.tensor_parallel.problems() if self.tensor_parallel is not None else [])

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "checkpoint": self.checkpoint.as_dict(),
            "layout": self.folded_layout.as_dict(),
            "mapper": self.mapper.as_dict() if self.mapper else None,
            "model": self.model.as_dict() if self.model else None,
            "probe": {b: _verdict_dict(v) for b, v in self.probe.items()} if self.probe else None,
            "load": self.load.as_dict() if self.load else None,
            "tensor_parallel": self.tensor_parallel.as_dict() if self.tensor_parallel else None,
            "suggested_fix": self.fix.as_dict() if self.fix else None,
            "loaders": {n: v.as_dict() for n, v in self.loaders.items()} if self.loaders else None,
            "selected_loaders": list(self.selected_loaders),
            "transformers": self.from_pretrained.as_dict() if self.from_pretrained else None,
            "clean": self.clean,
            "exit_status": self.exit_status,
        }

    def to_json(self, indent: int | None = None) -> str:
        """One JSON document; one line by default (json's C encoder: indenting runs in Python
        and costs more than the whole header parse of a 2000-name checkpoint)."""
        return json.dumps(self.as_dict(), indent=indent)

    def render(self, *, limit: int = 20, max_depth: int | None = None) -> str:
        """The report as text: the sections in order, each list capped at ``limit`` rows."""
        return render_report(self, limit=limit, max_depth=max_depth)

    def __str__(self) -> str:
        return self.render()


# --- building it ----------------------------------------------------------------------------------


def summarize_checkpoint(
    ck: Checkpoint, problems: list[IndexProblem] | None = None, source: Source | None = None
) -> CheckpointSummary:
    per_file: dict[str, list[int]] = {f: [0, 0] for f in ck.files}
    dtypes: dict[str, list[int]] = {}
    for t in ck.tensors.values():
        s = per_file.setdefault(t.file, [0, 0])
        s[0] += 1
        s[1] += t.nbytes
        d = dtypes.setdefault(t.dtype, [0, 0])
        d[0] += 1
        d[1] += t.nbytes
    return CheckpointSummary(
        ck.path,
        [ShardSummary(f, n, b) for f, (n, b) in per_file.items()],
        list(ck.tensors.values()),
        ck.total_bytes,
        {k: (n, b) for k, (n, b) in sorted(dtypes.items())},
        list(problems or []),
        source,
    )


def parse_mapper(
    rules: WeightsMapper | Mapping[str, Any] | str | os.PathLike[str],
) -> WeightsMapper:
    """A mapper from a ``WeightsMapper``, a dict of its fields, JSON text, or a JSON file's path."""
    from loadkit.mapper import WeightsMapper

    if isinstance(rules, WeightsMapper):
        return rules
    if isinstance(rules, Mapping):
        return WeightsMapper.from_json(rules)
    text = str(rules)
    source = "--mapper"
    if not text.lstrip().startswith(("{", "[")):
        from loadkit.checkpoint.shards import open_regular

        path = Path(text)
        try:
            exists = path.exists()
        except (OSError, ValueError):  # a name too long, or with a NUL byte
            exists = False
        if not exists:
            shown = text if len(text) <= 80 else text[:77] + "..."
            raise MapperConfigError(
                f"--mapper {shown!r}: neither JSON rules (an object such as "
                '{"orig_to_new_prefix": {"model.": ""}}) nor a readable JSON file'
            )
        source = str(path)
        fd = open_regular(source, lambda m: MapperConfigError(f"{printable(source)}: {m}"))
        with os.fdopen(fd, "rb") as f:
            raw = f.read(MAX_MAPPER_BYTES + 1)
        if len(raw) > MAX_MAPPER_BYTES:
            raise MapperConfigError(f"{printable(source)}: larger than {MAX_MAPPER_BYTES} bytes")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MapperConfigError(f"{printable(source)}: not UTF-8 ({exc.reason})") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise MapperConfigError(f"{source}: mapper rules nest too deeply") from None
    except ValueError as exc:  # JSONDecodeError, or an integer of more than 4300 digits
        raise MapperConfigError(f"{source}: mapper rules are not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise MapperConfigError(
            f"{source}: mapper rules must be a JSON object of WeightsMapper fields, "
            f"not {type(data).__name__}"
        )
    return WeightsMapper.from_json(data)


def mapper_report(
    mapper: WeightsMapper,
    names: list[str],
    source: str,
    origins: Mapping[tuple[str, str], str] | None = None,
) -> MapperReport:
    """Trace every name through ``mapper``: rule use counts, per-key steps, dropped keys.

    ``origins`` says where rules come from, by ``(stage, rule text)`` (a model's
    ``mapper_rule_origins``: which rules transformers supplied)."""
    origins = origins or {}
    rules: dict[tuple[str, str], RuleUse] = {}
    for stage, text, target in mapper.rules():
        rules.setdefault((stage, text), RuleUse(stage, text, target, origins.get((stage, text))))
    traces: list[dict[str, Any]] = []
    dropped: list[tuple[str, str]] = []
    unchanged = 0
    for name in names:
        t = mapper.trace(name)
        if not t.steps:
            unchanged += 1
            continue
        for step in t.steps:
            use = rules[(step.stage, step.rule)]
            use.fired += 1
            if use.example is None:
                use.example = (step.before, step.after)
        if t.result is None and t.dropped_by is not None:
            dropped.append((name, f"{t.dropped_by.stage} {t.dropped_by.rule!r}"))
        traces.append(
            {
                "name": name,
                "mapped": t.result,
                "shard_id": t.shard_id,
                "steps": [
                    {"stage": s.stage, "rule": s.rule, "before": s.before, "after": s.after}
                    for s in t.steps
                ],
            }
        )
    from loadkit.mapper import rematch_examples

    report = MapperReport(source, list(rules.values()), traces, dropped, unchanged)
    # Stacked rules vLLM 0.28.0 applies one inside the other's output, whatever this mapper's
    # behaviour: the warning is about what vLLM does with these rules.
    report.rematches = rematch_examples(mapper, names)
    report.behaviour = mapper.behaviour
    return report


def inspect_checkpoint(
    checkpoint: str | os.PathLike[str] | Checkpoint,
    *,
    model: str | nn.Module | Callable[..., nn.Module] | None = None,
    mapper: WeightsMapper | Mapping[str, Any] | str | None = None,
    mapper_label: str = "given mapper",
    replace_mapper: bool = False,
    rules: LoadRules | None = None,
    model_args: Mapping[str, Any] | None = None,
    probe: bool | None = None,
    suggest: bool = True,
    tp: int | None = None,
    strict_index: bool = False,
    timeout: float | None = None,
    loader: str = "all",
) -> InspectReport:
    """Inspect ``checkpoint`` (a file, a folder, a sharded index, or an opened ``Checkpoint``).

    Args:
        checkpoint: what to inspect; only headers are read. Also a Hugging Face repo id
            (``org/name[@revision]``, from the local cache) or an ``http(s)://`` URL of a
            ``.safetensors`` file or an index (read with Range requests).
        model: a built-in name (``loadkit.models.registry.BUILTIN``), a
            ``"package.module:callable"`` spec, a callable (called with no argument, or with the
            checkpoint's ``tensors`` mapping), or a module (copied to the meta device; the
            caller's is left alone).
        mapper: rules added after the model's own, stage by stage (those its root
            ``AutoWeightsLoader`` is given, and its ``hf_to_vllm_mapper``, which the probe
            reads); with ``replace_mapper`` they replace them.
        replace_mapper: ``mapper`` replaces the model's rules instead of extending them.
        rules: rules added to the model's root loader (skip, ignore) and to the verdict
            (``allow_missing``, ``strict_dtype``).
        model_args: keyword arguments for a callable ``model``.
        probe: report the pooling probe; ``None``: only for a pooling model.
        suggest: infer mapper rules for a systematic mismatch and prove them by a second load.
        strict_index: an inconsistent index (every tensor still loads) fails the report too.
        tp: also simulate each of ``tp`` tensor-parallel ranks on the meta device and report
            what each would hold and what cannot work (``report.tensor_parallel``).
        timeout: seconds each request to a remote checkpoint may take.
        loader: whose verdict decides ``clean``: ``"vllm"``, ``"transformers"`` (a model built
            from a transformers class, ``--model hf``: ``PreTrainedModel.from_pretrained``,
            simulated header-only) or ``"all"`` (every loader the model has).

    Returns:
        The report; bad input raises a ``loadkit.errors.LoadkitError``.

    Example:
        >>> report = inspect_checkpoint("data/gemma4_like/model.safetensors")  # headers only
        >>> report.clean, len(report.checkpoint.tensors), report.exit_status
        (None, 73, 0)
        >>> report = inspect_checkpoint("data/plamo2/untied.safetensors", model="plamo2")
        >>> report.clean, report.exit_status, report.probe
        (True, 0, None)
    """
    for pattern in rules.allow_missing if rules else ():
        problem = pattern_problem(pattern)
        if problem is not None:
            raise LoadkitError(f"allow_missing: invalid pattern {pattern!r}: {problem}")
    problems: list[IndexProblem] = []
    named: Source | None = None
    if isinstance(checkpoint, Checkpoint):
        ck = checkpoint
    else:  # a path (a folder: every index problem collected), a repo id, a URL
        ck, problems, named = open_source(checkpoint, timeout=timeout)
    infos = list(ck.tensors.values())
    report = InspectReport(summarize_checkpoint(ck, problems, named), strict_index=strict_index)
    user_mapper = None if mapper is None else parse_mapper(mapper)
    names = [t.name for t in infos]
    if model is None:
        if tp is not None:
            raise LoadkitError("tp needs a model: what each rank holds depends on its layers")
        if user_mapper is not None:
            report.mapper = mapper_report(user_mapper, names, mapper_label)
        return report

    # Only now does torch come in (the registry imports it when it builds the model).
    from loadkit.mapper import WeightsMapper
    from loadkit.models.registry import build_model
    from loadkit.pooling.probe import probe_verdict

    module, spec = build_model(model, ck.tensors, model_args, checkpoint=ck)
    from loadkit.inspection.simulate import dry_load, model_summary

    own_mapper = getattr(module, "hf_to_vllm_mapper", None)
    if not isinstance(own_mapper, WeightsMapper):
        own_mapper = None
    model_mapper = own_mapper  # the model's own, before any --mapper
    if user_mapper is not None:
        # The pooling probe reads hf_to_vllm_mapper: an instance attribute replaces the class's
        # for this (meta) model only. The dry load extends (or replaces) the root loader's.
        combined = user_mapper if replace_mapper or own_mapper is None else own_mapper | user_mapper
        setattr(module, "hf_to_vllm_mapper", combined)  # noqa: B010 (an instance attribute)
        own_mapper = combined
    report.model = model_summary(module, spec)
    if probe or (probe is None and report.model.pooling):
        params = {name for name, _ in module.named_parameters()}
        keys = [(t.name, t.nbytes) for t in infos]
        report.probe = {
            b: probe_verdict(keys, params, mapper=own_mapper, behaviour=b) for b in ("old", "new")
        }
    rules = rules or LoadRules()
    replace = user_mapper is not None and replace_mapper
    extend = None if replace else user_mapper
    report.load, used, autoloader = dry_load(
        module,
        infos,
        mapper=own_mapper if replace else model_mapper,
        replace_mapper=replace,
        extend=extend,
        rules=rules,
    )
    cls = type(module).__name__
    origins = getattr(module, "mapper_rule_origins", None)
    if user_mapper is not None:
        traced, label = user_mapper, mapper_label
        if autoloader and used is not None and extend is not None:  # what the load used
            traced, label = used, f"{cls}'s own rules, then {mapper_label}"
        report.mapper = mapper_report(traced, names, label, origins)
        if not autoloader:
            report.mapper.note = (
                f"{cls}.load_weights does not load through an AutoWeightsLoader at its root: "
                "these rules were traced, and given to the pooling probe, but not to the load"
            )
    elif autoloader and used is not None:
        source = (
            f"{cls}.hf_to_vllm_mapper"
            if used is own_mapper
            else f"the mapper {cls}.load_weights loads with"
        )
        report.mapper = mapper_report(used, names, source, origins)
    elif own_mapper is not None:
        report.mapper = mapper_report(own_mapper, names, f"{cls}.hf_to_vllm_mapper", origins)
    if rules.for_loader and not autoloader:
        report.load.notes.append(
            f"{cls}.load_weights does not load through an AutoWeightsLoader at its root: the "
            "skip and ignore rules given were not applied"
        )
    if suggest and not report.load.clean and autoloader:
        from loadkit.inspection.fix import suggest_fix

        def retry(with_mapper: WeightsMapper) -> LoadReport:
            return dry_load(
                module, infos, mapper=with_mapper, replace_mapper=True, rules=rules
            ).report

        report.fix = suggest_fix(report.load, used, retry, given=user_mapper, replace=replace)
    _loader_verdicts(report, module, infos, loader)
    if report.fix is not None and report.selected_loaders:
        report.fix.other_loaders = tuple(n for n in report.selected_loaders if n != "vllm")
    if report.fix is not None:
        # An audit event (sys.audit), for whoever listens (the test suite pastes every
        # suggestion it sees): the report and the call that made it.
        call = {
            "checkpoint": checkpoint,
            "model": model,
            "rules": rules,
            "model_args": model_args,
            "timeout": timeout,
            "loader": loader,
        }
        sys.audit("loadkit.inspect.suggested_fix", report, call)
    if tp is not None:
        from torch import nn as _nn

        from loadkit.inspection.tensor_parallel.plan import tp_report

        if isinstance(model, _nn.Module):
            raise LoadkitError(
                "tp needs a model name, spec or callable: a built module cannot be rebuilt "
                "for each rank's share"
            )
        build = lambda: build_model(model, ck.tensors, model_args, checkpoint=ck)[0]  # noqa: E731
        report.tensor_parallel = tp_report(ck.tensors, build, tp)
    return report


def _loader_verdicts(
    report: InspectReport, module: nn.Module, infos: list[Any], loader: str
) -> None:
    """One verdict per loader the model has: ``vllm`` from the dry load, and for a model built
    from a transformers class ``transformers`` (``from_pretrained``, simulated on meta)."""
    from loadkit.inspection.loaders import (
        TRANSFORMERS,
        VLLM,
        available_loaders,
        select_loaders,
        transformers_verdict,
        vllm_verdict,
    )

    assert report.load is not None
    available = available_loaders(module)
    selected = select_loaders(loader, available)
    verdicts = {VLLM: vllm_verdict(report.load, report.checkpoint)}
    if TRANSFORMERS in selected:
        from loadkit.inspection.simulate.from_pretrained import from_pretrained_verdict

        config = getattr(module, "config")  # noqa: B009 (a transformers wrapper's config)
        report.from_pretrained = from_pretrained_verdict(config, infos)
        verdicts[TRANSFORMERS] = transformers_verdict(report.from_pretrained, report.checkpoint)
    report.loaders = {n: verdicts[n] for n in available if n in verdicts}
    report.selected_loaders = selected
