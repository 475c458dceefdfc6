"""A load simulated on the meta device: what a real load would do, at no memory and little time.

The model is built on ``meta``; the checkpoint becomes meta tensors of its shapes and dtypes, in
the order ``Checkpoint.weights()`` would yield them; then the model's own ``load_weights`` (or an
``AutoWeightsLoader`` with the mapper) runs on them. Copying into a meta tensor does nothing, so
the real loading code runs, with the real mapper, skip rules and ``weight_loader``s, and the
ledgers it leaves say where each name went. The report therefore agrees with a real load.

Where a real load stops at the first problem, this one collects them all:

- every parameter's ``weight_loader`` is wrapped for the run: a loader that fails (a shape
  mismatch) is recorded with the checkpoint key it was handed, and the walk goes on;
- a ``TorchDispatchMode`` sees every ``copy_`` into a model tensor, so a loader that bypasses
  ``weight_loader`` still fills its parameter;
- a name the model does not have stops the walk (``UnknownNameError``, or a ``KeyError`` in a
  hand-written loader): it is recorded, left out, and the walk runs again. Names under the same
  unknown module are left out together, so a checkpoint of the wrong model takes a few passes.
  An error after the last weight (a final check) blames no key: the load fails as a whole.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from loadkit.checkpoint.dtypes import torch_dtype_name, torch_shape
from loadkit.checkpoint.reader import TensorInfo
from loadkit.errors import (
    LoadkitError,
    NestedWeightError,
    ShapeMismatchError,
    UnknownNameError,
    nearest_names,
)
from loadkit.inspection.records import (
    DELEGATED,
    DROPPED,
    IGNORED,
    LOAD_ERROR,
    LOADED,
    SHAPE_MISMATCH,
    SKIPPED,
    UNCONSUMED,
    UNEXPECTED,
    DtypeCast,
    KeyOutcome,
    LoadReport,
    Missing,
    ModelSummary,
    ShapeMismatch,
    Unexpected,
)
from loadkit.loading.auto_loader import AutoWeightsLoader
from loadkit.loading.counting import EagerDispatchMode
from loadkit.loading.ledger import LoadLedger, ledger_of, model_tensors
from loadkit.loading.meta import to_meta
from loadkit.loading.weight_loaders import default_weight_loader
from loadkit.mapper import WeightsMapper

MAX_RUNS = 256  # passes; each failing name (or unknown module) costs one
MAX_SUGGESTED = 100  # nearest-name searches per list (each is a scan of every name)
PAIR_CUTOFF = 0.6  # a missing tensor and an unused key this alike (and as large) may be one name


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def cast_is_incompatible(src: torch.dtype, dst: torch.dtype) -> bool:
    """A cast that changes what the values mean: float or complex into integers, anything but
    bool into bool, complex into real. Float <-> float and integer -> float casts are reported
    but allowed: loaders cast checkpoints saved in bf16 into f32 parameters all the time."""
    if src == dst:
        return False
    if dst == torch.bool:
        return True
    if not dst.is_floating_point and not dst.is_complex:
        return src.is_floating_point or src.is_complex
    return src.is_complex and not dst.is_complex


def meta_copy(model: nn.Module, *, always: bool = False) -> nn.Module:
    """``model`` itself when it is all on ``meta`` (a copy if ``always``), else a copy on meta.

    The caller's model is never changed, and its data is never copied: each tensor is replaced
    by a meta tensor of its shape and dtype (keeping attributes such as ``weight_loader``) before
    the module tree is deep-copied around it.
    """
    tensors = [*model.parameters(), *model.buffers()]
    if all(t.is_meta for t in tensors) and not always:
        return model
    memo: dict[int, Any] = {id(t): to_meta(t) for t in tensors}  # tied tensors stay tied
    return copy.deepcopy(model, memo)


def model_summary(model: nn.Module, spec: str) -> ModelSummary:
    entries = model_tensors(model)
    by_name = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    nbytes = sum(by_name[n].numel() * by_name[n].element_size() for n in entries)
    describe = getattr(model, "backend_info", None)
    return ModelSummary(
        spec,
        type(model).__name__,
        len(entries),
        nbytes,
        callable(getattr(model, "load_weights", None)),
        describe() if callable(describe) else None,
    )


@dataclass
class _Call:
    """One ``weight_loader`` call seen by the wrapper."""

    param: str
    key: str | None
    param_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]
    param_dtype: torch.dtype
    weight_dtype: torch.dtype
    error: BaseException | None = None


@dataclass
class _Run:
    current: str | None = None  # the key last pulled from the stream
    pulled: list[str] = field(default_factory=list)
    calls: list[_Call] = field(default_factory=list)
    writes: list[tuple[str, str | None]] = field(default_factory=list)  # (tensor, current key)
    late_writes: list[tuple[Any, str | None]] = field(default_factory=list)  # (storage, key)
    exhausted: bool = False  # every weight was read


class _WriteWatcher(EagerDispatchMode):
    """Sees every ``copy_`` into a model tensor, by storage, whichever path made it.

    A loader that bypasses ``weight_loader`` (calling ``default_weight_loader`` directly, or
    ``param.data.copy_``) still fills the parameter: this catches it. Meta tensors have storage
    objects too, and views of a parameter (``param.data[0:2]``) share its storage.
    """

    def __init__(self, storages: dict[int, str], holder: list[_Run]) -> None:
        super().__init__()
        self.storages = storages
        self.holder = holder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.copy_.default:
            try:
                storage = args[0].untyped_storage()
            except (RuntimeError, NotImplementedError):  # a tensor without storage
                storage = None
            if storage is not None:
                run = self.holder[0]
                name = self.storages.get(storage._cdata)
                if name is not None:
                    run.writes.append((name, run.current))
                else:
                    # Perhaps a tensor the load itself registers (upstream's lm_head bias):
                    # resolved against the model as it is after the run. Holding the storage
                    # keeps its address from being reused by another tensor meanwhile.
                    run.late_writes.append((storage, run.current))
        return func(*args, **(kwargs or {}))


def _storages(model: nn.Module) -> dict[int, str]:
    by_name = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    return {by_name[n].untyped_storage()._cdata: n for n in model_tensors(model)}


def _resolve_late_writes(model: nn.Module, run: _Run, known: dict[int, str]) -> None:
    """Credit copies into tensors the load registered itself (absent when the run began)."""
    if not run.late_writes:
        return
    now = {k: v for k, v in _storages(model).items() if k not in known}
    for storage, key in run.late_writes:
        name = now.get(storage._cdata)
        if name is not None:
            run.writes.append((name, key))
    run.late_writes.clear()


def _meta_weight(info: TensorInfo) -> torch.Tensor:
    dtype = getattr(torch, torch_dtype_name(info.dtype))
    t = torch.empty(torch_shape(info.dtype, info.shape), dtype=dtype, device="meta")
    t.loadkit_file = info.file  # load errors name the file, as for real tensors
    t.loadkit_key = info.name  # lets the wrapper name the key even through delegation
    return t


def _stream(
    infos: Sequence[TensorInfo], excluded: dict[str, Any], run: _Run
) -> Iterator[tuple[str, torch.Tensor]]:
    for info in infos:
        if info.name in excluded:
            continue
        run.current = info.name
        run.pulled.append(info.name)
        yield info.name, _meta_weight(info)
    run.exhausted = True


def _wrap_loaders(model: nn.Module, holder: list[_Run]) -> list[tuple[torch.Tensor, Any]]:
    """Give every parameter and persistent buffer a recording ``weight_loader``.

    Returns what to restore afterwards. The wrapper calls the tensor's own loader (or the
    default) and records the call; a failure is recorded, not raised, so one run collects them
    all.
    """
    restore: list[tuple[torch.Tensor, Any]] = []
    by_name = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    for name in model_tensors(model):
        tensor = by_name[name]
        original = getattr(tensor, "weight_loader", None)
        restore.append((tensor, original))
        tensor.weight_loader = _recording_loader(name, original or default_weight_loader, holder)
    return restore


def _recording_loader(name: str, loader: Any, holder: list[_Run]) -> Any:
    def recording_weight_loader(param: torch.Tensor, loaded_weight: Any, *args, **kwargs) -> Any:
        run = holder[0]
        key = getattr(loaded_weight, "loadkit_key", None) or run.current
        call = _Call(
            name,
            key,
            tuple(param.shape),
            tuple(getattr(loaded_weight, "shape", ())),
            param.dtype,
            getattr(loaded_weight, "dtype", param.dtype),
        )
        run.calls.append(call)
        try:
            return loader(param, loaded_weight, *args, **kwargs)
        except Exception as exc:  # collected: the report lists every failing load
            call.error = exc
            return None

    recording_weight_loader.wrapped = loader
    return recording_weight_loader


def _restore(restore: list[tuple[torch.Tensor, Any]]) -> None:
    for tensor, original in restore:
        if original is None:
            del tensor.weight_loader
        else:
            tensor.weight_loader = original


def _ledgers(model: nn.Module) -> dict[str, LoadLedger | None]:
    return {name: ledger_of(m) for name, m in model.named_modules()}


def _join(prefix: str, name: str | None) -> str | None:
    if name is None:
        return None
    return f"{prefix}.{name}" if prefix and name else (prefix or name)


def _fates(
    new: dict[str, LoadLedger], pulled: list[str]
) -> dict[str, tuple[str, str | None, str | None, str | None]]:
    """Key -> (status, mapped, target, rule) from the ledgers the run left, followed through
    delegation: a key handed to a child's ``load_weights`` takes its fate from the child's
    ledger, matched by position (the child saw the delegated keys in the same order)."""
    fates: dict[str, tuple[str, str | None, str | None, str | None]] = {}

    def resolve(path: str, ledger: LoadLedger, keys: Sequence[str | None]) -> None:
        handed: dict[str, list[str]] = {}
        for entry, key in zip(ledger.entries, keys, strict=False):
            if key is None:
                continue
            mapped = fates[key][1] if key in fates else _join(path, entry.mapped)
            target = _join(path, entry.target)
            fates[key] = (entry.status, mapped, target, entry.rule)
            if entry.status == DELEGATED and target is not None:
                handed.setdefault(target, []).append(key)
        for child_path, child_keys in handed.items():
            child = new.get(child_path)
            if child is not None and len(child.entries) == len(child_keys):
                resolve(child_path, child, child_keys)

    root = new.get("")
    if root is not None:
        if len(root.entries) == len(pulled):
            resolve("", root, pulled)
        else:
            known = set(pulled)
            resolve("", root, [e.name if e.name in known else None for e in root.entries])
    else:
        # A hand-written root loader that hands the stream to a child as is.
        for path, ledger in sorted(new.items(), key=lambda kv: kv[0].count(".")):
            if len(ledger.entries) == len(pulled):
                resolve(path, ledger, pulled)
                break
    return fates


@contextmanager
def _root_mapper(
    root: nn.Module, replace: WeightsMapper | None, used: list[Any], loaders: list[Any]
) -> Iterator[None]:
    """Record the mapper the root's ``AutoWeightsLoader`` loads with; optionally replace it.

    A model's own ``load_weights`` may build its mapper from more than ``hf_to_vllm_mapper``
    (packing rules, say): the report traces names through the mapper really used, and a given
    mapper replaces exactly that one.
    """
    original = AutoWeightsLoader.load_weights

    def load_weights(self: AutoWeightsLoader, weights: Any, *, mapper: Any = None) -> set[str]:
        if self.module is root:
            if replace is not None:
                mapper = replace
            used.append(mapper)
            loaders.append(self)
        return original(self, weights, mapper=mapper)

    AutoWeightsLoader.load_weights = load_weights  # type: ignore[method-assign]
    try:
        yield
    finally:
        AutoWeightsLoader.load_weights = original  # type: ignore[method-assign]


def dry_load(
    model: nn.Module,
    infos: Sequence[TensorInfo],
    *,
    mapper: WeightsMapper | None = None,
    replace_mapper: bool = False,
) -> tuple[LoadReport, WeightsMapper | None]:
    """Simulate loading ``infos`` into ``model`` (on ``meta``) and account for both sides.

    With its own ``load_weights`` the model loads itself (with its own mapper, or ``mapper`` in
    its place when ``replace_mapper``); without, ``AutoWeightsLoader(model).load_weights(weights,
    mapper=mapper)`` does. Returns the report and the mapper the root walk used.
    """
    model = meta_copy(model)
    root_name = type(model).__name__
    own = getattr(model, "load_weights", None)
    holder: list[_Run] = [_Run()]
    restore = _wrap_loaders(model, holder)
    watcher = _WriteWatcher(_storages(model), holder)
    excluded: dict[str, KeyOutcome] = {}
    unexpected: list[Unexpected] = []
    runs = 0
    complete = True
    used: list[WeightsMapper | None] = []
    loaders: list[AutoWeightsLoader] = []
    names = _MappedNames(infos)
    failure: str | None = None
    try:
        while True:
            runs += 1
            run = holder[0] = _Run()
            before = _ledgers(model)
            try:
                stream = _stream(infos, excluded, run)
                replace = mapper if replace_mapper else None
                with watcher, _root_mapper(model, replace, used, loaders):
                    if callable(own):
                        own(stream)
                    else:
                        AutoWeightsLoader(model).load_weights(stream, mapper=mapper)
                break
            except (Exception, SystemExit) as exc:  # the model's own code may sys.exit, too
                culprit = run.current
                if culprit is None or culprit in excluded:
                    raise LoadkitError(
                        f"{root_name}.load_weights failed before taking any weight, so the load "
                        f"cannot be simulated: {type(exc).__name__}: {exc}"
                    ) from exc
                if run.exhausted:
                    # Raised after the last weight (a final check, say): no key to blame, and
                    # leaving keys out would only make it worse. The load fails as a whole.
                    failure = (
                        f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                    )
                    break
                after = _ledgers(model)
                root = after.get("") if after.get("") is not before.get("") else None
                used_now = used[-1] if used else mapper
                loader = loaders[-1] if loaders and root is not None else None
                _exclude(exc, culprit, excluded, unexpected, root, names.using(used_now), loader)
                if runs >= MAX_RUNS:
                    complete = False
                    break
        after = _ledgers(model)
        new = {k: v for k, v in after.items() if v is not None and v is not before.get(k)}
        fates = _fates(new, run.pulled)
        _resolve_late_writes(model, run, watcher.storages)
    finally:
        _restore(restore)
    root_mapper = used[-1] if used else None
    report = _assemble(
        model, infos, run, new, fates, excluded, unexpected, root_mapper, runs, complete
    )
    if failure is not None:
        report.failure = f"{root_name}.load_weights raised after the last weight: {failure}"
    return report, root_mapper


class _MappedNames:
    """Each key's mapped name, computed once, and (built on first use) the keys under each
    dotted prefix of their mapped names: leaving out every key that fails like the culprit costs
    the size of that group, not a scan of every name on every pass."""

    def __init__(self, infos: Sequence[TensorInfo]) -> None:
        self.keys = [info.name for info in infos]
        self.mapper: WeightsMapper | None = None
        self._mapped: dict[str, str | None] | None = None
        self._under: dict[str, list[str]] | None = None

    def using(self, mapper: WeightsMapper | None) -> _MappedNames:
        if mapper is not self.mapper or self._mapped is None:
            self.mapper = mapper
            self._mapped = {k: mapper.map_name(k) if mapper else k for k in self.keys}
            self._under = None
        return self

    def mapped(self, key: str) -> str | None:
        assert self._mapped is not None
        return self._mapped[key]

    def under(self, prefix: str) -> list[str]:
        """Keys whose mapped name lies under ``prefix`` (every mapped key for ``""``)."""
        if self._under is None:
            assert self._mapped is not None
            under: dict[str, list[str]] = {}
            for key, mapped in self._mapped.items():
                if mapped is None:
                    continue
                under.setdefault("", []).append(key)
                parts = mapped.split(".")
                for i in range(1, len(parts)):
                    under.setdefault(".".join(parts[:i]), []).append(key)
            self._under = under
        return self._under.get(prefix, [])


def _exclude(
    exc: BaseException,
    culprit: str,
    excluded: dict[str, KeyOutcome],
    unexpected: list[Unexpected],
    root_ledger: LoadLedger | None,
    names: _MappedNames,
    loader: AutoWeightsLoader | None,
) -> None:
    """Record the name that stopped a run and leave it out next time, with every other name the
    root walk would stop at in the same module (an unknown child or parameter there)."""
    message = str(exc).split("\n", 1)[0]
    if isinstance(exc, UnknownNameError):  # our own nearest names replace its list
        message = f"no module or parameter named '{exc.name}' in {exc.root}"
    mapped = names.mapped(culprit)
    if not isinstance(exc, (UnknownNameError, NestedWeightError, KeyError)):
        excluded[culprit] = KeyOutcome(
            culprit, LOAD_ERROR, mapped, message=f"{type(exc).__name__}: {message}"
        )
        return
    unknown = getattr(exc, "name", None) or mapped or culprit  # as the model was asked for it
    if not isinstance(exc, LoadkitError):
        message = f"{type(exc).__name__}: {message}"
    group = [(culprit, message)]
    # When the root walk itself raised for this name, any key whose path reaches the same module
    # and names nothing there fails the same way: leave them out together, not one per pass.
    last = root_ledger.entries[-1] if root_ledger is not None and root_ledger.entries else None
    if (
        isinstance(exc, UnknownNameError)
        and loader is not None
        and last is not None
        and last.name == culprit
        and last.status == UNCONSUMED
        and last.mapped == mapped
        and mapped is not None
        and (mapped == unknown or mapped.startswith(unknown + "."))
        and exc.root == type(loader.module).__name__
    ):
        group += _same_failure(loader, names, unknown, culprit, excluded)
    for key, note in group:
        key_mapped = names.mapped(key)
        excluded[key] = KeyOutcome(key, UNEXPECTED, key_mapped, message=note)
        unexpected.append(Unexpected(key, key_mapped or unknown, note))


def _same_failure(
    loader: AutoWeightsLoader,
    names: _MappedNames,
    unknown: str,
    culprit: str,
    excluded: dict[str, KeyOutcome],
) -> list[tuple[str, str]]:
    """Keys (with their message) the root walk would also refuse in the module that lacks
    ``unknown``, by the rules it applies there (skip and ignore rules spare a key)."""
    parent = unknown.rpartition(".")[0]
    try:
        module = loader.module.get_submodule(parent) if parent else loader.module
    except AttributeError:
        return []
    known = set(dict(module.named_children())) | set(loader._loadable_tensors(module))
    skip, ignore = loader._skip_rule, loader._ignore_rule
    root = type(loader.module).__name__
    out = []
    for key in names.under(parent):
        if key in excluded or key == culprit:
            continue
        mapped = names.mapped(key)
        assert mapped is not None
        head = (mapped[len(parent) + 1 :] if parent else mapped).split(".", 1)[0]
        qual = f"{parent}.{head}" if parent else head
        if head in known or skip(mapped) or skip(qual + ".") or skip(qual):
            continue
        if ignore(qual + ".") or ignore(qual):
            continue
        out.append((key, f"no module or parameter named '{qual}' in {root}"))
    return out


def _pair_renames(
    missing: Sequence[str],
    tensors: dict[str, torch.Tensor],
    keys: Sequence[KeyOutcome],
    infos: Sequence[TensorInfo],
) -> dict[str, str]:
    """Missing tensor -> the unused checkpoint key that most likely is it, renamed.

    A renamed key has the element count of the tensor it should fill and a name close to its
    name; each key explains at most one tensor (best pairs first), so two missing tensors are
    not both pinned on one key.
    """
    numel = {t.name: t.numel for t in infos}
    unused = [(k.mapped or k.name, k.name) for k in keys if k.status in (UNEXPECTED, LOAD_ERROR)]
    scored = []
    for param in missing[:MAX_SUGGESTED]:
        want = tensors[param].numel()
        matcher = difflib.SequenceMatcher(None, b=param)
        for looked, key in unused[:MAX_SUGGESTED]:
            if numel[key] != want:
                continue
            matcher.set_seq1(looked)
            if matcher.real_quick_ratio() < PAIR_CUTOFF or matcher.quick_ratio() < PAIR_CUTOFF:
                continue
            score = matcher.ratio()
            if score >= PAIR_CUTOFF:
                scored.append((-score, param, key))
    pairs: dict[str, str] = {}
    taken: set[str] = set()
    for _, param, key in sorted(scored):
        if param not in pairs and key not in taken:
            pairs[param] = key
            taken.add(key)
    return pairs


def _assemble(
    model: nn.Module,
    infos: Sequence[TensorInfo],
    run: _Run,
    new: dict[str, LoadLedger],
    fates: dict[str, tuple[str, str | None, str | None, str | None]],
    excluded: dict[str, KeyOutcome],
    unexpected: list[Unexpected],
    mapper: WeightsMapper | None,
    runs: int,
    complete: bool,
) -> LoadReport:
    root_name = type(model).__name__
    entries = model_tensors(model)
    by_name = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    calls: dict[str, list[_Call]] = {}
    for call in run.calls:
        calls.setdefault(call.key or "", []).append(call)
    pulled = set(run.pulled)
    written: dict[str, list[str]] = {}  # key -> tensors written while it was being loaded
    for tensor, key in run.writes:
        written.setdefault(key or "", []).append(tensor)

    keys: list[KeyOutcome] = []
    mismatches: list[ShapeMismatch] = []
    errors: list[KeyOutcome] = []
    casts: list[DtypeCast] = []
    filled: set[str] = set()
    failed: set[str] = set()
    for info in infos:
        name = info.name
        fate = fates.get(name)
        mapped = fate[1] if fate else (mapper.map_name(name) if mapper is not None else name)
        if name in excluded:
            out = excluded[name]
            keys.append(out)
            if out.status == LOAD_ERROR:
                errors.append(out)
            continue
        mine = calls.get(name, [])
        bad = [c for c in mine if c.error is not None]
        if bad:
            c = bad[0]
            failed.update(x.param for x in bad)
            msg = str(c.error).split("\n", 1)[0]
            if isinstance(c.error, ShapeMismatchError):  # name the parameter and the key
                msg = str(c.error.with_name(c.param, f"checkpoint key '{name}'"))
            if isinstance(c.error, ShapeMismatchError) or c.param_shape != c.weight_shape:
                keys.append(KeyOutcome(name, SHAPE_MISMATCH, mapped, c.param, message=msg))
                mismatches.append(ShapeMismatch(name, c.param, c.param_shape, c.weight_shape, msg))
            else:
                out = KeyOutcome(name, LOAD_ERROR, mapped, c.param, message=msg)
                keys.append(out)
                errors.append(out)
            continue
        if fate and fate[0] in (SKIPPED, IGNORED, DROPPED):
            keys.append(KeyOutcome(name, fate[0], mapped, rule=fate[3]))
            continue
        if mine:
            targets = list(dict.fromkeys(c.param for c in mine))
            filled.update(targets)
            keys.append(KeyOutcome(name, LOADED, mapped, ", ".join(targets)))
            for c in mine:
                if c.weight_dtype != c.param_dtype:
                    casts.append(
                        DtypeCast(
                            name,
                            c.param,
                            dtype_name(c.weight_dtype),
                            dtype_name(c.param_dtype),
                            cast_is_incompatible(c.weight_dtype, c.param_dtype),
                        )
                    )
            continue
        if fate and fate[0] == LOADED:
            keys.append(KeyOutcome(name, LOADED, mapped, fate[2]))
            continue
        if name in written:  # loaded by a path that bypassed weight_loader
            targets = list(dict.fromkeys(written[name]))
            filled.update(targets)
            keys.append(KeyOutcome(name, LOADED, mapped, ", ".join(targets)))
            continue
        if fate and fate[0] == DELEGATED:
            keys.append(
                KeyOutcome(
                    name,
                    DELEGATED,
                    mapped,
                    fate[2],
                    message=f"taken by {fate[2]}.load_weights; no parameter load seen for it",
                )
            )
            continue
        if name in pulled:
            keys.append(
                KeyOutcome(
                    name,
                    DELEGATED,
                    mapped,
                    root_name,
                    message=f"taken by {root_name}.load_weights; no parameter load seen for it",
                )
            )
            continue
        keys.append(KeyOutcome(name, UNCONSUMED, mapped, message="never read by the loader"))

    # Written by any path, and what the run's ledgers say a child's load_weights loaded.
    filled.update(t for t, _ in run.writes)
    for path, ledger in new.items():
        filled.update(_join(path, p.name) for p in ledger.params.values() if p.status == LOADED)
    missing_names = [n for n in entries if n not in filled and n not in failed]

    pairs = _pair_renames(missing_names, by_name, keys, infos)
    missing = [
        Missing(
            n,
            tuple(by_name[n].shape),
            dtype_name(by_name[n].dtype),
            [pairs[n]] if n in pairs else [],
        )
        for n in missing_names
    ]
    paired_param = {key: param for param, key in pairs.items()}
    for u in unexpected[:MAX_SUGGESTED]:
        first = [paired_param[u.name]] if u.name in paired_param else []
        near = nearest_names(u.looked_up, entries, n=3)
        u.suggestions = list(dict.fromkeys(first + near))[:3]
    return LoadReport(
        keys, missing, unexpected, mismatches, casts, errors,
        len(entries), sum(n in filled and n not in failed for n in entries),
        runs, complete,
    )  # fmt: skip
