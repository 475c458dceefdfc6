"""inspect as a debugging tool (issue 15): the fix first, every problem, nothing hidden."""

import json

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from loadkit import AutoWeightsLoader, LoadkitError, WeightsMapper, as_pooling_model
from loadkit_inspect.inspector import inspect_checkpoint
from loadkit_inspect.models.registry import ModelSpecError
from loadkit_inspect.options import LoadRules


class Block(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.norm = nn.LayerNorm(h)


class Encoder(nn.Module):
    """BERT-like names: many tensors of equal shape whose names differ by one word or layer."""

    def __init__(self, layers=4, h=4, labels=0):
        super().__init__()
        self.embed = nn.Embedding(8, h)
        self.layer = nn.ModuleList(Block(h) for _ in range(layers))
        if labels:
            self.classifier = nn.Linear(h, labels)


def state(prefix="", layers=4, dtype=torch.float32):
    torch.manual_seed(0)
    return {prefix + k: v.to(dtype).contiguous() for k, v in Encoder(layers).state_dict().items()}


def save(path, tensors):
    save_file(tensors, str(path))
    return path


def test_a_prefix_mismatch_gets_one_rule_printed_first_and_proven(tmp_path):
    f = save(tmp_path / "m.safetensors", state("bert."))
    r = inspect_checkpoint(f, model=Encoder)
    assert r.clean is False and r.exit_status == 1
    assert [(s.rule.stage, s.rule.old, s.rule.new) for s in r.fix.suggestions] == [
        ("prefix", "bert.", "")
    ]
    assert r.fix.explains == 33 and r.fix.mapper == {"orig_to_new_prefix": {"bert.": ""}}
    assert r.fix.result.clean is True
    lines = r.render().splitlines()
    assert lines[0].startswith("suggested fix")
    assert lines[2] == """  --mapper '{"orig_to_new_prefix": {"bert.": ""}}'"""
    assert lines[3] == "  would load cleanly with this rule"
    assert "  unexpected names (33): 33 explained by the suggested fix, above" in lines
    # The rule is real: passing it as --mapper gives the clean load it promised.
    again = inspect_checkpoint(f, model=Encoder, mapper=json.dumps(r.fix.mapper))
    assert again.clean is True and again.fix is None
    doc = json.loads(r.to_json())
    assert doc["schema"] == 8 and doc["suggested_fix"]["clean"] is True
    assert doc["suggested_fix"]["rules"][0]["explains"] == 33


def test_each_renamed_key_is_paired_with_its_own_tensor(tmp_path):
    s = state()
    renamed = {k.replace("layer.", "layers."): v for k, v in s.items() if "query" in k}
    s = {k: v for k, v in s.items() if "query" not in k} | renamed
    r = inspect_checkpoint(save(tmp_path / "m.safetensors", s), model=Encoder)
    pairs = {m.name: m.suggestions for m in r.load.missing}
    assert len(pairs) == 8  # query weight and bias in 4 layers
    assert all(v == [k.replace("layer.", "layers.")] for k, v in pairs.items())
    assert [x.rule.old for x in r.fix.suggestions] == ["layers."] and r.fix.result.clean


def test_the_fix_extends_the_models_own_rules(tmp_path):
    class Mapped(Encoder):
        hf_to_vllm_mapper = WeightsMapper(orig_to_new_suffix={".g": ".weight"})

        def load_weights(self, weights):
            return AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)

    s = {"x." + k.replace("norm.weight", "norm.g"): v for k, v in state().items()}
    f = save(tmp_path / "m.safetensors", s)
    r = inspect_checkpoint(f, model=Mapped)
    # --mapper extends the model's rules: the flag holds only the new one
    assert r.fix.mapper == {"orig_to_new_prefix": {"x.": ""}}
    assert r.fix.complete and r.fix.proven
    assert inspect_checkpoint(f, model=Mapped, mapper=r.fix.mapper).clean is True
    # replacing the model's rules with it drops '.g' -> '.weight': the norms stay unfilled
    replaced = inspect_checkpoint(f, model=Mapped, mapper=r.fix.mapper, replace_mapper=True)
    assert replaced.clean is False and len(replaced.load.missing) == 4
    assert replaced.fix.flag.endswith(" --replace-mapper")
    assert replaced.fix.mapper == {
        "orig_to_new_prefix": {"x.": ""},
        "orig_to_new_suffix": {".g": ".weight"},
    }


def test_a_lone_rename_is_paired_but_no_rule_is_proposed(tmp_path):
    s = state()
    s["embed.wieght"] = s.pop("embed.weight")
    r = inspect_checkpoint(save(tmp_path / "m.safetensors", s), model=Encoder)
    assert r.fix is None
    assert [(m.name, m.suggestions) for m in r.load.missing] == [("embed.weight", ["embed.wieght"])]


def test_allow_missing_skip_and_ignore_rules(tmp_path):
    s = state("bert.")
    s["cls.head.bias"] = torch.zeros(8)
    s["bert.embed.position_ids"] = torch.arange(8)

    class Classifier(nn.Module):
        def __init__(self, labels=2):
            super().__init__()
            self.bert = Encoder()
            self.classifier = nn.Linear(4, labels)

    f = save(tmp_path / "m.safetensors", s)
    r = inspect_checkpoint(f, model=Classifier)
    assert r.clean is False and len(r.load.unexpected) == 2 and len(r.load.missing) == 2
    rules = LoadRules(
        skip_prefixes=("bert.embed.position_ids",),
        ignore_unexpected_prefixes=("cls.",),
        allow_missing=("classifier.*",),
    )
    r = inspect_checkpoint(f, model=Classifier, rules=rules)
    assert r.clean is True and r.exit_status == 0
    status = {k.name: (k.status, k.rule) for k in r.load.keys}
    assert status["cls.head.bias"] == ("ignored", "ignore_unexpected_prefixes 'cls.'")
    assert status["bert.embed.position_ids"] == (
        "skipped",
        "skip_prefixes 'bert.embed.position_ids'",
    )
    assert [(m.name, m.allowed) for m in r.load.missing] == [
        ("classifier.weight", "classifier.*"),
        ("classifier.bias", "classifier.*"),
    ]
    assert "2 allowed by --allow-missing" in r.render()
    assert json.loads(r.to_json())["load"]["rules"]["allow_missing"] == ["classifier.*"]
    # A pattern fnmatch would read literally (it matches nothing) is bad input, as on the CLI.
    with pytest.raises(
        LoadkitError, match=r"allow_missing: invalid pattern 'classifier\.\[': '\[' at 11"
    ):
        inspect_checkpoint(f, model=Classifier, rules=LoadRules(allow_missing=("classifier.[",)))


def test_casts_are_summarised_by_kind_and_strict_dtype_fails_them(tmp_path):
    s = state(dtype=torch.bfloat16)
    s["embed.weight"] = s["embed.weight"].to(torch.float16)
    f = save(tmp_path / "m.safetensors", s)
    r = inspect_checkpoint(f, model=Encoder)
    groups = [(g.from_dtype, g.to_dtype, len(g.keys)) for g in r.load.cast_groups()]
    assert groups == [("bfloat16", "float32", 32), ("float16", "float32", 1)]
    assert r.clean is True
    text = r.render()
    assert "    32 tensors bfloat16 -> float32" in text
    assert "    1 tensor float16 -> float32  (unlike the checkpoint's bfloat16 tensors)" in text
    assert text.count("-> float32") == 2  # one line per kind, not one per key
    strict = inspect_checkpoint(f, model=Encoder, rules=LoadRules(strict_dtype=True))
    assert strict.clean is False and "33 dtype casts (--strict-dtype)" in strict.load.problems()
    assert inspect_checkpoint(
        save(tmp_path / "f.safetensors", state()), model=Encoder, rules=LoadRules(strict_dtype=True)
    ).clean


def test_model_arguments(tmp_path):
    f = save(tmp_path / "m.safetensors", state(layers=2))
    r = inspect_checkpoint(f, model=Encoder, model_args={"layers": 2})
    assert r.clean is True and r.model.parameters == 1 + 2 * 8
    with pytest.raises(ModelSpecError, match="takes no argument 'width'.*layers, h, labels"):
        inspect_checkpoint(f, model=Encoder, model_args={"width": 2})
    with pytest.raises(ModelSpecError, match="takes no --model-arg"):
        inspect_checkpoint(f, model="plamo2", model_args={"layers": 2})


def test_the_probe_only_for_pooling_models_or_when_asked(tmp_path):
    f = save(tmp_path / "m.safetensors", state())
    r = inspect_checkpoint(f, model=Encoder)
    assert r.probe is None and "pooling probe" not in r.render()
    assert json.loads(r.to_json())["probe"] is None
    assert inspect_checkpoint(f, model=Encoder, probe=True).probe["new"].hit
    pooled = inspect_checkpoint(f, model=as_pooling_model(Encoder))
    assert pooled.model.pooling and pooled.probe["old"].hit_index == 0
    assert inspect_checkpoint(f, model=as_pooling_model(Encoder), probe=False).probe is None
