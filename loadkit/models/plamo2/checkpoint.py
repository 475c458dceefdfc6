"""The Plamo2-like checkpoint side: ``make_checkpoint`` (checkpoint spelling, exactly
representable values) and ``config_from_checkpoint`` (the sizes read back from a header, for
``loadkit inspect``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from typing import TYPE_CHECKING

import torch

from loadkit.models._common import HeaderShapes
from loadkit.models.dyadic import dyadic_uniform, round_once
from loadkit.models.plamo2.config import Plamo2Config
from loadkit.models.plamo2.model import RENAMES, Plamo2ForCausalLM, rename

if TYPE_CHECKING:
    from loadkit.checkpoint.reader import TensorInfo

# --- checkpoints ----------------------------------------------------------------------------------

# Checkpoint name of each model parameter that the renames touch: the inverse of RENAMES.
_CHECKPOINT_SPELLING = {new: old for old, new in RENAMES.items()}


def checkpoint_name(param_name: str) -> str:
    """The checkpoint key a model parameter is stored under (``.A`` -> ``.A_log``, ...)."""
    for new, old in _CHECKPOINT_SPELLING.items():
        if param_name.endswith(new):
            return param_name[: -len(new)] + old
    return param_name


def make_checkpoint(
    config: Plamo2Config,
    seed: int = 0,
    *,
    include_lm_head: bool | None = None,
    include_rotary: bool = False,
) -> dict[str, torch.Tensor]:
    """A checkpoint with checkpoint-side names, in model order (float32, seeded).

    ``lm_head.weight`` is included when the config is untied (``include_lm_head`` overrides: a
    tied checkpoint that still carries it is how the overwrite pitfall shows). Every value lies
    on a dyadic grid (``loadkit.models.dyadic``), the same bits on every machine. Norm weights
    are multiples of 1/256 in [-0.25, 0.25]: adding 1.0 to them is exact in float32, so a missing
    or extra offset shows as exactly 1.0; other weights are multiples of 1/256 in [-1, 1].
    ``include_rotary`` adds a ``rotary_emb.inv_freq`` per attention layer, as some older exports
    carry.

    Args:
        config: the model's sizes; ``config.tie_word_embeddings`` decides ``lm_head.weight``.
        seed: fixes every value.
        include_lm_head: force ``lm_head.weight`` in (or out).
        include_rotary: add the rotary buffers some exports carry.

    Returns:
        ``{checkpoint name: tensor}`` in model order.

    >>> ckpt = make_checkpoint(Plamo2Config(tie_word_embeddings=True))
    >>> "lm_head.weight" in ckpt, "model.layers.layers.0.mixer.A_log" in ckpt
    (False, True)
    """
    with torch.device("meta"):
        shapes = Plamo2ForCausalLM(config).named_parameters()
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, p in shapes:
        if name.endswith("norm.weight"):
            value = dyadic_uniform(p.shape, gen, half_range=0.25, steps=64)
        else:
            value = dyadic_uniform(p.shape, gen, half_range=1.0, steps=256)
        out[checkpoint_name(name)] = value
        if include_rotary and name.endswith("mixer.qkv_proj.weight"):
            head = config.hidden_size_per_head
            inv = [Decimal(10000) ** Decimal(-i / head) for i in range(0, head, 2)]
            out[name.replace("qkv_proj.weight", "rotary_emb.inv_freq")] = round_once(
                inv, torch.float32
            )
    if include_lm_head is None:
        include_lm_head = not config.tie_word_embeddings
    if include_lm_head and "lm_head.weight" not in out:
        shape = (config.vocab_size, config.hidden_size)
        out["lm_head.weight"] = dyadic_uniform(shape, gen, half_range=1.0, steps=256)
    elif not include_lm_head:
        out.pop("lm_head.weight", None)
    return out


# --- a config from a checkpoint header (for `loadkit inspect --model plamo2`) --------------------

_LAYER = re.compile(r"^model\.layers\.layers\.(\d+)\.")


def config_from_checkpoint(tensors: Mapping[str, TensorInfo]) -> Plamo2Config:
    """Infer a ``Plamo2Config`` from checkpoint names and shapes alone (no tensor data).

    Accepts checkpoint spelling (``A_log``, ``B_norm_weight``, ...) and model spelling. Tying is
    inferred from the absence of ``lm_head.weight``. Raises ``CheckpointError`` naming the key
    when something needed is missing or the layer pattern matches no ``mamba_step``.
    """
    by_name = {rename(k): v for k, v in tensors.items()}
    header = HeaderShapes(by_name, "a Plamo2 checkpoint")
    shape = header.shape

    vocab, hidden = shape("model.embed_tokens.weight")
    layers = header.indices(_LAYER)
    if not layers or layers != list(range(len(layers))):
        header.fail("model.layers.layers.0", f"layer indices {layers} are not 0..n-1")
    mamba = [f"model.layers.layers.{i}.mixer.A" in by_name for i in layers]
    n = len(layers)
    # The smallest mamba_step that reproduces the pattern. Only a few can: with the first
    # attention layer at a, either step // 2 == a, or the layers are so few (n <= step // 2)
    # that only the last one attends, as for every step from 2n on. Trying just those keeps
    # this linear in the layers (trying every step was quadratic).
    first = mamba.index(False) if False in mamba else n
    step = next(
        (
            s
            for s in sorted({2 * first, 2 * first + 1, 2 * n} & set(range(2, 2 * n + 3)))
            if [Plamo2Config(num_hidden_layers=n, mamba_step=s).is_mamba(i) for i in layers]
            == mamba
        ),
        None,
    )
    if step is None:
        header.fail(
            "model.layers.layers.*.mixer",
            f"mixer pattern {['mamba' if m else 'attention' for m in mamba]} fits no mamba_step",
        )
    kw: dict[str, int] = {}
    if any(mamba):
        p = f"model.layers.layers.{mamba.index(True)}.mixer."
        (heads,) = shape(p + "A")
        inner, _, conv = shape(p + "conv1d.weight")
        kw.update(
            mamba_num_heads=heads,
            hidden_size_per_head=inner // heads,
            mamba_d_conv=conv,
            mamba_d_state=shape(p + "B_norm.weight")[0],
            time_step_rank=shape(p + "dt_norm.weight")[0],
        )
    if not all(mamba):
        p = f"model.layers.layers.{mamba.index(False)}.mixer."
        nh, head_dim = shape(p + "q_norm.weight")
        kw.update(
            num_attention_heads=nh,
            num_key_value_heads=shape(p + "k_norm.weight")[0],
            hidden_size_per_head=head_dim,
        )
    inter = shape("model.layers.layers.0.mlp.down_proj.weight")[1]
    return Plamo2Config(
        hidden_size=hidden,
        num_hidden_layers=n,
        vocab_size=vocab,
        tie_word_embeddings="lm_head.weight" not in by_name,
        mamba_step=step,
        intermediate_size=inter,
        **kw,
    )
