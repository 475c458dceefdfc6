"""One verdict per loader: ``vllm`` and, for a model built from a transformers class,
``transformers``.

A checkpoint "loads" only with respect to a loader:

- ``vllm``: the model's own loading code as loadkit re-implements vLLM 0.28.0's (for ``--model
  hf``, vLLM's Transformers modeling backend: its derived mapper, ``AutoWeightsLoader`` and the
  wrapper's skip rules); the report's ``load`` section is this loader's;
- ``transformers``: ``PreTrainedModel.from_pretrained`` of the installed transformers, computed
  header-only by ``loadkit.inspection.simulate.from_pretrained``.

Index problems where a listed shard is missing or unreadable fail both loaders (both read every
tensor of every listed file). This module is torch-free: the records and the text only.

>>> v = LoaderVerdict("vllm", False, ["1 unexpected: final_logits_bias"])
>>> headline([LoaderVerdict("transformers", True, []), v])
'transformers: would load cleanly | vllm: would NOT load (1 unexpected: final_logits_bias)'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from loadkit.errors import LoadkitError
from loadkit.fmt import plural

if TYPE_CHECKING:
    from loadkit.inspection.records import LoadReport
    from loadkit.inspection.simulate.from_pretrained import FromPretrained
    from loadkit.inspection.summary import CheckpointSummary
    from loadkit.inspection.tensor_parallel.plan import TPReport

VLLM = "vllm"
TRANSFORMERS = "transformers"
ALL = "all"
LOADER_CHOICES = (ALL, VLLM, TRANSFORMERS)
SHOWN = 3  # names shown per kind of problem in the headline


class LoaderVerdict(NamedTuple):
    """Would ``loader`` load the checkpoint cleanly, and if not, why (short phrases)."""

    loader: str
    clean: bool
    problems: list[str]

    def phrase(self) -> str:
        if self.clean:
            return f"{self.loader}: would load cleanly"
        return f"{self.loader}: would NOT load ({'; '.join(self.problems)})"

    def as_dict(self) -> dict[str, Any]:
        return {"loader": self.loader, "clean": self.clean, "problems": list(self.problems)}


def _names(kind: str, names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN]) + (", ..." if len(names) > SHOWN else "")
    return f"{len(names)} {kind}: {shown}"


def _index_problems(checkpoint: CheckpointSummary, strict_index: bool) -> list[str]:
    """The index problems every loader shares: those that stop the load, and with
    ``strict_index`` the inconsistencies."""
    n, m = len(checkpoint.failing), len(checkpoint.inconsistent)
    out = [plural(n, "index problem")] if n else []
    if strict_index and m:
        out.append(
            f"{plural(m, 'index inconsistency', 'index inconsistencies')} under --strict-index"
        )
    return out


def vllm_verdict(
    load: LoadReport,
    checkpoint: CheckpointSummary,
    *,
    tp: TPReport | None = None,
    strict_index: bool = False,
) -> LoaderVerdict:
    """The ``vllm`` loader's verdict from the simulated load, the index, and with ``tp`` what
    vLLM makes of that many ranks (a refusal is vLLM's alone: transformers has no tp)."""
    problems = _index_problems(checkpoint, strict_index)
    if load.unexpected:
        problems.append(_names("unexpected", [u.name for u in load.unexpected]))
    if load.failing_missing:
        problems.append(_names("missing", [m.name for m in load.failing_missing]))
    if load.shape_mismatches:
        problems.append(_names("mismatched", [s.param or s.name for s in load.shape_mismatches]))
    # The rest (load errors, casts refused by --strict-dtype...) as the load report counts them.
    counted = ("unexpected", "shape mismatch", "never filled")
    problems += [p for p in load.problems() if not any(c in p for c in counted)]
    problems += tp.problems() if tp is not None else []
    clean = load.clean and not problems
    return LoaderVerdict(VLLM, clean, [] if clean else problems or ["the load fails"])


def transformers_verdict(
    result: FromPretrained, checkpoint: CheckpointSummary, *, strict_index: bool = False
) -> LoaderVerdict:
    """The ``transformers`` loader's verdict from ``from_pretrained``'s simulated lists and the
    index."""
    problems = _index_problems(checkpoint, strict_index)
    if result.unexpected:
        problems.append(_names("unexpected", list(result.unexpected)))
    if result.missing:
        problems.append(_names("missing", list(result.missing)))
    if result.mismatched:
        kind = "mismatched" + ("" if result.ignore_mismatched_sizes else ", raises")
        problems.append(_names(kind, [m.name for m in result.mismatched]))
    problems += list(result.errors)
    return LoaderVerdict(TRANSFORMERS, not problems, problems)


def headline(verdicts: list[LoaderVerdict]) -> str:
    """The report's first line: every selected loader's verdict, side by side."""
    return " | ".join(v.phrase() for v in verdicts)


def select_loaders(choice: str, available: tuple[str, ...]) -> tuple[str, ...]:
    """The loaders ``--loader choice`` selects among those the model has.

    >>> select_loaders("all", ("transformers", "vllm")), select_loaders("vllm", ("vllm",))
    (('transformers', 'vllm'), ('vllm',))
    >>> select_loaders("transformers", ("vllm",))  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    loadkit.errors.LoadkitError: --loader transformers: ...
    """
    if choice == ALL:
        return available
    if choice not in LOADER_CHOICES:
        raise LoadkitError(f"--loader {choice!r}: choose from {', '.join(LOADER_CHOICES)}")
    if choice not in available:
        raise LoadkitError(
            f"--loader {choice}: this model loads only with {', '.join(available)} (the "
            "transformers loader is for models built from a transformers class: --model hf)"
        )
    return (choice,)


def available_loaders(module: Any) -> tuple[str, ...]:
    """``("transformers", "vllm")`` for a model built from a transformers class (``--model hf``),
    else ``("vllm",)``."""
    from loadkit.models.transformers.base import Base

    return (TRANSFORMERS, VLLM) if isinstance(module, Base) else (VLLM,)
