"""A small mixture-of-experts model whose expert weights are padded, as vLLM pads them.

Each layer's ``FusedMoE`` creates ``w13_weight`` and ``w2_weight`` with an intermediate size
rounded up for a kernel (12 to 16 here; gpt-oss's mxfp4 experts pad 2880 to 2944), while a
checkpoint holds the unpadded experts: a load writes the first 12 rows and never the padding.
What layerwise reload makes of that padding, release by release, is bug 6 (vLLM PR #50523;
notebook 07).

``config`` (sizes, the padded size), ``model`` (``FusedMoE`` and its loader, the router, the
forward at the padded size), ``checkpoint`` (the generator).
"""

from loadkit.errors import require_torch

require_torch(__name__)  # one line naming the extra, not "No module named torch"

from loadkit.models.padded_moe.checkpoint import make_checkpoint
from loadkit.models.padded_moe.config import PaddedMoeConfig, round_up
from loadkit.models.padded_moe.model import (
    FusedMoE,
    PaddedMoeBlock,
    PaddedMoeForCausalLM,
    PaddedMoeModel,
)

__all__ = [
    "FusedMoE",
    "PaddedMoeBlock",
    "PaddedMoeConfig",
    "PaddedMoeForCausalLM",
    "PaddedMoeModel",
    "make_checkpoint",
    "round_up",
]
