"""Tiny checkpoints that transformers itself writes, their mutations, and every verdict on each.

The oracle is transformers: ``from_pretrained(folder, output_loading_info=True,
ignore_mismatched_sizes=True)`` says which model tensors are missing, which checkpoint keys are
unexpected and which tensors have another shape (and, without ``ignore_mismatched_sizes``, whether
it raises). loadkit gives two columns, both header-only on the meta device:

- ``transformers``: ``loadkit_inspect.simulate.from_pretrained``, in transformers' own names;
  it must equal ``from_pretrained``'s lists and verdict in every case;
- ``vllm``: ``inspect_checkpoint(folder, model="hf")`` (vLLM's Transformers backend), in the
  wrapper's names (``model.`` for the base model, ``lm_head``/``classifier`` for heads). Where
  vLLM's backend differs from transformers, ``KNOWN_DIFFERENCES`` (per architecture),
  ``MUTATION_DIFFERENCES`` and ``CASE_DIFFERENCES`` say how and why, and the expected answer is
  transformers' one with the difference applied; ``make test-upstream`` holds the column against
  vLLM's own code.

Run ``.venv/bin/python tests/hf_cases.py`` to print the table, architecture x mutation
(docs/fidelity.md).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

SEED = 0
SMALL = {
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 32,
    "vocab_size": 64,
}


@dataclass(frozen=True)
class Arch:
    """One architecture: how to make its tiny config, the class that saves (and is the oracle),
    whether its checkpoint is sharded, and the keys its mutations touch."""

    name: str
    cls: str  # transformers class: saves the checkpoint, and from_pretrained is the oracle
    config: Callable[[], Any]
    sharded: bool = False
    stale_key: tuple[str, Any] | None = None  # (key, tensor factory): an old buffer's key


def _cfg(name: str, *, drop: tuple[str, ...] = (), **kw: Any) -> Callable[[], Any]:
    """transformers' ``name`` config at the ``SMALL`` sizes (less those in ``drop``: sizes it has
    no such setting for), with ``kw`` on top. A config whose own names differ (GPT-2's
    ``n_embd``) takes the common ones through its ``attribute_map``."""
    sizes = {k: v for k, v in SMALL.items() if k not in drop}

    def make() -> Any:
        import transformers

        return getattr(transformers, name)(**{**sizes, **kw})

    return make


def _seq2seq(name: str, **kw: Any) -> Callable[[], Any]:
    """An encoder-decoder config (BART, mBART, Whisper) at the ``SMALL`` sizes: one layer each."""
    return _cfg(
        name,
        drop=tuple(SMALL),
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        vocab_size=64,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
        **kw,
    )


def _positions(n: int, base: str = "") -> tuple[str, Callable[[], torch.Tensor]]:
    """The ``position_ids`` buffer (``n`` positions) as older versions saved it."""
    return f"{base}embeddings.position_ids", lambda: torch.arange(n).unsqueeze(0)


def _inv_freq(
    n: int, attention: str = "model.layers.0.self_attn"
) -> tuple[str, Callable[[], torch.Tensor]]:
    """A rotary embedding's ``inv_freq`` (``n`` values) as older versions saved it."""
    return f"{attention}.rotary_emb.inv_freq", lambda: torch.ones(n)


ARCHS: dict[str, Arch] = {
    a.name: a
    for a in [
        Arch(
            "bert",
            "BertModel",
            _cfg("BertConfig", max_position_embeddings=32),
            sharded=True,
            stale_key=_positions(32),
        ),
        Arch(
            "bert-cls",
            "BertForSequenceClassification",
            _cfg("BertConfig", max_position_embeddings=32, num_labels=3),
            stale_key=_positions(32, "bert."),
        ),
        Arch(
            "gpt2",
            "GPT2LMHeadModel",
            _cfg(
                "GPT2Config",
                drop=("intermediate_size",),
                max_position_embeddings=32,
                bos_token_id=0,
                eos_token_id=0,
            ),
            sharded=True,
            # the causal mask GPT-2 checkpoints used to carry
            stale_key=("transformer.h.0.attn.bias", lambda: torch.ones(1, 1, 32, 32).tril()),
        ),
        Arch(
            "llama", "LlamaForCausalLM", _cfg("LlamaConfig"), sharded=True, stale_key=_inv_freq(4)
        ),
        Arch(
            "qwen2",
            "Qwen2ForCausalLM",
            _cfg("Qwen2Config", num_key_value_heads=1),
            stale_key=_inv_freq(4),
        ),
        Arch(
            "mistral",
            "MistralForCausalLM",
            _cfg("MistralConfig", num_key_value_heads=1),
            stale_key=_inv_freq(4),
        ),
        Arch(
            "gemma",
            "GemmaForCausalLM",
            _cfg("GemmaConfig", num_key_value_heads=1, head_dim=8),
            stale_key=_inv_freq(4),
        ),
        Arch("phi", "PhiForCausalLM", _cfg("PhiConfig"), stale_key=_inv_freq(2)),
        Arch(
            "opt",
            "OPTForCausalLM",
            _cfg(
                "OPTConfig",
                drop=("intermediate_size",),
                ffn_dim=32,
                max_position_embeddings=32,
                word_embed_proj_dim=16,
            ),
        ),
        Arch(
            "t5",
            "T5ForConditionalGeneration",
            _cfg(
                "T5Config", drop=("intermediate_size",), d_ff=32, head_dim=8, num_decoder_layers=2
            ),
            sharded=True,
        ),
        Arch(
            "vit", "ViTModel", _cfg("ViTConfig", drop=("vocab_size",), image_size=8, patch_size=4)
        ),
        Arch(
            "gpt-neox",
            "GPTNeoXForCausalLM",
            _cfg("GPTNeoXConfig"),
            stale_key=_inv_freq(4, "gpt_neox.layers.0.attention"),
        ),
        Arch(
            "phi3",  # one fused qkv_proj and gate_up_proj per layer
            "Phi3ForCausalLM",
            _cfg("Phi3Config", pad_token_id=0, bos_token_id=0, eos_token_id=0),
            stale_key=_inv_freq(4),
        ),
        Arch("qwen3", "Qwen3ForCausalLM", _cfg("Qwen3Config", num_key_value_heads=1, head_dim=8)),
        Arch(
            "gemma2", "Gemma2ForCausalLM", _cfg("Gemma2Config", num_key_value_heads=1, head_dim=8)
        ),
        Arch("stablelm", "StableLmForCausalLM", _cfg("StableLmConfig")),
        Arch("olmo", "OlmoForCausalLM", _cfg("OlmoConfig", pad_token_id=0, eos_token_id=0)),
        Arch(
            "starcoder2", "Starcoder2ForCausalLM", _cfg("Starcoder2Config", num_key_value_heads=1)
        ),
        Arch("granite", "GraniteForCausalLM", _cfg("GraniteConfig")),
        Arch(
            "bloom",
            "BloomForCausalLM",
            _cfg("BloomConfig", drop=("intermediate_size",)),
        ),
        Arch("falcon", "FalconForCausalLM", _cfg("FalconConfig", drop=("intermediate_size",))),
        Arch(
            "gptj",
            "GPTJForCausalLM",
            _cfg(
                "GPTJConfig",
                drop=("intermediate_size",),
                rotary_dim=4,
                n_positions=32,
                bos_token_id=0,
                eos_token_id=0,
            ),
        ),
        Arch(
            "bart",  # final_logits_bias: a buffer of the generation class
            "BartForConditionalGeneration",
            _seq2seq("BartConfig", max_position_embeddings=32),
        ),
        Arch(
            "mbart",
            "MBartForConditionalGeneration",
            _seq2seq("MBartConfig", max_position_embeddings=32),
        ),
        Arch(
            "whisper",
            "WhisperForConditionalGeneration",
            _seq2seq(
                "WhisperConfig",
                num_mel_bins=8,
                max_source_positions=16,
                max_target_positions=16,
                decoder_start_token_id=0,
                suppress_tokens=None,
                begin_suppress_tokens=None,
            ),
        ),
        Arch(
            "deberta-v2",  # position_embeddings: a model tensor that matches an ignore pattern
            "DebertaV2Model",
            _cfg("DebertaV2Config", max_position_embeddings=32),
        ),
        Arch(
            "electra",  # embeddings_project: embedding_size != hidden_size
            "ElectraModel",
            _cfg("ElectraConfig", embedding_size=8, max_position_embeddings=32),
            stale_key=_positions(32),
        ),
        Arch(
            "distilbert-cls",  # pre_classifier: a head layer besides the classifier
            "DistilBertForSequenceClassification",
            _cfg(
                "DistilBertConfig",
                drop=tuple(SMALL),
                dim=16,
                n_layers=2,
                n_heads=2,
                hidden_dim=32,
                vocab_size=64,
                max_position_embeddings=32,
                num_labels=2,
            ),
        ),
        Arch(
            "llama-cls",  # the reward-model layout: a `score` head
            "LlamaForSequenceClassification",
            _cfg("LlamaConfig", num_labels=1, pad_token_id=0),
        ),
        Arch(
            "qwen2-cls",
            "Qwen2ForSequenceClassification",
            _cfg("Qwen2Config", num_key_value_heads=1, num_labels=2, pad_token_id=0),
        ),
        Arch("roberta", "RobertaModel", _cfg("RobertaConfig", max_position_embeddings=40)),
        Arch(
            "xlm-roberta-cls",
            "XLMRobertaForSequenceClassification",
            _cfg("XLMRobertaConfig", max_position_embeddings=40, num_labels=2),
        ),
        Arch(
            "albert",
            "AlbertModel",
            _cfg("AlbertConfig", embedding_size=8, max_position_embeddings=32),
        ),
        Arch("mpnet", "MPNetModel", _cfg("MPNetConfig", max_position_embeddings=40)),
    ]
}


# --- saving ---------------------------------------------------------------------------------------


def save_clean(arch: Arch, folder: Path) -> Path:
    """``arch``'s tiny model, seeded values, saved by transformers' ``save_pretrained``
    (safetensors; sharded into several files for some)."""
    import transformers

    torch.manual_seed(SEED)
    model = getattr(transformers, arch.cls)(arch.config())
    # Every value distinct from an initialiser's (biases 0, norms 1) and exactly representable
    # (eighths): a tensor left unloaded shows, and nothing depends on float kernels.
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for p in model.parameters():  # tied parameters once
            p.copy_(torch.randint(-8, 8, p.shape, generator=g).to(p.dtype) / 8)
    kwargs = {"max_shard_size": "8KB"} if arch.sharded else {}
    model.save_pretrained(folder, **kwargs)
    return folder


def clean_checkpoints(root: Path) -> Callable[[str], Path]:
    """Architecture name -> its clean checkpoint (``save_clean``) under ``root``, saved on first
    use."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = save_clean(ARCHS[name], root / name)
        return made[name]

    return get


def quiet_transformers() -> None:
    """transformers' warnings and progress bars off: the verdicts come from its return values."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    from loadkit import open_checkpoint

    return {k: v.clone() for k, v in open_checkpoint(folder).weights()}


def write_variant(
    clean: Path, tensors: dict[str, torch.Tensor], folder: Path, *, shards: int = 1
) -> Path:
    """``tensors`` beside a copy of ``clean``'s config.json: one safetensors file, or ``shards``
    files and the ``model.safetensors.index.json`` that lists them (as ``save_pretrained``)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(clean / "config.json", folder / "config.json")
    names = list(tensors)
    if shards == 1:
        groups = {"model.safetensors": names}
    else:
        size = -(-len(names) // shards)
        groups = {
            f"model-{i + 1:05d}-of-{shards:05d}.safetensors": names[i * size : (i + 1) * size]
            for i in range(shards)
        }
    for file, keys in groups.items():
        save_file(
            {k: tensors[k].contiguous() for k in keys}, folder / file, metadata={"format": "pt"}
        )
    if shards > 1:
        index = {
            "metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
            "weight_map": {k: f for f, keys in groups.items() for k in keys},
        }
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    return folder


# --- mutations ------------------------------------------------------------------------------------


def base_prefix(arch: Arch) -> str:
    """The base-model prefix transformers' class uses (``model``, ``transformer``, ``bert``...)."""
    return _hf_class(arch).base_model_prefix


def _hf_class(arch: Arch) -> Any:
    import transformers

    return getattr(transformers, arch.cls)


def _is_base_class(arch: Arch) -> bool:
    # BertModel, ViTModel: the checkpoint holds the base model's names without a prefix.
    return arch.cls.endswith("Model") and not arch.cls.endswith("LMHeadModel")


def _target_key(keys: list[str], *, ndim: int, layer: str = ".1.") -> str:
    """A key of the second layer with ``ndim`` dims (a weight matrix, or a norm vector)."""
    shapes = {k: s for k, s in keys}
    cands = sorted(k for k, s in shapes.items() if layer in k and len(s) == ndim)
    if not cands and layer == ".1.":  # one layer only (the encoder-decoder configs)
        return _target_key(keys, ndim=ndim, layer=".0.")
    cands = [k for k in cands if "c_attn.bias" not in k] or cands
    return cands[-1]


def _head_keys(arch: Arch, names: list[str]) -> list[str]:
    bmp = base_prefix(arch) + "."
    return [n for n in names if not n.startswith(bmp)]


Mutation = Callable[[Arch, dict[str, torch.Tensor]], dict[str, torch.Tensor] | None]


def m_drop(arch: Arch, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    key = _target_key([(k, v.shape) for k, v in t.items()], ndim=2)
    return {k: v for k, v in t.items() if k != key}


def m_rename(arch: Arch, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    key = _target_key([(k, v.shape) for k, v in t.items()], ndim=2)
    module, _, leaf = key.rpartition(".")
    renamed = f"{module}_old.{leaf}"  # an export script's stale module name
    return {(renamed if k == key else k): v for k, v in t.items()}


def m_reshape(arch: Arch, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A norm vector one longer (a weight matrix one row longer where norms have no weight)."""
    ndim = 1 if any(v.ndim == 1 for k, v in t.items() if ".0." in k) else 2
    key = _target_key([(k, v.shape) for k, v in t.items()], ndim=ndim)
    shape = (t[key].shape[0] + 1, *t[key].shape[1:])
    return {**t, key: torch.zeros(shape, dtype=t[key].dtype)}


def m_transpose(arch: Arch, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A weight matrix saved transposed (a Conv1D export, a hand-written converter)."""
    shapes = [(k, v.shape) for k, v in t.items() if v.ndim == 2 and v.shape[0] != v.shape[1]]
    key = _target_key(shapes, ndim=2)
    return {k: (v.t() if k == key else v) for k, v in t.items()}


def m_extra_bias(arch: Arch, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A stray ``.bias`` in a module that has none (beside an embedding's or a projection's
    weight; GPTQ exports write these); where every weight has its bias (ViT), in the module of
    the first key."""
    key = next(
        (k for k in t if k.endswith(".weight") and k[: -len("weight")] + "bias" not in t),
        None,
    )
    if key is None:
        return {**t, next(iter(t)).rpartition(".")[0] + ".bias": torch.zeros(2)}
    return {**t, key[: -len("weight")] + "bias": torch.zeros(t[key].shape[0])}


def m_half(arch: Arch, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One weight matrix saved in float16, the rest in float32 (both loaders cast)."""
    key = _target_key([(k, v.shape) for k, v in t.items()], ndim=2)
    return {k: (v.half() if k == key else v) for k, v in t.items()}


def m_extra(arch: Arch, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    prefix = "" if _is_base_class(arch) else base_prefix(arch) + "."
    return {**t, f"{prefix}extra_proj.weight": torch.zeros(2, 2)}


def m_prefix_added(arch: Arch, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """A base model's checkpoint saved under its base prefix (``bert.`` before every key), as
    its task classes save it."""
    if not _is_base_class(arch):
        return None
    bmp = base_prefix(arch) + "."
    return {bmp + k: v for k, v in t.items()}


def m_prefix_removed(arch: Arch, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """A task class's checkpoint whose base-model keys lost their prefix (heads keep their names:
    a head saved next to a base model saved on its own)."""
    if _is_base_class(arch):
        return None
    bmp = base_prefix(arch) + "."
    return {k.removeprefix(bmp): v for k, v in t.items()}


def m_wrapper_prefix(arch: Arch, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``model.`` before every key: vLLM's own naming of the wrapped model (an export from a
    vLLM model, or one wrapper around another)."""
    return {f"model.{k}": v for k, v in t.items()}


def m_head_in_base(arch: Arch, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """The head's keys saved inside the base model (``model.lm_head.weight``)."""
    heads = _head_keys(arch, list(t))
    if _is_base_class(arch) or not heads:
        return None  # a tied head is not saved; a base model has no head
    bmp = base_prefix(arch) + "."
    return {(bmp + k if k in heads else k): v for k, v in t.items()}


def m_legacy_names(arch: Arch, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """LayerNorm.weight/.bias saved as the old LayerNorm.gamma/.beta (transformers renames)."""
    if not any("LayerNorm.weight" in k for k in t):
        return None
    old = {"LayerNorm.weight": "LayerNorm.gamma", "LayerNorm.bias": "LayerNorm.beta"}
    out = {}
    for k, v in t.items():
        for new, legacy in old.items():
            k = k.replace(new, legacy)
        out[k] = v
    return out


def m_stale_buffer(arch: Arch, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """A buffer older transformers versions saved (position_ids, a per-layer inv_freq, GPT-2's
    masked_bias): both loaders must leave it alone."""
    if arch.stale_key is None:
        return None
    key, make = arch.stale_key
    return {**t, key: make()}


def m_tied_head_saved(arch: Arch, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """A tied model whose export also wrote ``lm_head.weight`` (a copy of the embedding)."""
    config = arch.config()
    if _is_base_class(arch) or not getattr(config, "tie_word_embeddings", False):
        return None
    if "lm_head.weight" in t or arch.cls.endswith("SequenceClassification"):
        return None
    embedding = next(v for k, v in t.items() if v.ndim == 2 and v.shape[0] == config.vocab_size)
    return {**t, "lm_head.weight": embedding.clone()}


MUTATIONS: dict[str, Mutation] = {
    "clean": lambda arch, t: dict(t),
    "key dropped": m_drop,
    "key renamed": m_rename,
    "key reshaped": m_reshape,
    "key transposed": m_transpose,
    "extra key": m_extra,
    "extra bias": m_extra_bias,
    "base prefix added": m_prefix_added,
    "base prefix removed": m_prefix_removed,
    "model. before every key": m_wrapper_prefix,
    "one float16 tensor": m_half,
    "sharded with an index": lambda arch, t: dict(t),
    "head inside base": m_head_in_base,
    "legacy LayerNorm names": m_legacy_names,
    "stale buffer saved": m_stale_buffer,
    "tied head saved": m_tied_head_saved,
}


# --- verdicts -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """Missing model tensors and mismatched ones (wrapper names), unexpected checkpoint keys."""

    missing: frozenset[str] = frozenset()
    unexpected: frozenset[str] = frozenset()
    mismatched: frozenset[str] = frozenset()

    @property
    def clean(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def describe(self) -> str:
        parts = [
            f"{name} {sorted(v)}"
            for name, v in (
                ("missing", self.missing),
                ("unexpected", self.unexpected),
                ("mismatched", self.mismatched),
            )
            if v
        ]
        return "; ".join(parts) or "clean"


# Architectures vLLM 0.34.0's Transformers backend refuses (neither ``is_backend_compatible``
# nor ``_can_set_attn_implementation``): their vllm column is that refusal, whatever the load.
REFUSED_BY_BACKEND = {"deberta-v2", "mpnet"}


def loadkit_verdict(folder: Path, loader: str = "vllm") -> tuple[Verdict, Any]:
    """``inspect_checkpoint(folder, model="hf", loader=loader, model_impl="transformers")``: the
    vllm column's verdict for vLLM 0.34.0's Transformers backend (whatever class ``auto`` would
    pick: this suite checks the backend), and the report (with ``loader="all"`` it holds the
    transformers column too)."""
    from loadkit_inspect import inspect_checkpoint

    report = inspect_checkpoint(folder, model="hf", loader=loader, model_impl="transformers")
    load = report.load
    assert not load.errors, load.errors
    verdict = Verdict(
        frozenset(m.name for m in load.missing),
        frozenset(u.name for u in load.unexpected),
        frozenset(s.param for s in load.shape_mismatches),
    )
    column = report.loaders["vllm"]
    refused = any(p.startswith("vLLM refuses it") for p in column.problems)
    assert column.clean == (verdict.clean and not refused), report.render()
    tf = report.from_pretrained
    both = column.clean and (tf is None or tf.clean)
    assert report.clean == both and report.exit_status == (0 if both else 1), report.render()
    return verdict, report


def from_pretrained_info(arch: Arch, folder: Path) -> tuple[Verdict, bool, Any]:
    """transformers' own answer: ``from_pretrained(..., output_loading_info=True,
    ignore_mismatched_sizes=True)``'s missing, unexpected and mismatched keys as transformers
    names them; whether ``from_pretrained`` without ``ignore_mismatched_sizes`` raises (called
    only when something is mismatched: otherwise the two calls are the same); and the model."""
    cls = _hf_class(arch)
    model, info = cls.from_pretrained(
        folder, output_loading_info=True, ignore_mismatched_sizes=True
    )
    raw = Verdict(
        frozenset(info["missing_keys"]),
        frozenset(info["unexpected_keys"]),
        frozenset(m[0] for m in info["mismatched_keys"]),
    )
    raises = False
    if raw.mismatched:
        try:
            cls.from_pretrained(folder)
        except RuntimeError:
            raises = True
    return raw, raises, model


def transformers_verdict(arch: Arch, folder: Path, raw: Verdict, model: Any) -> Verdict:
    """transformers' verdict in the vLLM wrapper's names (``model.`` for the base model; heads
    by their own names; unexpected names as checkpoint keys), to hold against the vllm column."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    from loadkit import open_checkpoint

    bmp = model.base_model_prefix
    is_base = getattr(model, bmp, None) is None

    def wrapper_name(name: str) -> str:
        if is_base:
            return f"model.{name}"
        return f"model.{name[len(bmp) + 1 :]}" if name.startswith(bmp + ".") else name

    # Unexpected names come back renamed as transformers renamed them: map them back to keys
    # with transformers' own renaming function.
    conversions = get_model_conversion_mapping(model)
    renamings = [c for c in conversions if isinstance(c, WeightRenaming)]
    converters = [c for c in conversions if isinstance(c, WeightConverter)]
    state = model.state_dict()
    unexpected = set()
    for key in open_checkpoint(folder).tensors:
        renamed, _ = rename_source_key(key, renamings, converters, bmp, state)
        if renamed not in state and key in state:
            renamed = key
        if renamed in raw.unexpected:
            unexpected.add(key)
    return Verdict(
        frozenset(wrapper_name(n) for n in raw.missing),
        frozenset(unexpected),
        frozenset(wrapper_name(m) for m in raw.mismatched),
    )


# --- where vLLM's backend differs from transformers ---------------------------------------------


@dataclass(frozen=True)
class Difference:
    """Why vLLM's backend answers otherwise than transformers (docs/fidelity.md has the upstream
    line), and how: ``apply`` turns transformers' verdict into vLLM's. ``apply`` is ``None``
    where the answer is not derived here: the vllm column is then only checked against vLLM's
    own code (``make test-upstream``)."""

    why: str
    apply: Callable[[Arch, Verdict, list[str]], Verdict] | None = field(default=None, repr=False)


def _gpt2_attn_bias(arch: Arch, hf: Verdict, keys: list[str]) -> Verdict:
    layers = arch.config().n_layer
    dropped = {f"model.h.{i}.attn.c_attn.bias" for i in range(layers)}
    return replace(hf, missing=hf.missing | dropped)


def _unexpected_keys(*names: str) -> Callable[[Arch, Verdict, list[str]], Verdict]:
    """Checkpoint keys ending in one of ``names`` (wherever saved) are unexpected."""

    def apply(arch: Arch, hf: Verdict, keys: list[str]) -> Verdict:
        extra = {k for k in keys if any(k == n or k.endswith("." + n) for n in names)}
        return replace(hf, unexpected=hf.unexpected | extra)

    return apply


def _missing_params(
    *fragments: str, checkpoint: tuple[str, ...] = ()
) -> Callable[[Arch, Verdict, list[str]], Verdict]:
    """Model tensors whose names hold one of ``fragments`` stay unfilled; the checkpoint keys
    holding ``checkpoint`` fragments are unexpected."""

    def apply(arch: Arch, hf: Verdict, keys: list[str]) -> Verdict:
        from loadkit.models.transformers import from_config

        config = arch.config()
        config.architectures = [arch.cls]  # as save_pretrained records it: picks the wrapper
        model = from_config(config, device="meta")
        params = {n for n, _ in model.named_parameters()}
        missing = {n for n in params if any(f in n for f in fragments)}
        extra = {k for k in keys if any(f in k for f in checkpoint)}
        return replace(hf, missing=hf.missing | missing, unexpected=hf.unexpected | extra)

    return apply


FINAL_LOGITS_BIAS = Difference(
    "BART-style generation classes keep `final_logits_bias` as a buffer of their own, outside "
    "the base model; vLLM's wrapper has the base model and `lm_head` only, and no mapper rule "
    "or skip covers the key: unexpected.",
    _unexpected_keys("final_logits_bias"),
)

UNTIED_EMBEDDINGS = Difference(
    "vLLM 0.34.0 replaces each vocabulary `nn.Embedding` by a `VocabParallelEmbedding` with a "
    "weight of its own (`recursive_replace`); transformers ties the encoder's and the decoder's "
    "`embed_tokens` to `shared` with distinct modules, so in vLLM they are two more parameters "
    "no checkpoint key fills: missing (0.28.0 re-tied them through `set_input_embeddings`).",
    _missing_params("encoder.embed_tokens.", "decoder.embed_tokens."),
)

KNOWN_DIFFERENCES: dict[str, Difference] = {
    "gpt2": Difference(
        "GPT2's `_keys_to_ignore_on_load_unexpected` holds the regex `attn.bias`; vLLM turns "
        "each pattern into a mapper rule that drops every key it *finds* (`re.search`), and "
        "`attn.bias` also matches `h.N.attn.c_attn.bias`: the attention biases are dropped "
        "and never loaded (vLLM stricter: exit 1 on every GPT-2 checkpoint). transformers only "
        "filters keys that are already unexpected.",
        _gpt2_attn_bias,
    ),
    "bart": Difference(
        f"{FINAL_LOGITS_BIAS.why} {UNTIED_EMBEDDINGS.why}",
        lambda arch, hf, keys: UNTIED_EMBEDDINGS.apply(  # type: ignore[misc]
            arch,
            FINAL_LOGITS_BIAS.apply(arch, hf, keys),
            keys,  # type: ignore[misc]
        ),
    ),
    "mbart": Difference(
        f"{FINAL_LOGITS_BIAS.why} {UNTIED_EMBEDDINGS.why}",
        lambda arch, hf, keys: UNTIED_EMBEDDINGS.apply(  # type: ignore[misc]
            arch,
            FINAL_LOGITS_BIAS.apply(arch, hf, keys),
            keys,  # type: ignore[misc]
        ),
    ),
    "t5": UNTIED_EMBEDDINGS,
    "deberta-v2": Difference(
        "DebertaV2's `_keys_to_ignore_on_load_unexpected` holds `position_embeddings`; vLLM "
        "drops every key the pattern finds, so the model's own "
        "`embeddings.position_embeddings.weight` is never loaded: missing.",
        _missing_params("position_embeddings"),
    ),
    "electra": Difference(
        "vLLM's LegacyMixin skips every name under `model.embeddings_project.` (a head of older "
        "ELECTRA discriminators); ElectraModel with embedding_size != hidden_size has that "
        "projection inside its embeddings path: its weight and bias stay missing.",
        _missing_params("embeddings_project"),
    ),
    "distilbert-cls": Difference(
        "vLLM's classification wrapper takes only `classifier` (or `score`) from the "
        "sequence-classification model; DistilBERT's `pre_classifier` layer has no place in "
        "it: unexpected.",
        _unexpected_keys("pre_classifier.weight", "pre_classifier.bias"),
    ),
    "llama-cls": Difference(
        "vLLM's classification wrapper stores the head it finds (`score` here) as "
        "`self.classifier`, so the module is named `classifier`; the checkpoint's `score.weight` "
        "has no rule to it: unexpected, and `classifier.weight` missing.",
        _missing_params("classifier.", checkpoint=("score.weight",)),
    ),
    "qwen2-cls": Difference(
        "As LlamaForSequenceClassification: `score` is the wrapper's `classifier`.",
        _missing_params("classifier.", checkpoint=("score.weight",)),
    ),
}

# Mutations whose vLLM answer differs from transformers' on every architecture.
MUTATION_DIFFERENCES: dict[str, Difference] = {
    "extra bias": Difference(
        "AutoWeightsLoader ignores an unexpected parameter name ending in `.bias` in a module "
        "it knows (vLLM's rule for GPTQ exports): vLLM loads what transformers calls "
        "unexpected.",
        lambda arch, hf, keys: replace(
            hf, unexpected=frozenset(u for u in hf.unexpected if not u.endswith(".bias"))
        ),
    ),
    "model. before every key": Difference(
        "`model.` is vLLM's own name for the wrapped model: its mapper strips a `model.` that "
        "no child of the base model starts, where transformers knows no such prefix.",
    ),
}


# One mutation of one architecture.
CASE_DIFFERENCES: dict[tuple[str, str], Difference] = {
    ("whisper", "tied head saved"): Difference(
        "A tied model's `lm_head.weight` is skipped by vLLM's AutoWeightsLoader (an alias of "
        "the tied embedding), whatever the head is called in transformers; Whisper's head is "
        "`proj_out`, so transformers calls a saved `lm_head.weight` unexpected.",
        lambda arch, hf, keys: replace(
            hf, unexpected=frozenset(u for u in hf.unexpected if not u.startswith("lm_head."))
        ),
    ),
}


def expected_vllm(arch: Arch, mutation: str, hf: Verdict, keys: list[str]) -> Verdict | None:
    """What vLLM's backend says, given transformers' verdict: the same, or with the known
    differences applied; ``None`` where it is not derived here."""
    diffs = (
        CASE_DIFFERENCES.get((arch.name, mutation)),
        MUTATION_DIFFERENCES.get(mutation),
        KNOWN_DIFFERENCES.get(arch.name),
    )
    for diff in diffs:
        if diff is not None:
            if diff.apply is None:
                return None
            hf = diff.apply(arch, hf, keys)
    return hf


# --- the table ----------------------------------------------------------------------------------


def applies(arch: Arch, mutation: str) -> bool:
    """Whether a mutation means anything for an architecture (decided from static facts)."""
    base, tied = _is_base_class(arch), _tied(arch)
    classifier = arch.cls.endswith("SequenceClassification")
    if mutation == "head inside base":  # a head saved next to the base model
        return not base and (classifier or not tied)
    if mutation == "legacy LayerNorm names":
        return arch.name in ("bert", "bert-cls")
    if mutation == "stale buffer saved":
        return arch.stale_key is not None
    if mutation == "tied head saved":
        return not base and tied and not classifier
    if mutation == "base prefix added":
        return base
    if mutation == "base prefix removed":
        return not base
    return True


def cases() -> list[tuple[str, str]]:
    """Every (architecture, mutation) that applies."""
    return [(a, m) for a in ARCHS for m in MUTATIONS if applies(ARCHS[a], m)]


def _tied(arch: Arch) -> bool:
    return bool(getattr(arch.config(), "tie_word_embeddings", False))


def run_case(arch: Arch, mutation: str, clean: Path, work: Path) -> dict[str, Any]:
    """Every verdict on one (architecture, mutation): transformers' own, loadkit's two columns,
    and the vllm column derived from transformers' where it can be."""
    tensors = MUTATIONS[mutation](arch, read_tensors(clean))
    assert tensors is not None, (arch.name, mutation)
    if mutation == "clean":
        folder = clean
    else:
        folder = write_variant(clean, tensors, work, shards=3 if "sharded" in mutation else 1)
    raw, raises, model = from_pretrained_info(arch, folder)
    hf = transformers_verdict(arch, folder, raw, model)
    ours, report = loadkit_verdict(folder, loader="all")  # both columns, as the CLI gives them
    ours_tf = report.from_pretrained
    return {
        "arch": arch.name,
        "mutation": mutation,
        "from_pretrained": raw,
        "from_pretrained_raises": raises,
        "transformers_column": ours_tf,
        "transformers_agrees": (
            Verdict(
                frozenset(ours_tf.missing),
                frozenset(ours_tf.unexpected),
                frozenset(m.name for m in ours_tf.mismatched),
            )
            == raw
            and ours_tf.raises == raises
            and ours_tf.clean == raw.clean
        ),
        "transformers": hf,
        "loadkit": ours,
        "expected": expected_vllm(arch, mutation, hf, list(tensors)),
        "agrees": ours == hf,
        "report": report,
    }


def table(rows: list[dict[str, Any]]) -> str:
    """architecture x mutation: ``T/V`` per cell, T the transformers column against
    ``from_pretrained``, V the vllm column against transformers' answer with the known
    differences applied (``=`` equal, ``d`` differs as documented, ``?`` only checked against
    vLLM's code, ``X`` wrong)."""
    mutations = list(dict.fromkeys(r["mutation"] for r in rows))
    archs = list(dict.fromkeys(r["arch"] for r in rows))
    cell = {(r["arch"], r["mutation"]): r for r in rows}

    def mark(r: dict[str, Any] | None) -> str:
        if r is None:
            return "n/a"
        t = "=" if r["transformers_agrees"] else "X"
        if r["expected"] is None:
            v = "?"
        elif r["loadkit"] != r["expected"]:
            v = "X"
        else:
            v = "=" if r["agrees"] else "d"
        return f"{t}/{v}"

    lines = [
        "| architecture | " + " | ".join(mutations) + " |",
        "| --- | " + " | ".join("---" for _ in mutations) + " |",
    ]
    for a in archs:
        cells = [mark(cell.get((a, m))) for m in mutations]
        lines.append(f"| {a} ({ARCHS[a].cls}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    import tempfile
    import time

    quiet_transformers()
    rows = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        clean = clean_checkpoints(root / "clean")
        for i, (a, m) in enumerate(cases()):
            rows.append(run_case(ARCHS[a], m, clean(a), root / "variants" / f"case{i}"))
    print(table(rows))
    for r in rows:
        wrong_v = r["expected"] is not None and r["loadkit"] != r["expected"]
        if not r["transformers_agrees"] or wrong_v:
            print(f"\n{r['arch']} / {r['mutation']}:")
            print(f"  from_pretrained:     {r['from_pretrained'].describe()}")
            print(f"  transformers column: {r['transformers_column'].problems()}")
            print(f"  transformers (wrapper names): {r['transformers'].describe()}")
            print(f"  expected vllm: {r['expected'].describe() if r['expected'] else None}")
            print(f"  vllm column:   {r['loadkit'].describe()}")
    summary = {
        "cases": len(rows),
        "architectures": len({r["arch"] for r in rows}),
        "mutations": len({r["mutation"] for r in rows}),
        "transformers_agree": sum(r["transformers_agrees"] for r in rows),
        "vllm_derived_agree": sum(
            r["expected"] is not None and r["loadkit"] == r["expected"] for r in rows
        ),
        "vllm_not_derived": sum(r["expected"] is None for r in rows),
        "seconds": round(time.perf_counter() - start, 1),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
