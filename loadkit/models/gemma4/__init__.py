"""A Gemma4-like model: the checkpoint layout the pooling probe never matched.

The checkpoint stores the text model under ``model.language_model.*``; the model holds it under
``language_model.model.*``. Names meet only through the model's ``hf_to_vllm_mapper``, which is
why the old pooling probe, checking raw names under ``""`` and ``"model."``, never hit.

As in vLLM, q/k/v and gate/up are packed into ``qkv_proj`` and ``gate_up_proj``: the checkpoint
has separate tensors, a stacked mapper rule names the packed parameter and tags the tensor with
a ``shard_id``, and the packed parameter's ``weight_loader`` reads that ``shard_id``.

Sizes are configurable (``Gemma4Config``); the defaults make the small model whose checkpoint is
committed in ``data/gemma4_like/``. ``full_scale_config()`` approximates the upstream Gemma4-E2B
layout (about 2011 tensors, 9.5 GiB in bf16) for the meta device. The committed checkpoint is
written by ``data/generate.py``, larger ones by ``benchmarks/gemma4_checkpoint.py``.

``config`` (sizes, name prefixes), ``model`` (modules, mappers), ``checkpoint`` (layout,
generator, header inference).
"""

from loadkit.errors import require_torch

require_torch(__name__)  # one line naming the extra, not "No module named torch"

from loadkit.models.gemma4.checkpoint import (
    checkpoint_layout,
    config_from_checkpoint,
    layout_bytes,
    make_checkpoint,
    make_tensor,
)
from loadkit.models.gemma4.config import (
    LAYER_NORMS,
    TEXT_CKPT,
    TEXT_PARAM,
    TOWERS,
    Gemma4Config,
    full_scale_config,
)
from loadkit.models.gemma4.model import (
    GEMMA4_MAPPER,
    PACKING_MAPPER,
    SHARD_ORDER,
    EncoderTower,
    Gemma4Attention,
    Gemma4DecoderLayer,
    Gemma4ForCausalLM,
    Gemma4ForConditionalGeneration,
    Gemma4MLP,
    Gemma4TextModel,
    expected_parameters,
    hf_to_vllm_mapper_for,
    load_mapper,
)

__all__ = [
    "GEMMA4_MAPPER",
    "LAYER_NORMS",
    "PACKING_MAPPER",
    "SHARD_ORDER",
    "TEXT_CKPT",
    "TEXT_PARAM",
    "TOWERS",
    "EncoderTower",
    "Gemma4Attention",
    "Gemma4Config",
    "Gemma4DecoderLayer",
    "Gemma4ForCausalLM",
    "Gemma4ForConditionalGeneration",
    "Gemma4MLP",
    "Gemma4TextModel",
    "checkpoint_layout",
    "config_from_checkpoint",
    "expected_parameters",
    "full_scale_config",
    "hf_to_vllm_mapper_for",
    "layout_bytes",
    "load_mapper",
    "make_checkpoint",
    "make_tensor",
]
