"""The words loadkit uses everywhere: behaviours and statuses, each defined once.

``Behaviour`` names the two sides of every bug (``"old"`` reproduces it, ``"new"`` is the fix);
``check_behaviour`` is the one check, raising ``loadkit.errors.BehaviourError``. ``Status`` is
every fate a checkpoint key or a model tensor can meet, in a load (the ledger) or in a simulated
one (the inspect report). Torch-free and cheap to import (``enum`` comes with ``re`` anyway).
"""

from __future__ import annotations

from collections.abc import Collection
from enum import StrEnum
from typing import Literal, TypeVar, overload

from loadkit.errors import BehaviourError

__all__ = [
    "BEHAVIOURS",
    "CLEAN_STATUSES",
    "ENTRY_STATUSES",
    "KEY_STATUSES",
    "PARAM_STATUSES",
    "VLLM_VERSION",
    "Behaviour",
    "Status",
    "check_behaviour",
]


# The vLLM release whose loading code loadkit's "new" behaviour and API follow: what a
# ``vllm`` verdict of ``loadkit inspect`` answers for (docs/fidelity.md).
VLLM_VERSION = "0.34.0"

Behaviour = Literal["old", "new"]
BEHAVIOURS: tuple[Behaviour, ...] = ("old", "new")

_B = TypeVar("_B", bound=str)


@overload
def check_behaviour(behaviour: str) -> Behaviour: ...
@overload
def check_behaviour(behaviour: str, allowed: Collection[_B], *, what: str = ...) -> _B: ...


def check_behaviour(
    behaviour: str, allowed: Collection[str] = BEHAVIOURS, *, what: str = "behaviour"
) -> str:
    """Return ``behaviour`` if it is one of ``allowed``; else raise ``BehaviourError``.

    Args:
        behaviour: the value a caller passed.
        allowed: the names this function accepts (``("old", "new")`` unless a pitfall has more).
        what: the argument's name, for the message.

    Returns:
        ``behaviour`` itself, typed as one of ``allowed`` (``Behaviour`` by default), so a
        constructor can check and store in one line.

    >>> check_behaviour("new")
    'new'
    >>> check_behaviour("newest")
    Traceback (most recent call last):
    ...
    loadkit.errors.BehaviourError: behaviour must be 'old' or 'new', not 'newest'
    """
    if behaviour not in allowed:
        names = [repr(b) for b in allowed]
        choice = " or ".join(names) if len(names) == 2 else f"one of {', '.join(names)}"
        raise BehaviourError(f"{what} must be {choice}, not {behaviour!r}")
    return behaviour


class Status(StrEnum):
    """Where a checkpoint key went, or whether a model tensor was filled.

    Members are ``str``: they compare equal to, format and serialise (``json``) as their plain
    words, and their ``repr`` is the plain word's too, so printed records read as before.

    >>> Status.MAPPER_DROPPED == "dropped by mapper", f"{Status.LOADED}"
    (True, 'loaded')
    """

    # a checkpoint key in a load (the ledger's words)
    LOADED = "loaded"
    SKIPPED = "skipped"
    IGNORED = "ignored"
    MAPPER_DROPPED = "dropped by mapper"
    DELEGATED = "delegated"
    UNCONSUMED = "unconsumed"  # pulled by nobody: a loader that stopped early
    UNEXPECTED = "unexpected"  # not in the model, recorded by an observer instead of raised
    # a checkpoint key in a simulated load that would fail (the inspect report adds these)
    SHAPE_MISMATCH = "shape mismatch"
    LOAD_ERROR = "load error"
    # a model tensor
    NEVER_LOADED = "never loaded"

    def __repr__(self) -> str:
        return repr(self.value)


# A checkpoint key's fate in a real load, and a model tensor's.
ENTRY_STATUSES = (
    Status.LOADED,
    Status.SKIPPED,
    Status.IGNORED,
    Status.MAPPER_DROPPED,
    Status.DELEGATED,
    Status.UNCONSUMED,
    Status.UNEXPECTED,
)
PARAM_STATUSES = (Status.LOADED, Status.NEVER_LOADED)
# A key's fate in a simulated load: the clean ones, then the ones that fail the load.
CLEAN_STATUSES = ENTRY_STATUSES[:5]
KEY_STATUSES = (
    *CLEAN_STATUSES,
    Status.UNCONSUMED,
    Status.UNEXPECTED,
    Status.SHAPE_MISMATCH,
    Status.LOAD_ERROR,
)
