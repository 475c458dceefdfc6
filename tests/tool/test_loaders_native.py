"""``--model hf`` on checkpoints vLLM 0.34.0 serves with its native classes: the verdict names
the class, and says what vLLM would do with a partial or wrong checkpoint: refuse it (a norm or
a stacked shard missing, an unexpected key, a shape that does not fit), or load it without a
word and leave a tensor uninitialised (a linear weight missing: vLLM does not check those).

The expected kinds are read off vLLM 0.34.0's code (``track_weights_loading``, the stacked
layers' ``pop_missing_shards``, ``AutoWeightsLoader``); ``make test-upstream`` runs the wheel's
own ``load_weights`` on the same files (tests/upstream/test_native_upstream.py).
"""

from __future__ import annotations

from importlib.metadata import version

import pytest
import torch
from native_cases import ARCHS, cases, make_variant

from loadkit_inspect import inspect_checkpoint

# mutation -> what vLLM 0.34.0 does with it: "clean", "fails" (it raises), "quiet" (it loads
# and leaves a tensor uninitialised)
KIND = {
    "clean": "clean",
    "prefix renamed": "fails",
    "norm dropped": "fails",
    "linear dropped": "quiet",
    "stacked shard dropped": "fails",
    "matrix transposed": "fails",
    "extra head": "fails",
    "tied head flipped": "clean",
    "layers shifted": "fails",
    "stray layer key": "fails",
    "extra bias": "clean",
    "kv scale": "fails",
    "rotary buffer saved": "clean",
    "expert dropped": "quiet",  # vLLM tracks no expert slice
    "experts fused": "clean",  # the fused entries of the expert mapping take them
    "experts split": "clean",  # gpt-oss loads one expert's tensor at a time too
}


# Where an architecture answers otherwise, and why (read off its class).
CASE_KIND = {
    # Gemma2ForCausalLM has no lm_head at all (the embedding makes the logits): a saved head is
    # a key the model has no place for
    ("gemma2", "tied head flipped"): "fails",
    # DeepseekV2ForCausalLM never ties its lm_head: a tied config without the head saved
    # leaves it uninitialised, and vLLM counts a ParallelLMHead as loaded
    ("deepseek-v3", "tied head flipped"): "quiet",
    # DeepSeek's hand-written loader maps experts one by one (no fused entries): a tensor of
    # every expert at once is a KeyError
    ("deepseek-v3", "experts fused"): "fails",
    ("deepseek-v2", "tied head flipped"): "quiet",
    ("deepseek-v2", "experts fused"): "fails",
    # without q_lora_rank, kv_a_proj_with_mqa is a linear of its own, not a stacked shard
    ("deepseek-v2", "stacked shard dropped"): "quiet",
    # DeepSeek's hand-written loader passes an extra ``.bias`` over: a key loaded nowhere
    ("deepseek-v3", "extra bias"): "quiet",
    ("deepseek-v2", "extra bias"): "quiet",
    ("gpt-oss", "tied head flipped"): "quiet",  # GptOssForCausalLM never ties its head either
    # gpt-oss's own load_weights passes a name it does not have over without a word
    ("gpt-oss", "stray layer key"): "quiet",
}


@pytest.fixture(scope="module")
def native_clean(tmp_path_factory, quiet_transformers):
    from native_cases import clean_checkpoints

    return clean_checkpoints(tmp_path_factory.mktemp("native"))


@pytest.mark.parametrize(("arch", "mutation"), cases())
def test_the_vllm_verdict_is_the_native_classs(arch, mutation, native_clean, tmp_path):
    folder = make_variant(ARCHS[arch], mutation, native_clean(arch), tmp_path / "variant")
    if folder is None:
        pytest.skip(f"{mutation} does not apply to {arch}")
    report = inspect_checkpoint(folder, model="hf", loader="vllm")
    verdict = report.loaders["vllm"]
    expected = ARCHS[arch].vllm_class or ARCHS[arch].cls
    assert verdict.label == f"vllm 0.34.0, native {expected}"
    kind = "clean" if verdict.clean else "quiet" if verdict.quiet else "fails"
    assert kind == CASE_KIND.get((arch, mutation), KIND[mutation]), verdict.phrase()
    assert report.exit_status == (0 if kind == "clean" else 1)


def test_a_missing_linear_weight_is_said_plainly(native_clean, tmp_path):
    folder = make_variant(ARCHS["llama"], "linear dropped", native_clean("llama"), tmp_path / "v")
    report = inspect_checkpoint(folder, model="hf")
    first = " ".join(report.render().split("\n\n")[0].split()).replace(" | ", " ")
    assert first == (
        f"transformers {version('transformers')}: would load, but 1 newly initialised at random "
        "(MISSING: model.layers.1.mlp.down_proj.weight) "
        "vllm 0.34.0, native LlamaForCausalLM: would load WITHOUT AN ERROR but leave 1 tensor "
        "uninitialised (never in the checkpoint; vLLM does not check it): "
        "model.layers.1.mlp.down_proj.weight"
    )


def test_a_missing_stacked_shard_is_named_as_vllm_names_it(native_clean, tmp_path):
    clean = native_clean("qwen3")
    folder = make_variant(ARCHS["qwen3"], "stacked shard dropped", clean, tmp_path / "v")
    verdict = inspect_checkpoint(folder, model="hf", loader="vllm").loaders["vllm"]
    assert verdict.problems == ["1 missing: model.layers.1.self_attn.qkv_proj.weight.k"]


def test_a_key_the_model_drops_is_said_plainly(native_clean, tmp_path):
    folder = make_variant(ARCHS["gpt-oss"], "stray layer key", native_clean("gpt-oss"), tmp_path)
    verdict = inspect_checkpoint(folder, model="hf", loader="vllm").loaders["vllm"]
    assert verdict.phrase() == (
        "vllm 0.34.0, native GptOssForCausalLM: would load WITHOUT AN ERROR but ignore 1 "
        "checkpoint key (taken by the model's own load_weights and loaded nowhere): "
        "model.layers.0.mlp.extra.weight"
    )


def test_a_missing_norm_fails_and_a_missing_linear_is_said_beside_it(native_clean, tmp_path):
    from native_cases import Variant, read_tensors, write_variant

    clean = native_clean("mistral")
    t = read_tensors(clean)
    drop = ("model.norm.weight", "model.layers.0.self_attn.o_proj.weight")
    folder = write_variant(clean, Variant({k: v for k, v in t.items() if k not in drop}), tmp_path)
    verdict = inspect_checkpoint(folder, model="hf", loader="vllm").loaders["vllm"]
    assert not verdict.clean and not verdict.quiet
    assert verdict.problems == [
        "1 missing: model.norm.weight",
        "besides, it would leave 1 tensor uninitialised (never in the checkpoint; vLLM does not "
        "check it): "
        "model.layers.0.self_attn.o_proj.weight",
    ]


def test_a_quantized_checkpoint_is_not_checked(native_clean, tmp_path):
    from native_cases import Variant, read_config, read_tensors, write_variant

    clean = native_clean("deepseek-v3")
    config = read_config(clean)
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    folder = write_variant(clean, Variant(read_tensors(clean), config), tmp_path)
    report = inspect_checkpoint(folder, model="hf")
    verdict = report.loaders["vllm"]
    assert not verdict.checked and not verdict.clean
    assert verdict.problems == [
        "vLLM 0.34.0 would build DeepseekV3ForCausalLM quantized ('fp8' from the config's "
        "quantization_config), whose quantized layers loadkit does not re-implement"
    ]
    # transformers' quantizer takes the scales and swaps the layers: not judged either, and
    # neither load stands in (no unquantized load claims 'missing' or 'unused' here)
    fp = report.from_pretrained
    assert fp.quantized == "fp8" and fp.outcome == "unknown" and not fp.unexpected
    assert (
        report.loaders["transformers"]
        .phrase()
        .startswith(
            f"transformers {version('transformers')}: not judged (it would load through its 'fp8' "
        )
    )
    assert report.load is None and report.exit_status == 1
    text = report.render()
    assert "load  (vllm loader): not simulated (vllm 0.34.0, native DeepseekV3ForCausalLM: " in text
    assert "unexpected names" not in text and "UNEXPECTED" not in text


def test_a_load_stopped_early_names_no_tensor_it_never_reached(native_clean, tmp_path):
    from native_cases import Variant, read_tensors, write_variant

    from loadkit_inspect.simulate.run import MAX_RUNS

    # a hand-written loader stops at each key the model lacks (a KeyError): one pass each,
    # until the dry load gives up
    clean = native_clean("deepseek-v2")
    t = read_tensors(clean)
    stray = {f"model.layers.0.mlp.stray{i}.weight": torch.zeros(1) for i in range(MAX_RUNS + 8)}
    folder = write_variant(clean, Variant({**stray, **t}), tmp_path)
    report = inspect_checkpoint(folder, model="hf", loader="vllm")
    assert not report.load.complete
    verdict = report.loaders["vllm"]
    assert not verdict.clean and not verdict.quiet
    words = " ".join(verdict.problems)
    assert f"{MAX_RUNS} unexpected" in words and "simulation stopped early" in words
    # tensors the load never reached are neither missing nor left uninitialised
    assert "missing" not in words and "uninitialised" not in words
    assert report.fix is None and report.not_offered is None  # no rule inferred from them


def test_deepseeks_multi_token_prediction_layer_is_set_aside_by_design(native_clean, tmp_path):
    """DeepSeek-V3 ships layer 61, its multi-token-prediction module, beside the 61 decoder
    layers: vLLM's load_weights passes it over (a speculative-decoding draft loads it), which is
    no silent loss. A key the loader drops for no such reason stays a finding."""
    from native_cases import Variant, read_config, read_tensors, write_variant

    clean = native_clean("deepseek-v3")
    config = read_config(clean)
    config["num_nextn_predict_layers"] = 1
    t = read_tensors(clean)
    mtp = {
        k.replace("layers.1.", "layers.2."): v.clone() for k, v in t.items() if ".layers.1." in k
    }
    folder = write_variant(clean, Variant({**t, **mtp}, config), tmp_path / "mtp")
    report = inspect_checkpoint(folder, model="hf", loader="vllm")
    verdict = report.loaders["vllm"]
    assert verdict.clean and report.exit_status == 0
    assert verdict.notes == (
        f"{len(mtp)} keys set aside: the multi-token-prediction layer 2 (vLLM loads it only "
        "into a speculative-decoding draft)",
    )
    assert verdict.phrase().endswith(f"would load cleanly ({verdict.notes[0]})")
    assert report.as_dict()["loaders"]["vllm"]["notes"] == list(verdict.notes)
    # an indexer key (DeepSeek-V3.2's, which loadkit does not build) is dropped for no such reason
    stray = {"model.layers.0.self_attn.indexer.wk.weight": torch.zeros(4, 16)}
    dropped = write_variant(clean, Variant({**t, **mtp, **stray}, config), tmp_path / "stray")
    verdict = inspect_checkpoint(dropped, model="hf", loader="vllm").loaders["vllm"]
    assert verdict.quiet and not verdict.clean and not verdict.notes
    assert verdict.problems == [
        "ignore 1 checkpoint key (taken by the model's own load_weights and loaded nowhere): "
        "model.layers.0.self_attn.indexer.wk.weight"
    ]
