"""A SigLIP-like vision tower whose attention packs q, k and v into one ``qkv_proj`` (bug 5).

The layout is that of the vision towers MiniCPM-V and Idefics2 load in vLLM: parameters
``vision_model.embeddings.{patch_embedding,position_embedding}.*``,
``vision_model.encoder.layers.{i}.{layer_norm1,layer_norm2}.*``,
``vision_model.encoder.layers.{i}.self_attn.{qkv_proj,out_proj}.*``,
``vision_model.encoder.layers.{i}.mlp.{fc1,fc2}.*`` and ``vision_model.post_layernorm.*``. The
checkpoint has ``q_proj``, ``k_proj`` and ``v_proj`` apart; a stacked ``WeightsMapper`` rule names
the packed ``qkv_proj`` and tags each tensor with its shard, and ``QKVParallelLinear``'s
``weight_loader`` places it (at ``tp=1`` here: no process group needed).

``QKV_RULES`` are the bare-name rules vLLM PR #47058 gave MiniCPM-V 4.6's ViT attention. Under
vLLM 0.28.0's stacked stage (``WeightsMapper``'s default, ``behaviour="old"``) ``q_proj`` becomes
``qkv_proj`` and then ``v_proj`` matches inside it: ``qkqkv_proj``, and the load fails as
upstream's did (issues #48423, #48449). With ``behaviour="new"`` the same rules load exactly.

>>> from loadkit import AutoWeightsLoader, WeightsMapper
>>> config = VisionTowerConfig()  # the committed data/vision_tower checkpoint's
>>> model = VisionTower(config)
>>> new = WeightsMapper(orig_to_new_stacked=QKV_RULES, behaviour="new")
>>> len(AutoWeightsLoader(model).load_weights(make_checkpoint(config).items(), mapper=new))
29
"""

from __future__ import annotations

import dataclasses
import math
import re
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.nn.functional as F
from torch import nn

from loadkit.checkpoint.reader import TensorInfo
from loadkit.errors import CheckpointError, LoadkitError
from loadkit.loading.auto_loader import AutoWeightsLoader
from loadkit.mapper import WeightsMapper
from loadkit.parallel.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear

PREFIX = "vision_model."

# vLLM PR #47058's rules for MiniCPM-V 4.6's ViT attention: bare component names, q, k, v.
QKV_RULES = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v")}
SHARDS = ("q", "k", "v")


@dataclass(frozen=True)
class VisionTowerConfig:
    """Sizes of the tower. The defaults make the committed 2-layer checkpoint.

    The head count shapes no tensor (q, k and v are ``hidden x hidden`` whatever it is), so a
    checkpoint's header cannot tell it: ``config_from_checkpoint`` keeps the default.
    """

    hidden_size: int = 16
    num_attention_heads: int = 2
    intermediate_size: int = 32
    num_hidden_layers: int = 2
    num_channels: int = 3
    patch_size: int = 2
    image_size: int = 4
    layer_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type == "int" and (not isinstance(v, int) or v <= 0):
                raise LoadkitError(f"VisionTowerConfig.{f.name} must be a positive int, not {v!r}")
        if self.hidden_size % self.num_attention_heads:
            raise LoadkitError(
                f"VisionTowerConfig: hidden_size {self.hidden_size} is not divisible by "
                f"{self.num_attention_heads} heads"
            )
        if self.image_size % self.patch_size:
            raise LoadkitError(
                f"VisionTowerConfig: image_size {self.image_size} is not a multiple of "
                f"patch_size {self.patch_size}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


# --- the checkpoint side -------------------------------------------------------------------------


def checkpoint_layout(config: VisionTowerConfig) -> list[tuple[str, tuple[int, ...]]]:
    """Checkpoint names and shapes (q, k, v apart), sorted by name as safetensors files are."""
    c, h = config, config.hidden_size
    out: dict[str, tuple[int, ...]] = {
        f"{PREFIX}embeddings.patch_embedding.weight": (
            h,
            c.num_channels,
            c.patch_size,
            c.patch_size,
        ),
        f"{PREFIX}embeddings.patch_embedding.bias": (h,),
        f"{PREFIX}embeddings.position_embedding.weight": (c.num_patches, h),
        f"{PREFIX}post_layernorm.weight": (h,),
        f"{PREFIX}post_layernorm.bias": (h,),
    }
    for i in range(c.num_hidden_layers):
        p = f"{PREFIX}encoder.layers.{i}."
        for norm in ("layer_norm1", "layer_norm2"):
            out |= {f"{p}{norm}.weight": (h,), f"{p}{norm}.bias": (h,)}
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            out |= {f"{p}self_attn.{proj}.weight": (h, h), f"{p}self_attn.{proj}.bias": (h,)}
        out |= {
            f"{p}mlp.fc1.weight": (c.intermediate_size, h),
            f"{p}mlp.fc1.bias": (c.intermediate_size,),
            f"{p}mlp.fc2.weight": (h, c.intermediate_size),
            f"{p}mlp.fc2.bias": (h,),
        }
    return sorted(out.items())


def tensor_values(seed: int, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Seeded, exactly representable values, never zero: ``±k/16`` (``1 ± k/16`` for norm
    weights), ``k`` in 1..4, seeded by name. No zero, so a row left unloaded (zeros) is never
    mistaken for a checkpoint row."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    size = torch.randint(1, 5, shape, generator=g, dtype=torch.int32)
    sign = torch.randint(0, 2, shape, generator=g, dtype=torch.int32) * 2 - 1
    values = (size * sign).to(torch.float32) / 16
    if "norm" in name and name.endswith(".weight"):
        return 1 + values
    return values


def make_checkpoint(config: VisionTowerConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Checkpoint-side tensors (names as on disk), in file order."""
    return {name: tensor_values(seed, name, shape) for name, shape in checkpoint_layout(config)}


def config_from_checkpoint(tensors: Mapping[str, TensorInfo]) -> VisionTowerConfig:
    """The config from a header (``open_checkpoint(p).tensors``): the patch embedding gives the
    width, channels and patch size, the position embedding the image size, ``fc1`` the MLP width.
    """
    file = next((t.file for t in tensors.values()), "<empty checkpoint>")

    def fail(key: str, message: str) -> NoReturn:
        t = tensors.get(key)
        raise CheckpointError(
            t.file if t else file, f"not a vision-tower checkpoint: {message}", key
        )

    def shape(key: str, ndim: int) -> tuple[int, ...]:
        t = tensors.get(key)
        if t is None:
            fail(key, "the key is missing")
        if len(t.shape) != ndim:
            fail(key, f"expected a {ndim}-d tensor, found shape {list(t.shape)}")
        return tuple(t.shape)

    patch_key = f"{PREFIX}embeddings.patch_embedding.weight"
    hidden, channels, patch, _ = shape(patch_key, 4)
    positions, _ = shape(f"{PREFIX}embeddings.position_embedding.weight", 2)
    side = math.isqrt(positions)
    if side * side != positions:
        fail(f"{PREFIX}embeddings.position_embedding.weight", f"{positions} is not a square")
    layer_re = re.compile(re.escape(PREFIX) + r"encoder\.layers\.(\d+)\.")
    layers = sorted({int(m[1]) for k in tensors if (m := layer_re.match(k))})
    if not layers:
        fail(f"{PREFIX}encoder.layers.0.mlp.fc1.weight", "no encoder layers found")
    inter, _ = shape(f"{PREFIX}encoder.layers.0.mlp.fc1.weight", 2)
    heads = VisionTowerConfig.num_attention_heads if hidden % 2 == 0 else 1
    try:
        return VisionTowerConfig(
            hidden_size=hidden,
            num_attention_heads=heads,
            intermediate_size=inter,
            num_hidden_layers=max(layers) + 1,
            num_channels=channels,
            patch_size=patch,
            image_size=side * patch,
        )
    except LoadkitError as exc:
        fail(patch_key, str(exc))


# --- the model side ------------------------------------------------------------------------------


class VisionEmbeddings(nn.Module):
    def __init__(self, c: VisionTowerConfig) -> None:
        super().__init__()
        self.patch_embedding = nn.Conv2d(
            c.num_channels, c.hidden_size, kernel_size=c.patch_size, stride=c.patch_size
        )
        self.position_embedding = nn.Embedding(c.num_patches, c.hidden_size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embedding(pixel_values).flatten(2).transpose(1, 2)  # [B, P, h]
        return patches + self.position_embedding.weight


class VisionAttention(nn.Module):
    """Bidirectional attention over the patches; q, k and v packed in one ``qkv_proj``."""

    def __init__(self, c: VisionTowerConfig, prefix: str) -> None:
        super().__init__()
        self.num_heads, self.head_dim = c.num_attention_heads, c.head_dim
        self.qkv_proj = QKVParallelLinear(
            c.hidden_size, c.head_dim, c.num_attention_heads, prefix=f"{prefix}.qkv_proj"
        )
        self.out_proj = RowParallelLinear(c.hidden_size, c.hidden_size, prefix=f"{prefix}.out_proj")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, P, _ = x.shape
        q, k, v = (
            t.reshape(B, P, self.num_heads, self.head_dim).transpose(1, 2)
            for t in self.qkv_proj.split(self.qkv_proj(x))
        )
        out = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(out.transpose(1, 2).reshape(B, P, -1))


class VisionMLP(nn.Module):
    def __init__(self, c: VisionTowerConfig, prefix: str) -> None:
        super().__init__()
        self.fc1 = ColumnParallelLinear(c.hidden_size, c.intermediate_size, prefix=f"{prefix}.fc1")
        self.fc2 = RowParallelLinear(c.intermediate_size, c.hidden_size, prefix=f"{prefix}.fc2")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class VisionEncoderLayer(nn.Module):
    def __init__(self, c: VisionTowerConfig, prefix: str) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.self_attn = VisionAttention(c, f"{prefix}.self_attn")
        self.layer_norm2 = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.mlp = VisionMLP(c, f"{prefix}.mlp")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class VisionEncoder(nn.Module):
    def __init__(self, c: VisionTowerConfig, prefix: str) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            VisionEncoderLayer(c, f"{prefix}.layers.{i}") for i in range(c.num_hidden_layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class VisionTransformer(nn.Module):
    def __init__(self, c: VisionTowerConfig) -> None:
        super().__init__()
        self.embeddings = VisionEmbeddings(c)
        self.encoder = VisionEncoder(c, f"{PREFIX}encoder")
        self.post_layernorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.post_layernorm(self.encoder(self.embeddings(pixel_values)))


class VisionTower(nn.Module):
    """The tower as a model: ``vision_model`` and the mapper its checkpoint needs.

    ``hf_to_vllm_mapper`` has #47058's rules under vLLM 0.28.0's stacked stage (the mapper's
    default): ``load_weights`` fails on this checkpoint as upstream did. Load with
    ``AutoWeightsLoader(model).load_weights(weights, mapper=...)`` to choose another mapper.

    >>> model = VisionTower()
    >>> tuple(model.vision_model.encoder.layers[0].self_attn.qkv_proj.weight.shape)
    (48, 16)
    """

    hf_to_vllm_mapper = WeightsMapper(orig_to_new_stacked=QKV_RULES)

    def __init__(self, config: VisionTowerConfig | None = None) -> None:
        super().__init__()
        self.config = config or VisionTowerConfig()
        self.vision_model = VisionTransformer(self.config)

    @torch.no_grad()
    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Patch features ``[batch, patches, hidden]`` for images ``[batch, channels, H, W]``."""
        return self.vision_model(pixel_values)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loader = AutoWeightsLoader(self)
        try:
            return loader.load_weights(weights, mapper=self.hf_to_vllm_mapper)
        finally:
            self.ledger = loader.ledger


def qkv_rows(
    model: VisionTower, checkpoint: Mapping[str, torch.Tensor]
) -> dict[str, list[str | None]]:
    """Which checkpoint row each row of every ``qkv_proj.weight`` holds, read from the values.

    ``checkpoint`` is name -> tensor as on disk. Each row of ``...self_attn.qkv_proj.weight`` is
    looked for among the rows of the same layer's ``q_proj``, ``k_proj`` and ``v_proj`` weights:
    the answer is ``"q 3"`` (row 3 of ``q_proj``), or ``None`` for a row equal to none of them
    (left as built, or garbage). The committed checkpoint's rows are all distinct (tested), so
    each answer is the one row it can be.

    >>> model = VisionTower()
    >>> rows = qkv_rows(model, make_checkpoint(model.config))
    >>> rows["vision_model.encoder.layers.0.self_attn.qkv_proj.weight"][:2]  # zeros as built
    [None, None]
    """
    out: dict[str, list[str | None]] = {}
    for name, param in model.named_parameters():
        if not name.endswith(".self_attn.qkv_proj.weight"):
            continue
        layer = name.removesuffix(".qkv_proj.weight")
        sources = [
            (f"{shard} {j}", row)
            for shard in SHARDS
            for j, row in enumerate(checkpoint[f"{layer}.{shard}_proj.weight"])
        ]
        out[name] = [
            next((label for label, source in sources if torch.equal(row, source)), None)
            for row in param.detach()
        ]
    return out
