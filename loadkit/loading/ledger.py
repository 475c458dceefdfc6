"""The load ledger: where every checkpoint name went and whether every parameter was filled.

``load_state_dict`` reports missing and unexpected keys after the fact; the ledger accounts for
both sides completely. Each checkpoint entry ends in exactly one status of ``ENTRY_STATUSES`` and
each model parameter or persistent buffer in exactly one of ``PARAM_STATUSES`` (both
``loadkit.terms.Status`` members).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from loadkit.fmt import table
from loadkit.loading.observe import LoadObserver, current_observer
from loadkit.loading.tensors import named_loadable
from loadkit.terms import ENTRY_STATUSES, PARAM_STATUSES, Status

# Short names of the ledger's statuses (``loadkit.terms.Status`` members, not copies).


@dataclass(slots=True)  # one per checkpoint name: 200,000 of them, each made in the load
class CheckpointEntry:
    """One checkpoint tensor as the loader saw it, in stream order."""

    index: int
    name: str
    shape: tuple[int, ...]
    mapped: str | None = None
    status: Status = Status.UNCONSUMED
    target: str | None = None  # the parameter loaded, or the child module delegated to
    rule: str | None = None  # the rule that skipped, ignored or dropped it
    # The child whose own load_weights returned without pulling this name: the walk then
    # handled it (loaded, skipped, ignored) by the generic rules, as upstream does.
    left_by: str | None = None

    @property
    def detail(self) -> str:
        after = f" (left by {self.left_by}.load_weights)" if self.left_by else ""
        if self.status == Status.LOADED:
            return f"-> {self.target}{after}"
        if self.status in (Status.SKIPPED, Status.IGNORED) and after:
            return f"{self.rule}{after}"
        if self.status == Status.DELEGATED:
            return f"-> {self.target}.load_weights"
        return self.rule or ""


@dataclass
class ParamEntry:
    """One parameter or persistent buffer of the model."""

    name: str
    kind: str  # "parameter" or "buffer"
    shape: tuple[int, ...]
    status: Status = Status.NEVER_LOADED
    sources: list[str] = field(default_factory=list)  # checkpoint names loaded into it
    via: str | None = None  # a child's own load_weights that reported it loaded
    aliases: list[str] = field(default_factory=list)  # tied names sharing this tensor


def model_tensors(module: torch.nn.Module) -> dict[str, ParamEntry]:
    """Every parameter and persistent buffer by qualified name; tied names become aliases."""
    out: dict[str, ParamEntry] = {}
    seen: dict[int, str] = {}
    for name, tensor in named_loadable(module):
        first = seen.setdefault(id(tensor), name)
        if first != name:
            out[first].aliases.append(name)
        elif name not in out:
            kind = "parameter" if isinstance(tensor, torch.nn.Parameter) else "buffer"
            out[name] = ParamEntry(name, kind, tuple(tensor.shape))
    return out


class LoadLedger:
    """Both sides of one load: ``entries`` (checkpoint, in order) and ``params`` (model)."""

    def __init__(self, module: torch.nn.Module, observer: LoadObserver | None = None) -> None:
        self.root = type(module).__name__
        self.entries: list[CheckpointEntry] = []
        self._module = module
        self._params: dict[str, ParamEntry] | None = None  # the model's side, on first use
        self._alias_of: dict[str, str] = {}
        # The scope's observer (loadkit.loading.observe) when none is given: models build their
        # loaders themselves, so an observer cannot be handed to them.
        self.observer = observer if observer is not None else current_observer()
        if self.observer is not None:
            self.observer.opened(self, module)

    @property
    def params(self) -> dict[str, ParamEntry]:
        """Every parameter and persistent buffer of the module, by qualified name (walked on
        first use: a load that stops at its first key, as a dry load's discovery passes do,
        never walks a large model)."""
        if self._params is None:
            self._params = model_tensors(self._module)
            self._alias_of = {a: p.name for p in self._params.values() for a in p.aliases}
        return self._params

    # --- recording (AutoWeightsLoader calls these) ----------------------------------------------

    def add(self, name: str, tensor: Any) -> CheckpointEntry:
        entry = CheckpointEntry(len(self.entries), name, tuple(getattr(tensor, "shape", ())))
        self.entries.append(entry)
        if self.observer is not None:
            self.observer.took(self, entry, tensor)
        return entry

    def param_loaded(self, qualname: str, source: str | None = None, via: str | None = None):
        params = self.params  # first: it fills the alias table
        entry = params.get(self._alias_of.get(qualname, qualname))
        if entry is None:
            return  # a child's loader reported a name the model does not hold: nothing to mark
        entry.status = Status.LOADED
        if source is not None:
            entry.sources.append(source)
        if via is not None:
            entry.via = via

    # --- reading ---

    def entries_with(self, status: Status) -> list[CheckpointEntry]:
        return [e for e in self.entries if e.status == status]

    def params_with(self, status: Status) -> list[ParamEntry]:
        return [p for p in self.params.values() if p.status == status]

    @property
    def never_loaded(self) -> list[str]:
        return [p.name for p in self.params_with(Status.NEVER_LOADED)]

    def counts(self) -> dict[str, dict[str, int]]:
        ck = Counter(e.status for e in self.entries)
        pm = Counter(p.status for p in self.params.values())
        return {
            "checkpoint": {s: ck.get(s, 0) for s in ENTRY_STATUSES},
            "model": {s: pm.get(s, 0) for s in PARAM_STATUSES},
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "counts": self.counts(),
            "checkpoint": [
                {
                    "name": e.name,
                    "mapped": e.mapped,
                    "status": e.status,
                    "target": e.target,
                    "rule": e.rule,
                    "left_by": e.left_by,
                    "shape": list(e.shape),
                }
                for e in self.entries
            ],
            "model": [
                {
                    "name": p.name,
                    "kind": p.kind,
                    "status": p.status,
                    "sources": p.sources,
                    "via": p.via,
                    "aliases": p.aliases,
                }
                for p in self.params.values()
            ],
        }

    def table(self, *, full: bool = False, limit: int = 20) -> str:
        """A short text table: counts, then the entries that were not plainly loaded.

        ``full=True`` lists every entry; otherwise loaded entries are summarised by count.
        """
        c = self.counts()
        lines = [
            f"{self.root}: checkpoint {len(self.entries)} names: "
            + ", ".join(f"{n} {s}" for s, n in c["checkpoint"].items() if n),
            f"{' ' * len(self.root)}  model {len(self.params)} tensors: "
            + ", ".join(f"{n} {s}" for s, n in c["model"].items() if n),
        ]
        shown = self.entries if full else [e for e in self.entries if e.status != Status.LOADED]
        if shown:
            rows = [(e.name, e.status, e.detail) for e in shown[:limit]]
            header = ("checkpoint name", "status", "detail")
            # The status column fits every status, so the tables of different loads line up.
            status_width = max(map(len, ENTRY_STATUSES))
            lines.append(table(rows, header=header, indent="  ", min_widths=(0, status_width)))
            if len(shown) > limit:
                lines.append(f"  ... {len(shown) - limit} more")
        missing = self.never_loaded
        if missing:
            lines.append("  never loaded: " + ", ".join(missing[:limit]))
            if len(missing) > limit:
                lines.append(f"  ... {len(missing) - limit} more")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        c = self.counts()
        return f"<LoadLedger {self.root} checkpoint={c['checkpoint']} model={c['model']}>"


_ATTR = "_loadkit_ledger"


def remember(module: torch.nn.Module, ledger: LoadLedger) -> None:
    """Keep ``ledger`` on ``module`` itself (as the pooling adapter keeps ``probe_record``)."""
    object.__setattr__(module, _ATTR, ledger)  # plain attribute: no nn.Module registration


def ledger_of(module: torch.nn.Module) -> LoadLedger | None:
    """The ledger of the last ``AutoWeightsLoader`` load rooted at ``module``.

    Models build their ``AutoWeightsLoader`` inside ``load_weights`` and drop it; the ledger stays
    reachable from the model itself.

    Example:
        >>> import torch
        >>> from loadkit import AutoWeightsLoader
        >>> model = torch.nn.Linear(2, 2)
        >>> _ = AutoWeightsLoader(model).load_weights([("bias", torch.zeros(2))])
        >>> ledger_of(model).never_loaded
        ['weight']
    """
    return module.__dict__.get(_ATTR)
