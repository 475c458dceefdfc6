"""The passes of a dry load: run the model's ``load_weights`` until every failing key is known.

A name the model does not have is recorded by the observer and the walk goes on, so a load
through ``AutoWeightsLoader`` takes one pass however many names are wrong. A hand-written
``load_weights`` stops at the first such name (a ``KeyError``) or failing step: the key is left
out, and a *discovery* pass resumes right after it; when a discovery pass reaches the end, one
full pass without the keys left out gives the report. Every key is fed a bounded number of
times, so the cost is linear in the number of names. An error after the last weight (a final
check) blames no key: the load fails as a whole.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from loadkit.checkpoint import TensorInfo
from loadkit.errors import LoadkitError, NestedWeightError, UnknownNameError
from loadkit.loading import AutoWeightsLoader, loadable_tensors, observing
from loadkit.mapper import WeightsMapper
from loadkit.terms import Status
from loadkit_inspect.options import LoadRules
from loadkit_inspect.progress import Count
from loadkit_inspect.report.records import KeyOutcome, Unexpected
from loadkit_inspect.simulate.observer import DryLoadObserver
from loadkit_inspect.simulate.recording import (
    Pass,
    Recorder,
    WriteWatcher,
    premade,
    recording_weight_loaders,
)

MAX_RUNS = 256  # passes; a hand-written load_weights' failing name (or unknown module) costs one


@dataclass
class Simulation:
    """What the passes found: the last full pass, and the keys left out on the way."""

    final: Pass
    observer: DryLoadObserver
    excluded: dict[str, KeyOutcome] = field(default_factory=dict)
    unexpected: dict[str, Unexpected] = field(default_factory=dict)  # among ``excluded``
    runs: int = 0
    complete: bool = True
    failure: str | None = None  # raised after the last weight, with no key to blame
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)  # the model's, afterwards


class _Exclusions:
    """Keys left out of later passes, and why; unknown modules leave out every key under them."""

    def __init__(self, infos: Sequence[TensorInfo]) -> None:
        self.infos = infos
        self.excluded: dict[str, KeyOutcome] = {}
        self.unexpected: dict[str, Unexpected] = {}
        self._under: dict[str, list[str]] | None = None  # dotted prefix -> keys (built once)
        self._mapper: WeightsMapper | None = None

    def _keys_under(self, name: str, mapper: WeightsMapper | None) -> list[str]:
        if self._under is None or self._mapper is not mapper:
            self._mapper, self._under = mapper, {}
            for info in self.infos:
                mapped = mapper.map_name(info.name) if mapper is not None else info.name
                if mapped is None:
                    continue
                parts = mapped.split(".")
                for i in range(1, len(parts) + 1):
                    self._under.setdefault(".".join(parts[:i]), []).append(info.name)
        return self._under.get(name, [])

    def add(
        self,
        exc: BaseException,
        culprit: str,
        mapper: WeightsMapper | None,
        known: dict[str, torch.Tensor],
    ) -> None:
        message = str(exc).split("\n", 1)[0]
        mapped = mapper.map_name(culprit) if mapper is not None else culprit
        # A KeyError for a name the model has is load_weights' own error (a lookup in a table of
        # its own), not a name the model lacks.
        own_error = isinstance(exc, KeyError) and (
            mapped in known or (bool(exc.args) and exc.args[0] in known)
        )
        if own_error or not isinstance(exc, (UnknownNameError, NestedWeightError, KeyError)):
            said = f"{type(exc).__name__}: {message}"
            if own_error:
                said = f"the loader raised {said}, for a name the model has: its own error"
            self.excluded[culprit] = KeyOutcome(culprit, Status.LOAD_ERROR, mapped, message=said)
            return
        if isinstance(exc, UnknownNameError):  # the report's own nearest names replace its list
            message = f"no module or parameter named '{exc.name}' in {exc.root}"
        elif not isinstance(exc, LoadkitError):
            message = f"{type(exc).__name__}: {message}"
        group = [culprit]
        if isinstance(exc, UnknownNameError) and exc.name != mapped:
            # Every key that maps under the same unknown module fails the same way.
            group += [k for k in self._keys_under(exc.name, mapper) if k != culprit]
        for key in group:
            if key in self.excluded:
                continue
            key_mapped = mapper.map_name(key) if mapper is not None else key
            self.excluded[key] = KeyOutcome(key, Status.UNEXPECTED, key_mapped, message=message)
            self.unexpected[key] = Unexpected(key, key_mapped or culprit, message)


def run_passes(
    model: nn.Module,
    infos: Sequence[TensorInfo],
    *,
    mapper: WeightsMapper | None,
    replace_mapper: bool,
    rules: LoadRules,
    extend: WeightsMapper | None = None,
    tensors: dict[str, torch.Tensor],
    progress: Count | None = None,
) -> Simulation:
    """Run ``model``'s loader over ``infos`` (meta tensors) until one full pass gets through.
    ``tensors``: the model's, by name (``loadkit.loading.tensors.loadable_tensors``);
    ``progress``: called with (names fed, names in all) as each pass goes."""
    recorder = Recorder()
    paths = {id(m): name for name, m in model.named_modules()}
    replace = mapper if replace_mapper else None
    passes = _Passes(model, infos, tensors)
    start = 0
    with recording_weight_loaders(tensors, recorder):
        watcher = WriteWatcher(tensors, recorder)
        # Each pass leaves out one more key or is followed by a full pass: MAX_RUNS keys left
        # out at most, then one full pass for the report.
        for runs in range(1, MAX_RUNS + 2):
            now = recorder.now = Pass(start=start)
            observer = DryLoadObserver(model, recorder, replace, rules, paths, extend)
            # A full pass gets its tensors made up front, out of the watcher's mode; a discovery
            # pass (which may stop at its next key) makes each as it is fed.
            made = premade(infos, passes.out.excluded) if start == 0 else None
            stream = now.stream(infos, passes.out.excluded, progress, made)
            error = _load_once(model, stream, watcher, observer, mapper)
            next_start = passes.after(error, now, runs, observer.root_mapper() or mapper)
            if next_start is None:
                break
            start = next_start
    after = loadable_tensors(model)  # with any tensor the load registered itself
    watcher.resolve_late_writes(after, now)
    out = passes.out
    sim = Simulation(
        now, observer, out.excluded, out.unexpected, runs, passes.complete, passes.failure
    )
    sim.tensors = after
    return sim


def _load_once(
    model: nn.Module,
    stream: Iterator[tuple[str, torch.Tensor]],
    watcher: WriteWatcher,
    observer: DryLoadObserver,
    mapper: WeightsMapper | None,
) -> BaseException | None:
    """One pass of the model's ``load_weights`` over ``stream``; what it raised, if anything."""
    own = getattr(model, "load_weights", None)
    try:
        with watcher, observing(observer):
            if callable(own):
                own(stream)
            else:  # as the pooling adapter and upstream load a model without one
                AutoWeightsLoader(model).load_weights(stream, mapper=mapper)
    except (Exception, SystemExit) as exc:  # the model's own code may sys.exit
        return exc
    return None


class _Passes:
    """Where each pass starts, from how the one before it ended; the keys left out on the way."""

    def __init__(
        self, model: nn.Module, infos: Sequence[TensorInfo], tensors: dict[str, torch.Tensor]
    ) -> None:
        self.root_name = type(model).__name__
        self.tensors = tensors
        self.position = {info.name: i for i, info in enumerate(infos)}
        self.out = _Exclusions(infos)
        self.complete = True
        self.failure: str | None = None  # raised after the last weight, with no key to blame

    def after(
        self, error: BaseException | None, now: Pass, runs: int, mapper: WeightsMapper | None
    ) -> int | None:
        """The next pass's start, or ``None``: ``now`` was the last pass, the report's."""
        if error is None:  # a full pass got through; after a discovery, one full pass
            return 0 if now.start else None
        culprit = now.current
        if not now.exhausted and culprit is not None and culprit not in self.out.excluded:
            self.out.add(error, culprit, mapper, self.tensors)
            if runs >= MAX_RUNS:
                self.complete = False
                return None
            return self.position[culprit] + 1  # discovery: go on right after the culprit
        if now.start:  # a discovery pass got no further: confirm with a full pass
            return 0
        if culprit is None or culprit in self.out.excluded:
            raise LoadkitError(
                f"{self.root_name}.load_weights failed before taking any weight, so the "
                f"load cannot be simulated: {type(error).__name__}: {error}"
            ) from error
        # Raised after the last weight (a final check, say): no key to blame, and leaving keys
        # out would only make it worse. The load fails as a whole.
        text = str(error).splitlines()[0] if str(error) else ""
        self.failure = f"{self.root_name}.load_weights raised after the last weight: "
        self.failure += f"{type(error).__name__}: {text}"
        return None
