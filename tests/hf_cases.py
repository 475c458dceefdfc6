"""Tiny checkpoints that transformers itself writes, their mutations, and both verdicts on each.

The oracle is transformers: ``from_pretrained(folder, output_loading_info=True,
ignore_mismatched_sizes=True)`` says which model tensors are missing, which checkpoint keys are
unexpected and which tensors have another shape. loadkit's verdict is ``inspect_checkpoint(folder,
model="hf")`` (header-only, on the meta device). Both are put in the wrapper's names (``model.``
for the base model, ``lm_head``/``classifier`` for heads; unexpected names as checkpoint keys) and
compared. Where vLLM's Transformers backend differs from transformers, ``KNOWN_DIFFERENCES`` says
how and why, and the expected loadkit verdict is transformers' one with that difference applied.

Run ``.venv/bin/python tests/hf_cases.py`` to print the agreement table (docs/fidelity.md).
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


def write_variant(clean: Path, tensors: dict[str, torch.Tensor], folder: Path) -> Path:
    """``tensors`` as one safetensors file beside a copy of ``clean``'s config.json."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(clean / "config.json", folder / "config.json")
    save_file(
        {k: v.contiguous() for k, v in tensors.items()},
        folder / "model.safetensors",
        metadata={"format": "pt"},
    )
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
    key = _target_key([(k, v.shape) for k, v in t.items()], ndim=1)
    out = dict(t)
    out[key] = torch.zeros(t[key].shape[0] + 1, dtype=t[key].dtype)
    return out


def m_extra(arch: Arch, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    prefix = "" if _is_base_class(arch) else base_prefix(arch) + "."
    return {**t, f"{prefix}extra_proj.weight": torch.zeros(2, 2)}


def m_prefix(arch: Arch, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Base-model checkpoints gain the base prefix; the others lose it (heads keep their
    names: a head saved next to a base model saved without its prefix)."""
    bmp = base_prefix(arch) + "."
    if _is_base_class(arch):
        return {bmp + k: v for k, v in t.items()}
    return {k.removeprefix(bmp): v for k, v in t.items()}


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
    "extra key": m_extra,
    "base prefix added/removed": m_prefix,
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


def loadkit_verdict(folder: Path) -> tuple[Verdict, Any]:
    """``inspect_checkpoint(folder, model="hf")``'s verdict, and the report."""
    from loadkit import inspect_checkpoint

    report = inspect_checkpoint(folder, model="hf")
    load = report.load
    assert not load.errors, load.errors
    verdict = Verdict(
        frozenset(m.name for m in load.missing),
        frozenset(u.name for u in load.unexpected),
        frozenset(s.param for s in load.shape_mismatches),
    )
    assert report.clean == verdict.clean, report.render()
    return verdict, report


def transformers_verdict(arch: Arch, folder: Path) -> Verdict:
    """transformers' own verdict: ``from_pretrained(..., output_loading_info=True)``."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    from loadkit import open_checkpoint

    model, info = _hf_class(arch).from_pretrained(
        folder, output_loading_info=True, ignore_mismatched_sizes=True
    )
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
        if renamed in info["unexpected_keys"]:
            unexpected.add(key)
    return Verdict(
        frozenset(wrapper_name(n) for n in info["missing_keys"]),
        frozenset(unexpected),
        frozenset(wrapper_name(m[0]) for m in info["mismatched_keys"]),
    )


# --- where vLLM's backend differs from transformers ---------------------------------------------


@dataclass(frozen=True)
class Difference:
    why: str
    apply: Callable[[Arch, Verdict, list[str]], Verdict] = field(repr=False)


def _gpt2_attn_bias(arch: Arch, hf: Verdict, keys: list[str]) -> Verdict:
    layers = arch.config().n_layer
    dropped = {f"model.h.{i}.attn.c_attn.bias" for i in range(layers)}
    return replace(hf, missing=hf.missing | dropped)


def _neox_embed_out(arch: Arch, hf: Verdict, keys: list[str]) -> Verdict:
    head = {k for k in keys if k.endswith("embed_out.weight")}
    return replace(hf, missing=hf.missing | {"lm_head.weight"}, unexpected=hf.unexpected | head)


KNOWN_DIFFERENCES: dict[str, Difference] = {
    "gpt2": Difference(
        "GPT2's `_keys_to_ignore_on_load_unexpected` holds the regex `attn.bias`; vLLM turns "
        "each pattern into a mapper rule that drops every key it *finds* (`re.search`), and "
        "`attn.bias` also matches `h.N.attn.c_attn.bias`: the attention biases are dropped "
        "and never loaded (vLLM stricter: exit 1 on every GPT-2 checkpoint). transformers only "
        "filters keys that are already unexpected.",
        _gpt2_attn_bias,
    ),
    "gpt-neox": Difference(
        "GPT-NeoX checkpoints name the head `embed_out`; transformers renames it to `lm_head` by "
        "a rule registered for `GPTNeoXForCausalLM`. vLLM asks for the conversion mapping of "
        "the base model it builds (`GPTNeoXModel`), which has no such rule: `embed_out.weight` "
        "is unexpected and `lm_head.weight` is never filled (vLLM stricter).",
        _neox_embed_out,
    ),
}


def expected_loadkit(arch: Arch, hf: Verdict, keys: list[str]) -> Verdict:
    """What vLLM's backend says, given transformers' verdict: the same, or with the known
    difference applied."""
    diff = KNOWN_DIFFERENCES.get(arch.name)
    return diff.apply(arch, hf, keys) if diff else hf


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
    return True


def cases() -> list[tuple[str, str]]:
    """Every (architecture, mutation) that applies."""
    return [(a, m) for a in ARCHS for m in MUTATIONS if applies(ARCHS[a], m)]


def _tied(arch: Arch) -> bool:
    return bool(getattr(arch.config(), "tie_word_embeddings", False))


def run_case(arch: Arch, mutation: str, clean: Path, work: Path) -> dict[str, Any]:
    """Both verdicts on one (architecture, mutation)."""
    tensors = MUTATIONS[mutation](arch, read_tensors(clean))
    assert tensors is not None, (arch.name, mutation)
    folder = clean if mutation == "clean" else write_variant(clean, tensors, work)
    hf = transformers_verdict(arch, folder)
    ours, report = loadkit_verdict(folder)
    expected = expected_loadkit(arch, hf, list(tensors))
    return {
        "arch": arch.name,
        "mutation": mutation,
        "transformers": hf,
        "loadkit": ours,
        "expected": expected,
        "agrees": ours == hf,
        "report": report,
    }


def table(rows: list[dict[str, Any]]) -> str:
    mutations = list(dict.fromkeys(r["mutation"] for r in rows))
    archs = list(dict.fromkeys(r["arch"] for r in rows))
    cell = {(r["arch"], r["mutation"]): r for r in rows}

    def mark(r: dict[str, Any] | None) -> str:
        if r is None:
            return "n/a"
        if r["agrees"]:
            return "yes"
        return "no (vLLM)" if r["loadkit"] == r["expected"] else "NO"

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

    quiet_transformers()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        clean = clean_checkpoints(root / "clean")
        for i, (a, m) in enumerate(cases()):
            rows.append(run_case(ARCHS[a], m, clean(a), root / "variants" / f"case{i}"))
    print(table(rows))
    for r in rows:
        if not r["agrees"]:
            print(f"\n{r['arch']} / {r['mutation']}:")
            print(f"  transformers: {r['transformers'].describe()}")
            print(f"  loadkit:      {r['loadkit'].describe()}")
    print(json.dumps({"cases": len(rows), "agree": sum(r["agrees"] for r in rows)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
