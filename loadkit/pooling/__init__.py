"""The pooling adapter: ``adapter`` (``as_pooling_model``, torch) and the probe's decision over
names, ``probe`` (torch-free, shared with the header-only inspector).

The adapter is imported on first use so that ``loadkit.pooling.probe`` stays torch-free.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"as_pooling_model": "adapter", "ProbeRecord": "probe", "predict_probe": "probe"}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"loadkit.pooling.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'loadkit.pooling' has no attribute {name!r}")
