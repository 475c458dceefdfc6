"""A Llama/Qwen-like GQA model built from vLLM's tensor-parallel layers.

The layout is Qwen3's (which is Llama's plus a per-head RMSNorm on q and k): checkpoint keys
``model.layers.{i}.self_attn.{q,k,v,o}_proj.weight`` (and biases with ``attention_bias``),
``self_attn.{q,k}_norm.weight``, ``mlp.{gate,up,down}_proj.weight``, the two layer norms,
``model.embed_tokens.weight``, ``model.norm.weight`` and ``lm_head.weight`` (absent when tied).
As in vLLM, q/k/v load into one ``QKVParallelLinear`` and gate/up into one
``MergedColumnParallelLinear`` through stacked ``hf_to_vllm_mapper`` rules.

Built inside ``loadkit.parallel.use_group(group)``, each rank holds its share; the forward
all-reduces after every row-parallel layer and all-gathers the logits, so every rank returns the
full logits. ``config_from_checkpoint`` sizes the model from a header alone.

``config`` (sizes, tensor-parallel findings), ``model`` (modules, ``model_from_checkpoint``),
``checkpoint`` (layout, generator, writer, header inference).
"""

from loadkit.errors import require_torch

require_torch(__name__)  # one line naming the extra, not "No module named torch"

from loadkit.models.llama.checkpoint import (
    checkpoint_layout,
    config_from_checkpoint,
    layout_bytes,
    make_checkpoint,
    tensor_values,
    write_checkpoint,
)
from loadkit.models.llama.config import (
    LlamaLikeConfig,
    TPFinding,
)
from loadkit.models.llama.model import (
    LLAMA_MAPPER,
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
    LlamaModel,
    model_from_checkpoint,
    rotate,
)

__all__ = [
    "LLAMA_MAPPER",
    "LlamaAttention",
    "LlamaDecoderLayer",
    "LlamaForCausalLM",
    "LlamaLikeConfig",
    "LlamaMLP",
    "LlamaModel",
    "TPFinding",
    "checkpoint_layout",
    "config_from_checkpoint",
    "layout_bytes",
    "make_checkpoint",
    "model_from_checkpoint",
    "rotate",
    "tensor_values",
    "write_checkpoint",
]
