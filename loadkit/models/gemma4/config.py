"""The Gemma4-like model's sizes (``Gemma4Config``, ``full_scale_config``) and where its text model
lives on each side (``TEXT_CKPT`` in the checkpoint, ``TEXT_PARAM`` in the model)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from loadkit.checkpoint.dtypes import torch_names
from loadkit.errors import LoadkitError

TEXT_CKPT = "model.language_model."
TEXT_PARAM = "language_model.model."
TOWERS = ("vision_tower", "audio_tower")


@dataclass(frozen=True)
class Gemma4Config:
    """Sizes of a Gemma4-like model. Towers (vision, audio) are off unless given layers."""

    num_hidden_layers: int = 4
    hidden_size: int = 32
    intermediate_size: int = 64
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 16
    vocab_size: int = 128
    hidden_size_per_layer_input: int = 8  # per-layer embeddings (PLE); 0 turns them off
    vocab_size_per_layer_input: int = 128
    double_wide_mlp_layers: int = 0  # the last n layers have twice the intermediate size
    vision_layers: int = 0
    vision_hidden_size: int = 0
    vision_intermediate_size: int = 0
    audio_layers: int = 0
    audio_hidden_size: int = 0
    audio_intermediate_size: int = 0
    packing_in_mapper: bool = False  # put the q/k/v, gate/up packing rules in hf_to_vllm_mapper
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type == "int" and (not isinstance(v, int) or v < 0):
                raise LoadkitError(f"Gemma4Config.{f.name} must be a non-negative int, not {v!r}")
        for name in ("num_hidden_layers", "hidden_size", "intermediate_size", "head_dim"):
            if getattr(self, name) == 0:
                raise LoadkitError(f"Gemma4Config.{name} must be positive")
        if self.num_attention_heads == 0 or self.num_key_value_heads == 0:
            raise LoadkitError("Gemma4Config needs at least one attention and one key/value head")
        if self.double_wide_mlp_layers > self.num_hidden_layers:
            raise LoadkitError(
                f"Gemma4Config.double_wide_mlp_layers={self.double_wide_mlp_layers} exceeds "
                f"num_hidden_layers={self.num_hidden_layers}"
            )
        for tower in ("vision", "audio"):
            if getattr(self, f"{tower}_layers") and not (
                getattr(self, f"{tower}_hidden_size")
                and getattr(self, f"{tower}_intermediate_size")
            ):
                raise LoadkitError(
                    f"Gemma4Config: a {tower} tower needs hidden and intermediate sizes"
                )
        if self.dtype not in torch_names():
            raise LoadkitError(f"Gemma4Config.dtype {self.dtype!r} is not one of {torch_names()}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def layer_intermediate_size(self, i: int) -> int:
        wide = i >= self.num_hidden_layers - self.double_wide_mlp_layers
        return self.intermediate_size * (2 if wide else 1)

    def towers(self) -> list[tuple[str, int, int, int]]:
        """(name, layers, hidden, intermediate) of each tower present."""
        out = []
        for name in TOWERS:
            kind = name.split("_")[0]
            n = getattr(self, f"{kind}_layers")
            if n:
                hid = getattr(self, f"{kind}_hidden_size")
                out.append((name, n, hid, getattr(self, f"{kind}_intermediate_size")))
        return out


def full_scale_config(num_hidden_layers: int = 35) -> Gemma4Config:
    """An approximation of the upstream Gemma4-E2B checkpoint, for the meta device.

    The text model follows E2B's published sizes (35 layers, hidden 1536, per-layer embeddings
    of 256 over a 262144 vocabulary, double-wide MLPs in the 20 KV-shared layers). The vision
    and audio towers are generic encoder blocks sized so that the totals come out near the
    upstream report (2011 tensors, 9.543 GiB): counts and bytes are close, names are not.
    """
    return Gemma4Config(
        num_hidden_layers=num_hidden_layers,
        hidden_size=1536,
        intermediate_size=6144,
        num_attention_heads=8,
        num_key_value_heads=1,
        head_dim=256,
        vocab_size=262144,
        hidden_size_per_layer_input=256,
        vocab_size_per_layer_input=262144,
        double_wide_mlp_layers=min(20, num_hidden_layers),
        vision_layers=27,
        vision_hidden_size=1152,
        vision_intermediate_size=4304,
        audio_layers=61,
        audio_hidden_size=384,
        audio_intermediate_size=1536,
    )


LAYER_NORMS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)
