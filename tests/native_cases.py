"""Tiny checkpoints of the architectures vLLM 0.34.0 serves with its native classes, written by
transformers itself, and the ways users' checkpoints go wrong.

Each architecture is a transformers config class at tiny sizes (``NativeArch.config``) and the
transformers class that saves it (``save_pretrained``: safetensors and ``config.json``, the
architecture recorded in ``architectures``); every value is a seeded multiple of 1/8 (exactly
representable, independent of the CPU's float kernels). A mutation turns the clean tensors (and
config) into a variant: a renamed prefix, a dropped tensor, a dropped expert, fused experts
where per-expert ones are expected and the reverse, a transposed matrix, an extra head, a tied
head flipped, layers shifted, ...

``tests/tool/test_loaders_native.py`` holds loadkit's verdict on each against what vLLM 0.34.0
would do; ``tests/upstream/test_native_upstream.py`` runs the wheel's own ``load_weights`` on
loadkit's module tree over the same files.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

SEED = 0


@dataclass(frozen=True)
class NativeArch:
    """One architecture: its transformers config (tiny), the class that saves it, what it has."""

    name: str
    cls: str  # transformers' class: saves the checkpoint; vLLM's architecture name
    config: Callable[[], Any]
    moe: bool = False
    multimodal: bool = False
    vllm_class: str | None = None  # vLLM's class, when its name differs from ``cls``


def _cfg(name: str, **kw: Any) -> Callable[[], Any]:
    def make() -> Any:
        import transformers

        return getattr(transformers, name)(**kw)

    return make


DENSE = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 64,
    "max_position_embeddings": 64,
}

ARCHS: dict[str, NativeArch] = {
    a.name: a
    for a in [
        NativeArch("llama", "LlamaForCausalLM", _cfg("LlamaConfig", **DENSE)),
        NativeArch(
            "llama-tied", "LlamaForCausalLM", _cfg("LlamaConfig", **DENSE, tie_word_embeddings=True)
        ),
        NativeArch("mistral", "MistralForCausalLM", _cfg("MistralConfig", **DENSE, head_dim=4)),
        NativeArch("qwen2", "Qwen2ForCausalLM", _cfg("Qwen2Config", **DENSE)),
        NativeArch(
            "gpt2",
            "GPT2LMHeadModel",
            _cfg(
                "GPT2Config",
                n_embd=16,
                n_layer=2,
                n_head=4,
                vocab_size=64,
                n_positions=64,
                bos_token_id=0,
                eos_token_id=0,
            ),
        ),
        NativeArch("qwen3", "Qwen3ForCausalLM", _cfg("Qwen3Config", **DENSE, head_dim=8)),
        NativeArch(
            "gemma2",
            "Gemma2ForCausalLM",
            _cfg("Gemma2Config", **DENSE, head_dim=8, pad_token_id=0),
        ),
        NativeArch(
            "gemma3",
            "Gemma3ForCausalLM",
            _cfg("Gemma3TextConfig", **DENSE, head_dim=8, pad_token_id=0),
        ),
        NativeArch(
            "mixtral",
            "MixtralForCausalLM",
            _cfg("MixtralConfig", **DENSE, num_local_experts=4, num_experts_per_tok=2),
            moe=True,
        ),
        NativeArch(
            "qwen2-moe",
            "Qwen2MoeForCausalLM",
            _cfg(
                "Qwen2MoeConfig",
                **DENSE,
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=8,
                shared_expert_intermediate_size=16,
                decoder_sparse_step=1,
            ),
            moe=True,
        ),
        NativeArch(
            "qwen3-moe",
            "Qwen3MoeForCausalLM",
            _cfg(
                "Qwen3MoeConfig",
                **DENSE,
                head_dim=8,
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=8,
                mlp_only_layers=[0],
            ),
            moe=True,
        ),
        NativeArch(
            "deepseek-v3",
            "DeepseekV3ForCausalLM",
            _cfg(
                "DeepseekV3Config",
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=4,
                vocab_size=64,
                max_position_embeddings=64,
                n_routed_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=8,
                n_shared_experts=1,
                first_k_dense_replace=1,
                q_lora_rank=8,
                kv_lora_rank=8,
                qk_rope_head_dim=4,
                qk_nope_head_dim=4,
                v_head_dim=4,
                n_group=1,
                topk_group=1,
                topk_method="noaux_tc",  # as real DeepSeek-V3 configs say (transformers' does not)
            ),
            moe=True,
        ),
        NativeArch(
            "deepseek-v2",  # no q_lora_rank: q_proj and kv_a_proj_with_mqa unpacked
            "DeepseekV2ForCausalLM",
            _cfg(
                "DeepseekV2Config",
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=4,
                vocab_size=64,
                max_position_embeddings=64,
                n_routed_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=8,
                n_shared_experts=2,
                first_k_dense_replace=1,
                q_lora_rank=None,
                kv_lora_rank=8,
                qk_rope_head_dim=4,
                qk_nope_head_dim=4,
                v_head_dim=4,
                n_group=1,
                topk_group=1,
            ),
            moe=True,
        ),
        NativeArch(
            "gpt-oss",
            "GptOssForCausalLM",
            _cfg(
                "GptOssConfig",
                **{**DENSE, "intermediate_size": 8},
                head_dim=8,
                num_local_experts=4,
                num_experts_per_tok=2,
                sliding_window=8,
            ),
            moe=True,
        ),
        NativeArch(
            "qwen2.5-vl",
            "Qwen2_5_VLForConditionalGeneration",
            _cfg(
                "Qwen2_5_VLConfig",
                text_config={**DENSE, "tie_word_embeddings": False},
                vision_config={
                    "depth": 2,
                    "hidden_size": 16,
                    "intermediate_size": 32,
                    "num_heads": 2,
                    "out_hidden_size": 16,
                    "patch_size": 2,
                    "temporal_patch_size": 2,
                    "spatial_merge_size": 2,
                    "fullatt_block_indexes": [1],
                    "window_size": 4,
                },
            ),
            multimodal=True,
        ),
        NativeArch(
            "phi3",
            "Phi3ForCausalLM",
            _cfg("Phi3Config", **DENSE, pad_token_id=0, bos_token_id=0, eos_token_id=0),
        ),
    ]
}


# --- saving ---------------------------------------------------------------------------------------


def save_clean(arch: NativeArch, folder: Path) -> Path:
    """``arch``'s tiny model written by transformers' ``save_pretrained``; every parameter a
    seeded multiple of 1/8 between -1 and 1 (a tensor left unloaded shows)."""
    import transformers

    config = arch.config()
    config.architectures = [arch.cls]
    torch.manual_seed(SEED)
    model = getattr(transformers, arch.cls)(config)
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randint(-8, 8, p.shape, generator=g).to(p.dtype) / 8)
    model.save_pretrained(folder)
    return folder


def clean_checkpoints(root: Path) -> Callable[[str], Path]:
    """Architecture name -> its clean checkpoint under ``root``, written on first use."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = save_clean(ARCHS[name], root / name)
        return made[name]

    return get


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    from loadkit import open_checkpoint

    return {k: v.clone() for k, v in open_checkpoint(folder).weights()}


def read_config(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "config.json").read_text())


class Variant(NamedTuple):
    """A mutated checkpoint: its tensors and, where the mutation changes it, its config."""

    tensors: dict[str, torch.Tensor]
    config: dict[str, Any] | None = None


def write_variant(clean: Path, variant: Variant, folder: Path) -> Path:
    """``variant`` as one safetensors file beside a config.json (``clean``'s, or the variant's)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    if variant.config is None:
        shutil.copy(clean / "config.json", folder / "config.json")
    else:
        (folder / "config.json").write_text(json.dumps(variant.config, indent=1))
    tensors = {k: v.contiguous() for k, v in variant.tensors.items()}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


# --- mutations ------------------------------------------------------------------------------------

Mutation = Callable[[NativeArch, dict[str, torch.Tensor], dict[str, Any]], Variant | None]


def _first(t: dict[str, torch.Tensor], pattern: str) -> str | None:
    return next((k for k in sorted(t) if re.search(pattern, k)), None)


def m_prefix_renamed(arch, t, config):
    """Every ``model.`` key saved under another prefix (an export's wrapper); GPT-2's
    ``transformer.`` keys under ``model.``."""
    old, new = ("transformer.", "model.") if arch.name == "gpt2" else ("model.", "transformer.")
    return Variant({(new + k[len(old) :] if k.startswith(old) else k): v for k, v in t.items()})


def m_norm_dropped(arch, t, config):
    """The final norm missing: vLLM checks it (no ``quant_method``) and refuses the load."""
    key = _first(t, r"(^|\.)(norm|ln_f)\.weight$")
    return None if key is None else Variant({k: v for k, v in t.items() if k != key})


def m_linear_dropped(arch, t, config):
    """A linear layer's weight missing (layer 1's down projection): vLLM counts it as loaded."""
    key = _first(t, r"(layers|h)\.1\.mlp\.(down_proj|c_proj)\.weight$")
    return None if key is None else Variant({k: v for k, v in t.items() if k != key})


def m_shard_dropped(arch, t, config):
    """One part of a stacked parameter missing (layer 1's k_proj; with multi-head latent
    attention its kv_a_proj_with_mqa, packed with q_a_proj): a stacked parameter partly filled."""
    key = _first(t, r"layers\.1\.self_attn\.(k_proj|kv_a_proj_with_mqa)\.weight$")
    return None if key is None else Variant({k: v for k, v in t.items() if k != key})


def m_transposed(arch, t, config):
    """A projection saved transposed (layer 0's up projection, or its fused gate_up)."""
    key = _first(t, r"(layers|h)\.0\.mlp\.(up_proj|gate_up_proj|c_fc)\.weight$")
    return None if key is None else Variant({**t, key: t[key].t()})


def m_extra_head(arch, t, config):
    """A second head the model has no place for (a value head of an RL export)."""
    hidden = (
        config.get("hidden_size") or config.get("n_embd") or config["text_config"]["hidden_size"]
    )
    return Variant({**t, "v_head.weight": torch.zeros(1, hidden)})


def m_tied_flipped(arch, t, config):
    """The config's ``tie_word_embeddings`` flipped: a tied model with its head saved as if it
    were untied, or an untied one whose head the export left out."""
    text = config.get("text_config", config)  # a multimodal model reads its text config's
    tied = bool(text.get("tie_word_embeddings"))
    flipped = {**config, "tie_word_embeddings": not tied}
    if "text_config" in config:
        flipped["text_config"] = {**text, "tie_word_embeddings": not tied}
    if tied:
        embed = t[_first(t, r"(embed_tokens|wte)\.weight$") or ""]
        return Variant({**t, "lm_head.weight": embed.clone()}, flipped)
    return Variant({k: v for k, v in t.items() if k != "lm_head.weight"}, flipped)


def m_stray_layer_key(arch, t, config):
    """A key inside a layer the model has no place for (``model.layers.0.mlp.extra.weight``)."""
    return Variant({**t, "model.layers.0.mlp.extra.weight": torch.zeros(2, 2)})


def m_layers_shifted(arch, t, config):
    """Every layer saved one number up (``layers.0`` as ``layers.1``...): an off-by-one export."""

    def shift(k: str) -> str:
        return re.sub(r"\.(layers|h)\.(\d+)\.", lambda m: f".{m[1]}.{int(m[2]) + 1}.", k)

    return Variant({shift(k): v for k, v in t.items()})


def m_extra_bias(arch, t, config):
    """A stray ``o_proj.bias`` (GPTQ exports write them): vLLM ignores unexpected biases."""
    key = _first(t, r"layers\.0\.self_attn\.o_proj\.weight$")
    if key is None or key[: -len("weight")] + "bias" in t:
        return None
    return Variant({**t, key[: -len("weight")] + "bias": torch.zeros(t[key].shape[0])})


def m_kv_scale(arch, t, config):
    """An FP8 k-cache scale (``self_attn.k_proj.k_scale``) in an unquantized model's checkpoint."""
    key = _first(t, r"layers\.0\.self_attn\.k_proj\.weight$")
    if key is None:
        return None
    return Variant({**t, key[: -len("weight")] + "k_scale": torch.ones(())})


def m_rotary_saved(arch, t, config):
    """The rotary ``inv_freq`` buffer older exports saved: vLLM drops it."""
    key = _first(t, r"layers\.0\.self_attn\.o_proj\.weight$")
    if key is None:
        return None
    return Variant({**t, key.replace("o_proj.weight", "rotary_emb.inv_freq"): torch.ones(2)})


# The checkpoint names of a layer's experts: per expert (gate, up, down), and all at once.
EXPERT_NAMES = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))
FUSED_NAMES = {"gate_proj": ("gate_up_proj", "down_proj"), "w1": ("w13", "w2")}


def _expert_layers(t: dict[str, torch.Tensor]) -> dict[str, tuple[str, str, str, int]]:
    """``{layer prefix: (gate, up, down, experts)}`` for every layer saved per expert."""
    out = {}
    for key in t:
        m = re.match(r"(.*\.experts)\.(\d+)\.(\w+)\.weight$", key)
        if m is None:
            continue
        for names in EXPERT_NAMES:
            if m[3] == names[0]:
                count = sum(
                    k.startswith(m[1] + ".") and k.endswith(f".{names[0]}.weight") for k in t
                )
                out[m[1]] = (*names, count)
    return out


def m_expert_dropped(arch, t, config):
    """One expert of the last expert layer missing (all three of its tensors)."""
    layers = _expert_layers(t)
    if not layers:
        return None
    prefix = sorted(layers)[-1] + ".1."
    return Variant({k: v for k, v in t.items() if not k.startswith(prefix)})


def m_experts_fused(arch, t, config):
    """Every layer's experts saved all at once, as vLLM's fused mapping names them
    (``experts.gate_up_proj [experts, 2 * intermediate, hidden]``, ``experts.down_proj``), where
    per-expert tensors are expected."""
    layers = _expert_layers(t)
    if not layers:
        return None
    out = dict(t)
    for layer, (gate, up, down, count) in layers.items():
        pairs = [(f"{layer}.{e}.{gate}.weight", f"{layer}.{e}.{up}.weight") for e in range(count)]
        w13 = [torch.cat([out.pop(g), out.pop(u)]) for g, u in pairs]
        w2 = [out.pop(f"{layer}.{e}.{down}.weight") for e in range(count)]
        fused_gate_up, fused_down = FUSED_NAMES[gate]
        out[f"{layer}.{fused_gate_up}"] = torch.stack(w13)
        out[f"{layer}.{fused_down}"] = torch.stack(w2)
    return Variant(out)


def m_experts_split(arch, t, config):
    """Every layer's experts saved one by one (``experts.3.gate_up_proj``, its bias...) where
    the model's own format holds them all at once (gpt-oss: ``experts.gate_up_proj [experts,
    hidden, 2 * intermediate]``)."""
    fused = [k for k in t if re.search(r"\.experts\.(gate_up_proj|down_proj)(_bias)?$", k)]
    if not fused:
        return None
    out = {k: v for k, v in t.items() if k not in fused}
    for key in fused:
        layer, _, leaf = key.rpartition(".")
        for e, part in enumerate(t[key].unbind(0)):
            out[f"{layer}.{e}.{leaf}"] = part.clone()
    return Variant(out)


MUTATIONS: dict[str, Mutation] = {
    "clean": lambda arch, t, config: Variant(dict(t)),
    "prefix renamed": m_prefix_renamed,
    "norm dropped": m_norm_dropped,
    "linear dropped": m_linear_dropped,
    "stacked shard dropped": m_shard_dropped,
    "matrix transposed": m_transposed,
    "extra head": m_extra_head,
    "tied head flipped": m_tied_flipped,
    "layers shifted": m_layers_shifted,
    "stray layer key": m_stray_layer_key,
    "extra bias": m_extra_bias,
    "kv scale": m_kv_scale,
    "rotary buffer saved": m_rotary_saved,
    "expert dropped": m_expert_dropped,
    "experts fused": m_experts_fused,
    "experts split": m_experts_split,
}


def cases() -> list[tuple[str, str]]:
    """Every (architecture, mutation) that applies (a mutation returning ``None`` does not)."""
    return [(name, mutation) for name in ARCHS for mutation in MUTATIONS]


def make_variant(arch: NativeArch, mutation: str, clean: Path, folder: Path) -> Path | None:
    """``clean`` mutated by ``mutation``, written into ``folder`` (``None``: it does not apply)."""
    if mutation == "clean":
        return clean
    variant = MUTATIONS[mutation](arch, read_tensors(clean), read_config(clean))
    return None if variant is None else write_variant(clean, variant, folder)
