"""One verdict per loader: ``vllm`` and, for a model built from a transformers class,
``transformers``.

A checkpoint "loads" only with respect to a loader:

- ``vllm``: the model's own loading code as loadkit re-implements vLLM's (``VLLM_VERSION``, the
  release loadkit follows; for ``--model hf``, the class vLLM 0.34.0 would use, named in the
  verdict: a native class judged as its ``track_weights_loading`` judges it, or its Transformers
  modeling backend); the report's ``load`` section is this loader's;
- ``transformers``: ``PreTrainedModel.from_pretrained`` of the installed transformers, computed
  header-only by ``loadkit_inspect.simulate.from_pretrained``.

Each verdict names the version it answers for: ``vllm 0.34.0: would load cleanly``.

Each loader reads the files it chooses itself (``loadkit_inspect.sources.files``): a listed shard
missing or unreadable makes vLLM raise (``index_raises``), and transformers where it reads that
shard (its simulation opens the files it reads). The transformers verdict is said in its own
terms: it loads, loads with warnings (tensors newly initialised at random, keys unused), or
raises. This module is torch-free: the records and the text only.

>>> v = LoaderVerdict("vllm", False, ["1 unexpected: lm_head.bias"], "0.34.0")
>>> headline([LoaderVerdict("transformers", True, [], "4.57.1"), v])
'transformers 4.57.1: would load cleanly | vllm 0.34.0: would NOT load (1 unexpected: lm_head.bias)'
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from loadkit.errors import LoadkitError
from loadkit.fmt import plural
from loadkit.terms import VLLM_VERSION, Status

if TYPE_CHECKING:
    from loadkit.loading import Tracked
    from loadkit_inspect.report.records import LoadReport
    from loadkit_inspect.report.summary import CheckpointSummary
    from loadkit_inspect.simulate.from_pretrained import FromPretrained
    from loadkit_inspect.sources.files import FileChoice
    from loadkit_inspect.tensor_parallel.plan import TPReport

# What the notebook layer takes: a loader's verdict and the report's first line.
__all__ = ["LoaderVerdict", "headline"]

VLLM = "vllm"
TRANSFORMERS = "transformers"
ALL = "all"
LOADER_CHOICES = (ALL, VLLM, TRANSFORMERS)
SHOWN = 3  # names shown per kind of problem in the headline


class LoaderVerdict(NamedTuple):
    """Would ``loader`` (at ``version``) load the checkpoint cleanly, and if not, why (short
    phrases).

    ``via``: the class the loader would use, where the model says (``--model hf``: ``native
    Qwen3MoeForCausalLM``); ``checked``: ``False`` when loadkit does not model that class (no
    verdict, ``problems`` says why); ``quiet``: the load would go through without an error and
    leave tensors uninitialised (vLLM's most dangerous outcome), ``problems`` says which.
    ``outcome``, where the loader's own terms are known (``transformers``): ``loads``,
    ``warns`` (it returns the model with tensors newly initialised at random or keys unused),
    ``raises``, ``unknown``.

    >>> LoaderVerdict("transformers", False, ["1 newly initialised at random (MISSING: b)"],
    ...               "5.24.0", outcome="warns").phrase()
    'transformers 5.24.0: would load, but 1 newly initialised at random (MISSING: b)'
    """

    loader: str
    clean: bool
    problems: list[str]
    version: str = ""
    via: str | None = None
    checked: bool = True
    quiet: bool = False
    outcome: str = ""
    notes: tuple[str, ...] = ()  # what the loader does by design, said beside a clean verdict

    @property
    def label(self) -> str:
        """The loader, the version it answers for and the class it uses: ``vllm 0.34.0``,
        ``vllm 0.34.0, native LlamaForCausalLM``."""
        name = f"{self.loader} {self.version}" if self.version else self.loader
        return f"{name}, {self.via}" if self.via else name

    def phrase(self) -> str:
        said = "; ".join(self.problems)
        if not self.checked:
            return f"{self.label}: not checked ({said})"
        if self.clean:
            noted = f" ({'; '.join(self.notes)})" if self.notes else ""
            return f"{self.label}: would load cleanly{noted}"
        if self.quiet:
            return f"{self.label}: would load WITHOUT AN ERROR but {' and '.join(self.problems)}"
        if self.outcome == "loads":  # loadkit's own rule fails it (--strict-index)
            return f"{self.label}: would load cleanly, but {said}"
        if self.outcome == "warns":
            return f"{self.label}: would load, but {said}"
        if self.outcome == "raises":
            return f"{self.label}: would raise {said}"
        if self.outcome == "unknown":
            return f"{self.label}: not judged ({said})"
        return f"{self.label}: would NOT load ({said})"

    def as_dict(self) -> dict[str, Any]:
        out = {
            "loader": self.loader,
            "version": self.version,
            "clean": self.clean,
            "outcome": self.outcome or None,
            "problems": list(self.problems),
        }
        if self.via is not None:  # --model hf: the class, and what kind of verdict it is
            out.update(
                label=self.label, checked=self.checked, quiet=self.quiet, notes=[*self.notes]
            )
        return out


class VllmSide(NamedTuple):
    """What the ``vllm`` verdict needs beyond the dry load: the class vLLM would use (``via``)
    and the version of the registry that chose it, vLLM's refusal of the architecture, why the
    class is not modelled, and the load as vLLM's ``track_weights_loading`` judges it
    (``loadkit.loading.track.Tracked``: only for vLLM's native classes, whose layers carry a
    ``quant_method``)."""

    via: str | None = None
    version: str = VLLM_VERSION
    refusal: str | None = None
    unmodelled: str | None = None
    tracked: Tracked | None = None
    passed_over: Callable[[str], str | None] | None = None  # keys set aside by design, and why

    def verdict(
        self,
        clean: bool,
        problems: list[str],
        *,
        checked: bool = True,
        quiet: bool = False,
        notes: tuple[str, ...] = (),
    ) -> LoaderVerdict:
        return LoaderVerdict(
            VLLM, clean, problems, self.version, self.via, checked, quiet, notes=notes
        )


def _names(kind: str, names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN]) + (", ..." if len(names) > SHOWN else "")
    return f"{len(names)} {kind}: {shown}"


def _shards(names: list[str]) -> str:
    return ", ".join(f"'{n}'" for n in names)


def index_raises(checkpoint: CheckpointSummary) -> list[str]:
    """What vLLM raises for the folder problems that stop the load (``[]`` when none does):
    ``FileNotFoundError`` for a listed file that is missing (``filter_duplicate_safetensors_
    files``), the safetensors library's ``SafetensorError`` for a file it cannot read, and its
    size assertion for the copy of a key stored twice with two shapes that the parameter does
    not fit (``default_weight_loader``). transformers' column is its own simulation, on the
    files it reads."""
    failing = checkpoint.failing
    out = []
    missing = sorted({p.listed for p in failing if p.kind == "missing shard" and p.listed})
    if missing:
        out.append(f"raises FileNotFoundError: listed shard {_shards(missing)} missing")
    unreadable = sorted({p.listed or "" for p in failing if p.kind == "unreadable shard"})
    if unreadable:
        out.append(f"raises SafetensorError: shard {_shards(unreadable)} cannot be read")
    twice = [p.key for p in failing if p.kind == "in two shards" and p.key]
    if twice:
        out.append(f"raises: {_names('key stored twice with two shapes', twice)}")
    known = ("missing shard", "unreadable shard", "in two shards")
    others = [p for p in failing if p.kind not in known]
    if others:
        what = "index problem" if checkpoint.index else "file problem"
        out.append(f"{plural(len(others), what)} ({others[0].kind})")
    return out


def _strict(checkpoint: CheckpointSummary, strict_index: bool) -> list[str]:
    """With ``strict_index``, the inconsistencies fail every loader alike."""
    m = len(checkpoint.inconsistent)
    if not (strict_index and m):
        return []
    return [f"{plural(m, 'index inconsistency', 'index inconsistencies')} under --strict-index"]


def vllm_verdict(
    load: LoadReport | None,
    checkpoint: CheckpointSummary,
    *,
    tp: TPReport | None = None,
    strict_index: bool = False,
    side: VllmSide | None = None,
    files: FileChoice | None = None,
) -> LoaderVerdict:
    """The ``vllm`` loader's verdict from the simulated load, the index, and with ``tp`` what
    vLLM makes of that many ranks (a refusal is vLLM's alone: transformers has no tp). vLLM
    refuses an architecture before anything else, checks ``tp`` before it builds the model and
    the index before it loads a weight: what raises first is all it says. With
    ``side.tracked``, tensors vLLM does not check are no failure of their own: the load goes
    through and leaves them uninitialised (``quiet``). ``load`` is ``None`` only where
    ``side.unmodelled`` says why no load was simulated."""
    side = side or VllmSide()
    refused_tp = tp is not None and tp.refusal is not None  # checked before any class is built
    if side.unmodelled is not None and not refused_tp:
        return side.verdict(False, [side.unmodelled], checked=False)
    if side.refusal is not None:
        return side.verdict(False, [f"vLLM refuses it: {side.refusal}"])
    problems = tp.problems() if tp is not None else []
    # the index's problems are vLLM's where it reads the index's files (not the Mistral format)
    raised = [] if files is not None and files.mistral else index_raises(checkpoint)
    if files is not None and files.raises is not None:  # before it opens a file
        raised = [f"raises {files.raises.text()}"]
    if problems or raised:
        return side.verdict(False, problems + raised)
    assert load is not None, "a vLLM verdict needs the simulated load"
    problems = _strict(checkpoint, strict_index) + _load_problems(load, side.tracked)
    set_aside = _by_design(load, side)
    quiet = _quiet(load, side.tracked, set(set_aside))
    if not problems and quiet and load.clean_but_missing:
        return side.verdict(False, quiet, quiet=True)
    if quiet:
        problems.append(f"besides, it would {' and '.join(quiet)}")
    clean = load.clean_but_missing and not problems
    notes = _design_notes(set_aside) if clean else ()
    return side.verdict(clean, [] if clean else problems or ["the load fails"], notes=notes)


def _by_design(load: LoadReport, side: VllmSide) -> dict[str, str]:
    """The keys the model's own ``load_weights`` took and passed over by design, and why
    (``side.passed_over``: DeepSeek's multi-token-prediction layers)."""
    if side.passed_over is None:
        return {}
    taken = (k.name for k in load.keys if k.status == Status.DELEGATED)
    return {k: why for k in taken if (why := side.passed_over(k)) is not None}


def _design_notes(set_aside: dict[str, str]) -> tuple[str, ...]:
    """``788 keys set aside: the multi-token-prediction layer 61 (...)``, one per reason."""
    counts = Counter(set_aside.values())
    return tuple(f"{plural(n, 'key')} set aside: {why}" for why, n in counts.items())


def _quiet(load: LoadReport, tracked: Tracked | None, by_design: set[str]) -> list[str]:
    """What a load vLLM does not check would do without a word (``tracked``: vLLM's native
    classes): leave tensors uninitialised, and drop keys its own ``load_weights`` took and
    loaded nowhere (gpt-oss passes a name it does not have over), those it sets aside
    ``by_design`` apart."""
    if tracked is None or not load.complete:  # stopped early: most tensors never reached
        return []
    allowed = {m.name for m in load.missing if m.allowed is not None}
    left = [q for q in tracked.quiet if q not in allowed]
    dropped = [
        k.name for k in load.keys if k.status == Status.DELEGATED and k.name not in by_design
    ]
    out = []
    if left:
        them = "it" if len(left) == 1 else "them"
        out.append(
            f"leave {plural(len(left), 'tensor')} uninitialised (never in the checkpoint; vLLM "
            f"does not check {them}): {_shown(left)}"
        )
    if dropped:
        out.append(
            f"ignore {plural(len(dropped), 'checkpoint key')} (taken by the model's own "
            f"load_weights and loaded nowhere): {_shown(dropped)}"
        )
    return out


def _shown(names: list[str]) -> str:
    return ", ".join(names[:SHOWN]) + (", ..." if len(names) > SHOWN else "")


def _load_problems(load: LoadReport, tracked: Tracked | None) -> list[str]:
    """The dry load's problems as vLLM raises them: unexpected keys, missing tensors (with
    ``tracked``: only those vLLM checks, and the missing shards of a partly loaded stacked
    parameter), mismatched shapes, and the rest as the load report counts them."""
    problems = []
    if load.unexpected:
        problems.append(_names("unexpected", [u.name for u in load.unexpected]))
    if not load.complete:
        missing = []  # a dry load that stopped early never reached them: not a finding
    elif tracked is None:
        missing = [m.name for m in load.failing_missing]
    else:
        allowed = {m.name for m in load.missing if m.allowed is not None}
        missing = [n for n in tracked.refused if n not in allowed]
    if missing:
        problems.append(_names("missing", missing))
    if load.shape_mismatches:
        problems.append(_names("mismatched", [s.param or s.name for s in load.shape_mismatches]))
    # The rest (load errors, casts refused by --strict-dtype...) as the load report counts them.
    counted = ("unexpected", "shape mismatch", "never filled")
    return problems + [p for p in load.problems() if not any(c in p for c in counted)]


def transformers_verdict(
    result: FromPretrained, checkpoint: CheckpointSummary, *, strict_index: bool = False
) -> LoaderVerdict:
    """The ``transformers`` loader's verdict in its own terms, from ``from_pretrained``'s
    simulated outcome (the files it reads included: a shard it cannot open makes it raise
    before it reports any list); ``--strict-index`` fails it too."""
    version = result.transformers_version
    strict = _strict(checkpoint, strict_index)
    outcome = result.outcome
    problems = transformers_problems(result)
    if outcome == "raises":
        return LoaderVerdict(TRANSFORMERS, False, problems, version, outcome=outcome)
    clean = outcome == "loads" and not strict
    return LoaderVerdict(TRANSFORMERS, clean, strict + problems, version, outcome=outcome)


def transformers_problems(result: FromPretrained) -> list[str]:
    """``from_pretrained``'s outcome in short phrases, in the words of its load report: what it
    raises; else the tensors it initialises at random (MISSING), the keys it leaves unused
    (UNEXPECTED), the ones it reinitialises (MISMATCH, under ``ignore_mismatched_sizes``)."""
    error = result.error
    if error is not None and result.raised is None and not result.errors:
        shown = [f"{m.name} (checkpoint {list(m.checkpoint_shape)}, model {list(m.model_shape)})"
                 for m in result.mismatched]  # fmt: skip
        return [
            f"RuntimeError: {_names('size MISMATCH', shown)}; ignore_mismatched_sizes=True "
            f"would reinitialise {'it' if len(shown) == 1 else 'them'} at random"
        ]
    if error is not None:
        return [error.text()]
    if result.quantized is not None:
        return [
            f"it would load through its {result.quantized!r} quantizer (the config's "
            "quantization_config), which loadkit does not model"
        ]
    if result.outcome == "unknown" and result.files is not None:
        return [f"it reads {', '.join(result.files.files)}, a PyTorch pickle loadkit does not read"]
    out = []
    if result.missing:
        out.append(_kind("newly initialised at random", "MISSING", result.missing))
    if result.unexpected:
        out.append(_kind("unused", "UNEXPECTED", result.unexpected))
    if result.mismatched:
        names = [m.name for m in result.mismatched]
        out.append(_kind("reinitialised at random", "MISMATCH", names))
    return out


def _kind(what: str, status: str, names: Sequence[str]) -> str:
    """``2 newly initialised at random (MISSING: a, b)``."""
    shown = ", ".join(names[:SHOWN]) + (", ..." if len(names) > SHOWN else "")
    return f"{len(names)} {what} ({status}: {shown})"


def headline(verdicts: list[LoaderVerdict]) -> str:
    """The report's first line: every selected loader's verdict, side by side."""
    return " | ".join(v.phrase() for v in verdicts)


def select_loaders(
    choice: str, available: tuple[str, ...], *, unchecked: str | None = None
) -> tuple[str, ...]:
    """The loaders ``--loader choice`` selects among those the model has. ``unchecked``: why
    the ``vllm`` loader has no verdict (loadkit does not model the class vLLM would use):
    ``all`` then selects the others, and ``vllm`` alone is an error.

    >>> select_loaders("all", ("transformers", "vllm")), select_loaders("vllm", ("vllm",))
    (('transformers', 'vllm'), ('vllm',))
    >>> select_loaders("all", ("transformers", "vllm"), unchecked="not modelled")
    ('transformers',)
    >>> select_loaders("transformers", ("vllm",))  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    loadkit.errors.LoadkitError: --loader transformers: ...
    """
    if choice not in LOADER_CHOICES:
        raise LoadkitError(f"--loader {choice!r}: choose from {', '.join(LOADER_CHOICES)}")
    if choice == ALL:
        return tuple(n for n in available if not (n == VLLM and unchecked and len(available) > 1))
    if choice not in available:
        raise LoadkitError(
            f"--loader {choice}: this model loads only with {', '.join(available)} (the "
            "transformers loader is for models built from a transformers class: --model hf)"
        )
    if choice == VLLM and unchecked:
        raise LoadkitError(f"--loader vllm: no verdict: {unchecked}")
    return (choice,)


def hf_config(module: Any) -> Any:
    """The transformers config a model was built from (``--model hf``), or ``None``."""
    found = getattr(module, "hf_config", None)
    if found is not None:
        return found
    from loadkit.models.transformers import Base

    return module.config if isinstance(module, Base) else None


def available_loaders(module: Any) -> tuple[str, ...]:
    """``("transformers", "vllm")`` for a model built from a transformers config (``--model
    hf``), else ``("vllm",)``."""
    return (TRANSFORMERS, VLLM) if hf_config(module) is not None else (VLLM,)


def vllm_side(module: Any, loaded: Any) -> VllmSide:
    """The ``vllm`` verdict's side information for ``module`` (built by ``--model hf``: it
    carries ``vllm_class``, the class vLLM would use) and its dry load ``loaded``."""
    choice = getattr(module, "vllm_class", None)
    if choice is None:
        return VllmSide()
    tracked = loaded.tracked if choice.native and loaded is not None else None
    unmodelled = getattr(module, "vllm_unmodelled", None)
    passed_over = getattr(module, "passed_over", None)  # a native class that sets keys aside
    return VllmSide(
        choice.via, choice.version, choice.refusal, unmodelled, tracked,
        passed_over if callable(passed_over) else None,
    )  # fmt: skip
