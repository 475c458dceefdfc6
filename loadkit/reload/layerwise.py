"""Layerwise reload: new weights into a running model, one layer at a time (docs/api.md, bugs 3, 6).

Online reload exists for reinforcement learning: the trainer sends fresh weights to an inference
engine that keeps running, and the engine's tensors must keep their storage (captured CUDA graphs
hold raw pointers into it). The lifecycle, as vLLM 0.34.0's ``model_loader/reload/layerwise.py``:

1. ``record_metadata_for_reloading(model)`` after the first load: each layer's parameters and
   buffers as meta tensors (shape, dtype, class, attributes such as ``weight_loader``).
2. ``initialize_layerwise_reload(model)``: every layer (a module with direct parameters or
   buffers) goes on meta, its counter to 0, its total to the elements its tensors take from a
   checkpoint (``get_tensor_load_numel``: a padded weight's ``weight_loader_numel``), and every
   tensor's loader is wrapped.
3. The model's own load path runs (``model.load_weights(weights)``). Each wrapped call is counted
   (``get_numel_loaded``'s rule) and buffered; when a layer's count reaches its total the layer
   is finalised at once (``loadkit.reload.layer``), unless ``defer_processing``. A load for a
   finalised layer is dropped with an ``ExcessiveLoadWarning``.
4. ``finalize_layerwise_reload(model)`` finalises what is still open, restores the loaders and
   runs every module's post-load hook, children first (``finalize_model_weights``). Call it in a
   ``finally``: if the load raises, it is what puts the live parameters back.

Counting elements, not calls, is what lets a packed parameter filled slice by slice (q, k and v
into one ``qkv_proj``) finalise only when complete. The keywords choose which vLLM's rules run:

- ``behaviour="old"`` counts every copied element, so a composed loader (load, then
  ``copy_(fn(param))``) counts its parameter twice and can finalise its layer before the last
  parameter arrives: Mamba2's ``mixer.D`` (bug 3, before vLLM #44814). ``"new"`` caps each call.
- ``padding="counted"`` counts a padded weight's every element, in its total and in the cap
  (vLLM 0.30.0 and earlier): its layer never completes during the load and is finalised only by
  ``finalize_layerwise_reload``. ``"excluded"`` honours ``weight_loader_numel`` (0.31.0 on).
- ``fill`` is what a materialised tensor holds before the replay: ``"zero"`` (0.34.0),
  ``"stale"`` (a fixed pattern standing for the ``torch.empty`` memory of 0.33.0 and earlier),
  ``"nan"`` (loadkit's visible marker). The padding and any dropped parameter keep it (bug 6).

``reload_log(model)`` returns every counted call in order. The buffered loads keep the tensors
they were handed until their layer is finalised, as upstream does: a stream that reuses one
buffer (``open_checkpoint(p).weights(reuse_buffer=True)``) has overwritten them by then, and the
replay loads the wrong bytes. Reload from tensors that stay valid.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch
from torch import nn

from loadkit.errors import (
    ExcessiveLoadWarning,
    PartialLayerWarning,
    ReloadStateError,
    UnloadedLayerWarning,
)
from loadkit.loading.counting import PADDINGS, Padding, count_copies
from loadkit.loading.meta import to_meta
from loadkit.loading.postload import finalize_model_weights
from loadkit.loading.tensors import qualname
from loadkit.reload.layer import (
    FILL_WORDS,
    FILLS,
    Fill,
    LayerReload,
    ScratchArena,
    first_argument,
    original_loader,
)
from loadkit.terms import Behaviour, check_behaviour

__all__ = [
    "ExcessiveLoadWarning",
    "PartialLayerWarning",
    "ReloadStateError",
    "ReloadStep",
    "UnloadedLayerWarning",
    "finalize_layerwise_reload",
    "initialize_layerwise_reload",
    "max_layer_reload_bytes",
    "record_metadata_for_reloading",
    "reload_log",
]

_META_ATTR = "_loadkit_reload_meta"  # on each layer: {param name: meta tensor}
_LOADERS_ATTR = "_loadkit_reload_loaders"  # on each layer: {name: (its loader, first argument)}
_STATE_ATTR = "_loadkit_reload"  # on each layer while a reload is open: LayerReload
_SESSION_ATTR = "_loadkit_reload_session"  # on the model: the current or last _Session

REACHED_TOTAL = "count reached total"
AT_FINALIZE = "finalize_layerwise_reload"
EXCESSIVE = "excessive loading"


@dataclass(frozen=True, slots=True)
class ReloadStep:
    """One counted (or dropped) weight-loader call, or a finalisation by ``finalize``."""

    step: int  # position in the reload, from 0
    layer: str  # qualified module name
    parameter: str  # direct parameter name ("" for a finalisation by finalize_layerwise_reload)
    counted: int  # elements get_numel_loaded reported (0 when dropped)
    running: int  # the layer's count after this step
    total: int  # the layer's total
    finalised: bool  # this step finalised the layer
    dropped: bool  # the layer was already finalised: the load was thrown away
    reason: str = ""  # REACHED_TOTAL, AT_FINALIZE or EXCESSIVE


@dataclass
class _Session:
    behaviour: Behaviour
    padding: Padding
    fill: Fill
    defer_processing: bool
    layers: list[LayerReload] = field(default_factory=list)
    steps: list[ReloadStep] = field(default_factory=list)
    arena: ScratchArena = field(default_factory=ScratchArena)
    open: bool = True

    def log(self, state: LayerReload, parameter: str, counted: int, reason: str = "") -> None:
        finalised = reason in (REACHED_TOTAL, AT_FINALIZE)
        step = ReloadStep(
            len(self.steps),
            state.name,
            parameter,
            counted,
            state.count,
            state.total,
            finalised,
            reason == EXCESSIVE,
            reason,
        )
        self.steps.append(step)


def _layers(model: nn.Module) -> list[tuple[str, nn.Module, dict[str, torch.Tensor]]]:
    """Every module with direct parameters or buffers, with those tensors (parameters first),
    in ``named_modules()``'s order and under its names (walked here: every reload walks it)."""
    out = []
    seen: set[int] = set()
    stack: list[tuple[str, nn.Module]] = [("", model)]
    while stack:
        name, module = stack.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        tensors: dict[str, torch.Tensor] = {
            n: p for n, p in module._parameters.items() if p is not None
        }
        if module._buffers:
            tensors.update((n, b) for n, b in module._buffers.items() if b is not None)
        if tensors:
            out.append((name, module, tensors))
        prefix = f"{name}." if name else ""
        stack.extend((prefix + n, c) for n, c in reversed(module._modules.items()) if c is not None)
    return out


def record_metadata_for_reloading(model: nn.Module) -> None:
    """Keep each layer's parameters as meta tensors, for every later reload of ``model``.

    Args:
        model: the loaded model; every module with direct parameters is a layer.

    Returns:
        ``None``; raises ``ReloadStateError`` while a reload is open.

    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))  # one layer: weight (4) + bias (2)
    >>> record_metadata_for_reloading(model)
    >>> model[0]._loadkit_reload_meta["weight"].device.type
    'meta'
    """
    session = getattr(model, _SESSION_ATTR, None)
    if session is not None and session.open:
        raise ReloadStateError(
            f"{type(model).__name__}: a reload is open; call finalize_layerwise_reload first"
        )
    for _, module, tensors in _layers(model):
        metas, loaders = {}, {}
        for n, t in tensors.items():
            meta = to_meta(t)
            meta.__dict__.pop("weight_loader", None)  # the live tensor's own, unwrapped, below
            if "weight_loader" in t.__dict__:
                meta.__dict__["weight_loader"] = original_loader(t)
            metas[n] = meta
            loader = original_loader(meta)
            loaders[n] = (loader, first_argument(loader))
        setattr(module, _META_ATTR, metas)
        setattr(module, _LOADERS_ATTR, loaders)


def max_layer_reload_bytes(model: nn.Module) -> int:
    """Bytes of the largest layer as recorded: what a layerwise reload materialises at once.

    Args:
        model: a model whose metadata was recorded (``record_metadata_for_reloading``).

    Returns:
        The largest layer's bytes in checkpoint format, 0 when nothing was recorded.

    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    >>> record_metadata_for_reloading(model)
    >>> max_layer_reload_bytes(model)  # 16 + 4 float32 elements
    80
    """
    sizes = (
        sum(t.nbytes for t in recorded.values())
        for module in model.modules()
        if (recorded := getattr(module, _META_ATTR, None)) is not None
    )
    return max(sizes, default=0)


def _check_layer(name: str, module: nn.Module, params: dict[str, torch.Tensor]) -> dict:
    label = f"layer '{name}' ({type(module).__name__})"
    recorded = getattr(module, _META_ATTR, None)
    if recorded is None:
        raise ReloadStateError(
            f"{label} has no recorded metadata: call record_metadata_for_reloading(model) "
            "after the first load"
        )
    if recorded.keys() != params.keys():
        raise ReloadStateError(
            f"{label} now has tensors {sorted(params)} but {sorted(recorded)} were recorded"
        )
    for pname, p in params.items():
        if p.shape != recorded[pname].shape:
            raise ReloadStateError(
                f"{label} tensor '{pname}' has shape {list(p.shape)} but shape "
                f"{list(recorded[pname].shape)} was recorded: it cannot be copied back"
            )
        first = module.__dict__[_LOADERS_ATTR][pname][1]
        if first != "param":
            raise ReloadStateError(
                f"{label} tensor '{pname}': its weight_loader's first argument is "
                f"{first!r}, not 'param'; counting and replay find the parameter by that name"
            )
    return recorded


def _check_open(model: nn.Module, layers: list) -> None:
    """Refuse a second reload, a tied tensor, or a layer in another model's open reload."""
    previous = getattr(model, _SESSION_ATTR, None)
    if previous is not None and previous.open:
        raise ReloadStateError(
            f"{type(model).__name__}: a reload is already open; call finalize_layerwise_reload"
        )
    owner: dict[int, tuple[str, str]] = {}
    for name, module, params in layers:
        for pname, p in params.items():
            if id(p) in owner:
                raise ReloadStateError(
                    f"parameter '{qualname(name, pname)}' is the same tensor as "
                    f"'{qualname(*owner[id(p)])}' (tied): layerwise reload needs each "
                    "parameter in exactly one layer"
                )
            owner[id(p)] = (name, pname)
        if _STATE_ATTR in module.__dict__:
            raise ReloadStateError(
                f"layer '{name}' ({type(module).__name__}) is in another open reload"
            )


def initialize_layerwise_reload(
    model: nn.Module,
    *,
    defer_processing: bool = False,
    behaviour: Behaviour = "new",
    padding: Padding = "excluded",
    fill: Fill = "zero",
) -> None:
    """Put every layer on meta, zero its counter and wrap its loaders (see the module doc).

    Args:
        model: a model whose metadata was recorded (``record_metadata_for_reloading``).
        defer_processing: finalise no layer during the load, only in
            ``finalize_layerwise_reload`` (vLLM 0.34.0's keyword).
        behaviour: ``"old"`` counts every copied element, ``"new"`` caps each call.
        padding: ``"excluded"`` (0.31.0 on) or ``"counted"`` (0.30.0 and earlier).
        fill: what a materialised tensor holds before the replay: ``"zero"`` (0.34.0),
            ``"stale"`` (0.33.0 and earlier, a fixed pattern) or ``"nan"``.

    Returns:
        ``None``; the model's own load path then runs the wrapped loaders.

    >>> import torch
    >>> from loadkit import AutoWeightsLoader
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))  # one layer: weight (4) + bias (2)
    >>> update = [("0.weight", torch.eye(2)), ("0.bias", torch.ones(2))]
    >>> record_metadata_for_reloading(model)
    >>> initialize_layerwise_reload(model)
    >>> model[0].weight.device.type  # on meta until the layer is complete
    'meta'
    >>> sorted(AutoWeightsLoader(model).load_weights(update))
    ['0.bias', '0.weight']
    >>> model[0].weight.device.type, model[0].bias.tolist()  # finalised when its count hit 6
    ('cpu', [1.0, 1.0])
    """
    check_behaviour(behaviour)
    check_behaviour(padding, PADDINGS, what="padding")
    check_behaviour(fill, FILLS, what="fill")
    layers = _layers(model)
    _check_open(model, layers)  # everything is checked before anything changes
    recorded = [_check_layer(name, module, params) for name, module, params in layers]
    session = _Session(behaviour, padding, fill, defer_processing)

    def wrap(state: LayerReload, pname: str, loader):
        return _wrap(session, state, pname, loader)

    for (name, module, params), rec in zip(layers, recorded, strict=True):
        state = LayerReload(name, module, behaviour, padding, fill, rec, params)
        state.loaders = {n: loader for n, (loader, _) in module.__dict__[_LOADERS_ATTR].items()}
        state.open(wrap)
        module.__dict__[_STATE_ATTR] = state
        session.layers.append(state)
    model.__dict__[_SESSION_ATTR] = session


def _wrap(session: _Session, state: LayerReload, pname: str, loader):
    cap = state.caps[pname] if state.behaviour == "new" else None
    stand_in = state.recorded[pname]

    def reload_weight_loader(param, *args, **kwargs):
        if state.finalised:
            session.log(state, pname, 0, EXCESSIVE)
            warnings.warn(
                f"layer {state.label}: excessive loading of '{pname}': the layer was finalised "
                f"at {state.count}/{state.total} elements, so this load is dropped",
                ExcessiveLoadWarning,
                stacklevel=2,
            )
            return None
        # Count on the meta stand-in, whichever tensor the caller passed: never the live storage.
        counted, result = count_copies(loader, stand_in, args, kwargs, cap)
        state.loads.append((pname, args, kwargs))  # only loads that ran are replayed
        state.count += counted
        done = state.count >= state.total and not session.defer_processing
        session.log(state, pname, counted, REACHED_TOTAL if done else "")
        if done:
            state.finalise(session.arena)
        return result

    reload_weight_loader.__wrapped__ = loader  # type: ignore[attr-defined]
    return reload_weight_loader


def _finalise_open(session: _Session) -> tuple[list[str], list[str]]:
    """Finalise every layer a load reached; put back those none did. (partly, untouched)."""
    partly, untouched = [], []
    for state in session.layers:
        if state.finalised:
            continue
        if state.count > 0:
            if state.count < state.total:
                partly.append(state.name)
            session.log(state, "", 0, AT_FINALIZE)
            state.finalise(session.arena)
        else:
            if state.total > 0:  # upstream: "Failed to load weights" only for loadable layers
                untouched.append(state.name)
            state.restore_untouched()
    return partly, untouched


def finalize_layerwise_reload(model: nn.Module) -> list[str]:
    """Finalise the layers still open, restore the loaders, run the post-load hooks; return (and
    warn about) the layers left partly loaded.

    A layer nobody loaded keeps its current values (warned separately); a partly loaded one is
    finalised like any other, so what no load wrote keeps the fill.

    Args:
        model: a model with a reload open.

    Returns:
        The names of the layers that were partly loaded (each also a ``PartialLayerWarning``).

    >>> import torch
    >>> from loadkit import AutoWeightsLoader
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))  # one layer: weight (4) + bias (2)
    >>> update = [("0.weight", torch.eye(2)), ("0.bias", torch.ones(2))]
    >>> record_metadata_for_reloading(model)
    >>> initialize_layerwise_reload(model, fill="nan")
    >>> _ = AutoWeightsLoader(model).load_weights(update[:1])  # no bias
    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     finalize_layerwise_reload(model)
    ['0']
    >>> model[0].bias.isnan().all().item()  # the dropped parameter shows the fill
    True
    """
    session = getattr(model, _SESSION_ATTR, None)
    if session is None or not session.open:
        raise ReloadStateError(
            f"{type(model).__name__}: no reload is open; call initialize_layerwise_reload first"
        )
    try:
        partly, untouched = _finalise_open(session)
    finally:
        for state in session.layers:
            state.close()
            state.module.__dict__.pop(_STATE_ATTR, None)
        session.open = False
        session.arena = ScratchArena()  # frees the scratch memory
    finalize_model_weights(model)
    if partly:
        warnings.warn(
            f"{len(partly)} layer(s) left partly loaded, finalised with "
            f"{FILL_WORDS[session.fill]} where nothing was loaded: {partly}",
            PartialLayerWarning,
            stacklevel=2,
        )
    if untouched:
        warnings.warn(
            f"{len(untouched)} layer(s) received no weights and keep their values: {untouched}",
            UnloadedLayerWarning,
            stacklevel=2,
        )
    return partly


def reload_log(model: nn.Module) -> list[ReloadStep]:
    """Every step of the current (or last) reload of ``model``, in order; [] if none ran.

    Args:
        model: the model reloaded.

    Returns:
        ``ReloadStep`` records: layer, parameter, elements counted, running count, total, and
        whether the step finalised the layer or was dropped.

    >>> import torch
    >>> from loadkit import AutoWeightsLoader
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))  # one layer: weight (4) + bias (2)
    >>> update = [("0.weight", torch.eye(2)), ("0.bias", torch.ones(2))]
    >>> record_metadata_for_reloading(model)
    >>> initialize_layerwise_reload(model)
    >>> _ = AutoWeightsLoader(model).load_weights(update)
    >>> finalize_layerwise_reload(model)
    []
    >>> [(s.parameter, s.counted, s.running, s.finalised) for s in reload_log(model)]
    [('weight', 4, 4, False), ('bias', 2, 6, True)]
    """
    session = getattr(model, _SESSION_ATTR, None)
    return list(session.steps) if session is not None else []
