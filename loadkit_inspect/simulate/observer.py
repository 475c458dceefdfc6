"""The dry load's ``LoadObserver``: which ledger took which checkpoint key, and with what mapper.

Every ledger opened during a pass (the root's ``AutoWeightsLoader``, a child's own, a hand-written
loader's) reports each name it takes; the key is read off the meta tensor (``loadkit_key``),
falling back to the key last pulled from the stream for tensors a loader made itself. So a key
handed down through delegation is followed by identity, never by position. Names the model does
not have are recorded and the walk goes on, so one pass finds them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from torch import nn

from loadkit.loading import AutoWeightsLoader, CheckpointEntry, LoadLedger, LoadObserver, qualname
from loadkit.mapper import WeightsMapper
from loadkit.terms import Status
from loadkit_inspect.options import LoadRules
from loadkit_inspect.simulate.recording import Recorder


class Fate(NamedTuple):
    """A key's fate as the ledgers tell it (qualified from the model's root)."""

    status: Status
    mapped: str | None  # the name the root AutoWeightsLoader looked up
    target: str | None  # the parameter it filled, or the module it was handed to
    rule: str | None


class DryLoadObserver(LoadObserver):
    def __init__(
        self,
        model: nn.Module,
        recorder: Recorder,
        replace: WeightsMapper | None,
        rules: LoadRules | None = None,
        module_paths: dict[int, str] | None = None,
        extend: WeightsMapper | None = None,
    ):
        self.root = model
        self.rules = rules or LoadRules()
        self.root_name = type(model).__name__
        self.recorder = recorder
        self.replace = replace
        self.extend = extend  # rules appended to the root AutoWeightsLoader's own (``--mapper``)
        if module_paths is None:
            module_paths = {id(m): name for name, m in model.named_modules()}
        self.module_paths = module_paths  # shared by every pass: computed once
        self.ledgers: list[tuple[str, LoadLedger]] = []  # (module path, ledger), in order opened
        self.used: list[WeightsMapper | None] = []  # mappers the root's AutoWeightsLoader used
        self._path: dict[int, str] = {}
        self._taken: dict[str, list[tuple[str, CheckpointEntry]]] = {}
        self._key_of: dict[int, str] = {}
        self.rejected: dict[str, tuple[str, str]] = {}  # key -> (looked up, reason)

    # --- hooks ---

    def opened(self, ledger: LoadLedger, module: nn.Module) -> None:
        path = self.module_paths.get(id(module))
        if path is not None:  # an AutoWeightsLoader rooted outside the model tells nothing
            self._path[id(ledger)] = path
            self.ledgers.append((path, ledger))

    def took(self, ledger: LoadLedger, entry: CheckpointEntry, tensor: Any) -> None:
        path = self._path.get(id(ledger))
        if path is None:
            return
        key = getattr(tensor, "loadkit_key", None) or self.recorder.now.current
        if key is None:
            return
        self._key_of[id(entry)] = key
        taken = self._taken.get(key)
        if taken is None:
            self._taken[key] = [(path, entry)]
        else:  # handed down: the child's ledger takes it too
            taken.append((path, entry))

    def loading(
        self, auto_loader: AutoWeightsLoader, mapper: WeightsMapper | None
    ) -> WeightsMapper | None:
        if auto_loader.module is self.root:
            if self.replace is not None:
                mapper = self.replace
            elif self.extend is not None:  # each stage: the AutoWeightsLoader's rules, then these
                mapper = self.extend if mapper is None else mapper | self.extend
            self.used.append(mapper)
            # The user's rules join the root AutoWeightsLoader's own, on this instance only (the
            # skip prefixes are the observer's own: skipped below).
            auto_loader.ignore_unexpected_prefixes += self.rules.ignore_unexpected_prefixes
            auto_loader.ignore_unexpected_suffixes += self.rules.ignore_unexpected_suffixes
        return mapper

    def skipped(self, auto_loader: AutoWeightsLoader, entry: CheckpointEntry) -> str | None:
        # The user's skip prefixes match the name after the mapper and the checkpoint's own
        # spelling of a key, at the root AutoWeightsLoader only, as its other rules.
        if auto_loader.module is not self.root or not self.rules.skip_prefixes:
            return None
        return self.rules.skipped(self._key_of.get(id(entry), entry.name), entry.mapped)

    def unexpected(
        self, ledger: LoadLedger, name: str, entries: Sequence[CheckpointEntry], reason: str
    ) -> bool:
        path = self._path.get(id(ledger), "")
        for entry in entries:
            key = self._key_of.get(id(entry))
            if key is not None:
                looked_up = qualname(path, entry.mapped or name)
                self.rejected[key] = (looked_up, reason)
        return True

    # --- reading ---

    def fates(self) -> dict[str, Fate]:
        """Each key's fate: the last ledger entry that settled it (a child's, after the parent
        delegated), its mapped name as the first ledger (the root's) saw it."""
        out: dict[str, Fate] = {}
        passing = (Status.DELEGATED, Status.UNCONSUMED)
        for key, taken in self._taken.items():
            first_path, first = taken[0]
            if len(taken) == 1:  # nearly every key: one ledger took it
                path, entry = first_path, first
            else:
                settled = [t for t in taken if t[1].status not in passing]
                delegated = [t for t in taken if t[1].status == Status.DELEGATED]
                path, entry = (settled or delegated or taken)[-1]
            out[key] = Fate(
                entry.status,
                None if first.mapped is None else qualname(first_path, first.mapped),
                None if entry.target is None else qualname(path, entry.target),
                entry.rule,
            )
        return out

    def root_mapper(self) -> WeightsMapper | None:
        return self.used[-1] if self.used else None
