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
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import torch
from torch import nn

from loadkit import AutoWeightsLoader, WeightsMapper
from loadkit.checkpoint import dtypes
from loadkit.checkpoint.reader import TensorInfo
from loadkit.checkpoint.writer import write_safetensors
from loadkit.errors import CheckpointError, LoadkitError
from loadkit.models._common import DATA_DIR, RMSNorm
from loadkit.parallel.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from loadkit.parallel.state import get_tp_group
from loadkit.parallel.vocab_parallel_embedding import (
    DEFAULT_VOCAB_PADDING_SIZE,
    ParallelLMHead,
    VocabParallelEmbedding,
    pad_vocab_size,
    vocab_shard,
)
from loadkit.vocab import Behaviour

DATA_DIR_NAME = "llama_like"
DATA_CHECKPOINT = DATA_DIR / DATA_DIR_NAME / "model.safetensors"

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


@dataclass(frozen=True)
class LlamaLikeConfig:
    """Sizes of the model. The defaults make the tiny test model: 8 query heads over 2 kv heads,
    a vocabulary of 100 (padded to 128), so ``tp=4`` shows both kv replication and padding."""

    vocab_size: int = 100
    hidden_size: int = 32
    intermediate_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    head_dim: int = 8
    attention_bias: bool = True
    tie_word_embeddings: bool = False
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type == "int" and (not isinstance(v, int) or v <= 0):
                raise LoadkitError(f"LlamaLikeConfig.{f.name} must be a positive int, not {v!r}")
        if self.dtype not in dtypes.torch_names():
            raise LoadkitError(f"LlamaLikeConfig.dtype {self.dtype!r} is not a torch dtype name")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def verify_tensor_parallel(self, tp: int) -> list[TPFinding]:
        """What ``tp`` ranks would make of this model, before building anything.

        ``error`` findings cannot work (upstream refuses them too); ``note`` findings work but
        cost something (replicated kv heads, padded vocabulary rows).
        """
        out: list[TPFinding] = []
        if tp < 1:
            return [TPFinding("error", "tp", f"tp must be at least 1, not {tp}")]
        H, KV = self.num_attention_heads, self.num_key_value_heads
        if H % tp:
            out.append(
                TPFinding(
                    "error",
                    "attention heads",
                    f"{H} attention heads are not divisible by tp={tp}",
                )
            )
        if KV >= tp and KV % tp:
            out.append(
                TPFinding("error", "kv heads", f"{KV} kv heads are not divisible by tp={tp}")
            )
        elif KV < tp and tp % KV:
            out.append(
                TPFinding(
                    "error",
                    "kv heads",
                    f"tp={tp} is not a multiple of the {KV} kv heads: they cannot be "
                    "replicated evenly",
                )
            )
        elif KV < tp:
            out.append(
                TPFinding(
                    "note",
                    "kv replication",
                    f"{KV} kv heads < tp={tp}: each kv head is replicated on {tp // KV} ranks "
                    f"(rank r holds kv head r // {tp // KV})",
                )
            )
        if self.intermediate_size % tp:
            out.append(
                TPFinding(
                    "error",
                    "intermediate size",
                    f"intermediate size {self.intermediate_size} is not divisible by tp={tp}",
                )
            )
        padded = pad_vocab_size(self.vocab_size)
        if padded % tp:
            out.append(
                TPFinding(
                    "error",
                    "vocabulary",
                    f"padded vocabulary {padded} is not divisible by tp={tp}",
                )
            )
        elif padded != self.vocab_size:
            shards = [vocab_shard(self.vocab_size, r, tp) for r in range(tp)]
            pads = ", ".join(
                f"rank {r} {s.padding_rows}" for r, s in enumerate(shards) if s.padding_rows
            )
            out.append(
                TPFinding(
                    "note",
                    "vocab padding",
                    f"vocabulary {self.vocab_size} padded to {padded} "
                    f"(multiple of {DEFAULT_VOCAB_PADDING_SIZE}), {padded // tp} rows per rank; "
                    f"zero rows: {pads}",
                )
            )
        return out


@dataclass(frozen=True)
class TPFinding:
    """One thing ``tp`` ranks would run into: ``severity`` is ``"error"`` or ``"note"``."""

    severity: str
    subject: str
    message: str


# --- the checkpoint side -------------------------------------------------------------------------


def checkpoint_layout(config: LlamaLikeConfig) -> list[tuple[str, tuple[int, ...]]]:
    """Checkpoint names and shapes, sorted by name (as safetensors files are)."""
    c = config
    h, q, kv = c.hidden_size, c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    out: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (c.vocab_size, h),
        "model.norm.weight": (h,),
    }
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = (c.vocab_size, h)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        out |= {
            f"{p}input_layernorm.weight": (h,),
            f"{p}post_attention_layernorm.weight": (h,),
            f"{p}self_attn.q_proj.weight": (q, h),
            f"{p}self_attn.k_proj.weight": (kv, h),
            f"{p}self_attn.v_proj.weight": (kv, h),
            f"{p}self_attn.o_proj.weight": (h, q),
            f"{p}self_attn.q_norm.weight": (c.head_dim,),
            f"{p}self_attn.k_norm.weight": (c.head_dim,),
            f"{p}mlp.gate_proj.weight": (c.intermediate_size, h),
            f"{p}mlp.up_proj.weight": (c.intermediate_size, h),
            f"{p}mlp.down_proj.weight": (h, c.intermediate_size),
        }
        if c.attention_bias:
            out |= {
                f"{p}self_attn.q_proj.bias": (q,),
                f"{p}self_attn.k_proj.bias": (kv,),
                f"{p}self_attn.v_proj.bias": (kv,),
                f"{p}self_attn.o_proj.bias": (h,),
            }
    return sorted(out.items())


def tensor_values(seed: int, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Seeded, exactly representable values: small integers over a power of two.

    Norm weights sit around 1 (``1 + k/8``), everything else in ``[-4/32, 4/32]``; seeded by
    name, so a tensor does not depend on its place in the file.
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    ints = torch.randint(-4, 5, shape, generator=g, dtype=torch.int32)
    if "norm" in name:
        return (1 + ints.to(torch.float32) / 8).to(dtype)
    return (ints.to(torch.float32) / 32).to(dtype)


def make_checkpoint(config: LlamaLikeConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Checkpoint-side tensors (names as on disk), in file order."""
    return {
        name: tensor_values(seed, name, shape, config.torch_dtype)
        for name, shape in checkpoint_layout(config)
    }


def write_checkpoint(
    path: str | os.PathLike[str],
    config: LlamaLikeConfig,
    *,
    seed: int = 0,
    progress: bool = False,
    drop: Iterable[str] = (),
) -> Path:
    """Write a safetensors file tensor by tensor (memory stays at one tensor).

    ``drop`` leaves keys out (a broken checkpoint for error tests).
    """
    dropped = set(drop)
    layout = {n: s for n, s in checkpoint_layout(config) if n not in dropped}
    dtype = dtypes.safetensors_dtype(config.dtype)
    return write_safetensors(
        path,
        [(name, dtype, shape) for name, shape in layout.items()],
        lambda name: tensor_values(seed, name, layout[name], config.torch_dtype),
        metadata={"loadkit": "llama-like"},
        progress=progress,
    )


def layout_bytes(config: LlamaLikeConfig) -> int:
    itemsize = dtypes.itemsize(dtypes.safetensors_dtype(config.dtype))
    return sum(math.prod(s) * itemsize for _, s in checkpoint_layout(config))


def config_from_checkpoint(tensors: Mapping[str, TensorInfo]) -> LlamaLikeConfig:
    """Infer the config from a header (``open_checkpoint(p).tensors``): the q norm gives the head
    size, q/k rows the head counts, a missing ``lm_head.weight`` tied embeddings."""

    def info(key: str, ndim: int) -> tuple[int, ...]:
        t = tensors.get(key)
        if t is None:
            fail(key, "the key is missing")
        if len(t.shape) != ndim:
            fail(key, f"expected a {ndim}-d tensor, found shape {list(t.shape)}")
        return t.shape

    file = next((t.file for t in tensors.values()), "<empty checkpoint>")

    def fail(key: str, message: str) -> NoReturn:
        t = tensors.get(key)
        raise CheckpointError(t.file if t else file, f"not a Llama-like checkpoint: {message}", key)

    vocab, hidden = info("model.embed_tokens.weight", 2)
    layers = sorted({int(m[1]) for k in tensors if (m := re.match(r"model\.layers\.(\d+)\.", k))})
    if not layers:
        fail("model.layers.0.self_attn.q_proj.weight", "no decoder layers found")
    if layers != list(range(len(layers))):
        gap = next(i for i, j in enumerate(layers) if i != j)
        fail(f"model.layers.{gap}.self_attn.q_proj.weight", f"layers {layers} skip {gap}")
    p = "model.layers.0.self_attn."
    (head_dim,) = info(f"{p}q_norm.weight", 1)
    heads = {}
    for proj in ("q", "k"):
        rows, _ = info(f"{p}{proj}_proj.weight", 2)
        if rows % head_dim:
            fail(f"{p}{proj}_proj.weight", f"{rows} rows are not a multiple of head_dim {head_dim}")
        heads[proj] = rows // head_dim
    inter, _ = info("model.layers.0.mlp.gate_proj.weight", 2)
    dtype = dtypes.torch_name(tensors["model.embed_tokens.weight"].dtype)
    try:
        return LlamaLikeConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=inter,
            num_hidden_layers=len(layers),
            num_attention_heads=heads["q"],
            num_key_value_heads=heads["k"],
            head_dim=head_dim,
            attention_bias=f"{p}q_proj.bias" in tensors,
            tie_word_embeddings="lm_head.weight" not in tensors,
            dtype=dtype,
        )
    except LoadkitError as exc:
        fail("model.embed_tokens.weight", str(exc))


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

    >>> from loadkit.parallel import simulated_group, use_group
    >>> with torch.device("meta"), use_group(simulated_group(0, 2)):
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
        skip = ["lm_head."] if self.config.tie_word_embeddings else None
        loader = AutoWeightsLoader(self, skip_prefixes=skip)
        loaded = loader.load_weights(weights, mapper=self.hf_to_vllm_mapper)
        self.ledger = loader.ledger
        return loaded
