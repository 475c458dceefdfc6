"""The NemotronH-like checkpoint side: ``make_checkpoint`` in each of ``ORDERS`` (exactly
representable values) and ``config_from_checkpoint`` (sizes from a header)."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from loadkit.checkpoint.dtypes import torch_name
from loadkit.errors import CheckpointError
from loadkit.models._common import HeaderShapes
from loadkit.models.dyadic import (
    draw_integers,
    dyadic_uniform,
    ln,
    round_once,
    softplus_inverse,
)
from loadkit.models.nemotron_h.config import NemotronHConfig
from loadkit.terms import check_behaviour

if TYPE_CHECKING:
    from loadkit.checkpoint.reader import TensorInfo

# Checkpoint orders of a mamba mixer's per-head parameters. "d-last" is upstream's (and a
# trainer's parameter order in RL); "shuffled" shuffles every layer's keys with its own seed.
ORDERS = ("d-last", "d-first", "shuffled")
_HEAD_ORDER = {"d-last": ("A_log", "dt_bias", "D"), "d-first": ("D", "A_log", "dt_bias")}


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
