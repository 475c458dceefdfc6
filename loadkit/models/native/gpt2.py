"""vLLM 0.34.0's ``GPT2LMHeadModel`` (``vllm/model_executor/models/gpt2.py``), its loading half.

The module tree is transformers' names on vLLM's layers: ``transformer.wte`` (a
``VocabParallelEmbedding``) and ``transformer.wpe`` (a plain embedding), per block ``ln_1``,
``attn.c_attn`` (q, k and v packed in one ``QKVParallelLinear``, as on disk), ``attn.c_proj``,
``ln_2``, ``mlp.c_fc`` and ``mlp.c_proj``, then ``transformer.ln_f``; ``lm_head`` is tied to
``wte`` when ``tie_word_embeddings`` (GPT-2's default). Loading is upstream's:
``GPT2LMHeadModel.load_weights`` puts ``transformer.`` before every name that lacks it (a
checkpoint saved from ``GPT2Model``), its ``AutoWeightsLoader`` hands ``transformer.*`` to
``GPT2Model.load_weights``, which transposes the ``Conv1D`` weights of ``c_attn``, ``c_proj`` and
``c_fc`` (transformers stores them ``[in, out]``) and drops the causal-mask buffers older
checkpoints saved (``.attn.bias``, ``.attn.masked_bias``; the real ``c_attn.bias`` has no dot
before ``attn`` and stays).

>>> import torch
>>> from transformers import GPT2Config
>>> config = GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=64, n_positions=32)
>>> with torch.device("meta"):
...     model = GPT2LMHeadModel(config)
>>> tuple(model.transformer.h[0].attn.c_attn.weight.shape), model.lm_head.weight is None
((48, 16), False)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from loadkit.errors import ModelSpecError
from loadkit.loading.auto_loader import AutoWeightsLoader
from loadkit.mapper import WeightsMapper
from loadkit.models.native.common import Attention, dtype_of, make_layers, maybe_prefix
from loadkit.models.native.llama import tied
from loadkit.parallel.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from loadkit.parallel.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# GPT2Model.hf_to_vllm_mapper (vLLM 0.34.0): the attention-mask buffers, not c_attn.bias.
MASK_BUFFERS = WeightsMapper(orig_to_new_substr={".attn.bias": None, ".attn.masked_bias": None})
# Settings vLLM's GPT2Model asserts are off: it cannot be built with them.
UNSUPPORTED = ("add_cross_attention", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn")


class LayerNorm(nn.Module):
    """vLLM's ``LayerNorm``: a weight (ones) and a bias (zeros)."""

    def __init__(self, hidden_size: int, *, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(hidden_size, dtype=dtype))


class GPT2Attention(nn.Module):
    def __init__(self, config: Any, *, dtype: torch.dtype | None, prefix: str) -> None:
        super().__init__()
        heads, hidden = config.num_attention_heads, config.hidden_size
        head_dim = hidden // heads
        self.c_attn = QKVParallelLinear(
            hidden, head_dim, heads, bias=True, params_dtype=dtype, prefix=f"{prefix}.c_attn"
        )
        self.c_proj = RowParallelLinear(
            hidden, hidden, bias=True, params_dtype=dtype, prefix=f"{prefix}.c_proj"
        )
        qkv = self.c_attn
        self.attn = Attention(qkv.num_heads, head_dim, qkv.num_kv_heads, f"{prefix}.attn")


class GPT2MLP(nn.Module):
    def __init__(
        self, intermediate: int, config: Any, *, dtype: torch.dtype | None, prefix: str
    ) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.c_fc = ColumnParallelLinear(
            hidden, intermediate, bias=True, params_dtype=dtype, prefix=f"{prefix}.c_fc"
        )
        self.c_proj = RowParallelLinear(
            intermediate, hidden, bias=True, params_dtype=dtype, prefix=f"{prefix}.c_proj"
        )


class GPT2Block(nn.Module):
    def __init__(self, config: Any, *, dtype: torch.dtype | None, prefix: str) -> None:
        super().__init__()
        hidden = config.hidden_size
        inner = config.n_inner if config.n_inner is not None else 4 * hidden
        self.ln_1 = LayerNorm(hidden, dtype=dtype)
        self.attn = GPT2Attention(config, dtype=dtype, prefix=f"{prefix}.attn")
        self.ln_2 = LayerNorm(hidden, dtype=dtype)
        self.mlp = GPT2MLP(inner, config, dtype=dtype, prefix=f"{prefix}.mlp")


class GPT2Model(nn.Module):
    """vLLM's ``GPT2Model``: its own ``load_weights``, an ``AutoWeightsLoader`` over the
    transposed ``Conv1D`` weights with the mask-buffer mapper."""

    hf_to_vllm_mapper = MASK_BUFFERS

    def __init__(self, config: PretrainedConfig, *, prefix: str = "transformer") -> None:
        super().__init__()
        on = [name for name in UNSUPPORTED if getattr(config, name, False)]
        if on:  # upstream's asserts
            raise ModelSpecError(f"vLLM 0.34.0's GPT2Model asserts {on[0]} is off")
        self.config = config
        dtype = dtype_of(config)
        hidden = config.hidden_size
        self.wte = VocabParallelEmbedding(
            config.vocab_size, hidden, params_dtype=dtype, prefix=f"{prefix}.wte"
        )
        self.wpe = nn.Embedding(config.max_position_embeddings, hidden, dtype=dtype)
        self.h = make_layers(
            config.num_hidden_layers,
            lambda p: GPT2Block(config, dtype=dtype, prefix=p),
            f"{prefix}.h",
        )
        self.ln_f = LayerNorm(hidden, dtype=dtype)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loader = AutoWeightsLoader(self)
        return loader.load_weights(transpose_conv1d(weights), mapper=self.hf_to_vllm_mapper)


def transpose_conv1d(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """transformers' GPT-2 keeps ``c_attn``, ``c_proj`` and ``c_fc`` as ``Conv1D`` (weights
    ``[in, out]``): each such ``.weight`` transposed, as vLLM's ``_transpose_conv1d``.

    >>> [tuple(w.shape) for _, w in transpose_conv1d([("h.0.mlp.c_fc.weight", torch.zeros(2, 3))])]
    [(3, 2)]
    """
    for name, loaded_weight in weights:
        if name.endswith(".weight") and any(p in name for p in ("c_attn", "c_proj", "c_fc")):
            loaded_weight = loaded_weight.t()
        yield name, loaded_weight


def add_transformer_prefix(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """``transformer.`` before every name without it, ``lm_head.`` and ``score.`` names apart
    (vLLM's ``_add_transformer_prefix``: a checkpoint saved from ``GPT2Model``).

    >>> named = [("h.0.ln_1.weight", None), ("lm_head.weight", None)]
    >>> [n for n, _ in add_transformer_prefix(named)]
    ['transformer.h.0.ln_1.weight', 'lm_head.weight']
    """
    for name, tensor in weights:
        if not name.startswith(("transformer.", "lm_head.", "score.")):
            name = "transformer." + name
        yield name, tensor


class GPT2LMHeadModel(nn.Module):
    """vLLM's ``GPT2LMHeadModel`` on the current device and tensor-parallel group."""

    def __init__(self, config: PretrainedConfig, *, prefix: str = "") -> None:
        super().__init__()
        self.config = config
        self.transformer = GPT2Model(config, prefix=maybe_prefix(prefix, "transformer"))
        self.lm_head = ParallelLMHead(
            config.vocab_size,
            config.hidden_size,
            params_dtype=dtype_of(config),
            prefix=f"{prefix}.lm_head",
        )
        if tied(config):
            self.lm_head = self.lm_head.tie_weights(self.transformer.wte)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(add_transformer_prefix(weights))
