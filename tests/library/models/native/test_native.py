"""vLLM 0.34.0's native classes as loadkit re-implements them, loaded for real on the CPU from
checkpoints transformers wrote: each packed parameter holds its checkpoint tensors in vLLM's
order (``qkv_proj`` = q, k, v; ``gate_up_proj`` = gate, up), every other parameter its own
tensor, and a tied head the embedding; nothing is left as it was built."""

from __future__ import annotations

import pytest
import torch
from native_cases import ARCHS, read_tensors

from loadkit.loading.track import track_weights_loading
from loadkit.models.native import CLASSES, native_class


@pytest.fixture(scope="module")
def native_clean(tmp_path_factory, quiet_transformers):
    from native_cases import clean_checkpoints

    return clean_checkpoints(tmp_path_factory.mktemp("native"))


def gpt_oss_expected(name: str, t: dict[str, torch.Tensor]) -> torch.Tensor:
    """gpt-oss: the embedding and attention renamed, experts saved ``[experts, in, out]``."""
    hf = name.replace(".attn.", ".self_attn.").replace("embedding.", "embed_tokens.")
    hf = hf.replace("experts.routed_experts.", "experts.")
    for ours, theirs in (("w13_weight", "gate_up_proj"), ("w2_weight", "down_proj")):
        if hf.endswith(ours):
            return t[hf.replace(ours, theirs)].transpose(1, 2)
    hf = hf.replace("w13_bias", "gate_up_proj_bias").replace("w2_bias", "down_proj_bias")
    return expected(hf, t) if hf not in t else t[hf]


def qwen2_5_vl_expected(name: str, t: dict[str, torch.Tensor]) -> torch.Tensor:
    """Qwen2.5-VL: the language model under ``model.`` and ``lm_head`` in the checkpoint."""
    hf = name.replace("language_model.model.", "model.").replace(
        "language_model.lm_head", "lm_head"
    )
    return expected(hf, t)


def gpt2_expected(name: str, t: dict[str, torch.Tensor]) -> torch.Tensor:
    """GPT-2: transformers' ``Conv1D`` weights stored ``[in, out]``, vLLM's ``[out, in]``."""
    conv1d = name.endswith(".weight") and any(p in name for p in ("c_attn", "c_proj", "c_fc"))
    return t[name].t() if conv1d else t[name]


def expected(name: str, t: dict[str, torch.Tensor]) -> torch.Tensor:
    """The checkpoint tensor(s) a vLLM parameter holds, in vLLM's packing order: q, k, v;
    gate, up; per expert gate over up (``w13``) and down (``w2``)."""
    if ".routed_experts." in name:
        return _experts(name, t)
    for packed, parts in (("qkv_proj", ("q_proj", "k_proj", "v_proj")),
                          ("gate_up_proj", ("gate_proj", "up_proj")),
                          ("fused_qkv_a_proj", ("q_a_proj", "kv_a_proj_with_mqa"))):  # fmt: skip
        if f".{packed}." in name and name not in t:
            return torch.cat([t[name.replace(packed, p)] for p in parts])
    return t[name]


def _experts(name: str, t: dict[str, torch.Tensor]) -> torch.Tensor:
    layer = name.split(".routed_experts.")[0].removesuffix(".experts")
    for gate, up, down in (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2")):
        count = sum(k.startswith(f"{layer}.experts.") and k.endswith(f".{down}.weight") for k in t)
        if not count:
            continue
        if name.endswith("w13_weight"):
            parts = [(f"{layer}.experts.{e}.{gate}.weight", f"{layer}.experts.{e}.{up}.weight")
                     for e in range(count)]  # fmt: skip
            return torch.stack([torch.cat([t[g], t[u]]) for g, u in parts])
        return torch.stack([t[f"{layer}.experts.{e}.{down}.weight"] for e in range(count)])
    raise KeyError(name)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_a_real_load_puts_every_checkpoint_tensor_where_vllm_puts_it(arch, native_clean):
    a = ARCHS[arch]
    folder = native_clean(arch)
    t = read_tensors(folder)
    from loadkit.models.transformers.config import load_config

    config, _ = load_config(folder)
    model = native_class(a.vllm_class or a.cls)(config)
    for p in model.parameters():
        p.data.fill_(float("nan"))  # what no load reaches stays NaN
    loaded = model.load_weights(t.items())
    assert track_weights_loading(model, loaded) == ([], [])
    special = {
        "gpt-oss": gpt_oss_expected,
        "qwen2.5-vl": qwen2_5_vl_expected,
        "gpt2": gpt2_expected,
    }
    wanted = special.get(arch, expected)
    for name, param in model.named_parameters():
        assert not param.isnan().any(), name
        assert torch.equal(param, wanted(name, t)), name
    if config.tie_word_embeddings and hasattr(model, "lm_head"):  # Gemma 2 has none
        body = getattr(model, "model", None)
        embedding = body.embed_tokens if body is not None else model.transformer.wte  # GPT-2
        assert model.lm_head.weight is embedding.weight


def test_every_native_architecture_has_a_case():
    assert {a.vllm_class or a.cls for a in ARCHS.values()} >= set(CLASSES)
