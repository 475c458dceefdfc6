"""Layerwise reload (vLLM's online weight reload), with capped or uncapped copy counting.

``layerwise`` records metadata, opens a reload and finalises what is left; ``layer`` finalises
one layer (materialise, replay, copy back).
"""

from loadkit.errors import require_torch

require_torch(__name__)  # one line naming the extra, not "No module named torch"

from loadkit.reload.layerwise import (
    ExcessiveLoadWarning,
    PartialLayerWarning,
    ReloadStep,
    UnloadedLayerWarning,
    finalize_layerwise_reload,
    initialize_layerwise_reload,
    record_metadata_for_reloading,
    reload_log,
)

__all__ = [
    "ExcessiveLoadWarning",
    "PartialLayerWarning",
    "ReloadStep",
    "UnloadedLayerWarning",
    "finalize_layerwise_reload",
    "initialize_layerwise_reload",
    "record_metadata_for_reloading",
    "reload_log",
]
