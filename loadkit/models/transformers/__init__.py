"""Any Hugging Face architecture as a loadkit model: vLLM's Transformers modeling backend.

transformers builds the model on the meta device; the wrapper (picked as upstream picks it)
derives ``hf_to_vllm_mapper`` from transformers' own renamings, ignore list and base-model prefix,
and loads through ``AutoWeightsLoader``. Layout as upstream's
``vllm/model_executor/models/transformers/``: ``base`` (``Base``), ``causal``, ``legacy``,
``pooling`` (the mixins), ``wrappers`` (the classes and the choice), ``config`` (reading
``config.json``), ``spec`` (``--model hf``).

>>> from loadkit.models.transformers import from_config  # doctest: +SKIP
>>> model = from_config("path/to/checkpoint", device="cpu")  # doctest: +SKIP
>>> model.load_weights(open_checkpoint("path/to/checkpoint").weights())  # doctest: +SKIP

The names below are imported on first use: importing this package costs nothing until then
(``--model hf`` checks its spec and config before torch and transformers are loaded).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from loadkit.models.transformers.base import Base
    from loadkit.models.transformers.config import (
        CONFIG_NAME,
        config_dict,
        config_from_dict,
        config_path,
        load_config,
        one_line,
        read_config_dict,
    )
    from loadkit.models.transformers.wrappers import choose_wrapper

_LAZY = {
    "Base": "loadkit.models.transformers.base",
    "TransformersForCausalLM": "loadkit.models.transformers.wrappers",
    "TransformersEmbeddingModel": "loadkit.models.transformers.wrappers",
    "TransformersForSequenceClassification": "loadkit.models.transformers.wrappers",
    "WRAPPERS": "loadkit.models.transformers.wrappers",
    "choose_wrapper": "loadkit.models.transformers.wrappers",
    "load_config": "loadkit.models.transformers.config",
    "CONFIG_NAME": "loadkit.models.transformers.config",
    "config_dict": "loadkit.models.transformers.config",
    "config_from_dict": "loadkit.models.transformers.config",
    "config_path": "loadkit.models.transformers.config",
    "one_line": "loadkit.models.transformers.config",
    "read_config_dict": "loadkit.models.transformers.config",
}

__all__ = [
    "CONFIG_NAME",
    "WRAPPERS",
    "Base",
    "TransformersEmbeddingModel",
    "TransformersForCausalLM",
    "TransformersForSequenceClassification",
    "choose_wrapper",
    "config_dict",
    "config_from_dict",
    "config_path",
    "from_config",
    "load_config",
    "one_line",
    "read_config_dict",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)


def from_config(
    config: PretrainedConfig | str | os.PathLike[str],
    *,
    task: str | None = None,
    device: str = "cpu",
) -> Base:
    """The wrapper for ``config`` (a ``PretrainedConfig``, a ``config.json``, or a folder).

    ``task`` ("causal", "embed", "classify") overrides upstream's choice by architecture.
    ``device="meta"`` builds without memory (what the inspector does); on a real device the
    model is ready for ``load_weights``.
    """
    from loadkit.models.transformers.config import load_config
    from loadkit.models.transformers.wrappers import choose_wrapper

    source = None
    if isinstance(config, (str, os.PathLike)):
        config, source = load_config(config)
    choice = choose_wrapper(config, task)
    model = choice.wrapper(config, device=device)
    model.config_source = source
    model.wrapper_reason = choice.reason
    return model
