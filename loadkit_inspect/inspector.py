"""``inspect_checkpoint``: where a checkpoint's names meet a model's names, before any load.

The inspector is a pipeline of small steps, each taking and returning plain records, in the
order this module defines them:

1. ``read_checkpoint``: the safetensors headers (a file, a folder and its index, a repo id in the
   local cache, a URL), never the tensor data;
2. ``map_names``: the ``--mapper`` rules parsed, every checkpoint name traced through them;
3. ``build``: the model on the meta device, with the given rules in place of its own
   (``probe_prefixes`` then runs the pooling adapter's prefix probe, ``"old"`` and ``"new"``);
4. ``load``: a simulated load (``loadkit_inspect.simulate``): every key's fate, missing and
   unexpected names with the nearest names, shape mismatches and dtype casts; ``trace_mapper``
   then traces the mapper the load used;
5. ``plan_tensor_parallel``: each of ``tp`` ranks simulated on the meta device (or the config
   checked as vLLM checks it); ``judge_loaders`` then gives one verdict per loader the model has
   (``vllm``, with what it makes of ``tp``, and for a transformers model ``transformers``:
   ``from_pretrained`` simulated on the meta device);
6. ``suggest_fixes``: mapper rules for a systematic mismatch, proven by a second dry load (or
   the rules considered and refused, and why);
7. the report (``loadkit_inspect.inspect_report.InspectReport``) holds the records.

Without a model the pipeline stops after step 2. This module does not import torch: the steps
that need it import it, so a header-only report is built from headers alone.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from loadkit.checkpoint import Checkpoint, IndexProblem, TensorInfo
from loadkit.errors import LoadkitError, require_torch
from loadkit_inspect.inspect_report import InspectReport
from loadkit_inspect.options import LoadRules, pattern_problem
from loadkit_inspect.progress import Progress
from loadkit_inspect.report.summary import CheckpointSummary, summarize_checkpoint
from loadkit_inspect.sources.resolve import Source, open_source

if TYPE_CHECKING:
    from torch import nn

    from loadkit.mapper import WeightsMapper
    from loadkit.pooling import ProbeRecord
    from loadkit_inspect.fixes.fix import NotOffered, SuggestedFix
    from loadkit_inspect.fixes.rename_fix import RenameFix
    from loadkit_inspect.loaders import LoaderVerdict
    from loadkit_inspect.mapper_trace import MapperReport
    from loadkit_inspect.report.records import ModelSummary
    from loadkit_inspect.simulate import DryLoad
    from loadkit_inspect.simulate.from_pretrained import FromPretrained
    from loadkit_inspect.sources.files import FileChoice
    from loadkit_inspect.tensor_parallel.plan import TPReport


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
    progress: bool = False,
    model_impl: str = "auto",
) -> InspectReport:
    """Inspect ``checkpoint``: the pipeline, each step below in order, each given what it needs;
    the records they return make the report. These keywords are the inspector's options, the
    only place they are spelled (``loadkit inspect``'s flags are read into them).

    Args:
        checkpoint: what to inspect (a file, a folder, a sharded index, or an opened
            ``Checkpoint``); only headers are read. Also a Hugging Face repo id
            (``org/name[@revision]``, from the local cache) or an ``http(s)://`` URL of a
            ``.safetensors`` file or an index (read with Range requests).
        model: a built-in name (``loadkit_inspect.models.registry.BUILTIN``), a
            ``"package.module:callable"`` spec, a callable (called with no argument, or with the
            checkpoint's ``tensors`` mapping), or a module (copied to the meta device; the
            caller's is left alone).
        mapper: rules (a ``WeightsMapper``, a dict of its fields, JSON text or a JSON file's
            path) added after the model's own, stage by stage (those its root
            ``AutoWeightsLoader`` is given, and its ``hf_to_vllm_mapper``, which the probe
            reads); with ``replace_mapper`` they replace them.
        mapper_label: how the report names ``mapper``.
        replace_mapper: ``mapper`` replaces the model's rules instead of extending them.
        rules: rules added to the model's root AutoWeightsLoader (skip, ignore) and to the verdict
            (``allow_missing``, ``strict_dtype``).
        model_args: keyword arguments for a callable ``model``.
        probe: report the pooling probe; ``None``: only for a pooling model.
        suggest: infer mapper rules for a systematic mismatch and prove them by a second load.
        tp: also simulate each of ``tp`` tensor-parallel ranks on the meta device and report
            what each would hold and what cannot work (``report.tensor_parallel``).
        strict_index: an inconsistent index (every tensor still loads) fails the report too.
        timeout: seconds each request to a remote checkpoint may take.
        loader: whose verdict decides ``clean``: ``"vllm"``, ``"transformers"`` (a model built
            from a transformers class, ``--model hf``: ``PreTrainedModel.from_pretrained``,
            simulated header-only) or ``"all"`` (every loader the model has).
        progress: show a progress bar on stderr (tqdm) once the inspect has run 2 seconds
            (``LOADKIT_PROGRESS_DELAY`` seconds when set): shards read, names loaded.
        model_impl: for ``model="hf"``, the implementation vLLM 0.34.0 is asked for (its
            ``--model-impl``): ``"auto"`` (its native class where it has one), ``"vllm"``,
            ``"transformers"`` (the Transformers modeling backend).

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
    rules = check_patterns(rules or LoadRules())
    with Progress(progress) as bar:
        read = read_checkpoint(checkpoint, timeout, bar)
        names = map_names(mapper, mapper_label, replace_mapper, read)
        if model is None:
            if tp is not None:
                raise LoadkitError("tp needs a model: what each rank holds depends on its layers")
            return InspectReport(read.summary, mapper=names.report, strict_index=strict_index)
        built = build(model, dict(model_args or {}), read, names, model_impl)
        probed = probe_prefixes(probe, read, built)
        # vLLM would use a class loadkit does not model: no load of another class stands in.
        loaded = None if built.vllm_unmodelled else load(rules, read, built, names, bar)
        traced = names.report if loaded is None else trace_mapper(read, built, loaded, names)
        plan = plan_tensor_parallel(tp, model, dict(model_args or {}), read, model_impl, built)
        verdicts = judge_loaders(loader, strict_index, rules, read, built, loaded, plan)
        fix, not_offered = suggest_fixes(suggest, rules, read, built, loaded, names, verdicts, bar)
        renaming = suggest_rename(suggest, rules, read, built, names, verdicts, bar)
    return InspectReport(
        read.summary,
        mapper=traced,
        model=built.summary,
        probe=probed,
        load=None if loaded is None else loaded.report,
        tensor_parallel=plan,
        fix=fix,
        strict_index=strict_index,
        loaders=verdicts.loaders,
        selected_loaders=verdicts.selected,
        from_pretrained=verdicts.from_pretrained,
        not_offered=not_offered,
        rename_fix=renaming,
    )


# --- the records the steps pass on ----------------------------------------------------------------


class CheckpointRead(NamedTuple):
    """Step 1: the opened checkpoint and its header summary (index problems included)."""

    checkpoint: Checkpoint
    summary: CheckpointSummary

    @property
    def infos(self) -> list[TensorInfo]:
        """The checkpoint's tensors, in the order ``Checkpoint.weights()`` yields them."""
        return self.summary.tensors

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.summary.tensors]


class NameMapping(NamedTuple):
    """Step 2: the user's mapper (``None``: the model's own), every name traced through it, how
    the report names it, and whether it replaces the model's own rules."""

    mapper: WeightsMapper | None
    report: MapperReport | None
    label: str = "given mapper"
    replace: bool = False

    @property
    def replaces(self) -> bool:
        """Does a mapper given replace the model's own rules?"""
        return self.mapper is not None and self.replace


class BuiltModel(NamedTuple):
    """Step 3: the model on the meta device, and the mapper it loads with (``hf_to_vllm_mapper``,
    extended, or replaced, by the user's when given)."""

    module: nn.Module
    summary: ModelSummary
    mapper: WeightsMapper | None
    own_mapper: WeightsMapper | None  # the model's own, before any --mapper

    @property
    def cls(self) -> str:
        return type(self.module).__name__

    @property
    def vllm_unmodelled(self) -> str | None:
        """Why the ``vllm`` column is not checked (vLLM would use a class loadkit does not
        model), or ``None``."""
        return getattr(self.module, "vllm_unmodelled", None)


class LoaderVerdicts(NamedTuple):
    """Step 5: one verdict per loader the model has, those ``selected`` deciding ``clean``;
    ``from_pretrained``: the transformers loader's own lists (a transformers model only)."""

    loaders: dict[str, LoaderVerdict]
    selected: tuple[str, ...]
    from_pretrained: FromPretrained | None


# --- the steps, in order --------------------------------------------------------------------------


def check_patterns(rules: LoadRules) -> LoadRules:
    """``rules``, once every ``allow_missing`` pattern is known to match something if it can:
    one that would quietly match nothing is an error up front."""
    for pattern in rules.allow_missing:
        problem = pattern_problem(pattern)
        if problem is not None:
            raise LoadkitError(f"allow_missing: invalid pattern {pattern!r}: {problem}")
    return rules


def read_checkpoint(
    checkpoint: str | os.PathLike[str] | Checkpoint,
    timeout: float | None = None,
    progress: Progress | None = None,
) -> CheckpointRead:
    """Open ``checkpoint``'s headers: a path (a folder: every index problem collected, the rest
    read), a repo id or a URL (``timeout``: seconds per request); ``progress`` counts shards.
    Each loader's files are chosen as it chooses them; the checkpoint kept is what vLLM reads
    (the dry load's input), every file counted."""
    from loadkit_inspect.sources.files import loader_files

    problems: list[IndexProblem] = []
    named: Source | None = None
    if isinstance(checkpoint, Checkpoint):
        ck = checkpoint
    else:
        count = progress.stage("reading headers", "shard") if progress else None
        ck, problems, named = open_source(checkpoint, timeout=timeout, progress=count)
    choices = loader_files(ck.path, named.kind if named else None, ck.files)
    held = ck.held
    ck = _as_vllm_reads(ck, choices.get("vllm"))
    return CheckpointRead(ck, summarize_checkpoint(ck, problems, named, choices, held))


def _as_vllm_reads(ck: Checkpoint, choice: FileChoice | None) -> Checkpoint:
    """The checkpoint as vLLM reads it, where its files are not the ones read (a
    ``consolidated*.safetensors`` file selects the Mistral format; numbers in file names sort
    as numbers): those files, every tensor of each, in its order."""
    from loadkit.checkpoint import Layout, read_layout, read_safetensors_header

    if choice is None or not choice.files or choice.raises or choice.pickle:
        return ck
    if not os.path.isdir(ck.path):  # a file, a URL: what both loaders read
        return ck
    paths = [os.path.join(ck.path, f) for f in choice.files]
    if paths == ck.files:
        return ck
    layout = Layout(ck.path, None, dict(zip(choice.files, paths, strict=True)), {}, {})
    merged = read_layout(layout, read_safetensors_header, strict=False, exists=os.path.lexists)
    return Checkpoint(ck.path, merged.files, merged.tensors, merged.metadata_text, merged.held)


def map_names(
    mapper: WeightsMapper | Mapping[str, Any] | str | None,
    label: str,
    replace: bool,
    read: CheckpointRead,
) -> NameMapping:
    """Parse the user's mapper rules, if any, and trace every checkpoint name through them."""
    if mapper is None:
        return NameMapping(None, None, label, replace)
    from loadkit_inspect.mapper_trace import mapper_report, parse_mapper

    parsed = parse_mapper(mapper)
    return NameMapping(parsed, mapper_report(parsed, read.names, label), label, replace)


def build(
    model: str | nn.Module | Callable[..., nn.Module],
    model_args: Mapping[str, Any],
    read: CheckpointRead,
    names: NameMapping,
    model_impl: str = "auto",
) -> BuiltModel:
    """The model on ``meta`` (torch comes in here); the user's mapper extends (or replaces) its
    own. ``model_impl``: vLLM's ``--model-impl`` for an ``hf`` model."""
    from loadkit.mapper import WeightsMapper
    from loadkit_inspect.models.registry import build_model

    ck = read.checkpoint
    require_torch("--model (the load is simulated with torch on the meta device)")
    module, spec = build_model(model, ck.tensors, model_args, checkpoint=ck, model_impl=model_impl)
    # After the build: a model that cannot be built (no config.json) fails before torch loads.
    from loadkit_inspect.simulate import model_summary

    found = getattr(module, "hf_to_vllm_mapper", None)
    own = found if isinstance(found, WeightsMapper) else None
    mapper = own
    if names.mapper is not None:
        # The pooling probe reads hf_to_vllm_mapper: an instance attribute replaces the class's
        # for this (meta) model only. The dry load extends (or replaces) the root
        # AutoWeightsLoader's.
        extend = not names.replace and own is not None
        mapper = own | names.mapper if extend and own is not None else names.mapper
        setattr(module, "hf_to_vllm_mapper", mapper)  # noqa: B010 (an instance attribute)
    return BuiltModel(module, model_summary(module, spec), mapper, own)


def probe_prefixes(
    probe: bool | None, read: CheckpointRead, built: BuiltModel
) -> dict[str, ProbeRecord] | None:
    """The pooling probe's verdict under ``"old"`` and ``"new"``: asked for (``probe``), or
    (``probe`` ``None``) a pooling model; none where vLLM's class is not modelled (its pooling
    adapter would probe another model)."""
    if not (probe or (probe is None and built.summary.pooling)) or built.vllm_unmodelled:
        return None
    from loadkit.pooling import predict_probe

    params = {name for name, _ in built.module.named_parameters()}
    keys = [(t.name, t.nbytes) for t in read.infos]
    return {
        b: predict_probe(keys, params, mapper=built.mapper, behaviour=b) for b in ("old", "new")
    }


def load(
    rules: LoadRules,
    read: CheckpointRead,
    built: BuiltModel,
    names: NameMapping,
    progress: Progress,
) -> DryLoad:
    """The load simulated on ``meta`` with the model's ``load_weights`` and the user's rules."""
    from loadkit_inspect.simulate import dry_load

    replace = names.replaces
    loaded = dry_load(
        built.module,
        read.infos,
        mapper=built.mapper if replace else built.own_mapper,
        replace_mapper=replace,
        extend=None if replace else names.mapper,
        rules=rules,
        progress=progress.stage("dry load", "name"),
    )
    if rules.for_auto_loader and not loaded.auto_loader_at_root:
        loaded.report.notes.append(
            f"{built.cls}.load_weights does not load through an AutoWeightsLoader at its root: the "
            "skip and ignore rules given were not applied"
        )
    return loaded


def trace_mapper(
    read: CheckpointRead,
    built: BuiltModel,
    loaded: DryLoad,
    names: NameMapping,
) -> MapperReport | None:
    """The mapper section: the user's rules (as the load used them, after the model's own;
    noting a load that bypassed them), else the mapper the model's root AutoWeightsLoader used,
    else the model's ``hf_to_vllm_mapper``."""
    from loadkit_inspect.mapper_trace import mapper_report

    cls = built.cls
    origins = getattr(built.module, "mapper_rule_origins", None)
    if names.mapper is not None:
        traced, label = names.mapper, names.label
        if loaded.auto_loader_at_root and loaded.mapper is not None and not names.replace:
            traced, label = loaded.mapper, f"{cls}'s own rules, then {names.label}"
        report = mapper_report(traced, read.names, label, origins)
        if not loaded.auto_loader_at_root:
            report.note = (
                f"{cls}.load_weights does not load through an AutoWeightsLoader at its root: "
                "these rules were traced, and given to the pooling probe, but not to the load"
            )
        return report
    if loaded.auto_loader_at_root and loaded.mapper is not None:
        source = (
            f"{cls}.hf_to_vllm_mapper"
            if loaded.mapper is built.mapper
            else f"the mapper {cls}.load_weights loads with"
        )
        return mapper_report(loaded.mapper, read.names, source, origins)
    if built.mapper is not None:
        return mapper_report(built.mapper, read.names, f"{cls}.hf_to_vllm_mapper", origins)
    return None


def plan_tensor_parallel(
    tp: int | None,
    model: str | nn.Module | Callable[..., nn.Module],
    model_args: Mapping[str, Any],
    read: CheckpointRead,
    model_impl: str = "auto",
    built: BuiltModel | None = None,
) -> TPReport | None:
    """Each of ``tp`` ranks simulated on ``meta``: what it would hold, and what cannot work;
    where vLLM's class is not modelled (``built``), its config alone, checked as vLLM checks it
    before it builds anything."""
    if tp is None:
        return None
    from torch import nn

    from loadkit_inspect.models.registry import build_model
    from loadkit_inspect.tensor_parallel.plan import config_report, tp_report

    if built is not None and built.vllm_unmodelled:
        return config_report(built.module, tp, "the vllm column is not checked")

    ck = read.checkpoint
    if isinstance(model, nn.Module):
        raise LoadkitError(
            "tp needs a model name, spec or callable: a built module cannot be rebuilt "
            "for each rank's share"
        )

    def rebuild() -> nn.Module:
        return build_model(model, ck.tensors, model_args, checkpoint=ck, model_impl=model_impl)[0]

    return tp_report(ck.tensors, rebuild, tp)


def judge_loaders(
    loader: str,
    strict_index: bool,
    rules: LoadRules,
    read: CheckpointRead,
    built: BuiltModel,
    loaded: DryLoad | None,
    plan: TPReport | None = None,
) -> LoaderVerdicts:
    """``vllm``'s verdict from the dry load (and ``plan``: what it makes of ``--tp``), and for a
    model built from a transformers class ``transformers``'s (``from_pretrained``, simulated on
    meta, under the user's ``rules``), when ``loader`` asks; ``strict_index`` fails both alike."""
    from loadkit_inspect.loaders import (
        TRANSFORMERS,
        VLLM,
        available_loaders,
        hf_config,
        select_loaders,
        transformers_verdict,
        vllm_side,
        vllm_verdict,
    )

    available = available_loaders(built.module)
    side = vllm_side(built.module, loaded)
    refused = plan is not None and plan.refusal is not None  # vLLM's config check: any class
    selected = select_loaders(loader, available, unchecked=None if refused else side.unmodelled)
    strict = strict_index
    files = _vllm_choice(read)
    report = None if loaded is None else loaded.report
    verdicts = {
        VLLM: vllm_verdict(
            report, read.summary, tp=plan, strict_index=strict, side=side, files=files
        )
    }
    from_pretrained = None
    if TRANSFORMERS in selected:
        config = hf_config(built.module)
        from_pretrained = _from_pretrained(read, config).under(rules)
        verdicts[TRANSFORMERS] = transformers_verdict(
            from_pretrained, read.summary, strict_index=strict
        )
    loaders = {n: verdicts[n] for n in available if n in verdicts}
    return LoaderVerdicts(loaders, selected, from_pretrained)


def _vllm_choice(read: CheckpointRead) -> FileChoice | None:
    """The files vLLM's default loader reads (``None``: an opened ``Checkpoint``)."""
    return read.summary.loader_files.get("vllm")


def _from_pretrained(read: CheckpointRead, config: Any) -> FromPretrained:
    """``from_pretrained`` simulated on the files it reads (a folder: chosen as transformers
    chooses them, the config's ``transformers_weights`` included; a file or a URL: that
    checkpoint). Where it raises before loading (no file it reads, one it cannot open), the
    lists are those of what it could read: of the files vLLM reads when it reads none."""
    from loadkit_inspect.simulate.from_pretrained import from_pretrained_verdict
    from loadkit_inspect.sources.files import configured_weights, read_chosen, transformers_files

    choice = read.summary.loader_files.get("transformers")
    folder = read.checkpoint.path
    if choice is None or not os.path.isdir(folder) or read.summary.source is None:
        return from_pretrained_verdict(config, read.infos)._replace(files=choice)
    explicit = getattr(config, "transformers_weights", None)
    if explicit != configured_weights(folder):  # another config (hf:PATH) names another file
        choice = transformers_files(folder, explicit)
    infos, raised = read.infos, choice.raises
    chosen = [os.path.join(folder, f) for f in choice.files]
    if choice.files and not choice.pickle and chosen != read.checkpoint.files:
        infos, raised = read_chosen(folder, choice.files)
    result = from_pretrained_verdict(config, infos)
    return result._replace(raised=raised or result.raised, files=choice)


def suggest_fixes(
    suggest: bool,
    rules: LoadRules,
    read: CheckpointRead,
    built: BuiltModel,
    loaded: DryLoad | None,
    names: NameMapping,
    verdicts: LoaderVerdicts,
    progress: Progress,
) -> tuple[SuggestedFix | None, NotOffered | None]:
    """Rules that explain a systematic mismatch, offered only when a second dry load makes
    things better (proven when it is clean); or the rules considered and refused, and why. A
    fix names the other loaders judged, which its mapper rules do not apply to. A dry load that
    stopped early (too many failing names) offers none: the tensors it never reached are not
    missing, and rules inferred from them would be guesses."""
    if loaded is None or not suggest:  # no vLLM load simulated: nothing to fix for it
        return None, None
    if "vllm" not in verdicts.selected:  # --loader transformers: vLLM's rules were not asked for
        return None, None
    report = loaded.report
    if report.clean or not report.complete or not loaded.auto_loader_at_root:
        return None, None
    from loadkit_inspect.fixes.fix import NotOffered, suggest_fix
    from loadkit_inspect.simulate import dry_load

    def retry(with_mapper: WeightsMapper) -> Any:
        return dry_load(
            built.module,
            read.infos,
            mapper=with_mapper,
            replace_mapper=True,
            rules=rules,
            progress=progress.stage("dry load, proving a fix", "name"),
        ).report

    found = suggest_fix(
        loaded.report, loaded.mapper, retry, given=names.mapper, replace=names.replaces
    )
    if found is None or isinstance(found, NotOffered):
        return None, found
    found.other_loaders = tuple(n for n in verdicts.selected if n != "vllm")
    return found, None


def suggest_rename(
    suggest: bool,
    rules: LoadRules,
    read: CheckpointRead,
    built: BuiltModel,
    names: NameMapping,
    verdicts: LoaderVerdicts,
    progress: Progress,
) -> RenameFix | None:
    """The fix for the loader that takes no mapper (``transformers``): ``loadkit rename`` with
    the rules that rename the keys it leaves unused into the tensors it leaves at random, or
    without rules where a loader raises because of the folder's layout; offered only where
    both loaders, simulated on what it writes, do better."""
    fp = verdicts.from_pretrained
    source = read.summary.source
    if not suggest or fp is None or fp.clean or source is None or source.kind == "url":
        return None
    if read.summary.failing:  # a tensor no loader can read: nothing whole to rewrite
        return None
    from loadkit_inspect.fixes.rename_fix import (
        LAYOUT,
        NAMES,
        RenameFix,
        new_names,
        rename_rules,
        rules_json,
    )
    from loadkit_inspect.mapper_trace import parse_mapper

    vllm_files = read.summary.loader_files.get("vllm")
    layout = (fp.files is not None and fp.files.raises is not None) or (
        vllm_files is not None and vllm_files.raises is not None
    )
    suggestions = [] if layout else rename_rules(fp, read.infos)
    if not layout and not suggestions:
        return None
    mapping = rules_json(suggestions) if suggestions else None
    try:
        renamed = new_names(read.names, parse_mapper(mapping) if mapping else None)
    except LoadkitError:  # a rule would drop or fuse a key: no renaming
        return None
    results, clean = _renamed_verdicts(rules, read, built, names, renamed, progress)
    if not layout and len(results["transformers"].problems) >= len(fp.problems()):
        return None
    phrases = {n: v.phrase() for n, v in results.items()}
    return RenameFix(LAYOUT if layout else NAMES, mapping, suggestions, source.name, phrases, clean)


def _renamed_verdicts(
    rules: LoadRules,
    read: CheckpointRead,
    built: BuiltModel,
    names: NameMapping,
    renamed: dict[str, str],
    progress: Progress,
) -> tuple[dict[str, LoaderVerdict], bool]:
    """Both loaders simulated on the checkpoint ``loadkit rename`` would write: the same tensors
    under ``renamed`` names, laid out as ``save_pretrained`` lays them out (no index problem)."""
    from loadkit_inspect.loaders import hf_config, transformers_verdict, vllm_side, vllm_verdict
    from loadkit_inspect.simulate.from_pretrained import from_pretrained_verdict

    infos = [i._replace(name=renamed[i.name]) for i in read.infos]
    summary = read.summary._replace(tensors=infos, problems=[])
    again = CheckpointRead(read.checkpoint, summary)
    loaded = None if built.vllm_unmodelled else load(rules, again, built, names, progress)
    report = None if loaded is None else loaded.report
    vllm = vllm_verdict(report, summary, side=vllm_side(built.module, loaded))
    fp = from_pretrained_verdict(hf_config(built.module), infos).under(rules)
    tf = transformers_verdict(fp, summary)
    # a column not checked (vLLM's class not modelled) decides nothing, here as in the report
    return {"transformers": tf, "vllm": vllm}, tf.clean and (vllm.clean or not vllm.checked)
