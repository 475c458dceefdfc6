"""loadkit: see, step by step, what happens when a PyTorch model loads its weights.

Public names are resolved lazily so that ``import loadkit`` (and the header-only inspector) does
not pay for importing torch until a torch-backed name is used.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "WeightsMapper": "loadkit.mapper",
    "default_weight_loader": "loadkit.weight_loaders",
    "composed_weight_loader": "loadkit.weight_loaders",
    "AutoWeightsLoader": "loadkit.auto_loader",
    "LoadLedger": "loadkit.ledger",
    "ledger_of": "loadkit.ledger",
    "CopyCounter": "loadkit.counting",
    "CloneCounter": "loadkit.counting",
    "get_numel_loaded": "loadkit.counting",
    "open_checkpoint": "loadkit.checkpoint",
    "Checkpoint": "loadkit.checkpoint",
    "Plamo2Config": "loadkit.models.plamo2",
    "Plamo2ForCausalLM": "loadkit.models.plamo2",
    "as_pooling_model": "loadkit.pooling",
    "ProbeRecord": "loadkit.pooling",
    "record_metadata_for_reloading": "loadkit.reload",
    "initialize_layerwise_reload": "loadkit.reload",
    "finalize_layerwise_reload": "loadkit.reload",
    "reload_log": "loadkit.reload",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        # Submodules (loadkit.reload, loadkit.models, ...) are reachable as attributes too.
        if not name.startswith("_") and importlib.util.find_spec(f"loadkit.{name}") is not None:
            return importlib.import_module(f"loadkit.{name}")
        raise AttributeError(f"module 'loadkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
