"""Layerwise reload: new weights into a running model, one layer at a time (docs/api.md, bug 3).

Online reload exists for reinforcement learning: the trainer sends fresh weights to an inference
engine that keeps running, and the engine's tensors must keep their storage (captured CUDA graphs
hold raw pointers into it). The lifecycle:

1. ``record_metadata_for_reloading(model)`` after the first load: each layer's parameters and
   buffers as meta tensors (shape, dtype, class, attributes such as ``weight_loader``).
2. ``initialize_layerwise_reload(model, behaviour=...)``: every layer (a module with direct
   parameters or buffers) goes on meta, its counter to 0, its total to the numel of its direct
   parameters **and buffers** (as vLLM 0.28.0 counts them, non-persistent buffers included), and
   every tensor's loader is wrapped.
3. The model's own load path runs (``model.load_weights(weights)``). Each wrapped call is counted
   with ``get_numel_loaded`` and buffered; when a layer's count reaches its total the layer is
   finalised at once (``loadkit.reload.layer``). A load for a finalised layer is dropped with an
   ``ExcessiveLoadWarning``.
4. ``finalize_layerwise_reload(model)`` finalises what is still open and restores the loaders.
   Call it in a ``finally``: if the load raises, it is what puts the live parameters back.

Counting elements, not calls, is what lets a packed parameter filled slice by slice (q, k and v
into one ``qkv_proj``) finalise only when complete. ``"old"`` counts every copied element, so a
composed loader (load, then ``copy_(fn(param))``) counts its parameter twice and can finalise its
layer before the last parameter arrives: Mamba2's ``mixer.D`` upstream. ``"new"`` caps each call at
the parameter's size. ``reload_log(model)`` returns every counted call in order.

The buffered loads keep the tensors they were handed until their layer is finalised, as upstream
does: a stream that reuses one buffer (``open_checkpoint(p).weights(reuse_buffer=True)``) has
overwritten them by then, and the replay loads the wrong bytes. Reload from tensors that stay valid.
"""

from __future__ import annotations

import inspect
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
from loadkit.loading.counting import get_numel_loaded
from loadkit.loading.meta import to_meta
from loadkit.loading.tensors import qualname
from loadkit.loading.weight_loaders import WeightLoader, loader_of
from loadkit.reload.layer import LayerReload, ScratchArena
from loadkit.terms import Behaviour, check_behaviour

__all__ = [
    "ExcessiveLoadWarning",
    "PartialLayerWarning",
    "ReloadStateError",
    "ReloadStep",
    "UnloadedLayerWarning",
    "finalize_layerwise_reload",
    "initialize_layerwise_reload",
    "record_metadata_for_reloading",
    "reload_log",
]

_META_ATTR = "_loadkit_reload_meta"  # on each layer: {param name: meta tensor}
_STATE_ATTR = "_loadkit_reload"  # on each layer while a reload is open: LayerReload
_SESSION_ATTR = "_loadkit_reload_session"  # on the model: the current or last _Session

REACHED_TOTAL = "count reached total"
AT_FINALIZE = "finalize_layerwise_reload"
EXCESSIVE = "excessive loading"


@dataclass(frozen=True)
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
    layers: list[LayerReload] = field(default_factory=list)
    steps: list[ReloadStep] = field(default_factory=list)
    arena: ScratchArena = field(default_factory=ScratchArena)
    open: bool = True

    def log(
        self,
        state: LayerReload,
        parameter: str,
        counted: int,
        *,
        finalised: bool,
        dropped: bool,
        reason: str = "",
    ) -> None:
        self.steps.append(
            ReloadStep(
                len(self.steps),
                state.name,
                parameter,
                counted,
                state.count,
                state.total,
                finalised,
                dropped,
                reason,
            )
        )


def _layers(model: nn.Module) -> list[tuple[str, nn.Module, dict[str, torch.Tensor]]]:
    """Every module with direct parameters or buffers, with those tensors (parameters first)."""
    out = []
    for name, module in model.named_modules():
        tensors = {n: p for n, p in module._parameters.items() if p is not None}
        tensors.update((n, b) for n, b in module._buffers.items() if b is not None)
        if tensors:
            out.append((name, module, tensors))
    return out


def record_metadata_for_reloading(model: nn.Module) -> None:
    """Keep each layer's parameters as meta tensors, for every later reload of ``model``.

    Args:
        model: the loaded model; every module with direct parameters is a layer.

    Returns:
        ``None``; raises ``ReloadStateError`` while a reload is open.

    >>> import torch
    >>> from loadkit import AutoWeightsLoader
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))  # one layer: weight (4) + bias (2)
    >>> update = [("0.weight", torch.eye(2)), ("0.bias", torch.ones(2))]
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
        setattr(module, _META_ATTR, {n: to_meta(t) for n, t in tensors.items()})


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
        first = next(iter(inspect.signature(loader_of(recorded[pname])).parameters), None)
        if first != "param":
            raise ReloadStateError(
                f"{label} tensor '{pname}': its weight_loader's first argument is "
                f"{first!r}, not 'param'; counting and replay find the parameter by that name"
            )
    return recorded


def initialize_layerwise_reload(model: nn.Module, *, behaviour: Behaviour = "new") -> None:
    """Put every layer on meta, zero its counter and wrap its loaders (see the module doc).

    Args:
        model: a model whose metadata was recorded (``record_metadata_for_reloading``).
        behaviour: ``"old"`` counts every copied element, ``"new"`` caps each call at its
            parameter's size.

    Returns:
        ``None``; the model's own load path then runs the wrapped loaders.

    >>> import torch
    >>> from loadkit import AutoWeightsLoader
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))  # one layer: weight (4) + bias (2)
    >>> update = [("0.weight", torch.eye(2)), ("0.bias", torch.ones(2))]
    >>> record_metadata_for_reloading(model)
    >>> initialize_layerwise_reload(model, behaviour="new")
    >>> model[0].weight.device.type  # on meta until the layer is complete
    'meta'
    >>> sorted(AutoWeightsLoader(model).load_weights(update))
    ['0.bias', '0.weight']
    >>> model[0].weight.device.type, model[0].bias.tolist()  # finalised when its count hit 6
    ('cpu', [1.0, 1.0])
    """
    check_behaviour(behaviour)
    previous = getattr(model, _SESSION_ATTR, None)
    if previous is not None and previous.open:
        raise ReloadStateError(
            f"{type(model).__name__}: a reload is already open; call finalize_layerwise_reload"
        )
    layers = _layers(model)
    owner: dict[int, str] = {}
    for name, module, params in layers:  # check everything before changing anything
        for pname, p in params.items():
            qual = qualname(name, pname)
            if id(p) in owner:
                raise ReloadStateError(
                    f"parameter '{qual}' is the same tensor as '{owner[id(p)]}' (tied): "
                    "layerwise reload needs each parameter in exactly one layer"
                )
            owner[id(p)] = qual
        if getattr(module, _STATE_ATTR, None) is not None:
            raise ReloadStateError(
                f"layer '{name}' ({type(module).__name__}) is in another open reload"
            )
    recorded = [_check_layer(name, module, params) for name, module, params in layers]
    session = _Session(behaviour)
    for (name, module, params), rec in zip(layers, recorded, strict=True):
        state = LayerReload(name, module, behaviour, rec, params)
        state.open(lambda st, pname, loader: _wrap(session, st, pname, loader))
        setattr(module, _STATE_ATTR, state)
        session.layers.append(state)
    setattr(model, _SESSION_ATTR, session)


def _wrap(session: _Session, state: LayerReload, pname: str, loader: WeightLoader) -> WeightLoader:
    signature = inspect.signature(loader)

    def reload_weight_loader(param, *args, **kwargs):
        if state.finalised:
            session.log(state, pname, 0, finalised=False, dropped=True, reason=EXCESSIVE)
            warnings.warn(
                f"layer {state.label}: excessive loading of '{pname}': the layer was finalised "
                f"at {state.count}/{state.total} elements, so this load is dropped",
                ExcessiveLoadWarning,
                stacklevel=2,
            )
            return None
        bound = signature.bind(param, *args, **kwargs)
        bound.apply_defaults()
        # Count on the meta stand-in, whichever tensor the caller passed: never the live storage.
        bound.arguments["param"] = state.meta[pname]
        counted, result = get_numel_loaded(loader, bound, behaviour=state.behaviour)
        state.loads.append((pname, bound))  # only loads that ran are replayed
        state.count += counted
        done = state.count >= state.total
        session.log(
            state,
            pname,
            counted,
            finalised=done,
            dropped=False,
            reason=REACHED_TOTAL if done else "",
        )
        if done:
            state.finalise(session.arena)
        return result

    reload_weight_loader.__wrapped__ = loader  # type: ignore[attr-defined]
    return reload_weight_loader


def finalize_layerwise_reload(model: nn.Module) -> list[str]:
    """Finalise the layers still open; return (and warn about) those left partly loaded.

    A layer nobody loaded keeps its current values (warned separately); a partly loaded one is
    finalised like any other, so its missing parameters become NaN.

    Args:
        model: a model with a reload open.

    Returns:
        The names of the layers that were partly loaded (each also a ``PartialLayerWarning``).

    >>> import torch
    >>> from loadkit import AutoWeightsLoader
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))  # one layer: weight (4) + bias (2)
    >>> update = [("0.weight", torch.eye(2)), ("0.bias", torch.ones(2))]
    >>> record_metadata_for_reloading(model)
    >>> initialize_layerwise_reload(model)
    >>> _ = AutoWeightsLoader(model).load_weights(update[:1])  # no bias
    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     finalize_layerwise_reload(model)
    ['0']
    >>> model[0].bias.isnan().all().item()  # the dropped parameter shows as NaN
    True
    """
    session = getattr(model, _SESSION_ATTR, None)
    if session is None or not session.open:
        raise ReloadStateError(
            f"{type(model).__name__}: no reload is open; call initialize_layerwise_reload first"
        )
    partly, untouched = [], []
    try:
        for state in session.layers:
            if not state.finalised:
                if state.count > 0:
                    partly.append(state.name)
                    session.log(state, "", 0, finalised=True, dropped=False, reason=AT_FINALIZE)
                    state.finalise(session.arena)
                else:
                    untouched.append(state.name)
                    state.restore_untouched()
    finally:
        for state in session.layers:
            state.close()
            state.module.__dict__.pop(_STATE_ATTR, None)
        session.open = False
        session.arena = ScratchArena()  # frees the scratch memory
    if partly:
        warnings.warn(
            f"{len(partly)} layer(s) left partly loaded, finalised with NaN where nothing was "
            f"loaded: {partly}",
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
