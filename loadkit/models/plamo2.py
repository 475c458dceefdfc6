"""A Plamo2-like hybrid model and its loader before and after vLLM #41699 (docs/api.md, bug 2).

Upstream moved Plamo2's hand-written loader from ``Plamo2ForCausalLM`` into ``Plamo2Model`` and
let ``AutoWeightsLoader`` delegate to it. The move strips ``model.`` from every name the loader
sees, so the one test that spelled the prefix out (``"model.norm.weight" in name``) had to change.
Four behaviours:

- ``"old"``: the loader in ``Plamo2ForCausalLM``, over full names (``model.norm.weight``); it
  skips a tied ``lm_head.weight`` and rotary names itself, and returns ``None``.
- ``"new"``: the loader in ``Plamo2Model``, final norm matched by ``name == "norm.weight"``;
  ``Plamo2ForCausalLM`` delegates through ``AutoWeightsLoader`` (``skip_prefixes=["lm_head."]``
  when tied) and returns the set of loaded names.
- ``"moved-verbatim"``: moved but the test kept: it never matches, the final norm loses +1.0.
- ``"loose-match"``: ``"norm.weight" in name``: also matches the B/C/dt/q/k norms (+1.0 each).

Only the norms have a forward here (``RMSNorm``): that is what the pitfalls change. Mixers and
MLPs hold parameters with upstream names and shapes but no forward; nothing pretends to run a
mamba scan.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Literal, get_args

import torch
from torch import nn

from loadkit.errors import (
    LoadkitError,
    ShapeMismatchError,
    UnknownNameError,
)
from loadkit.loading.auto_loader import AutoWeightsLoader
from loadkit.loading.ledger import LoadLedger, remember
from loadkit.loading.weight_loaders import (
    composed_weight_loader,
    default_weight_loader,
    load_param,
    set_weight_attrs,
    weight_source,
)
from loadkit.models._common import HeaderShapes, RMSNorm
from loadkit.models.dyadic import dyadic_uniform, round_once
from loadkit.vocab import Status, check_behaviour

if TYPE_CHECKING:
    from loadkit.checkpoint.reader import TensorInfo

# Plamo2 has two pitfalls besides the bug and its fix (see the module docstring).
Plamo2Behaviour = Literal["old", "new", "moved-verbatim", "loose-match"]
BEHAVIOURS: tuple[Plamo2Behaviour, ...] = get_args(Plamo2Behaviour)

# --- the config ---------------------------------------------------------------------------------


@dataclass
class Plamo2Config:
    """Sizes of the model. The defaults make a tiny model: layer 0 mamba, layer 1 attention.

    >>> Plamo2Config().layer_kinds, Plamo2Config(num_hidden_layers=4).layer_kinds
    (['mamba', 'attention'], ['mamba', 'attention', 'mamba', 'attention'])
    """

    hidden_size: int = 16
    num_hidden_layers: int = 2
    vocab_size: int = 48
    tie_word_embeddings: bool = False
    rms_norm_eps: float = 1e-6
    # attention
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    hidden_size_per_head: int = 4
    # mamba (intermediate size = mamba_num_heads * hidden_size_per_head)
    mamba_num_heads: int = 3
    mamba_d_state: int = 4
    mamba_d_conv: int = 4
    mamba_step: int = 2
    time_step_rank: int = 8  # upstream: max(64, hidden_size // 16); a field here to stay tiny
    # MLP
    intermediate_size: int = 32

    def __post_init__(self) -> None:
        sizes = {
            k: v for k, v in vars(self).items() if isinstance(v, int) and not isinstance(v, bool)
        }
        bad = {k: v for k, v in sizes.items() if v < 1}
        if bad:
            raise LoadkitError(f"Plamo2Config sizes must be positive, got {bad}")
        if self.mamba_step < 2:
            raise LoadkitError(f"Plamo2Config.mamba_step must be > 1, got {self.mamba_step}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise LoadkitError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )

    @property
    def mamba_intermediate_size(self) -> int:
        return self.mamba_num_heads * self.hidden_size_per_head

    def is_mamba(self, i: int) -> bool:
        """Whether layer ``i`` has a mamba mixer (else attention), as upstream decides."""
        if self.num_hidden_layers <= self.mamba_step // 2:
            return i != self.num_hidden_layers - 1  # few layers: only the last one attends
        return i % self.mamba_step != self.mamba_step // 2

    @property
    def layer_kinds(self) -> list[str]:
        return ["mamba" if self.is_mamba(i) else "attention" for i in range(self.num_hidden_layers)]


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

    def _qual(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

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
            source = weight_source(self._qual(name), weight)
            new_name = rename(name)
            param = params.get(new_name)
            if param is None:
                raise UnknownNameError(
                    self._qual(new_name),
                    type(self).__name__,
                    (self._qual(p) for p in params),
                    source,
                )
            weight, step = convert(
                new_name,
                weight,
                param,
                num_heads=self.config.mamba_num_heads,
                behaviour=self.behaviour,
                qualname=self._qual(new_name),
                source=source,
            )
            load_param(param, weight, name=self._qual(new_name), source=source)
            step.received, step.loaded = name, new_name
            self.load_trace.append(step)
            loaded.add(new_name)
        return loaded


class Plamo2ForCausalLM(nn.Module):
    """The Plamo2-like causal LM, loading with one of four behaviours (see the module docstring).

    Args:
        config: the sizes (``Plamo2Config``).
        behaviour: ``"old"``, ``"new"``, ``"moved-verbatim"`` or ``"loose-match"``.

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
        skip = ["lm_head."] if self.config.tie_word_embeddings else None
        return AutoWeightsLoader(self, skip_prefixes=skip).load_weights(weights)

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


DATA_FILES = {
    "untied": "plamo2/untied.safetensors",
    "tied": "plamo2/tied.safetensors",
    "tied-with-lm-head": "plamo2/tied-with-lm-head",
}


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
