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
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from loadkit.checkpoint.dtypes import torch_name
from loadkit.errors import CheckpointError, LoadkitError
from loadkit.loading.auto_loader import AutoWeightsLoader
from loadkit.loading.weight_loaders import (
    composed_weight_loader,
    default_weight_loader,
    set_weight_attrs,
)
from loadkit.mapper import WeightsMapper
from loadkit.models._common import HeaderShapes, RMSNorm, packed_weight_loader, shard_rows
from loadkit.models.dyadic import (
    draw_integers,
    dyadic_uniform,
    ln,
    round_once,
    softplus_inverse,
)
from loadkit.vocab import check_behaviour

if TYPE_CHECKING:
    from loadkit.checkpoint.reader import TensorInfo

# Checkpoint orders of a mamba mixer's per-head parameters. "d-last" is upstream's (and a
# trainer's parameter order in RL); "shuffled" shuffles every layer's keys with its own seed.
ORDERS = ("d-last", "d-first", "shuffled")
_HEAD_ORDER = {"d-last": ("A_log", "dt_bias", "D"), "d-first": ("D", "A_log", "dt_bias")}
LAYER_KINDS = {"M": "mamba", "-": "mlp", "*": "attention"}


@dataclass
class NemotronHConfig:
    """Sizes of the model; the defaults make a tiny hybrid with 4 heads per mamba mixer."""

    vocab_size: int = 64
    hidden_size: int = 16
    hybrid_override_pattern: str = "MM*-M-M"  # M mamba, - MLP, * attention
    mamba_num_heads: int = 4
    mamba_head_dim: int = 4
    n_groups: int = 1
    ssm_state_size: int = 4
    conv_kernel: int = 4
    use_conv_bias: bool = True
    intermediate_size: int = 32
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 8
    layer_norm_epsilon: float = 1e-5
    dtype: str = "float32"

    def __post_init__(self) -> None:
        bad = sorted(set(self.hybrid_override_pattern) - set(LAYER_KINDS))
        if bad:
            raise LoadkitError(f"hybrid_override_pattern has unknown layer kinds {bad}")
        if self.mamba_num_heads % self.n_groups:
            raise LoadkitError("mamba_num_heads must be a multiple of n_groups")

    @property
    def num_hidden_layers(self) -> int:
        return len(self.hybrid_override_pattern)

    @property
    def mamba_intermediate(self) -> int:
        return self.mamba_num_heads * self.mamba_head_dim

    @property
    def conv_dim(self) -> int:
        return self.mamba_intermediate + 2 * self.n_groups * self.ssm_state_size

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


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


# --- checkpoints -------------------------------------------------------------------------------


def _pow2_near(x: float) -> float:
    return 2.0 ** round(math.log2(x))


def _around_one(n: int, g: torch.Generator) -> torch.Tensor:
    # 1 + k/128, |k| <= 16: exact even in bfloat16, whose spacing at 1 is 1/128.
    return 1 + dyadic_uniform((n,), g, half_range=0.125, steps=16)


# Per-head values are drawn on grids and stored through one rounding (loadkit.models.dyadic):
# A = -a for an integer a in [1, 16], dt = softplus(dt_bias) = k / 1024 for k in [1, 102].
A_RANGE = (1, 16)
DT_GRID = 1024
DT_STEPS = (1, 102)


def _layer_tensors(c: NemotronHConfig, kind: str, g: torch.Generator) -> dict[str, torch.Tensor]:
    def spread(*shape: int, std: float) -> torch.Tensor:
        # Uniform on a dyadic grid, its half-range the power of two nearest std * sqrt(3).
        return dyadic_uniform(shape, g, half_range=_pow2_near(std * math.sqrt(3)))

    H = c.hidden_size
    out = {"norm.weight": _around_one(H, g)}
    if kind == "M":
        heads, inner = c.mamba_num_heads, c.mamba_intermediate
        a = draw_integers(g, heads, *A_RANGE)
        dt = [k / DT_GRID for k in draw_integers(g, heads, *DT_STEPS)]
        out |= {
            "mixer.in_proj.weight": spread(inner + c.conv_dim + heads, H, std=H**-0.5),
            "mixer.conv1d.weight": spread(c.conv_dim, 1, c.conv_kernel, std=c.conv_kernel**-0.5),
            "mixer.A_log": round_once(map(ln, a), torch.float32),  # -exp(A_log) == -a
            "mixer.dt_bias": round_once(map(softplus_inverse, dt), c.torch_dtype),
            "mixer.D": _around_one(heads, g),
            "mixer.norm.weight": _around_one(inner, g),
            "mixer.out_proj.weight": spread(H, inner, std=inner**-0.5),
        }
        if c.use_conv_bias:
            out["mixer.conv1d.bias"] = spread(c.conv_dim, std=0.1)
        first = ["norm.weight", "mixer.in_proj.weight", "mixer.conv1d.weight"]
        first += ["mixer.conv1d.bias"] if c.use_conv_bias else []
        out = {k: out[k] for k in first} | {k: v for k, v in out.items() if k not in first}
    elif kind == "-":
        out |= {
            "mixer.up_proj.weight": spread(c.intermediate_size, H, std=H**-0.5),
            "mixer.down_proj.weight": spread(H, c.intermediate_size, std=c.intermediate_size**-0.5),
        }
    else:
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        out |= {
            "mixer.q_proj.weight": spread(q, H, std=H**-0.5),
            "mixer.k_proj.weight": spread(kv, H, std=H**-0.5),
            "mixer.v_proj.weight": spread(kv, H, std=H**-0.5),
            "mixer.o_proj.weight": spread(H, q, std=q**-0.5),
        }
    return out


def _ordered(keys: list[str], order: str, rng: random.Random) -> list[str]:
    if order == "shuffled":
        keys = list(keys)
        rng.shuffle(keys)
        return keys
    heads = [f"mixer.{n}" for n in _HEAD_ORDER[order]]
    if heads[0] not in keys:
        return keys
    rest = [k for k in keys if k not in heads]
    at = rest.index("mixer.norm.weight")  # after conv1d, before the gated norm
    return rest[:at] + heads + rest[at:]


def make_checkpoint(
    config: NemotronHConfig | None = None, seed: int = 0, order: str = "d-last"
) -> dict[str, torch.Tensor]:
    """A checkpoint with Hugging Face names, its values fixed by ``seed``, keys in ``order``.

    ``order`` (one of ``ORDERS``) changes only the key order, never a value: the same seed gives
    the same tensors in every order. ``"shuffled"`` shuffles each layer's keys with a generator
    seeded by ``seed`` and the layer index; layers stay in sequence.

    Every value is the same bits on every machine (``loadkit.models.dyadic``): weights and norms
    lie on dyadic grids; ``-exp(A_log)`` is an integer in ``A_RANGE`` and
    ``softplus(dt_bias)`` a multiple of ``1 / DT_GRID``, each up to one rounding.
    """
    c = config or NemotronHConfig()
    check_behaviour(order, ORDERS, what="order")
    g = torch.Generator().manual_seed(seed)
    dtype = c.torch_dtype
    out: dict[str, torch.Tensor] = {
        "backbone.embeddings.weight": dyadic_uniform((c.vocab_size, c.hidden_size), g, half_range=2)
    }
    for i, kind in enumerate(c.hybrid_override_pattern):
        tensors = _layer_tensors(c, kind, g)
        for key in _ordered(list(tensors), order, random.Random(f"{seed}:{i}")):
            out[f"backbone.layers.{i}.{key}"] = tensors[key]
    out["backbone.norm_f.weight"] = _around_one(c.hidden_size, g)
    out["lm_head.weight"] = dyadic_uniform((c.vocab_size, c.hidden_size), g, half_range=0.5)
    return {k: (v if k.endswith("A_log") else v.to(dtype)).contiguous() for k, v in out.items()}


# --- sizes from a checkpoint header --------------------------------------------------------------

_LAYER_KEY = re.compile(r"^(?:backbone\.|model\.)?layers\.(\d+)\.(.+)$")


def config_from_checkpoint(tensors: Mapping[str, TensorInfo]) -> NemotronHConfig:
    """Infer a config whose model has exactly the checkpoint's shapes (header only, no data).

    Accepts Hugging Face names (``backbone.*``) or model names (``model.*``). Splits that shapes
    do not record are chosen to reproduce every shape: one group of SSM state, and an attention
    head size of gcd(q rows, k rows).
    """
    if not tensors:
        raise CheckpointError("<empty>", "checkpoint holds no tensors")
    file = next(iter(tensors.values())).file
    header = HeaderShapes(tensors, "a NemotronH checkpoint")
    names = ("embeddings.weight", "embed_tokens.weight")
    embed = header.info(*(p + n for n in names for p in ("", "backbone.", "model.")))
    vocab, hidden = embed.shape
    layers: dict[int, dict[str, TensorInfo]] = {}
    for name, info in tensors.items():
        m = _LAYER_KEY.match(name)
        if m:
            layers.setdefault(int(m.group(1)), {})[m.group(2)] = info
    if sorted(layers) != list(range(len(layers))):
        raise CheckpointError(file, f"layer indices {sorted(layers)} are not 0..n-1", "layers")
    fields: dict[str, object] = {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "dtype": torch_name(embed.dtype),
    }
    pattern = "".join(_infer_layer(i, layers[i], hidden, file, fields) for i in sorted(layers))
    return NemotronHConfig(hybrid_override_pattern=pattern, **fields)  # type: ignore[arg-type]


def _set(fields: dict[str, object], key: str, value: int, file: str, where: str) -> None:
    if fields.setdefault(key, value) != value:
        raise CheckpointError(
            file, f"implies {key}={value}, but another layer implies {fields[key]}", where
        )


def _infer_layer(
    i: int, keys: dict[str, TensorInfo], hidden: int, file: str, fields: dict[str, object]
) -> str:
    where = f"layers.{i}"

    def need(key: str) -> TensorInfo:
        if key not in keys:
            raise CheckpointError(file, f"missing: layer {i} has {sorted(keys)}", f"{where}.{key}")
        return keys[key]

    a = keys.get("mixer.A_log") or keys.get("mixer.A")
    if a is not None:
        heads = a.shape[0]
        inner = need("mixer.norm.weight").shape[0]
        conv = need("mixer.conv1d.weight")
        conv_dim, kernel = conv.shape[0], conv.shape[-1]
        rows = need("mixer.in_proj.weight").shape[0]
        if inner % heads or (conv_dim - inner) % 2 or rows != inner + conv_dim + heads:
            raise CheckpointError(
                file,
                f"mamba shapes do not fit together: A {list(a.shape)}, norm [{inner}], "
                f"conv1d {list(conv.shape)}, in_proj rows {rows}",
                where,
            )
        for key, value in (
            ("mamba_num_heads", heads),
            ("mamba_head_dim", inner // heads),
            ("ssm_state_size", (conv_dim - inner) // 2),
            ("conv_kernel", kernel),
        ):
            _set(fields, key, value, file, where)
        fields["n_groups"] = 1
        fields["use_conv_bias"] = "mixer.conv1d.bias" in keys
        return "M"
    if "mixer.up_proj.weight" in keys:
        _set(fields, "intermediate_size", keys["mixer.up_proj.weight"].shape[0], file, where)
        return "-"
    if "mixer.o_proj.weight" in keys:
        q = keys["mixer.o_proj.weight"].shape[1]
        if "mixer.k_proj.weight" in keys:
            kv = keys["mixer.k_proj.weight"].shape[0]
        else:
            kv = (need("mixer.qkv_proj.weight").shape[0] - q) // 2
        hd = math.gcd(q, kv)
        _set(fields, "head_dim", hd, file, where)
        _set(fields, "num_attention_heads", q // hd, file, where)
        _set(fields, "num_key_value_heads", kv // hd, file, where)
        return "*"
    raise CheckpointError(file, f"cannot tell the layer kind from its keys {sorted(keys)}", where)
