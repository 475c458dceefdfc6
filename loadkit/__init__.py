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
    "default_weight_loader": "loadkit.loading.weight_loaders",
    "composed_weight_loader": "loadkit.loading.weight_loaders",
    "AutoWeightsLoader": "loadkit.loading.auto_loader",
    "LoadLedger": "loadkit.loading.ledger",
    "ledger_of": "loadkit.loading.ledger",
    "CopyCounter": "loadkit.loading.counting",
    "CloneCounter": "loadkit.loading.counting",
    "get_numel_loaded": "loadkit.loading.counting",
    "open_checkpoint": "loadkit.checkpoint.reader",
    "Checkpoint": "loadkit.checkpoint.reader",
    "Plamo2Config": "loadkit.models.plamo2",
    "Plamo2ForCausalLM": "loadkit.models.plamo2",
    "dyadic_uniform": "loadkit.models.dyadic",
    "as_pooling_model": "loadkit.pooling.adapter",
    "ProbeRecord": "loadkit.pooling.probe",
    "predict_probe": "loadkit.pooling.probe",
    "record_metadata_for_reloading": "loadkit.reload.layerwise",
    "initialize_layerwise_reload": "loadkit.reload.layerwise",
    "finalize_layerwise_reload": "loadkit.reload.layerwise",
    "reload_log": "loadkit.reload.layerwise",
    "LoadkitError": "loadkit.errors",
    "Behaviour": "loadkit.terms",
    "Status": "loadkit.terms",
    "VLLM_VERSION": "loadkit.terms",
}

__all__ = sorted(_EXPORTS)

# The modules of public names that import no torch (``pip install loadkit`` has them); every
# other name needs the ``torch`` extra.
_TORCH_FREE = {
    "loadkit.mapper",
    "loadkit.checkpoint.reader",
    "loadkit.pooling.probe",
    "loadkit.errors",
    "loadkit.terms",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        # Submodules (loadkit.reload, loadkit.models, ...) are reachable as attributes too.
        if not name.startswith("_") and importlib.util.find_spec(f"loadkit.{name}") is not None:
            return importlib.import_module(f"loadkit.{name}")
        raise AttributeError(f"module 'loadkit' has no attribute {name!r}")
    if module not in _TORCH_FREE:
        from loadkit.errors import require_torch

        require_torch(f"loadkit.{name}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
