"""Following a load from outside: an observer sees every ledgered load made inside a scope.

Models build their ``AutoWeightsLoader`` inside their own ``load_weights`` and drop it, so a tool
that follows a load (the inspector's dry load) cannot hand the loader anything. It opens a scope
instead: every ``LoadLedger`` created inside ``with observing(observer):`` reports to
``observer`` when it opens and for each checkpoint name it takes, and every ``AutoWeightsLoader``
asks it which mapper (and rules) to load with, and whether a name the model does not have may be
recorded instead of raised. The scope lives in a ``contextvars`` variable: nothing is patched
and nothing global is left behind; each thread and asyncio task sees its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from loadkit.loading.auto_loader import AutoWeightsLoader
    from loadkit.loading.ledger import CheckpointEntry, LoadLedger
    from loadkit.mapper import WeightsMapper


class LoadObserver:
    """Hooks a load calls; each default does what an unobserved load does. Subclass and override.

    Example:
        >>> import torch
        >>> from loadkit import AutoWeightsLoader
        >>> class Names(LoadObserver):
        ...     def __init__(self):
        ...         self.seen = []
        ...     def took(self, ledger, entry, tensor):
        ...         self.seen.append(entry.name)
        >>> model = torch.nn.Linear(2, 2)
        >>> with observing(Names()) as names:
        ...     _ = AutoWeightsLoader(model).load_weights([("bias", torch.zeros(2))])
        >>> names.seen
        ['bias']
    """

    def opened(self, ledger: LoadLedger, module: nn.Module) -> None:
        """A load rooted at ``module`` started and keeps ``ledger``."""

    def took(self, ledger: LoadLedger, entry: CheckpointEntry, tensor: Any) -> None:
        """The load took one checkpoint name (``entry``, before any rule disposed of it)."""

    def loading(
        self, auto_loader: AutoWeightsLoader, mapper: WeightsMapper | None
    ) -> WeightsMapper | None:
        """An ``AutoWeightsLoader`` starts a load with ``mapper``; returns the mapper to use. The
        observer may also add rules to this AutoWeightsLoader's own lists
        (``auto_loader.ignore_unexpected_prefixes``...)."""
        return mapper

    def skipped(self, auto_loader: AutoWeightsLoader, entry: CheckpointEntry) -> str | None:
        """A rule of the observer's own that skips ``entry`` (after the AutoWeightsLoader's mapper
        and its own skip rules, before the walk), named as a ledger shows rules; ``None``: none
        does.
        A dry load skips by the checkpoint's spelling of a name here."""
        return None

    def unexpected(
        self, ledger: LoadLedger, name: str, entries: Sequence[CheckpointEntry], reason: str
    ) -> bool:
        """``name`` (taken as ``entries``) is not in the model. ``True``: record it and go on
        (the entries become ``unexpected``); ``False``: raise, as an unobserved load does."""
        return False


_CURRENT: ContextVar[LoadObserver | None] = ContextVar("loadkit_load_observer", default=None)


def current_observer() -> LoadObserver | None:
    """The observer of the innermost ``observing`` scope, if any."""
    return _CURRENT.get()


@contextmanager
def observing(observer: LoadObserver) -> Iterator[LoadObserver]:
    """Every ledgered load inside the ``with`` block reports to ``observer``."""
    token = _CURRENT.set(observer)
    try:
        yield observer
    finally:
        _CURRENT.reset(token)
