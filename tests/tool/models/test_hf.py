"""``--model hf``: the report names the transformers class and each rule's origin; the command
line's clean and broken checkpoints and its exit-2 errors."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version

import pytest
import torch
from hf_cases import read_tensors, write_variant

from loadkit import open_checkpoint
from loadkit_inspect import inspect_checkpoint
from loadkit_inspect.cli.main import main

# transformers quiet for every test here, not only those that save a checkpoint (conftest.py)
pytestmark = pytest.mark.usefixtures("quiet_transformers")


def test_report_names_the_transformers_class_and_rule_origins(hf_clean):
    # vLLM 0.34.0 serves GPT-2 with its native class: the Transformers backend, asked for
    report = inspect_checkpoint(hf_clean("gpt2"), model="hf", model_impl="transformers")
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


@pytest.mark.slow  # a fresh process: this session's transformers is quiet already
def test_json_keeps_stderr_for_errors_alone(tmp_path, loadkit_cli):
    """transformers warns about this config (token ids outside a tiny vocabulary) when it is
    read: not on stderr under --json, which holds errors alone."""
    import transformers

    config = transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=64, n_positions=8)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    done = loadkit_cli("inspect", tmp_path, "--model", "hf", "--json")
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads(done.stdout)["exit_status"] == 0
