"""Exceptions users can act on: every error (and warning) loadkit raises is defined here.

Every error is a ``ValueError`` (so callers written against upstream, which raises
``ValueError``/``AssertionError``, keep working) and its message names the file, the key and the
shapes involved wherever they are known. This module imports nothing heavy: the header-only
checkpoint path uses it without torch.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "TORCH_HINT",
    "BehaviourError",
    "CheckpointError",
    "DuplicateKeyError",
    "ExcessiveLoadWarning",
    "HeaderError",
    "HeaderProblem",
    "LayerAsParameterError",
    "LoadkitError",
    "MapperConfigError",
    "MissingExtraError",
    "MissingShardIdError",
    "ModelSpecError",
    "NestedWeightError",
    "NotDivisibleError",
    "PartialLayerWarning",
    "ReloadStateError",
    "ShapeMismatchError",
    "ShardIdError",
    "ShardIndexError",
    "TensorParallelError",
    "TruncatedCheckpointError",
    "UnknownNameError",
    "UnloadedLayerWarning",
    "WeightLoadError",
    "nearest_names",
    "printable",
    "require_torch",
]


class LoadkitError(ValueError):
    """Base class of every loadkit error (also ``from loadkit import LoadkitError``)."""


TORCH_HINT = "pip install 'loadkit[torch]'"


class MissingExtraError(LoadkitError, ImportError):
    """A part of loadkit that needs an extra not installed here (torch: the ``torch`` extra).

    An ``ImportError`` too, so ``except ImportError`` around an optional import still works.
    """


def require_torch(what: str) -> None:
    """Raise ``MissingExtraError`` naming the ``torch`` extra when torch cannot be imported.

    ``pip install loadkit`` is the library's torch-free parts and the header-only inspect;
    whatever loads, counts or simulates needs ``pip install 'loadkit[torch]'``.

    Looked up, not imported (a step that fails on its input first never pays for torch).

    >>> require_torch("loadkit.loading")  # torch is installed here: nothing happens
    """
    from importlib.util import find_spec

    if find_spec("torch") is None:  # also where sys.modules["torch"] is None
        raise MissingExtraError(f"{what} needs torch, which is not installed: {TORCH_HINT}")


class BehaviourError(LoadkitError):
    """A ``behaviour`` (or another choice among names) that is not one of the allowed names."""


def printable(text: str) -> str:
    r"""``text`` with every character a terminal would act on escaped (newlines, control and
    format characters), so a hostile tensor name stays on one line and cannot move the cursor.

    >>> print(printable("layers.0\nweight\x1b[2J"))
    layers.0\nweight\x1b[2J
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(c: str) -> str:
    special = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
    if c in special:
        return special[c]
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


# --- checkpoints (docs/hostile-input.md) ----------------------------------------------------------


class CheckpointError(LoadkitError):
    """A checkpoint file or folder that cannot be read as it claims to be."""

    def __init__(self, file: str, message: str, key: str | None = None) -> None:
        self.file = str(file)
        self.key = key
        where = printable(self.file) + (f", key '{printable(key)}'" if key is not None else "")
        super().__init__(f"{where}: {message}")


class TruncatedCheckpointError(CheckpointError):
    """The file is shorter than its header says."""


class HeaderError(CheckpointError):
    """The safetensors header is missing, not JSON, or describes impossible tensors."""


class HeaderProblem(ValueError):
    """What is wrong with a header, and the key it concerns, before the file is known.

    Raised by ``loadkit.checkpoint.header`` (which reads text, not files); the reader turns it
    into a ``HeaderError`` naming the file, so it never reaches a user.
    """

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.key = key


class ShardIndexError(CheckpointError):
    """``model.safetensors.index.json`` disagrees with the shards on disk."""


class DuplicateKeyError(CheckpointError):
    """The same tensor name is stored in two shards."""


# --- loading --------------------------------------------------------------------------------------


class ShapeMismatchError(LoadkitError):
    """A checkpoint tensor does not fit the parameter it is loaded into."""

    def __init__(
        self,
        param_shape: tuple[int, ...],
        weight_shape: tuple[int, ...],
        name: str | None = None,
        source: str | None = None,
    ) -> None:
        self.param_shape = tuple(param_shape)
        self.weight_shape = tuple(weight_shape)
        self.name = name
        self.source = source
        subject = f"parameter '{name}'" if name else "parameter"
        origin = f" (from {source})" if source else ""
        super().__init__(
            f"Shape mismatch loading {subject}{origin}: parameter has shape "
            f"{list(self.param_shape)}, checkpoint weight has shape {list(self.weight_shape)}."
        )

    def with_name(self, name: str, source: str | None = None) -> ShapeMismatchError:
        """The same error with the parameter's qualified name (and the weight's origin) added."""
        return ShapeMismatchError(self.param_shape, self.weight_shape, name, source or self.source)


class UnknownNameError(LoadkitError):
    """A checkpoint name matches no module or parameter of the model."""

    def __init__(self, name: str, root: str, candidates: Iterable[str], source: str | None = None):
        self.name = name
        self.root = root
        self.suggestions = nearest_names(name, candidates)
        origin = f" (from {source})" if source else ""
        msg = f"There is no module or parameter named '{name}' in {root}.{origin}"
        if self.suggestions:
            msg += " Nearest existing names: " + ", ".join(f"'{s}'" for s in self.suggestions)
        super().__init__(msg)


class LayerAsParameterError(LoadkitError):
    """A stacked layer (``qkv_proj``, ``gate_up_proj``) handed a name it has no parameter for
    (a ``k_scale`` of an unquantized model): vLLM 0.34.0 passes the layer itself to its
    ``weight_loader`` in the parameter's place (``getattr(self, name, self)``), which fails.

    >>> str(LayerAsParameterError("model.layers.0.self_attn.qkv_proj.k_scale", "QKVParallelLinear"))
    "'model.layers.0.self_attn.qkv_proj.k_scale': QKVParallelLinear has no parameter of that \
name; vLLM 0.34.0 hands the layer itself to its weight_loader, which fails (AttributeError: \
'QKVParallelLinear' object has no attribute 'data')"
    """

    def __init__(self, name: str, layer: str) -> None:
        self.name = name
        self.layer = layer
        super().__init__(
            f"'{name}': {layer} has no parameter of that name; vLLM 0.34.0 hands the layer "
            f"itself to its weight_loader, which fails (AttributeError: '{layer}' object has no "
            "attribute 'data')"
        )


class NestedWeightError(LoadkitError):
    """A checkpoint name reaches below a parameter (``w.weight.extra``)."""

    def __init__(self, name: str, param: str, source: str | None = None) -> None:
        self.name = name
        self.param = param
        origin = f" (from {source})" if source else ""
        super().__init__(
            f"Attempted to load nested weight '{name}' into a single parameter '{param}'.{origin}"
        )


# --- mapper configuration -------------------------------------------------------------------------


class MapperConfigError(LoadkitError):
    """A ``WeightsMapper`` rule that can never work (an empty suffix, a broken regex)."""


def nearest_names(name: str, candidates: Iterable[str], n: int = 5) -> list[str]:
    """At most ``n`` existing names closest to ``name`` (users want a hint, not a wall of names)."""
    import difflib  # here, not at the top: the header-only inspector never suggests names

    pool = list(dict.fromkeys(candidates))
    return difflib.get_close_matches(name, pool, n=n, cutoff=0.4)


class WeightLoadError(LoadkitError):
    """A parameter's own ``weight_loader`` failed; says which parameter, key and shapes."""

    def __init__(
        self,
        name: str,
        param_shape: tuple[int, ...],
        weight_shape: tuple[int, ...],
        source: str | None,
        cause: BaseException,
    ) -> None:
        self.name = name
        origin = f" from {source}" if source else ""
        super().__init__(
            f"Loading parameter '{name}' (shape {list(param_shape)}){origin} "
            f"(shape {list(weight_shape)}) failed in its weight_loader: "
            f"{type(cause).__name__}: {cause}"
        )


# --- models ---------------------------------------------------------------------------------------


class ModelSpecError(LoadkitError):
    """A ``--model`` that names no model, cannot be imported, or does not build an nn.Module."""


class MissingShardIdError(LoadkitError):
    """A packed parameter got a tensor without (or with an unknown) ``shard_id``."""


# --- tensor parallelism ---------------------------------------------------------------------------


class TensorParallelError(LoadkitError):
    """A tensor-parallel setup that cannot work, or a rank that failed."""


class NotDivisibleError(TensorParallelError):
    """A size that must split evenly across ranks does not."""


class ShardIdError(LoadkitError):
    """A packed tensor-parallel layer got a tensor without a shard id it knows."""


# --- layerwise reload -----------------------------------------------------------------------------


class ReloadStateError(LoadkitError):
    """The reload lifecycle was used out of order, or the model cannot be reloaded layerwise."""


class ExcessiveLoadWarning(UserWarning):
    """A load arrived for a layer already finalised and was dropped (upstream: a debug log)."""


class PartialLayerWarning(UserWarning):
    """``finalize_layerwise_reload`` found layers that were not fully loaded."""


class UnloadedLayerWarning(PartialLayerWarning):
    """``finalize_layerwise_reload`` found layers that received no weights at all."""


class WeightsNotLoadedWarning(UserWarning):
    """``reload_weights``: parameters the update's load never reported loaded (vLLM 0.32.0 on:
    "Following weights were not loaded from checkpoint")."""


# --- direct reload and the load plan (vLLM 0.34.0) ------------------------------------------------


class DirectReloadError(ReloadStateError):
    """A direct reload was refused: no checkpoint layout recorded, a parameter replaced by
    post-load processing, a storage too small for its checkpoint layout, a finish without a
    begin. Raised before the model is changed, except by a finish."""


class LoadPlanError(ReloadStateError):
    """A load plan cannot be made for this model (outside a direct reload, a name declared
    twice, a loader that combines several checkpoint tensors, tracing that failed)."""


class Fallback(Exception):
    """A checkpoint name the load plan cannot write directly; the message says why. Caught by
    the plan, which sends that name through ``load_weights``."""


class TraceStopped(LoadkitError):
    """A loader needs the values of a traced checkpoint tensor (``.item()``), or an op on it
    fails on the meta device: the trace of that name stops, and the name falls back. Caught by
    the plan's bake; a ``LoadkitError`` so that loading code re-raises it unchanged."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"tracing {name!r} stopped: {reason}")
        self.name = name
        self.reason = reason
