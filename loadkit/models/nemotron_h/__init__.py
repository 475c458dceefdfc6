"""A NemotronH-like hybrid model: Mamba2 mixers, attention and MLP layers.

Parameter names follow upstream vLLM's ``NemotronHForCausalLM``; checkpoint names follow the
Hugging Face checkpoints (``backbone.*``, ``A_log``, ``embeddings``, separate ``q/k/v_proj``) and
reach the parameters through ``hf_to_vllm_mapper``, as upstream. What matters for layerwise
reload: a Mamba2 mixer holds ``A``, ``D`` and ``dt_bias`` (one value per head) as its own direct
parameters, so it is one "layer" of three equal parameters, while ``in_proj``, ``conv1d``,
``norm`` and ``out_proj`` are child modules, each a layer of its own. ``A`` loads through
``composed_weight_loader`` as ``-exp(A_log)``: two copies into one parameter.

The forward pass is small but real: the Mamba2 recurrence run step by step (the sequential form
of the SSD scan), with the ``D`` skip term ``y = scan(x) + D * x``, so a ``D`` full of NaN turns
every logit NaN, as upstream's dropped ``mixer.D`` did.

``config`` (sizes, layer kinds), ``model`` (modules and loading), ``checkpoint`` (generator
in each key order, header inference).
"""

from loadkit.errors import require_torch

require_torch(__name__)  # one line naming the extra, not "No module named torch"

from loadkit.models.nemotron_h.checkpoint import (
    A_RANGE,
    DT_GRID,
    DT_STEPS,
    ORDERS,
    config_from_checkpoint,
    make_checkpoint,
)
from loadkit.models.nemotron_h.config import (
    LAYER_KINDS,
    NemotronHConfig,
)
from loadkit.models.nemotron_h.model import (
    MambaMixer2,
    NemotronHAttention,
    NemotronHBlock,
    NemotronHForCausalLM,
    NemotronHMLP,
    NemotronHModel,
)

__all__ = [
    "A_RANGE",
    "DT_GRID",
    "DT_STEPS",
    "LAYER_KINDS",
    "ORDERS",
    "MambaMixer2",
    "NemotronHAttention",
    "NemotronHBlock",
    "NemotronHConfig",
    "NemotronHForCausalLM",
    "NemotronHMLP",
    "NemotronHModel",
    "config_from_checkpoint",
    "make_checkpoint",
]
