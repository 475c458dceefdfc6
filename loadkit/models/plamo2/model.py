"""The Plamo2-like modules (upstream names and shapes), the name and tensor conversions both
loaders share, and the two loaders: ``Plamo2Model`` (after the move) and ``Plamo2ForCausalLM``."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from loadkit.errors import (
    LoadkitError,
    ShapeMismatchError,
    UnknownNameError,
)
from loadkit.loading.ledger import LoadLedger, remember
from loadkit.loading.tensors import qualname
from loadkit.loading.weight_loaders import (
    composed_weight_loader,
    default_weight_loader,
    load_param,
    set_weight_attrs,
    weight_source,
)
from loadkit.models._common import RMSNorm
from loadkit.models.plamo2.config import BEHAVIOURS, Plamo2Config
from loadkit.models.plamo2.skips import AutoWeightsLoaderWithSkips
from loadkit.terms import Status, check_behaviour

# --- modules (upstream names and shapes) ----------------------------------------------------------


def _zeros(*shape: int) -> nn.Parameter:
    # Zeros, not random init: deterministic, and a parameter never loaded shows up as all zeros.
    return nn.Parameter(torch.zeros(*shape))


class Linear(nn.Module):
    """A bias-free linear layer: ``weight`` is ``[out, in]``."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = _zeros(out_features, in_features)


class Conv1d(nn.Module):
    """A depthwise causal conv: ``weight`` is ``[channels, 1, kernel]``, the checkpoint's shape."""

    def __init__(self, channels: int, kernel: int) -> None:
        super().__init__()
        self.weight = _zeros(channels, 1, kernel)


class Embedding(nn.Module):
    def __init__(self, num: int, dim: int) -> None:
        super().__init__()
        self.weight = _zeros(num, dim)


class Plamo2MambaMixer(nn.Module):
    def __init__(self, config: Plamo2Config) -> None:
        super().__init__()
        h, inner = config.hidden_size, config.mamba_intermediate_size
        heads, state, rank = config.mamba_num_heads, config.mamba_d_state, config.time_step_rank
        self.conv1d = Conv1d(inner, config.mamba_d_conv)
        self.in_proj = Linear(h, 2 * inner)  # [all gate rows; all hidden-state rows] once loaded
        self.bcdt_proj = Linear(inner, rank + 2 * state)
        self.dt_proj = Linear(rank, heads)
        self.A = _zeros(heads)
        # The checkpoint holds A_log; upstream stores A = -exp(A_log), via a composed loader.
        a_loader = composed_weight_loader(default_weight_loader, lambda a: -torch.exp(a.float()))
        set_weight_attrs(self.A, {"weight_loader": a_loader})
        self.D = _zeros(heads)
        self.dt_bias = _zeros(heads)
        self.out_proj = Linear(inner, h)
        self.dt_norm = RMSNorm(rank, eps=config.rms_norm_eps)
        self.B_norm = RMSNorm(state, eps=config.rms_norm_eps)
        self.C_norm = RMSNorm(state, eps=config.rms_norm_eps)


class Plamo2AttentionMixer(nn.Module):
    def __init__(self, config: Plamo2Config) -> None:
        super().__init__()
        h, hd = config.hidden_size, config.hidden_size_per_head
        nh, nkv = config.num_attention_heads, config.num_key_value_heads
        self.qkv_proj = Linear(h, (nh + 2 * nkv) * hd)
        self.o_proj = Linear(nh * hd, h)
        self.q_norm = RMSNorm(nh, hd, eps=config.rms_norm_eps)
        self.k_norm = RMSNorm(nkv, hd, eps=config.rms_norm_eps)


class DenseMLP(nn.Module):
    def __init__(self, config: Plamo2Config) -> None:
        super().__init__()
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size)


class Plamo2DecoderLayer(nn.Module):
    def __init__(self, config: Plamo2Config, layer_idx: int) -> None:
        super().__init__()
        self.is_mamba = config.is_mamba(layer_idx)
        self.mixer: nn.Module = (
            Plamo2MambaMixer(config) if self.is_mamba else Plamo2AttentionMixer(config)
        )
        self.mlp = DenseMLP(config)
        eps = config.rms_norm_eps
        self.pre_mixer_norm = RMSNorm(config.hidden_size, eps=eps)
        self.post_mixer_norm = RMSNorm(config.hidden_size, eps=eps)
        self.pre_mlp_norm = RMSNorm(config.hidden_size, eps=eps)
        self.post_mlp_norm = RMSNorm(config.hidden_size, eps=eps)


class Plamo2Decoder(nn.Module):
    """Holds the ModuleList as ``.layers``: hence ``model.layers.layers.{i}`` upstream."""

    def __init__(self, config: Plamo2Config) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            Plamo2DecoderLayer(config, i) for i in range(config.num_hidden_layers)
        )


# --- the name and tensor conversions both loaders share -----------------------------------------

# Checkpoint spelling -> model spelling, applied in this order to every name containing the key.
RENAMES: dict[str, str] = {
    ".A_log": ".A",
    ".B_norm_weight": ".B_norm.weight",
    ".C_norm_weight": ".C_norm.weight",
    ".dt_norm_weight": ".dt_norm.weight",
    ".q_weight": ".q_norm.weight",
    ".k_weight": ".k_norm.weight",
}
IN_PROJ = ".mixer.in_proj.weight"
# The checkpoint stores RMSNorm weights as offsets from these values; vLLM's RMSNorm has no offset.
LAYER_NORM_OFFSETS: tuple[tuple[str, float], ...] = (
    (".pre_mixer_norm", 1.0),
    (".post_mixer_norm", 1.0 / 5),
    (".pre_mlp_norm", 1.0),
    (".post_mlp_norm", 1.0 / (5**1.5)),
)
FINAL_NORM_OFFSET = 1.0

# How each behaviour recognises the final norm: (the test as written, the test).
FINAL_NORM_TESTS: dict[str, tuple[str, Callable[[str], bool]]] = {
    "old": ("'model.norm.weight' in name", lambda n: "model.norm.weight" in n),
    "new": ("name == 'norm.weight'", lambda n: n == "norm.weight"),
    "moved-verbatim": ("'model.norm.weight' in name", lambda n: "model.norm.weight" in n),
    "loose-match": ("'norm.weight' in name", lambda n: "norm.weight" in n),
}


def rename(name: str) -> str:
    """The checkpoint name in model spelling (``.A_log`` -> ``.A``, ...)."""
    for old, new in RENAMES.items():
        if old in name:
            name = name.replace(old, new)
    return name


def reorder_in_proj(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Checkpoint ``in_proj.weight`` rows -> the order the merged gate/hidden projection expects.

    The checkpoint interleaves per head: ``[h0 gate, h0 hidden, h1 gate, h1 hidden, ...]``. The
    model wants ``[h0 gate, h1 gate, ..., h0 hidden, h1 hidden, ...]``: transpose, view as
    ``[hidden, heads, 2 * head_dim]``, split each head in halves, concatenate, transpose back.
    """
    cols = weight.transpose(0, 1)
    per_head = cols.reshape(cols.shape[0], num_heads, -1)
    gate, hidden = per_head.chunk(2, dim=-1)
    merged = torch.cat([gate.reshape(cols.shape[0], -1), hidden.reshape(cols.shape[0], -1)], -1)
    return merged.transpose(0, 1)


@dataclass
class NameStep:
    """What one loader did with one name, as that loader saw it."""

    received: str  # the name as handed to this loader
    renamed: str  # after RENAMES
    reordered: bool = False  # the in_proj per-head reorder applied
    offset: float | None = None  # norm offset added with +=
    final_norm_test: bool | None = None  # the final-norm test's answer, where it was asked
    loaded: str | None = None  # the parameter loaded (this loader's naming); None: skipped
    note: str = ""


def convert(
    name: str,
    weight: torch.Tensor,
    param: torch.Tensor,
    *,
    num_heads: int,
    behaviour: str,
    qualname: str | None = None,
    source: str | None = None,
) -> tuple[torch.Tensor, NameStep]:
    """Reorder ``in_proj`` and add the norm offset (in place, as upstream) for one renamed name.

    ``name`` is already renamed and ``param`` is the parameter it names; ``qualname`` and
    ``source`` only go into error messages. ``step.received`` is left for the caller to set.
    """
    step = NameStep(received=name, renamed=name)
    if IN_PROJ in name:
        if tuple(weight.shape) != tuple(param.shape):
            raise ShapeMismatchError(
                tuple(param.shape), tuple(weight.shape), qualname or name, source
            )
        weight = reorder_in_proj(weight, num_heads)
        step.reordered = True
    for key, offset in LAYER_NORM_OFFSETS:
        if key in name:
            weight += offset  # in place: upstream mutates the tensor it was handed
            step.offset = offset
            break
    else:
        step.final_norm_test = FINAL_NORM_TESTS[behaviour][1](name)
        if step.final_norm_test:
            weight += FINAL_NORM_OFFSET
            step.offset = FINAL_NORM_OFFSET
    return weight, step


# --- the models ---------------------------------------------------------------------------------


class Plamo2Model(nn.Module):
    def __init__(self, config: Plamo2Config, *, behaviour: str = "new", prefix: str = "model"):
        super().__init__()
        self.config = config
        self.behaviour = check_behaviour(behaviour, BEHAVIOURS)
        self.prefix = prefix  # where the parent holds this module: for error messages only
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = Plamo2Decoder(config)
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.load_trace: list[NameStep] = []

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The loader after the move: names arrive without ``model.``; returns what it loaded."""
        if self.behaviour == "old":
            raise LoadkitError(
                "behaviour 'old': before #41699 Plamo2Model had no load_weights; "
                "Plamo2ForCausalLM.load_weights loaded every name itself"
            )
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        self.load_trace = []
        for name, weight in weights:
            source = weight_source(qualname(self.prefix, name), weight)
            new_name = rename(name)
            param = params.get(new_name)
            if param is None:
                raise UnknownNameError(
                    qualname(self.prefix, new_name),
                    type(self).__name__,
                    (qualname(self.prefix, p) for p in params),
                    source,
                )
            weight, step = convert(
                new_name,
                weight,
                param,
                num_heads=self.config.mamba_num_heads,
                behaviour=self.behaviour,
                qualname=qualname(self.prefix, new_name),
                source=source,
            )
            load_param(param, weight, name=qualname(self.prefix, new_name), source=source)
            step.received, step.loaded = name, new_name
            self.load_trace.append(step)
            loaded.add(new_name)
        return loaded


class Plamo2ForCausalLM(nn.Module):
    """The Plamo2-like causal LM, loading with one of four behaviours (see the module docstring).

    Args:
        config: the sizes (``Plamo2Config``).
        behaviour: ``"old"``, ``"new"``, ``"moved-verbatim"`` or ``"loose-match"``.

    >>> from loadkit.models.plamo2.checkpoint import make_checkpoint
    >>> config = Plamo2Config()
    >>> ckpt = make_checkpoint(config, seed=0)
    >>> norms = {}
    >>> for b in ("new", "moved-verbatim"):
    ...     model = Plamo2ForCausalLM(config, behaviour=b)
    ...     _ = model.load_weights((k, v.clone()) for k, v in ckpt.items())
    ...     norms[b] = (model.model.norm.weight - ckpt["model.norm.weight"]).unique().tolist()
    >>> norms  # the final norm's +1.0 offset, lost by the loader moved verbatim
    {'new': [1.0], 'moved-verbatim': [0.0]}
    """

    def __init__(self, config: Plamo2Config, *, behaviour: str = "new") -> None:
        super().__init__()
        self.config = config
        self.behaviour = check_behaviour(behaviour, BEHAVIOURS)
        self.model = Plamo2Model(config, behaviour=behaviour, prefix="model")
        self.lm_head = Linear(config.hidden_size, config.vocab_size)
        if config.tie_word_embeddings:
            # One Parameter under two names: named_parameters() lists it once, as embed_tokens.
            self.lm_head.weight = self.model.embed_tokens.weight
        self.load_trace: list[NameStep] = []  # the old loader's steps (the new one's are inner)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str] | None:
        """Load checkpoint-named weights, the way ``self.behaviour`` says.

        Args:
            weights: ``(checkpoint name, tensor)`` pairs, e.g. ``open_checkpoint(p).weights()``.

        Returns:
            The qualified names loaded; ``None`` under ``"old"``, as upstream returned before
            #41699. Either way ``ledger_of(self)`` tells where every name went.

        >>> from loadkit import open_checkpoint
        >>> from loadkit.loading.ledger import ledger_of
        >>> model = Plamo2ForCausalLM(Plamo2Config(tie_word_embeddings=False))
        >>> loaded = model.load_weights(open_checkpoint("data/plamo2/untied.safetensors").weights())
        >>> len(loaded), "model.norm.weight" in loaded, ledger_of(model).never_loaded
        (30, True, [])
        """
        if self.behaviour == "old":
            self._load_weights_old(weights)
            return None
        # vLLM 0.26.0's call (skip_prefixes left vLLM in 0.29.0: plamo2.skips says more)
        skip = ["lm_head."] if self.config.tie_word_embeddings else None
        return AutoWeightsLoaderWithSkips(self, skip_prefixes=skip).load_weights(weights)

    def _load_weights_old(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The pre-#41699 loader: one loop over full names, parameters found by name.

        It keeps a ledger like ``AutoWeightsLoader``'s (``ledger_of(model)``), so the two loaders
        can be compared entry by entry.
        """
        params = dict(self.named_parameters())
        ledger = LoadLedger(self)
        remember(self, ledger)
        self.load_trace = []
        for name, weight in weights:
            entry = ledger.add(name, weight)
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                # Tied: lm_head.weight is not in params (named_parameters lists it once).
                entry.status, entry.rule = Status.SKIPPED, "old loader: tied lm_head.weight"
                self.load_trace.append(NameStep(name, name, note=entry.rule))
                continue
            if "rotary_emb.inv_freq" in name:
                entry.status, entry.rule = Status.SKIPPED, "old loader: rotary_emb.inv_freq"
                self.load_trace.append(NameStep(name, name, note=entry.rule))
                continue
            source = weight_source(name, weight)
            new_name = entry.mapped = rename(name)
            param = params.get(new_name)
            if param is None:
                raise UnknownNameError(new_name, type(self).__name__, params, source)
            weight, step = convert(
                new_name,
                weight,
                param,
                num_heads=self.config.mamba_num_heads,
                behaviour="old",
                source=source,
            )
            load_param(param, weight, name=new_name, source=source)
            entry.status, entry.target = Status.LOADED, new_name
            ledger.param_loaded(new_name, source=name)
            step.received, step.loaded = name, new_name
            self.load_trace.append(step)
