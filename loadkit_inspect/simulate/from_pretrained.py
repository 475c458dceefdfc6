"""The ``transformers`` loader's verdict: what ``PreTrainedModel.from_pretrained`` would report.

Header-only. transformers builds the class on the meta device (its own init context, as
``from_pretrained`` does), the checkpoint becomes meta tensors of its shapes and dtypes, and
transformers' own loading functions run on them, unchanged:

- ``get_model_conversion_mapping(model)``: its key renamings and conversions (``WeightRenaming``,
  ``WeightConverter``: fused or split tensors, legacy names such as ``LayerNorm.gamma``);
- ``PreTrainedModel._load_pretrained_model``: the key matching of
  ``convert_and_load_state_dict_in_model`` (base-model prefix added or stripped, each converter's
  operations run on meta tensors, shape mismatches recorded);
- of ``PreTrainedModel._finalize_model_loading``, the three steps that change the lists:
  ``mark_tied_weights_as_initialized``, ``tie_weights(missing_keys=...)`` (tied weights not
  required), ``_adjust_missing_and_unexpected_keys`` (``_keys_to_ignore_on_load_missing`` /
  ``_unexpected``, and the ``inv_freq`` / ``position_ids`` buffers older checkpoints saved).
  The two it leaves out only give missing weights storage and initial values.

Steps loadkit does itself, each pinned by ``tests/tool/simulate/test_from_pretrained.py`` against
``from_pretrained(..., output_loading_info=True)`` (34 architectures, 16 mutations):

- which class loads: ``config.architectures[0]`` from the ``transformers`` namespace, else the
  class ``AutoModel`` maps the config to (a user may name another: ``cls=``);
- the tensors are meta tensors kept on meta (``device_map={"": "meta"}``): nothing is read or
  allocated, so missing weights are left uninitialised (their values are not part of a verdict);
- the verdict: transformers raises when there are loading errors, conversion errors, or shape
  mismatches without ``ignore_mismatched_sizes`` (``log_state_dict_report``); the same conditions
  are checked here on the final lists, without the report's logging;
- transformers' logging and progress bars are turned down while it runs and restored after (they
  would print its own report around loadkit's).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from loadkit.checkpoint import TensorInfo
from loadkit.errors import ModelSpecError, printable
from loadkit.loading import meta_tensor
from loadkit_inspect.report.text import capped, shapes
from loadkit_inspect.sources.files import FileChoice, Raised

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

    from loadkit_inspect.options import LoadRules

TRANSFORMERS = "transformers"


class Mismatch(NamedTuple):
    """A parameter whose checkpoint tensor has another shape (transformers' names)."""

    name: str
    checkpoint_shape: tuple[int, ...]
    model_shape: tuple[int, ...]


LOADS, WARNS, RAISES, UNKNOWN = "loads", "warns", "raises", "unknown"


class FromPretrained(NamedTuple):
    """What ``from_pretrained`` would report for a checkpoint, in transformers' own names.

    ``missing``: model parameters and buffers no checkpoint key fills (tied ones and ignored
    patterns left out, as transformers leaves them out): its load report's MISSING, "newly
    initialized" at random; ``unexpected``: checkpoint keys (after its renamings) that fill
    nothing (UNEXPECTED); ``mismatched``: loaded keys of another shape (MISMATCH); ``errors``:
    what makes ``from_pretrained`` raise besides mismatches (CONVERSION errors, loading errors);
    ``raised``: what it raises before it loads a tensor (no file it reads, a shard it cannot
    open, a class it cannot build): the lists are then what the files it could read would give.
    """

    cls: str
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    mismatched: tuple[Mismatch, ...]
    errors: tuple[str, ...]
    ignore_mismatched_sizes: bool
    renamed: dict[str, str]  # checkpoint key -> the name transformers gave it, where it renamed
    transformers_version: str
    allowed: tuple[str, ...] = ()  # missing tensors that --allow-missing lets stay unfilled
    ignored: tuple[str, ...] = ()  # unexpected keys that --skip-prefix and the ignore rules take
    raised: Raised | None = None  # what it raises before loading (files, class, config)
    files: FileChoice | None = None  # the files it reads (None: not a folder)
    shapes: dict[str, tuple[int, ...]] = {}  # noqa: RUF012 (missing tensor -> its model shape)
    quantized: str | None = None  # the config's quant_method: a quantizer, not simulated

    def under(self, rules: LoadRules) -> FromPretrained:
        """The lists with the user's load rules applied, as transformers applies a class's own
        ignore patterns: a missing tensor ``--allow-missing`` allows, an unexpected key that
        ``--skip-prefix`` or an ``--ignore-unexpected-*`` rule takes (by its transformers name or
        its checkpoint name) is no problem, and is listed as such.

        >>> from loadkit_inspect.options import LoadRules
        >>> fp = FromPretrained("BertModel", ("pooler.bias",), ("cls.w",), (), (), False, {}, "5")
        >>> ruled = fp.under(LoadRules(allow_missing=("pooler.*",), skip_prefixes=("cls.",)))
        >>> ruled.missing, ruled.unexpected, ruled.allowed, ruled.ignored, ruled.clean
        ((), (), ('pooler.bias',), ('cls.w',), True)
        """
        original = {v: k for k, v in self.renamed.items()}

        def taken(name: str) -> bool:
            key = original.get(name, name)
            return bool(rules.skipped(key) or rules.skipped(name) or rules.ignored(key, name))

        return self._replace(
            missing=tuple(m for m in self.missing if not rules.allowed(m)),
            unexpected=tuple(u for u in self.unexpected if not taken(u)),
            allowed=tuple(m for m in self.missing if rules.allowed(m)),
            ignored=tuple(u for u in self.unexpected if taken(u)),
        )

    @property
    def outcome(self) -> str:
        """``from_pretrained``'s outcome: ``loads`` (cleanly, no load report), ``warns`` (it
        returns the model and logs a load report: MISSING tensors newly initialised at random,
        UNEXPECTED keys unused, MISMATCH reinitialised under ``ignore_mismatched_sizes``),
        ``raises``, or ``unknown`` (it reads a PyTorch pickle, which loadkit does not read, or
        loads through a quantizer, which loadkit does not model)."""
        if self.raised is not None or self.errors:
            return RAISES
        if self.quantized is not None:
            return UNKNOWN
        if self.mismatched and not self.ignore_mismatched_sizes:
            return RAISES
        if self.files is not None and self.files.pickle:
            return UNKNOWN
        return WARNS if (self.missing or self.unexpected or self.mismatched) else LOADS

    @property
    def clean(self) -> bool:
        """Would ``from_pretrained`` load every weight without error, warning or leftover?"""
        return self.outcome == LOADS

    @property
    def raises(self) -> bool:
        """Would ``from_pretrained`` raise (rather than warn and initialise what is missing)?"""
        return self.outcome == RAISES

    @property
    def error(self) -> Raised | None:
        """What it raises: before loading (``raised``), else as its load report ends
        (``log_state_dict_report``: loading errors, then conversion errors, then mismatches)."""
        if self.raised is not None:
            return self.raised
        if self.errors:
            return Raised("RuntimeError", self.errors[0])
        if self.mismatched and not self.ignore_mismatched_sizes:
            return Raised(
                "RuntimeError",
                "You set `ignore_mismatched_sizes` to `False`, thus raising an error. For "
                "details look at the above report!",
            )
        return None

    def problems(self) -> list[str]:
        out = []
        for what, items in (
            ("missing", self.missing),
            ("unexpected", self.unexpected),
            ("mismatched", [m.name for m in self.mismatched]),
        ):
            if items:
                shown = ", ".join(items[:3]) + (", ..." if len(items) > 3 else "")
                out.append(f"{len(items)} {what}: {shown}")
        out += list(self.errors)
        return out

    def as_dict(self) -> dict[str, Any]:
        error = self.error
        return {
            "loader": TRANSFORMERS,
            "class": self.cls,
            "outcome": self.outcome,
            "clean": self.clean,
            "raises": self.raises,
            "error": error.as_dict() if error else None,
            "missing": list(self.missing),
            "unexpected": list(self.unexpected),
            "mismatched": [
                {
                    "name": m.name,
                    "checkpoint": list(m.checkpoint_shape),
                    "model": list(m.model_shape),
                }
                for m in self.mismatched
            ],
            "errors": list(self.errors),
            "ignore_mismatched_sizes": self.ignore_mismatched_sizes,
            "renamed": dict(self.renamed),
            "transformers_version": self.transformers_version,
            "allowed": list(self.allowed),
            "ignored": list(self.ignored),
            "files": self.files.as_dict() if self.files else None,
            "quantized": self.quantized,
        }

    def render(self, limit: int, verdict: str | None = None) -> list[str]:
        """The ``transformers`` loader's section: what ``from_pretrained`` would do, in its own
        terms (``verdict``: its verdict's phrase, ``--strict-index`` included, when the report
        has one), the files it reads, and its load report's lists, each capped at ``limit``
        rows."""
        said = verdict or f"transformers {self.transformers_version}: outcome {self.outcome}"
        how = "" if self.quantized else ", simulated on the meta device"
        lines = [
            f"transformers  {self.cls}.from_pretrained{how}",
            f"  {printable(said)}",
            *self._file_lines(),
        ]
        error = self.error
        if error is not None:
            lines.append(f"  raises {printable(error.error)}: {printable(error.message)}")
        if self.raised is not None and self.quantized is None:
            lines.append(
                "  (before it loads a tensor; the lists below are what it would report once it "
                "reads the folder's readable weights)"
            )
        if self.quantized is not None:
            return [*lines, "  not simulated: the quantizer decides which keys fill what"]
        return lines + self._list_lines(limit)

    def _file_lines(self) -> list[str]:
        """The files it reads, and the folder's weight files it never opens."""
        files = self.files
        if files is None:
            return []
        how = f" ({files.how})" if files.how and files.files else ""
        lines = [f"  reads {_some(files.files) if files.files else 'no file'}{how}"]
        if files.unread:
            lines.append(f"  never reads {_some(files.unread)}")
        return lines

    def _list_lines(self, limit: int) -> list[str]:
        lines = []
        if self.renamed:
            rows = [f"    {printable(k)} -> {printable(v)}" for k, v in self.renamed.items()]
            lines.append(f"  keys transformers renames ({len(rows)})")
            lines += capped(rows, len(rows), limit)
        for title, names in (
            ("UNEXPECTED: checkpoint keys it leaves unused", list(self.unexpected)),
            ("MISSING: model tensors newly initialised at random", list(self.missing)),
        ):
            lines.append(f"  {title} ({len(names)})" + ("" if names else ": none"))
            lines += capped([f"    {printable(n)}" for n in names], len(names), limit)
        for title, names in (
            ("missing, allowed by --allow-missing (still at random)", list(self.allowed)),
            ("unexpected, taken by the skip and ignore rules", list(self.ignored)),
        ):
            if names:
                lines.append(f"  {title} ({len(names)})")
                lines += capped([f"    {printable(n)}" for n in names], len(names), limit)
        raises = "" if self.ignore_mismatched_sizes else ": from_pretrained raises"
        lines.append(
            f"  MISMATCH: shapes that differ ({len(self.mismatched)})"
            + ((raises if self.mismatched else "") or ("" if self.mismatched else ": none"))
        )
        rows = [
            f"    {printable(m.name)}  {shapes(m.checkpoint_shape, m.model_shape)}"
            for m in self.mismatched
        ]
        lines += capped(rows, len(rows), limit)
        return lines + [f"  error: {printable(e)}" for e in self.errors]


def _some(names: Sequence[str], shown: int = 5) -> str:
    """The first ``shown`` names, and how many more."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(printable(n) for n in names[:shown]) + more


def loading_class(config: PretrainedConfig, cls: str | None = None) -> type[PreTrainedModel]:
    """The class ``from_pretrained`` is called on: ``cls``, else ``config.architectures[0]``,
    else the one ``AutoModel`` maps the config to.

    >>> from transformers import BertConfig
    >>> loading_class(BertConfig(architectures=["BertForMaskedLM"])).__name__
    'BertForMaskedLM'
    >>> loading_class(BertConfig()).__name__
    'BertModel'
    >>> print(from_pretrained_verdict(BertConfig(architectures=["MyBert"]), []).raised.text())
    AttributeError: transformers 5.24.0 has no model class 'MyBert' (the config's architectures[0])
    """
    import transformers

    name = cls or next(iter(getattr(config, "architectures", None) or []), None)
    if name is not None:
        found = getattr(transformers, name, None)
        if not (isinstance(found, type) and issubclass(found, transformers.PreTrainedModel)):
            raise ModelSpecError(
                f"transformers {transformers.__version__} has no model class {name!r}"
                + ("" if cls else " (the config's architectures[0])")
            )
        return found
    from transformers import AutoModel

    try:
        found = AutoModel._model_mapping[type(config)]
    except KeyError:
        raise ModelSpecError(
            f"the config names no architecture and AutoModel knows no model for "
            f"{type(config).__name__}"
        ) from None
    return found  # type: ignore[return-value]  # the lazy mapping is typed loosely


def meta_state_dict(infos: Sequence[TensorInfo]) -> dict[str, torch.Tensor]:
    """The checkpoint as meta tensors of its shapes and dtypes (nothing read)."""
    return {i.name: meta_tensor(i) for i in infos}


def from_pretrained_verdict(
    config: PretrainedConfig,
    infos: Sequence[TensorInfo],
    *,
    cls: str | None = None,
    ignore_mismatched_sizes: bool = False,
) -> FromPretrained:
    """What ``cls.from_pretrained`` (default: the config's architecture) would report.

    Example:
        >>> from transformers import BertConfig
        >>> from loadkit.checkpoint.reader import TensorInfo
        >>> cfg = BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        ...                  intermediate_size=16, vocab_size=32, architectures=["BertModel"])
        >>> info = TensorInfo("bert.pooler.dense.bias", "F32", (8,), 32, "m.safetensors", 8)
        >>> v = from_pretrained_verdict(cfg, [info])
        >>> v.clean, "pooler.dense.bias" in v.missing, v.unexpected, v.renamed
        (False, False, (), {'bert.pooler.dense.bias': 'pooler.dense.bias'})
    """
    from loadkit_inspect.models.hf import quant_method

    try:
        klass = loading_class(config, cls)
    except ModelSpecError as exc:  # transformers.<name> is an AttributeError
        return _refused(cls or "?", "AttributeError", str(exc), ignore_mismatched_sizes)
    method = quant_method(config)
    if method is not None:  # its quantizer replaces layers and takes the scales: not modelled
        return _unloaded(klass.__name__, ignore_mismatched_sizes, quantized=method)
    return _simulated(klass, copy.deepcopy(config), infos, ignore_mismatched_sizes)


def _refused(name: str, error: str, why: str, ignore_mismatched_sizes: bool) -> FromPretrained:
    """``from_pretrained`` stopping before it loads a tensor: the verdict says why, for this
    loader only."""
    return _unloaded(name, ignore_mismatched_sizes, raised=Raised(error, why))


def _unloaded(name: str, ignore_mismatched_sizes: bool, **why: Any) -> FromPretrained:
    """No tensor simulated: empty lists, and ``why`` (``raised``, ``quantized``)."""
    import transformers

    return FromPretrained(
        name, (), (), (), (), ignore_mismatched_sizes, {}, transformers.__version__, **why
    )


def _simulated(
    klass: Any, config: PretrainedConfig, infos: Sequence[TensorInfo], ignore_mismatched_sizes: bool
) -> FromPretrained:
    """``klass`` built on meta from ``config`` (a copy: ``from_pretrained`` copies it too) and
    transformers' own loading functions run on meta tensors of the checkpoint's shapes."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.modeling_utils import LoadStateDictConfig
    from transformers.utils.generic import ContextManagers

    dtype = torch.float32  # the dtype changes casts, never which key goes where
    from loadkit_inspect.models.hf import quiet_transformers

    with quiet_transformers():
        try:
            with ContextManagers(klass.get_init_context(dtype, False, False, None)):
                model = klass(config)
        except Exception as exc:  # transformers validates the config for the class
            from loadkit.models.transformers import one_line

            why = f"{klass.__name__}(config) fails: {one_line(exc)}"
            return _refused(klass.__name__, type(exc).__name__, why, ignore_mismatched_sizes)
        conversions = get_model_conversion_mapping(model)
        load_config = LoadStateDictConfig(
            ignore_mismatched_sizes=ignore_mismatched_sizes,
            device_map={"": "meta"},
            dtype=dtype,
            dtype_plan=model._get_dtype_plan(dtype),
            weight_mapping=conversions,  # type: ignore[arg-type]  # its own function's list
        )
        state = meta_state_dict(infos)
        info, _ = klass._load_pretrained_model(model, state, None, load_config)
        model.mark_tied_weights_as_initialized(info)
        model.tie_weights(missing_keys=info.missing_keys, recompute_mapping=False)
        model._adjust_missing_and_unexpected_keys(info)
        renamed = _renamed(model, state, conversions)
        expected = model.state_dict()
        shapes = {m: tuple(expected[m].shape) for m in info.missing_keys if m in expected}
    verdict = _verdict(klass.__name__, info, ignore_mismatched_sizes, renamed)
    return verdict._replace(shapes=shapes)


def _verdict(
    cls: str, info: Any, ignore_mismatched_sizes: bool, renamed: dict[str, str]
) -> FromPretrained:
    """``_load_pretrained_model``'s loading info as a ``FromPretrained``."""
    import transformers

    conversions = sorted(info.conversion_errors.items())
    errors = [*info.error_msgs, *(f"{k}: {conversion_error(v)}" for k, v in conversions)]
    return FromPretrained(
        cls,
        tuple(sorted(info.missing_keys)),
        tuple(sorted(info.unexpected_keys)),
        tuple(sorted(Mismatch(n, tuple(c), tuple(m)) for n, c, m in info.mismatched_keys)),
        tuple(errors),
        ignore_mismatched_sizes,
        renamed,
        transformers.__version__,
    )


def conversion_error(text: str) -> str:
    """A conversion error as transformers logs it, without the traceback it keeps (the
    exception's line, then what it was converting); other messages as they are.

    >>> conversion_error('''Traceback (most recent call last):
    ...   File "x.py", line 1, in f
    ...     torch.cat(...)
    ... RuntimeError: Sizes of tensors must match
    ... Sizes of tensors must match
    ... Error: Concatenate on tensors destined for w. Ckpt contains: 2''').split("; ")
    ['RuntimeError: Sizes of tensors must match', 'Error: Concatenate on tensors destined for w. \
Ckpt contains: 2']
    """
    lines = text.splitlines()
    if not lines or not lines[0].startswith("Traceback (most recent call last):"):
        return text
    raised = next((line for line in lines[1:] if line and not line.startswith(" ")), lines[-1])
    context = lines[-1] if lines[-1].startswith("Error") and lines[-1] != raised else None
    return f"{raised}; {context}" if context else raised


def _renamed(model: Any, state: Mapping[str, Any], conversions: Sequence[Any]) -> dict[str, str]:
    """Which name transformers gave each key (the report shows renamed keys by both names)."""
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    renamings = [c for c in conversions if isinstance(c, WeightRenaming)]
    converters = [c for c in conversions if isinstance(c, WeightConverter)]
    expected = model.state_dict()
    renamed = {}
    for key in state:
        new, _ = rename_source_key(key, renamings, converters, model.base_model_prefix, expected)
        if new != key:
            renamed[key] = new
    return renamed
