"""The Llama-like modules, built from vLLM's tensor-parallel layers: each rank holds its share,
the forward all-reduces and all-gathers so every rank returns the full logits."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from loadkit.checkpoint.reader import TensorInfo
from loadkit.loading.auto_loader import AutoWeightsLoader
from loadkit.mapper import WeightsMapper
from loadkit.models._common import RMSNorm
from loadkit.models.llama.checkpoint import config_from_checkpoint
from loadkit.models.llama.config import LlamaLikeConfig
from loadkit.parallel.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from loadkit.parallel.state import get_tp_group
from loadkit.parallel.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from loadkit.terms import Behaviour

# Upstream's LlamaModel.hf_to_vllm_mapper (vLLM 0.28.0): q/k/v and gate/up land in packed
# parameters, each tensor tagged with its shard id.
LLAMA_MAPPER = WeightsMapper(
    orig_to_new_stacked={
        ".q_proj": (".qkv_proj", "q"),
        ".k_proj": (".qkv_proj", "k"),
        ".v_proj": (".qkv_proj", "v"),
        ".gate_proj": (".gate_up_proj", 0),
        ".up_proj": (".gate_up_proj", 1),
    }
)


# --- the model side ------------------------------------------------------------------------------


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding, neox style (the two halves of each head rotate together)."""
    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, dtype=torch.float32) / half)
    angles = positions.float()[:, None] * freqs[None, :]  # [T, half]
    cos = torch.cat([angles.cos(), angles.cos()], -1)[:, None, :]  # [T, 1, hd]
    sin = torch.cat([angles.sin(), angles.sin()], -1)[:, None, :]
    x32 = x.float()
    rotated = torch.cat([-x32[..., half:], x32[..., :half]], -1)
    return (x32 * cos + rotated * sin).to(x.dtype)


class LlamaAttention(nn.Module):
    def __init__(
        self, c: LlamaLikeConfig, prefix: str, rank_behaviour: Behaviour, kv_behaviour: Behaviour
    ) -> None:
        super().__init__()
        dt = c.torch_dtype
        self.head_dim, self.theta = c.head_dim, c.rope_theta
        self.qkv_proj = QKVParallelLinear(
            c.hidden_size,
            c.head_dim,
            c.num_attention_heads,
            c.num_key_value_heads,
            bias=c.attention_bias,
            params_dtype=dt,
            prefix=f"{prefix}.qkv_proj",
            rank_behaviour=rank_behaviour,
            kv_behaviour=kv_behaviour,
        )
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.q_norm = RMSNorm(c.head_dim, eps=c.rms_norm_eps, dtype=dt)
        self.k_norm = RMSNorm(c.head_dim, eps=c.rms_norm_eps, dtype=dt)
        self.o_proj = RowParallelLinear(
            c.num_attention_heads * c.head_dim,
            c.hidden_size,
            bias=c.attention_bias,
            params_dtype=dt,
            prefix=f"{prefix}.o_proj",
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[0]
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        q = self.q_norm(q.reshape(T, self.num_heads, self.head_dim))
        k = self.k_norm(k.reshape(T, self.num_kv_heads, self.head_dim))
        v = v.reshape(T, self.num_kv_heads, self.head_dim)
        pos = torch.arange(T)
        q, k = rotate(q, pos, self.theta), rotate(k, pos, self.theta)
        # Grouped-query attention: this rank's query heads share its kv heads in order.
        group = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) / math.sqrt(self.head_dim)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        out = torch.einsum("hqk,khd->qhd", weights, v.float()).to(x.dtype)
        return self.o_proj(out.reshape(T, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    def __init__(self, c: LlamaLikeConfig, prefix: str, rank_behaviour: Behaviour) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            c.hidden_size,
            [c.intermediate_size] * 2,
            bias=False,
            params_dtype=c.torch_dtype,
            prefix=f"{prefix}.gate_up_proj",
            rank_behaviour=rank_behaviour,
        )
        self.down_proj = RowParallelLinear(
            c.intermediate_size,
            c.hidden_size,
            bias=False,
            params_dtype=c.torch_dtype,
            prefix=f"{prefix}.down_proj",
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(nn.functional.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self, c: LlamaLikeConfig, prefix: str, rank_behaviour: Behaviour, kv_behaviour: Behaviour
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps, dtype=c.torch_dtype)
        self.self_attn = LlamaAttention(c, f"{prefix}.self_attn", rank_behaviour, kv_behaviour)
        self.post_attention_layernorm = RMSNorm(
            c.hidden_size, eps=c.rms_norm_eps, dtype=c.torch_dtype
        )
        self.mlp = LlamaMLP(c, f"{prefix}.mlp", rank_behaviour)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(
        self, c: LlamaLikeConfig, rank_behaviour: Behaviour, kv_behaviour: Behaviour
    ) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(
            c.vocab_size, c.hidden_size, params_dtype=c.torch_dtype, prefix="model.embed_tokens"
        )
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(c, f"model.layers.{i}", rank_behaviour, kv_behaviour)
            for i in range(c.num_hidden_layers)
        )
        self.norm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps, dtype=c.torch_dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    """The model for this rank of the current group (``loadkit.parallel.use_group``).

    ``rank_behaviour="old"``: the merged-column and QKV loaders take the rank from a defaulted
    keyword (vllm-gguf-plugin #103). ``kv_behaviour="old"``: kv shards without replication (vLLM
    before #2379).

    >>> from loadkit.parallel import stand_in_group, use_group
    >>> with torch.device("meta"), use_group(stand_in_group(0, 2)):
    ...     model = LlamaForCausalLM(LlamaLikeConfig())
    >>> tuple(model.model.layers[0].self_attn.qkv_proj.weight.shape)  # 4 q + 1 k + 1 v heads of 8
    (48, 32)
    """

    hf_to_vllm_mapper = LLAMA_MAPPER

    def __init__(
        self,
        config: LlamaLikeConfig | None = None,
        *,
        rank_behaviour: Behaviour = "new",
        kv_behaviour: Behaviour = "new",
    ) -> None:
        super().__init__()
        self.config = c = config or LlamaLikeConfig()
        self.tp_rank, self.tp_size = get_tp_group().rank, get_tp_group().world_size
        self.model = LlamaModel(c, rank_behaviour, kv_behaviour)
        self.lm_head = ParallelLMHead(
            c.vocab_size, c.hidden_size, params_dtype=c.torch_dtype, prefix="lm_head"
        )
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits ``[len(input_ids), vocab_size]`` for one sequence, the same on every rank."""
        return self.lm_head.logits(self.model(input_ids))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        # A tied lm_head.weight is an alias of model.embed_tokens.weight: skipped unasked.
        loader = AutoWeightsLoader(self)
        loaded = loader.load_weights(weights, mapper=self.hf_to_vllm_mapper)
        self.ledger = loader.ledger
        return loaded


def model_from_checkpoint(
    tensors: Mapping[str, TensorInfo],
    *,
    rank_behaviour: Behaviour = "new",
    kv_behaviour: Behaviour = "new",
) -> LlamaForCausalLM:
    """The model for this rank of the current group, sized from a checkpoint's header: the
    model ``loadkit.executor`` runs and ``loadkit_inspect.tensor_parallel`` simulates when a
    caller picks the Llama-like one (a module-level function, so it crosses to rank processes).

    >>> from loadkit.models.llama.checkpoint import checkpoint_layout
    >>> from loadkit.parallel import stand_in_group, use_group
    >>> layout = checkpoint_layout(LlamaLikeConfig())
    >>> header = {n: TensorInfo(n, "F32", s, 0, "x", 0) for n, s in layout}
    >>> with torch.device("meta"), use_group(stand_in_group(1, 2)):
    ...     model = model_from_checkpoint(header, kv_behaviour="old")
    >>> model.model.layers[0].self_attn.qkv_proj.kv_behaviour, model.tp_rank
    ('old', 1)
    """
    return LlamaForCausalLM(
        config_from_checkpoint(tensors), rank_behaviour=rank_behaviour, kv_behaviour=kv_behaviour
    )
