"""The NemotronH/Mamba2-like modules: mamba mixers (``A`` loaded as ``-exp(A_log)``), MLPs and
attention, with a small honest forward."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from loadkit.loading.auto_loader import AutoWeightsLoader
from loadkit.loading.weight_loaders import (
    composed_weight_loader,
    default_weight_loader,
    set_weight_attrs,
)
from loadkit.mapper import WeightsMapper
from loadkit.models._common import RMSNorm, packed_weight_loader, shard_rows
from loadkit.models.nemotron_h.config import NemotronHConfig

if TYPE_CHECKING:
    pass


def _linear(n_in: int, n_out: int, dtype: torch.dtype) -> nn.Linear:
    return nn.Linear(n_in, n_out, bias=False, dtype=dtype)


class MambaMixer2(nn.Module):
    """Mamba2 mixer. Direct parameters: ``A``, ``D``, ``dt_bias`` (one per head)."""

    def __init__(self, c: NemotronHConfig) -> None:
        super().__init__()
        self.c = c
        dt, heads, inner = c.torch_dtype, c.mamba_num_heads, c.mamba_intermediate
        self.in_proj = _linear(c.hidden_size, inner + c.conv_dim + heads, dt)
        self.conv1d = nn.Conv1d(
            c.conv_dim, c.conv_dim, c.conv_kernel, groups=c.conv_dim, bias=c.use_conv_bias, dtype=dt
        )
        # Upstream keeps A in float32 whatever the model dtype.
        self.A = nn.Parameter(torch.empty(heads, dtype=torch.float32), requires_grad=False)
        self.D = nn.Parameter(torch.ones(heads, dtype=dt), requires_grad=False)
        self.dt_bias = nn.Parameter(torch.ones(heads, dtype=dt), requires_grad=False)
        self.norm = RMSNorm(inner, eps=c.layer_norm_epsilon, dtype=dt)  # gated: see forward
        self.out_proj = _linear(inner, c.hidden_size, dt)
        self._attach_loaders()

    def _attach_loaders(self) -> None:
        a_loader = composed_weight_loader(default_weight_loader, lambda a: -torch.exp(a.float()))
        set_weight_attrs(self.A, {"weight_loader": a_loader})

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> nn.Module:
        # Moving off meta (to_empty) makes new Parameter objects without our attributes.
        out = super()._apply(fn, recurse)
        self._attach_loaders()
        return out

    def scan(self, x: torch.Tensor, dt: torch.Tensor, B: torch.Tensor, C: torch.Tensor):
        """The Mamba2 recurrence h_t = exp(dt_t A) h_(t-1) + dt_t x_t B_t, y_t = C_t h_t."""
        c = self.c
        per_group = c.mamba_num_heads // c.n_groups
        B = B.repeat_interleave(per_group, dim=1)  # [T, heads, N]
        C = C.repeat_interleave(per_group, dim=1)
        h = x.new_zeros(c.mamba_num_heads, c.mamba_head_dim, c.ssm_state_size)
        ys = []
        for t in range(x.shape[0]):
            decay = torch.exp(dt[t] * self.A)[:, None, None]
            h = decay * h + (dt[t][:, None] * x[t])[:, :, None] * B[t][:, None, :]
            ys.append((h * C[t][:, None, :]).sum(-1))
        return torch.stack(ys)  # [T, heads, head_dim]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        c, T = self.c, hidden.shape[0]
        inner, gn = c.mamba_intermediate, c.n_groups * c.ssm_state_size
        z, xbc, dt = self.in_proj(hidden).split([inner, c.conv_dim, c.mamba_num_heads], dim=-1)
        xbc = self.conv1d(F.pad(xbc.T[None], (c.conv_kernel - 1, 0)))[0].T  # causal
        x, B, C = F.silu(xbc).split([inner, gn, gn], dim=-1)
        x = x.reshape(T, c.mamba_num_heads, c.mamba_head_dim)
        dt = F.softplus(dt + self.dt_bias)
        B = B.reshape(T, c.n_groups, c.ssm_state_size)
        C = C.reshape(T, c.n_groups, c.ssm_state_size)
        y = self.scan(x, dt, B, C) + self.D[:, None] * x  # the D skip term
        y = self.norm(y.reshape(T, inner) * F.silu(z))
        return self.out_proj(y)


class NemotronHMLP(nn.Module):
    def __init__(self, c: NemotronHConfig) -> None:
        super().__init__()
        self.up_proj = _linear(c.hidden_size, c.intermediate_size, c.torch_dtype)
        self.down_proj = _linear(c.intermediate_size, c.hidden_size, c.torch_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.relu(self.up_proj(x)).square())


class NemotronHAttention(nn.Module):
    """Causal attention with a packed ``qkv_proj`` filled by three shard loads (q, k, v)."""

    def __init__(self, c: NemotronHConfig, prefix: str = "mixer") -> None:
        super().__init__()
        self.c = c
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        self.shards = shard_rows({"q": q, "k": kv, "v": kv})
        self.qkv_proj = _linear(c.hidden_size, q + 2 * kv, c.torch_dtype)
        self.o_proj = _linear(q, c.hidden_size, c.torch_dtype)
        self._loader = packed_weight_loader(f"{prefix}.qkv_proj.weight", self.shards)
        self._attach_loaders()

    def _attach_loaders(self) -> None:
        # One packed loader (q, k, v by shard id), as every built-in model's packed parameters.
        set_weight_attrs(self.qkv_proj.weight, {"weight_loader": self._loader})

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> nn.Module:
        out = super()._apply(fn, recurse)
        self._attach_loaders()
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c, T = self.c, x.shape[0]
        q, k, v = self.qkv_proj(x).split([s for _, s in self.shards.values()], dim=-1)
        q = q.reshape(T, c.num_attention_heads, c.head_dim).transpose(0, 1)
        rep = c.num_attention_heads // c.num_key_value_heads
        k = k.reshape(T, c.num_key_value_heads, c.head_dim).transpose(0, 1)
        v = v.reshape(T, c.num_key_value_heads, c.head_dim).transpose(0, 1)
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(0, 1).reshape(T, -1))


_MIXERS = {"M": MambaMixer2, "-": NemotronHMLP, "*": NemotronHAttention}


class NemotronHBlock(nn.Module):
    def __init__(self, c: NemotronHConfig, kind: str, prefix: str = "layer") -> None:
        super().__init__()
        self.norm = RMSNorm(c.hidden_size, eps=c.layer_norm_epsilon, dtype=c.torch_dtype)
        self.mixer = NemotronHAttention(c, f"{prefix}.mixer") if kind == "*" else _MIXERS[kind](c)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.mixer(self.norm(h))


class NemotronHModel(nn.Module):
    def __init__(self, c: NemotronHConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size, dtype=c.torch_dtype)
        self.layers = nn.ModuleList(
            NemotronHBlock(c, k, f"model.layers.{i}")
            for i, k in enumerate(c.hybrid_override_pattern)
        )
        self.norm_f = RMSNorm(c.hidden_size, eps=c.layer_norm_epsilon, dtype=c.torch_dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer(h)
        return self.norm_f(h)


class NemotronHForCausalLM(nn.Module):
    """The model; ``load_weights`` takes Hugging Face checkpoint names.

    Each mamba mixer's ``A`` loads from ``A_log`` through ``composed_weight_loader`` (as
    ``-exp``), and its ``A``, ``dt_bias`` and ``D`` have equal sizes; q/k/v pack into ``qkv_proj``.

    >>> from loadkit import open_checkpoint
    >>> from loadkit.models.nemotron_h.checkpoint import config_from_checkpoint
    >>> ck = open_checkpoint("data/nemotron_h/initial.safetensors")
    >>> model = NemotronHForCausalLM(config_from_checkpoint(ck.tensors))
    >>> len(ck.tensors), len(model.load_weights(ck.weights()))  # q, k, v -> one qkv_proj
    (50, 48)
    """

    hf_to_vllm_mapper = WeightsMapper(
        orig_to_new_prefix={"backbone": "model", "mtp": None},
        orig_to_new_substr={"A_log": "A", "embeddings": "embed_tokens"},
        orig_to_new_stacked={
            ".q_proj": (".qkv_proj", "q"),
            ".k_proj": (".qkv_proj", "k"),
            ".v_proj": (".qkv_proj", "v"),
        },
    )

    def __init__(self, config: NemotronHConfig | None = None) -> None:
        super().__init__()
        self.config = config or NemotronHConfig()
        self.model = NemotronHModel(self.config)
        self.lm_head = _linear(
            self.config.hidden_size, self.config.vocab_size, self.config.torch_dtype
        )

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits ``[tokens, vocab]`` for one sequence of token ids."""
        return self.lm_head(self.model(input_ids))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)
