"""A rule that pairs a key with one of several same-shape tensors is never called proven.

Meta's original Llama checkpoints name attention `attention.wq` ... `attention.wo` and the norms
`attention_norm` and `ffn_norm`; transformers' Llama says `self_attn.q_proj` ... and
`input_layernorm`, `post_attention_layernorm`. `q_proj` and `o_proj` have the same shape (as do
the two norms), so a dry load is as clean with `wq` in `o_proj` as in `q_proj`: the second load
proves nothing about which is right, and the names alone chose.
"""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from loadkit_inspect.inspector import inspect_checkpoint

META_ATTENTION = {
    "self_attn.q_proj.": "attention.wq.",
    "self_attn.k_proj.": "attention.wk.",
    "self_attn.v_proj.": "attention.wv.",
    "self_attn.o_proj.": "attention.wo.",
}
META_NORMS = {"input_layernorm.": "attention_norm.", "post_attention_layernorm.": "ffn_norm."}


def _renamed(key, names):
    for ours, theirs in names.items():
        key = key.replace("." + ours, "." + theirs)
    return key


@pytest.fixture(scope="module")
def llama(tmp_path_factory, quiet_transformers):
    """A tiny LlamaForCausalLM saved by transformers (4 heads, 2 kv heads: q and o [32, 32], k and
    v [16, 32]; gate and up [64, 32]), and copies of it renamed or fused."""
    import shutil

    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=64, max_position_embeddings=64,
    )  # fmt: skip
    root = tmp_path_factory.mktemp("llama")
    transformers.LlamaForCausalLM(config).save_pretrained(root / "clean")
    tensors = load_file(root / "clean" / "model.safetensors")

    def copy(name, renamed):
        folder = root / name
        folder.mkdir()
        shutil.copy(root / "clean" / "config.json", folder / "config.json")
        save_file(renamed, folder / "model.safetensors")
        return folder

    fused = dict(tensors)
    for i in range(config.num_hidden_layers):
        attn = f"model.layers.{i}.self_attn."
        qkv = [fused.pop(f"{attn}{p}_proj.weight") for p in "qkv"]
        fused[f"{attn}qkv_proj.weight"] = torch.cat(qkv)  # [64, 32]: gate's and up's shape
        mlp = f"model.layers.{i}.mlp."
        gate_up = [fused.pop(f"{mlp}{p}_proj.weight") for p in ("gate", "up")]
        fused[f"{mlp}gate_up_proj.weight"] = torch.cat(gate_up)
    return {
        "clean": root / "clean",
        "meta": copy("meta", {_renamed(k, META_ATTENTION): v for k, v in tensors.items()}),
        "norms": copy("norms", {_renamed(k, META_NORMS): v for k, v in tensors.items()}),
        "prefixed": copy(
            "prefixed", {k.replace("model.", "transformer.", 1): v for k, v in tensors.items()}
        ),
        "fused": copy("fused", fused),
    }


def _swapped_mapper(fix):
    """The fix's rules with the targets of the two same-shape attention rules swapped."""
    mapper = json.loads(json.dumps(fix.mapper))
    substr = mapper["orig_to_new_substr"]
    wq, wo = ".attention.wq.", ".attention.wo."
    substr[wq], substr[wo] = substr[wo], substr[wq]
    return mapper


def test_same_shape_pairings_are_not_proven_though_the_second_load_is_clean(llama):
    r = inspect_checkpoint(llama["meta"], model="hf", model_impl="transformers", loader="vllm")
    fix = r.fix
    assert fix is not None and fix.result.clean  # the rules do make the load clean ...
    assert not fix.proven  # ... and prove nothing about which tensor is which
    keys = {a.key for a in fix.ambiguous}
    assert {f"model.layers.{i}.attention.w{p}.weight" for i in (0, 1) for p in "qkvo"} == keys
    # The alternative a pairing names is really one: swapping q and o loads as cleanly.
    swapped = inspect_checkpoint(
        llama["meta"], model="hf", model_impl="transformers", loader="vllm", mapper=fix.mapper
    )
    assert swapped.clean
    assert inspect_checkpoint(
        llama["meta"],
        model="hf",
        model_impl="transformers",
        loader="vllm",
        mapper=_swapped_mapper(fix),
    ).clean
    text = r.render()
    assert "would load cleanly with these rules, but NOT proven:" in text
    assert "shapes cannot tell these tensors apart" in text
    assert "(proven:" not in text
    assert "it would load cleanly with the suggested fix" not in text
    document = json.loads(r.to_json())
    assert document["suggested_fix"]["proven"] is False
    assert {a["key"] for a in document["suggested_fix"]["ambiguous"]} == keys


def test_two_norms_of_one_shape_are_not_proven_either(llama):
    fix = inspect_checkpoint(
        llama["norms"], model="hf", model_impl="transformers", loader="vllm"
    ).fix
    assert fix.result.clean and not fix.proven
    chosen = {a.key: a.chosen for a in fix.ambiguous}
    assert set(chosen) == {
        f"model.layers.{i}.{n}.weight"
        for i in (0, 1)
        for n in META_NORMS.values()
        for n in [n[:-1]]
    }


def test_ambiguous_keys_stay_listed_as_unexpected(llama):
    text = inspect_checkpoint(
        llama["meta"], model="hf", model_impl="transformers", loader="vllm"
    ).render()
    unexpected = text.split("unexpected names")[1].split("missing:")[0]
    assert "model.layers.0.attention.wq.weight" in unexpected


def test_a_fused_projection_is_not_proven_into_a_same_shape_mlp_weight(llama):
    r = inspect_checkpoint(llama["fused"], model="hf", model_impl="transformers", loader="vllm")
    fix = r.fix
    if fix is None or not hasattr(fix, "suggestions"):
        pytest.fail(f"expected the qkv_proj -> gate_proj rule to be considered: {fix!r}")
    targets = {a.chosen.rsplit(".", 2)[-2] for a in fix.ambiguous}
    assert targets and not fix.proven
    assert targets <= {"gate_proj", "up_proj"}


def test_a_prefix_rename_stays_proven(llama):
    fix = inspect_checkpoint(
        llama["prefixed"], model="hf", model_impl="transformers", loader="vllm"
    ).fix
    assert fix.proven and fix.ambiguous == []
    assert fix.mapper == {"orig_to_new_prefix": {"transformer.": "model."}}
