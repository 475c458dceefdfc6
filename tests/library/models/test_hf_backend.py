"""`loadkit.models.transformers`: vLLM's Transformers backend on transformers' own classes.

The mapper derivation, the wrapper choice, the skip rules, a real load (equal to transformers'
own ``from_pretrained``), and ``--model hf`` on the command line, with its exit-2 errors.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version

import pytest
import torch
from hf_cases import ARCHS, read_tensors, write_variant

from loadkit import open_checkpoint
from loadkit.models.transformers import (
    TransformersEmbeddingModel,
    TransformersForCausalLM,
    TransformersForSequenceClassification,
    choose_wrapper,
    from_config,
)
from loadkit_inspect import inspect_checkpoint
from loadkit_inspect.cli.main import main
from loadkit_inspect.models.registry import ModelSpecError

# transformers quiet for every test here, not only those that save a checkpoint (conftest.py)
pytestmark = pytest.mark.usefixtures("quiet_transformers")


def config(name):
    return ARCHS[name].config()


# --- the mapper, derived as upstream's _create_hf_to_vllm_mapper -------------------------------


def test_mapper_for_a_base_model_prefix_other_than_model():
    m = TransformersForCausalLM(config("gpt2"), device="meta")
    rules = [(stage, rule, target) for stage, rule, target in m.hf_to_vllm_mapper.rules()]
    regex = [(rule, target) for stage, rule, target in rules if stage == "regex"]
    assert regex == [
        ("attn.bias", None),  # GPT2Model._keys_to_ignore_on_load_unexpected, sorted
        ("crossattention.bias", None),
        (r"^transformer\.(.+)", r"model.\1"),
        (r"^(?!model\.)((wte|wpe|drop|h|ln_f).*)", r"model.\1"),
        (r"^(model\.)((?!wte|wpe|drop|h|ln_f).+)", r"\2"),
        (r"^model\.(.+\.)*(lm_head.+)", r"\2"),
    ]
    # transformers' own renamings come first: the legacy LayerNorm.gamma/beta ones among them
    renames = [rule for stage, rule, _ in rules if stage == "renaming"]
    assert "LayerNorm.gamma -> LayerNorm.weight" in renames
    mapper = m.hf_to_vllm_mapper
    assert mapper.map_name("transformer.h.0.mlp.c_fc.weight") == "model.h.0.mlp.c_fc.weight"
    assert mapper.map_name("h.0.mlp.c_fc.weight") == "model.h.0.mlp.c_fc.weight"  # no prefix
    assert mapper.map_name("model.lm_head.weight") == "lm_head.weight"  # nested head
    assert mapper.map_name("transformer.h.0.attn.bias") is None  # the old causal-mask buffer
    # the upstream pitfall the oracle tests pin: the ignore regex is searched anywhere
    assert mapper.map_name("transformer.h.0.attn.c_attn.bias") is None
    origins = m.mapper_rule_origins
    assert origins[("regex", "attn.bias")] == (
        "from transformers: GPT2Model._keys_to_ignore_on_load_unexpected"
    )
    assert "base_model_prefix 'transformer'" in origins[("regex", r"^transformer\.(.+)")]
    assert "legacy renamings" in origins[("renaming", "LayerNorm.gamma -> LayerNorm.weight")]


def test_mapper_when_the_base_model_prefix_is_model():
    m = TransformersForCausalLM(config("llama"), device="meta")
    regex = [rule for stage, rule, _ in m.hf_to_vllm_mapper.rules() if stage == "regex"]
    assert regex == [
        r"^(?!model\.)((embed_tokens|layers|norm|rotary_emb).*)",
        r"^(model\.)((?!embed_tokens|layers|norm|rotary_emb).+)",
        r"^model\.(.+\.)*(lm_head.+)",
    ]
    mapper = m.hf_to_vllm_mapper
    key = "model.layers.0.mlp.up_proj.weight"
    assert mapper.map_name(key) == key
    assert mapper.map_name("norm.weight") == "model.norm.weight"
    assert mapper.map_name("model.score.weight") == "score.weight"  # model. on a non-child


def test_the_callers_config_is_left_alone():
    cfg = config("llama")
    before = cfg.to_dict()
    TransformersForCausalLM(cfg, device="meta", dtype=torch.bfloat16)
    assert cfg.to_dict() == before


# --- which wrapper ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arch", "wrapper"),
    [
        ("bert", TransformersEmbeddingModel),  # BertModel: '...Model' -> pooling, embed
        ("vit", TransformersEmbeddingModel),
        ("bert-cls", TransformersForSequenceClassification),
        ("llama", TransformersForCausalLM),
        ("gpt2", TransformersForCausalLM),  # '...LMHeadModel' wins over '...Model'
        ("t5", TransformersForCausalLM),  # '...ForConditionalGeneration'
    ],
)
def test_wrapper_chosen_by_architecture_suffix(hf_clean, arch, wrapper):
    folder = hf_clean(arch)  # save_pretrained records the architecture in config.json
    m = from_config(folder, device="meta")
    assert type(m) is wrapper
    assert ARCHS[arch].cls in m.wrapper_reason


def test_wrapper_without_architecture_override_and_refusals():
    import transformers

    bare = transformers.BertConfig()
    assert bare.architectures is None
    assert choose_wrapper(bare).wrapper is TransformersForCausalLM  # upstream's default
    assert choose_wrapper(bare, "embed").wrapper is TransformersEmbeddingModel
    with pytest.raises(ModelSpecError, match="unknown wrapper 'pool'"):
        choose_wrapper(bare, "pool")
    moe = transformers.MixtralConfig(architectures=["MixtralForCausalLM"])
    with pytest.raises(ModelSpecError, match="mixture of experts.*TransformersMoE"):
        choose_wrapper(moe)
    assert choose_wrapper(moe, "causal").wrapper is TransformersForCausalLM
    vlm = transformers.LlavaConfig(architectures=["LlavaForConditionalGeneration"])
    with pytest.raises(ModelSpecError, match="multimodal"):
        choose_wrapper(vlm)


def test_legacy_mixin_drops_for_encoders_only():
    # vLLM 0.34.0: the drops are rules of the wrapper's mapper (0.28.0: skip lists)
    emb = TransformersEmbeddingModel(config("bert"), device="meta")
    causal = TransformersForCausalLM(config("llama"), device="meta")
    assert {"position_ids", "score.bias"} <= {
        k for k, v in emb.hf_to_vllm_mapper.orig_to_new_substr.items() if v is None
    }
    assert emb.hf_to_vllm_mapper.orig_to_new_prefix["model.predictions."] is None
    assert emb.mapper_rule_origins[("substr", "position_ids")].startswith("LegacyMixin")
    assert not causal.hf_to_vllm_mapper.orig_to_new_substr
    assert not causal.hf_to_vllm_mapper.orig_to_new_prefix


def test_tied_head_is_the_embedding_and_lm_head_is_an_alias():
    from loadkit.loading.tensors import tied_embedding_aliases

    m = TransformersForCausalLM(config("gemma"), device="meta")
    assert m.lm_head.weight is m.model.embed_tokens.weight
    assert tied_embedding_aliases(m) == {"lm_head.weight": "model.embed_tokens.weight"}
    untied = TransformersForCausalLM(config("llama"), device="meta")
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight
    assert tied_embedding_aliases(untied) == {}


def test_sequence_classification_takes_transformers_classifier():
    m = TransformersForSequenceClassification(config("bert-cls"), device="meta")
    assert isinstance(m.classifier, torch.nn.Linear)
    assert tuple(m.classifier.weight.shape) == (3, 16)
    assert m.model.pooler is not None  # BERT classifies its pooled output


# --- a real load equals transformers' own ----------------------------------------------------


def hf_model(name, folder):
    import transformers

    return getattr(transformers, ARCHS[name].cls).from_pretrained(folder)


def in_wrapper_names(hf, wrapper, items):
    """transformers' names as the wrapper spells them: the base model under ``model.``."""
    bmp = hf.base_model_prefix
    nested = getattr(hf, bmp, None) is not None  # GPT2LMHeadModel.transformer, not BertModel
    children = {n for n, _ in wrapper.model.named_children()}
    out = {}
    for name, tensor in items:
        if nested and name.startswith(bmp + "."):
            name = "model." + name[len(bmp) + 1 :]
        elif name.split(".", 1)[0] in children:
            name = "model." + name
        out[name] = tensor
    return out


def assert_same_as_transformers(wrapper, hf, *, not_loaded=()):
    ours = wrapper.state_dict()
    theirs = in_wrapper_names(hf, wrapper, hf.state_dict().items())
    assert set(ours) == set(theirs)
    differ = sorted(k for k in theirs if not torch.equal(ours[k], theirs[k]))
    assert differ == sorted(not_loaded)
    # Buffers too, the non-persistent ones (rotary inv_freq, position_ids) included.
    our_buffers = dict(wrapper.named_buffers())
    their_buffers = in_wrapper_names(hf, wrapper, hf.named_buffers())
    assert set(our_buffers) == set(their_buffers)
    for key, buf in their_buffers.items():
        assert torch.equal(our_buffers[key], buf), key


@pytest.mark.parametrize("name", ["llama", "bert", "bert-cls", "phi", "opt", "vit"])
def test_real_load_gives_transformers_state_dict(hf_clean, name):
    folder = hf_clean(name)
    wrapper = from_config(folder, device="cpu")
    loaded = wrapper.load_weights(open_checkpoint(folder).weights())
    assert loaded  # the qualified names the load filled
    assert_same_as_transformers(wrapper, hf_model(name, folder))


def test_real_load_of_a_head_bias(hf_clean):
    """Phi's lm_head has a bias: registered when the checkpoint has one, and loaded."""
    folder = hf_clean("phi")
    wrapper = from_config(folder, device="cpu")
    assert wrapper.lm_head.bias is None
    loaded = wrapper.load_weights(open_checkpoint(folder).weights())
    assert "lm_head.bias" in loaded
    assert torch.equal(wrapper.lm_head.bias, hf_model("phi", folder).lm_head.bias)


def test_real_load_of_gpt2_leaves_the_attention_biases_as_vllm_does(hf_clean):
    """The upstream pitfall, in a real load: c_attn.bias is dropped by the ignore regex."""
    folder = hf_clean("gpt2")  # sharded: several files and an index
    assert len(open_checkpoint(folder).files) > 1
    wrapper = from_config(folder, device="cpu")
    loaded = wrapper.load_weights(open_checkpoint(folder).weights())
    assert not any("c_attn.bias" in n for n in loaded)
    layers = ARCHS["gpt2"].config().n_layer
    assert_same_as_transformers(
        wrapper,
        hf_model("gpt2", folder),
        not_loaded=[f"model.h.{i}.attn.c_attn.bias" for i in range(layers)],
    )


def test_real_load_of_t5_leaves_its_untied_embeddings_as_vllm_0_34_does(hf_clean):
    """vLLM 0.34.0 gives each vocabulary embedding a weight of its own: T5's encoder and decoder
    embed_tokens no longer share `shared`'s, and no checkpoint key fills them."""
    folder = hf_clean("t5")
    wrapper = from_config(folder, device="cpu")
    untied = ["model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"]
    assert all(wrapper.get_parameter(n) is not wrapper.model.shared.weight for n in untied)
    loaded = wrapper.load_weights(open_checkpoint(folder).weights())
    assert "model.shared.weight" in loaded and not set(untied) & loaded
    assert_same_as_transformers(wrapper, hf_model("t5", folder), not_loaded=untied)


def test_legacy_position_ids_in_an_encoder_checkpoint_load_cleanly(hf_clean, tmp_path):
    """The issue's case: an old BERT checkpoint with embeddings.position_ids."""
    clean = hf_clean("bert")
    tensors = read_tensors(clean)
    tensors["embeddings.position_ids"] = torch.arange(32).unsqueeze(0)
    folder = write_variant(clean, tensors, tmp_path / "old-bert")
    report = inspect_checkpoint(folder, model="hf")
    assert report.clean, report.render()
    (key,) = [k for k in report.load.keys if k.name == "embeddings.position_ids"]
    assert (key.status, key.rule) == ("dropped by mapper", "substr 'position_ids'")
    # the same key in a generative model's checkpoint is unexpected: no legacy skip rule there
    hf_report = inspect_checkpoint(folder, model="hf-causal")
    assert "embeddings.position_ids" in {u.name for u in hf_report.load.unexpected}


# --- the report and the command line ------------------------------------------------------------


def test_report_names_the_transformers_class_and_rule_origins(hf_clean):
    report = inspect_checkpoint(hf_clean("gpt2"), model="hf")
    backend = report.model.backend
    assert backend["wrapper"] == "TransformersForCausalLM"
    assert backend["transformers_class"] == "GPT2Model"
    assert backend["model_type"] == "gpt2"
    assert backend["base_model_prefix"] == "transformer"
    assert backend["config"].endswith("config.json")
    rules = {(r.stage, r.rule): r for r in report.mapper.rules}
    prefix_rule = rules[("regex", r"^transformer\.(.+)")]
    # every key but the two attention biases the ignore regex drops first
    dropped = [name for name, _ in report.mapper.dropped]
    assert dropped == [f"transformer.h.{i}.attn.c_attn.bias" for i in (0, 1)]
    assert prefix_rule.fired == len(open_checkpoint(hf_clean("gpt2")).tensors) - 2
    assert prefix_rule.origin.startswith("derived from the transformers model")
    assert rules[("regex", "attn.bias")].origin.startswith("from transformers")
    text = report.render()
    assert "transformers 5." in text and "built GPT2Model (model_type 'gpt2')" in text
    assert "from transformers: GPT2Model._keys_to_ignore_on_load_unexpected" in text


@pytest.mark.slow  # a subprocess that imports torch and transformers
def test_cli_clean_and_broken_checkpoints(hf_clean, tmp_path, capsys, loadkit_cli):
    folder = hf_clean("llama")
    # vLLM 0.34.0 serves Llama natively; this is the Transformers backend, asked for by name
    backend = ["--model-impl", "transformers"]
    assert main(["inspect", str(folder), "--model", "hf", *backend]) == 0
    out = capsys.readouterr().out
    both = [
        f"transformers {version('transformers')}: would load cleanly",
        "vllm 0.34.0, TransformersForCausalLM: would load cleanly",
    ]  # one line each: together they are wider than a terminal
    assert out.splitlines()[:2] == both
    assert "built LlamaModel" in out
    assert out.endswith("verdict:\n" + "".join(f"  {line}\n" for line in both) + "  (exit 0)\n")
    tensors = read_tensors(folder)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    broken = write_variant(folder, tensors, tmp_path / "broken")
    # A real process, as a user runs it (one: each pays for importing torch and transformers).
    res = loadkit_cli(
        "inspect",
        broken,
        "--model",
        f"hf:{broken / 'config.json'}",
        *backend,
        "--json",
        timeout=300,
    )
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    doc = json.loads(res.stdout)
    assert [m["name"] for m in doc["load"]["missing"]] == ["model.layers.1.mlp.up_proj.weight"]
    assert doc["model"]["backend"]["transformers_class"] == "LlamaModel"
    origins = {r["rule"]: r["origin"] for r in doc["mapper"]["rules"]}
    assert origins["LayerNorm.gamma -> LayerNorm.weight"].startswith("from transformers")


@pytest.mark.slow  # a subprocess
def test_cli_missing_config_fails_fast_without_torch(tmp_path):
    """No config.json: exit 2, one line, before torch or transformers is imported."""
    folder = write_variant_without_config(tmp_path)
    code = (
        "import sys; from loadkit_inspect.cli.main import main; "
        f"rc = main(['inspect', {str(folder)!r}, '--model', 'hf']); "
        "print(rc, 'torch' in sys.modules, 'transformers' in sys.modules)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.stdout.split() == ["2", "False", "False"], res
    assert "config.json: no such config file" in res.stderr
    assert "Traceback" not in res.stderr


def write_variant_without_config(tmp_path):
    from safetensors.torch import save_file

    folder = tmp_path / "no-config"
    folder.mkdir()
    save_file({"w": torch.zeros(2)}, folder / "model.safetensors")
    return folder


@pytest.mark.parametrize(
    ("config_text", "message"),
    [
        ("{not json", "the config is not valid JSON"),
        ("[1, 2]", "must be a JSON object, not list"),
        ('{"hidden_size": 16}', "has no 'model_type'"),
        ('{"model_type": "lama"}', "unknown model_type 'lama'.*nearest: llama"),
        # docs/inspect.md promises the nearest known ones, also for a name close to none
        (
            '{"model_type": "my_custom_arch"}',
            r"unknown model_type 'my_custom_arch'.*none is close among \d{3,} known; "
            r"the nearest: \w+, \w+, \w+$",
        ),
        (
            '{"model_type": "llama", "hidden_size": 16, "num_attention_heads": 3}',
            "transformers cannot build a 'llama' config",
        ),
    ],
)
def test_cli_bad_configs_exit_2(tmp_path, capsys, config_text, message):
    folder = write_variant_without_config(tmp_path)
    (folder / "config.json").write_text(config_text)
    assert main(["inspect", str(folder), "--model", "hf"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config.json" in err
    assert __import__("re").search(message, err), err


def test_cli_hf_spec_errors(tmp_path, capsys, hf_clean):
    folder = hf_clean("bert")
    assert main(["inspect", str(folder), "--model", "hf:"]) == 2
    assert "give a config file or folder after the colon" in capsys.readouterr().err
    assert main(["inspect", str(folder), "--model", f"hf:{tmp_path / 'nowhere'}"]) == 2
    err = capsys.readouterr().err  # the path the user just gave: what is wrong with it
    assert f"{tmp_path / 'nowhere'}: does not exist; --model hf:PATH names a config.json" in err
    assert "give one with" not in err
    (tmp_path / "empty").mkdir()
    assert main(["inspect", str(folder), "--model", f"hf:{tmp_path / 'empty'}"]) == 2
    assert f"{tmp_path / 'empty'}: has no config.json; --model hf:PATH" in capsys.readouterr().err
    # a config given by folder, and a wrapper named explicitly
    assert main(["inspect", str(folder), "--model", f"hf-embed:{folder}", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"]["backend"]["wrapper"] == "TransformersEmbeddingModel"
    assert doc["model"]["backend"]["wrapper_reason"] == "asked for (embed)"


def test_registry_and_spec_grammar_agree():
    from loadkit.models.transformers.wrappers import WRAPPERS
    from loadkit_inspect.models.hf import HF_SPECS, parse_hf_spec
    from loadkit_inspect.models.registry import FROM_CONFIG

    assert set(FROM_CONFIG) == set(HF_SPECS)
    for name, task in HF_SPECS.items():
        wrapper = FROM_CONFIG[name]
        assert wrapper == ("architecture" if task is None else WRAPPERS[task].__name__)
        assert parse_hf_spec(f"{name}:some/dir").config == "some/dir"
    assert parse_hf_spec("hfx") is None and parse_hf_spec("pkg.hf:build") is None
