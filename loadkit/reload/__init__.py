"""Reloading a running model's weights in place, as vLLM 0.34.0's ``model_loader/reload``.

``layerwise`` (the default mode: counted, layer by layer; ``layer`` finalises one layer),
``direct`` (checkpoint tensors written straight into live storage, post-load processing run
again), ``lifecycle`` (``start_reload``, ``finish_reload``, ``weight_update_active``,
``reload_weights``), and the load plan: ``plan`` traces ``load_weights`` once (``trace``,
``bake``) into copies (``geometry``) replayed for every update.
"""

from loadkit.errors import require_torch

require_torch(__name__)  # one line naming the extra, not "No module named torch"

from loadkit.reload.direct import (
    begin_direct_reload,
    direct_reload_active,
    finish_direct_reload,
    record_checkpoint_layout,
)
from loadkit.reload.layerwise import (
    ExcessiveLoadWarning,
    PartialLayerWarning,
    ReloadStep,
    UnloadedLayerWarning,
    finalize_layerwise_reload,
    initialize_layerwise_reload,
    max_layer_reload_bytes,
    record_metadata_for_reloading,
    reload_log,
)
from loadkit.reload.lifecycle import (
    finish_reload,
    reload_weights,
    start_reload,
    weight_update_active,
)
from loadkit.reload.plan import LoadPlan, ParamMeta, load_planned, param_metas, plan_loads

__all__ = [
    "ExcessiveLoadWarning",
    "LoadPlan",
    "ParamMeta",
    "PartialLayerWarning",
    "ReloadStep",
    "UnloadedLayerWarning",
    "begin_direct_reload",
    "direct_reload_active",
    "finalize_layerwise_reload",
    "finish_direct_reload",
    "finish_reload",
    "initialize_layerwise_reload",
    "load_planned",
    "max_layer_reload_bytes",
    "param_metas",
    "plan_loads",
    "record_checkpoint_layout",
    "record_metadata_for_reloading",
    "reload_log",
    "reload_weights",
    "start_reload",
    "weight_update_active",
]
