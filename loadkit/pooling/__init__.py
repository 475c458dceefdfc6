"""The pooling adapter: ``adapter`` (``as_pooling_model``, torch) and the probe's decision over
names, ``probe`` (torch-free, shared with the header-only inspector).

The adapter is imported on first use so that ``loadkit.pooling`` stays torch-free.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from loadkit.pooling.probe import ProbeRecord, lookup_name, match_prefix, predict_probe

if TYPE_CHECKING:
    from loadkit.pooling.adapter import as_pooling_model

__all__ = ["ProbeRecord", "as_pooling_model", "lookup_name", "match_prefix", "predict_probe"]


def __getattr__(name: str) -> Any:
    if name == "as_pooling_model":
        return importlib.import_module("loadkit.pooling.adapter").as_pooling_model
    raise AttributeError(f"module 'loadkit.pooling' has no attribute {name!r}")
