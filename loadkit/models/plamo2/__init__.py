"""A Plamo2-like hybrid model and its loader before and after vLLM #41699 (docs/api.md, bug 2).

Upstream moved Plamo2's hand-written loader from ``Plamo2ForCausalLM`` into ``Plamo2Model`` and
let ``AutoWeightsLoader`` delegate to it. The move strips ``model.`` from every name the loader
sees, so the one test that spelled the prefix out (``"model.norm.weight" in name``) had to change.
Four behaviours:

- ``"old"``: the loader in ``Plamo2ForCausalLM``, over full names (``model.norm.weight``); it
  skips a tied ``lm_head.weight`` and rotary names itself, and returns ``None``.
- ``"new"``: the loader in ``Plamo2Model``, final norm matched by ``name == "norm.weight"``;
  ``Plamo2ForCausalLM`` delegates through ``AutoWeightsLoader`` as vLLM 0.26.0 had it
  (``skip_prefixes=["lm_head."]`` when tied: ``skips.AutoWeightsLoaderWithSkips``) and returns
  the set of loaded names.
- ``"moved-verbatim"``: moved but the test kept: it never matches, the final norm loses +1.0.
- ``"loose-match"``: ``"norm.weight" in name``: also matches the B/C/dt/q/k norms (+1.0 each).

Only the norms have a forward here (``RMSNorm``): that is what the pitfalls change. Mixers and
MLPs hold parameters with upstream names and shapes but no forward; nothing pretends to run a
mamba scan.

``config`` (the sizes and behaviours), ``model`` (the modules, the conversions and both loaders),
``checkpoint`` (the generator and the header inference), ``skips`` (the skip-list
``AutoWeightsLoader`` of vLLM 0.28.0 and before, Plamo2's).

Plamo2 itself left vLLM after 0.26.0 (PR #49729); the pitfall it teaches, a loader moved into a
child that now sees its names without the child's prefix, did not.
"""

from loadkit.errors import require_torch

require_torch(__name__)  # one line naming the extra, not "No module named torch"

from loadkit.models._common import RMSNorm, rms_norm
from loadkit.models.plamo2.checkpoint import (
    checkpoint_name,
    config_from_checkpoint,
    make_checkpoint,
)
from loadkit.models.plamo2.config import (
    BEHAVIOURS,
    Plamo2Behaviour,
    Plamo2Config,
)
from loadkit.models.plamo2.model import (
    FINAL_NORM_OFFSET,
    FINAL_NORM_TESTS,
    IN_PROJ,
    LAYER_NORM_OFFSETS,
    RENAMES,
    Conv1d,
    DenseMLP,
    Embedding,
    Linear,
    NameStep,
    Plamo2AttentionMixer,
    Plamo2Decoder,
    Plamo2DecoderLayer,
    Plamo2ForCausalLM,
    Plamo2MambaMixer,
    Plamo2Model,
    convert,
    rename,
    reorder_in_proj,
)

__all__ = [
    "BEHAVIOURS",
    "FINAL_NORM_OFFSET",
    "FINAL_NORM_TESTS",
    "IN_PROJ",
    "LAYER_NORM_OFFSETS",
    "RENAMES",
    "Conv1d",
    "DenseMLP",
    "Embedding",
    "Linear",
    "NameStep",
    "Plamo2AttentionMixer",
    "Plamo2Behaviour",
    "Plamo2Config",
    "Plamo2Decoder",
    "Plamo2DecoderLayer",
    "Plamo2ForCausalLM",
    "Plamo2MambaMixer",
    "Plamo2Model",
    "RMSNorm",
    "checkpoint_name",
    "config_from_checkpoint",
    "convert",
    "make_checkpoint",
    "rename",
    "reorder_in_proj",
    "rms_norm",
]
