"""vLLM 0.34.0's ``MistralForCausalLM`` (``mistral.py``), its loading half.

Llama's modules and names (``loadkit.models.native.llama``). Its ``load_weights`` runs each
checkpoint name through ``maybe_remap_mistral`` first, so that a consolidated checkpoint in
Mistral's own names (``layers.0.attention.wq.weight``, ``tok_embeddings.weight``) loads too:
every name component found in ``MISTRAL_MAPPING`` is replaced, unless its replacement is already
in the name; ``wq`` and ``wk`` weights are permuted back to Hugging Face's rotary layout.

>>> mapped, _ = maybe_remap_mistral("layers.0.attention.wq.weight", None)
>>> mapped
'model.layers.0.self_attn.q_proj.weight'
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from loadkit.loading.auto_loader import AutoWeightsLoader
from loadkit.models.native.llama import LlamaForCausalLM

MISTRAL_MAPPING = {
    "layers": "model.layers",
    "attention": "self_attn",
    "qscale_act": "input_scale",
    "qscale_weight": "weight_scale",
    "kv_fake_quantizer.qscale_act": "kv_scale",
    "q_fake_quantizer.qscale_act": "attn.q_scale",
    "k_fake_quantizer.qscale_act": "k_scale",
    "v_fake_quantizer.qscale_act": "v_scale",
    "wq": "q_proj",
    "wk": "k_proj",
    "wv": "v_proj",
    "wo": "o_proj",
    "attention_norm": "input_layernorm",
    "feed_forward": "mlp",
    "w1": "gate_proj",
    "w2": "down_proj",
    "w3": "up_proj",
    "ffn_norm": "post_attention_layernorm",
    "tok_embeddings": "model.embed_tokens",
    "output": "lm_head",
    "norm": "model.norm",
}


def _permute(w: torch.Tensor, n_heads: int, attn_out: int, head_dim: int) -> torch.Tensor:
    attn_in = head_dim * n_heads
    return (
        w.view(n_heads, attn_in // n_heads // 2, 2, attn_out)
        .transpose(1, 2)
        .reshape(attn_in, attn_out)
    )


def maybe_remap_mistral(name: str, loaded_weight: Any, config: Any = None) -> tuple[str, Any]:
    """A consolidated Mistral name and tensor as the Llama layout wants them (vLLM's
    ``MistralForCausalLM.maybe_remap_mistral``); a Hugging Face name passes unchanged."""
    modules = name.split(".")
    if config is not None and modules[-1] == "weight" and ("wk" in modules or "wq" in modules):
        heads = config.num_key_value_heads if "wk" in modules else config.num_attention_heads
        loaded_weight = _permute(loaded_weight, heads, config.hidden_size, config.head_dim)
    for i, item in enumerate(modules):
        nxt = modules[i + 1] if i < len(modules) - 1 else None
        combined = f"{item}.{nxt}" if nxt is not None else None
        if combined in MISTRAL_MAPPING:
            name = name.replace(combined, MISTRAL_MAPPING[combined])
        elif item in MISTRAL_MAPPING and MISTRAL_MAPPING[item] not in name:
            name = name.replace(item, MISTRAL_MAPPING[item])
    return name, loaded_weight


class MistralForCausalLM(LlamaForCausalLM):
    """vLLM's ``MistralForCausalLM``: Llama, loading Mistral's consolidated names too."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loader = AutoWeightsLoader(self)
        return loader.load_weights(
            maybe_remap_mistral(name, weight, self.config) for name, weight in weights
        )
