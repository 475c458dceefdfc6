"""Begin and complete a checkpoint-format weight update in either reload mode (vLLM 0.34.0's
``reload/lifecycle.py``), and ``reload_weights``, the whole update in one call
(``reload/inplace.py``, which warns about weights the update did not load).

Upstream picks the mode once per process (``VLLM_RELOAD_MODE``) and keeps "a weight update is
running" in a module global. loadkit takes the mode per call (``start_reload(model,
mode="direct")``; ``finish_reload`` finishes what its start began) and keeps the flag in a
context variable: the thread (or task) that started the update sees it, whichever module asks.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from contextvars import ContextVar, Token
from typing import Any, Literal, cast

import torch
from torch import nn

from loadkit.errors import ReloadStateError, WeightsNotLoadedWarning
from loadkit.reload.direct import begin_direct_reload, finish_direct_reload
from loadkit.reload.layerwise import finalize_layerwise_reload, initialize_layerwise_reload
from loadkit.terms import check_behaviour

__all__ = ["ReloadMode", "finish_reload", "reload_weights", "start_reload", "weight_update_active"]

ReloadMode = Literal["layerwise", "direct"]
RELOAD_MODES: tuple[ReloadMode, ...] = ("layerwise", "direct")

_ACTIVE: ContextVar[bool] = ContextVar("loadkit_weight_update_active", default=False)
_MODE_ATTR = "_loadkit_reload_mode"  # on the model between start and finish: (mode, token)


def weight_update_active() -> bool:
    """Whether a weight update is running here, when one ``load_weights`` call may hold only
    part of the checkpoint (a completeness check should not complain then).

    >>> weight_update_active()
    False
    """
    return _ACTIVE.get()


def start_reload(model: nn.Module, *, mode: ReloadMode = "layerwise", **layerwise: Any) -> None:
    """Begin a weight update of ``model`` in ``mode``.

    Args:
        model: for ``"layerwise"``, its metadata recorded (``record_metadata_for_reloading``);
            for ``"direct"``, its checkpoint layout (``record_checkpoint_layout``).
        mode: ``"layerwise"`` (vLLM's default) or ``"direct"``.
        **layerwise: ``initialize_layerwise_reload``'s keywords (``defer_processing``,
            ``behaviour``, ``padding``, ``fill``), for the layerwise mode only.

    Returns:
        ``None``; then ``model.load_weights(update)`` and ``finish_reload(model)``.

    >>> from loadkit import AutoWeightsLoader
    >>> from loadkit.reload import record_metadata_for_reloading
    >>> model = torch.nn.Linear(2, 2)
    >>> record_metadata_for_reloading(model)
    >>> start_reload(model)
    >>> weight_update_active()
    True
    >>> update = [("weight", torch.eye(2)), ("bias", torch.ones(2))]
    >>> sorted(AutoWeightsLoader(model).load_weights(update))
    ['bias', 'weight']
    >>> finish_reload(model), weight_update_active(), model.bias.tolist()
    (None, False, [1.0, 1.0])
    """
    check_behaviour(mode, RELOAD_MODES, what="mode")
    if _MODE_ATTR in model.__dict__:
        raise ReloadStateError(f"{type(model).__name__}: an update is running; finish_reload")
    if mode == "direct":
        if layerwise:
            raise ReloadStateError(f"direct reload takes no layerwise keywords: {list(layerwise)}")
        begin_direct_reload(model)
    else:
        initialize_layerwise_reload(model, **layerwise)
    model.__dict__[_MODE_ATTR] = (mode, _ACTIVE.set(True))


def finish_reload(model: nn.Module) -> None:
    """Complete the update ``start_reload`` began (layerwise: finalise; direct: post-load
    processing again). The "update running" flag is cleared first, as upstream does.

    Args:
        model: the model ``start_reload`` was called on.

    Returns:
        ``None``.
    """
    started: tuple[ReloadMode, Token[bool]] | None = model.__dict__.pop(_MODE_ATTR, None)
    if started is None:
        raise ReloadStateError(f"{type(model).__name__}: no update is running; start_reload")
    mode, token = started
    _ACTIVE.reset(token)
    if mode == "direct":
        finish_direct_reload(model)
    else:
        finalize_layerwise_reload(model)


def reload_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    *,
    mode: ReloadMode = "layerwise",
    **layerwise: Any,
) -> set[str] | None:
    """Reload ``model`` in place from ``weights`` in one call; warn about unloaded parameters.

    ``start_reload``, ``model.load_weights(weights)``, ``finish_reload``; then every parameter
    name the load did not report is named in a ``WeightsNotLoadedWarning`` (vLLM 0.32.0 on:
    "Following weights were not loaded from checkpoint"). ``finish_reload`` runs even if the
    load raises, so the model is never left on meta.

    Args:
        model: the model, with its metadata (layerwise) or layout (direct) recorded.
        weights: ``(checkpoint name, tensor)`` pairs.
        mode: ``"layerwise"`` or ``"direct"``.
        **layerwise: ``initialize_layerwise_reload``'s keywords.

    Returns:
        What ``model.load_weights`` returned: the names it loaded (no check when ``None``).

    >>> from loadkit import AutoWeightsLoader
    >>> from loadkit.reload import record_metadata_for_reloading
    >>> class Model(torch.nn.Linear):
    ...     def load_weights(self, weights):
    ...         return AutoWeightsLoader(self).load_weights(weights)
    >>> model = Model(2, 2)
    >>> record_metadata_for_reloading(model)
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     reload_weights(model, [("weight", torch.eye(2))])
    {'weight'}
    >>> [str(w.message) for w in caught if w.category.__name__ == "WeightsNotLoadedWarning"]
    ["Following weights were not loaded from checkpoint: ['bias']"]
    """
    to_load = {name for name, _ in model.named_parameters()}
    start_reload(model, mode=mode, **layerwise)
    try:
        loaded = cast(Any, model).load_weights(weights)
    finally:
        finish_reload(model)
    if loaded is None:
        return None
    loaded = set(loaded)
    missing = sorted(to_load - loaded)
    if missing:
        warnings.warn(
            f"Following weights were not loaded from checkpoint: {missing}",
            WeightsNotLoadedWarning,
            stacklevel=2,
        )
    return loaded
