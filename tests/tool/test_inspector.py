"""The inspect report as a Python API: each section, on small models with every loading style."""

import json

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from loadkit import AutoWeightsLoader, WeightsMapper, composed_weight_loader, default_weight_loader
from loadkit.errors import LoadkitError, MapperConfigError
from loadkit.terms import VLLM_VERSION
from loadkit_inspect.inspector import inspect_checkpoint
from loadkit_inspect.mapper_trace import parse_mapper
from loadkit_inspect.models.registry import ModelSpecError


def save(path, tensors):
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return path


def zeros(*shape, dtype=torch.float32):
    return torch.zeros(shape, dtype=dtype)


# --- models in each loading style -----------------------------------------------------------------


class Tiny(nn.Module):
    """No load_weights of its own: the inspector loads it with AutoWeightsLoader."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))


def tiny_state():
    return {
        "embed.weight": zeros(10, 4),
        "layers.0.weight": zeros(4, 4),
        "layers.0.bias": zeros(4),
        "layers.1.weight": zeros(4, 4),
        "layers.1.bias": zeros(4),
        "steps": zeros(dtype=torch.int64),
    }


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.proj = nn.Linear(4, 4, bias=False)


class Gemmaish(nn.Module):
    """Names match only after the model's own mapper (the pooling-probe case)."""

    hf_to_vllm_mapper = WeightsMapper(
        orig_to_new_prefix={"model.language_model.": "language_model.model."},
        orig_to_new_substr={"vision_tower": None},
    )

    def __init__(self):
        super().__init__()
        self.language_model = nn.Module()
        self.language_model.model = Inner()

    def load_weights(self, weights):
        return AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)


def gemmaish_state():
    return {
        "model.language_model.embed.weight": zeros(10, 4),
        "model.language_model.proj.weight": zeros(4, 4),
        "model.vision_tower.patch.weight": zeros(3, 3),
    }


class Body(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.norm = nn.LayerNorm(4)

    def load_weights(self, weights):
        return AutoWeightsLoader(self, ignore_unexpected_suffixes=[".extra"]).load_weights(weights)


class Delegating(nn.Module):
    """Root AutoWeightsLoader hands `model.*` to the child's own load_weights; a tied lm_head
    (a word embedding, as vLLM's ParallelLMHead is: its alias is skipped unasked)."""

    def __init__(self):
        super().__init__()
        self.model = Body()
        self.lm_head = nn.Embedding(10, 4)
        self.lm_head.weight = self.model.embed.weight

    def load_weights(self, weights):
        return AutoWeightsLoader(self).load_weights(weights)


def delegating_state():
    return {
        "model.embed.weight": zeros(10, 4),
        "model.norm.weight": zeros(4),
        "model.norm.bias": zeros(4),
        "model.norm.extra": zeros(1),
        "lm_head.weight": zeros(10, 4),
    }


class HandWritten(nn.Module):
    """A loop over params_dict, as older upstream models have; A loads as -exp(A_log)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(3))
        self.A = nn.Parameter(torch.zeros(3))
        self.A.weight_loader = composed_weight_loader(default_weight_loader, lambda t: -t.exp())

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        loaded = set()
        for name, w in weights:
            if name.endswith("inv_freq"):
                continue
            name = name.replace("A_log", "A")
            param = params[name]  # KeyError for a name the model does not have
            getattr(param, "weight_loader", default_weight_loader)(param, w)
            loaded.add(name)
        return loaded


def stacked_loader(param, loaded_weight):
    rows = {"q": 0, "k": 1, "v": 2}[loaded_weight.shard_id]
    default_weight_loader(param.data[rows * 2 : rows * 2 + 2], loaded_weight)


class Stacked(nn.Module):
    """q/k/v land in one packed qkv_proj through a stacked mapper rule and a shard loader."""

    def __init__(self):
        super().__init__()
        self.attn = nn.Module()
        self.attn.qkv_proj = nn.Linear(4, 6, bias=False)
        self.attn.qkv_proj.weight.weight_loader = stacked_loader


# Dotted, as upstream writes them: rules chain, and "v_proj" alone would match in "qkv_proj".
STACKED_MAPPER = {
    "orig_to_new_stacked": {
        ".q_proj": [".qkv_proj", "q"],
        ".k_proj": [".qkv_proj", "k"],
        ".v_proj": [".qkv_proj", "v"],
    }
}


class EarlyStop(nn.Module):
    """A loader that stops reading after the first weight."""

    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.zeros(2))
        self.b = nn.Parameter(torch.zeros(2))

    def load_weights(self, weights):
        for name, w in weights:
            default_weight_loader(getattr(self, name), w)
            return {name}
        return set()


# --- header-only sections -----------------------------------------------------------------------


def test_header_only_report(tmp_path):
    f = save(tmp_path / "m.safetensors", {**tiny_state(), "extra": zeros(2, dtype=torch.bfloat16)})
    r = inspect_checkpoint(f)
    c = r.checkpoint
    assert len(c.tensors) == 7 and c.total_bytes == sum(t.nbytes for t in c.tensors)
    assert c.dtypes["BF16"] == (1, 4) and c.dtypes["F32"][0] == 5 and c.dtypes["I64"] == (1, 8)
    assert [s.file for s in c.files] == [str(f)]
    assert r.folded_layout.find("layers.{0-1}").instances == 2
    assert r.layout.find("layers.1.bias").nbytes == 16
    assert (r.mapper, r.model, r.probe, r.load) == (None, None, None, None)
    assert r.clean is None and r.exit_status == 0
    d = json.loads(r.to_json())
    assert d["clean"] is None and d["exit_status"] == 0 and d["load"] is None
    assert d["checkpoint"]["tensor_count"] == 7
    assert d["layout"]["tensors"] == 7
    assert "verdict: headers valid" in r.render()


def test_mapper_section_without_a_model(tmp_path):
    f = save(tmp_path / "m.safetensors", gemmaish_state())
    r = inspect_checkpoint(f, mapper=Gemmaish.hf_to_vllm_mapper)
    m = r.mapper
    assert m.dropped == [("model.vision_tower.patch.weight", "substr 'vision_tower'")]
    fired = {(u.stage, u.rule): u.fired for u in m.rules}
    assert fired == {("substr", "vision_tower"): 1, ("prefix", "model.language_model."): 2}
    prefix = next(u for u in m.rules if u.stage == "prefix")
    assert prefix.example == (
        "model.language_model.embed.weight",
        "language_model.model.embed.weight",
    )
    assert m.unchanged == 0 and len(m.traces) == 3
    assert "dropped keys (1)" in r.render()


def test_parse_mapper_forms(tmp_path):
    rules = {"orig_to_new_prefix": {"a.": "b."}}
    assert parse_mapper(json.dumps(rules)).map_name("a.x") == "b.x"
    path = tmp_path / "rules.json"
    path.write_text(json.dumps(rules))
    assert parse_mapper(str(path)).map_name("a.x") == "b.x"
    assert parse_mapper(rules).map_name("a.x") == "b.x"
    stacked = parse_mapper(STACKED_MAPPER)
    assert stacked.map_name_with_shard("x.k_proj.weight") == ("x.qkv_proj.weight", "k")
    for bad in ("{not json", "[1, 2]", "no/such/file.json", '{"orig_to_new_suffix": {"": "x"}}'):
        with pytest.raises(MapperConfigError):
            parse_mapper(bad)


# --- with a model -------------------------------------------------------------------------------


def test_clean_load_with_autoweightsloader(tmp_path):
    f = save(tmp_path / "m.safetensors", tiny_state())
    r = inspect_checkpoint(f, model=Tiny)
    assert r.model.cls == "Tiny" and r.model.parameters == 6 and not r.model.has_own_load_weights
    assert r.clean is True and r.exit_status == 0
    assert {k.status for k in r.load.keys} == {"loaded"}
    assert r.load.filled == 6 and r.load.missing == [] and r.load.runs == 1
    target = {k.name: k.target for k in r.load.keys}
    assert target["layers.1.bias"] == "layers.1.bias"
    assert f"verdict: vllm {VLLM_VERSION}: would load cleanly (exit 0)" in r.render()


def test_unexpected_missing_and_nearest_names(tmp_path):
    state = tiny_state()
    state["layers.1.weigth"] = state.pop("layers.1.weight")  # a typo
    del state["layers.0.bias"]
    state["head.a"] = zeros(1)
    state["head.b"] = zeros(1)
    f = save(tmp_path / "m.safetensors", state)
    r = inspect_checkpoint(f, model=Tiny)
    load = r.load
    assert r.clean is False and r.exit_status == 1
    unexpected = {u.name: u for u in load.unexpected}
    assert set(unexpected) == {"layers.1.weigth", "head.a", "head.b"}
    assert unexpected["layers.1.weigth"].suggestions[0] == "layers.1.weight"
    assert "head" in unexpected["head.b"].message  # left out with head.a, as one unknown module
    # AutoWeightsLoader records names the model lacks and walks on (an observer takes them).
    assert load.runs == 1
    missing = {m.name: m for m in load.missing}
    assert set(missing) == {"layers.0.bias", "layers.1.weight"}
    assert missing["layers.1.weight"].suggestions == ["layers.1.weigth"]
    assert missing["layers.1.weight"].shape == (4, 4)
    assert load.counts()["unexpected"] == 3 and load.counts()["loaded"] == 4
    text = r.render()
    assert "unexpected names (3)" in text and "missing: model tensors never filled (2)" in text
    assert "nearest: layers.1.weight" in text


def test_shape_mismatches_are_all_collected(tmp_path):
    state = tiny_state()
    state["embed.weight"] = zeros(11, 4)
    state["layers.1.bias"] = zeros(5)
    f = save(tmp_path / "m.safetensors", state)
    r = inspect_checkpoint(f, model=Tiny)
    mm = {s.name: s for s in r.load.shape_mismatches}
    assert set(mm) == {"embed.weight", "layers.1.bias"}
    assert (mm["embed.weight"].param_shape, mm["embed.weight"].weight_shape) == ((10, 4), (11, 4))
    assert mm["layers.1.bias"].param == "layers.1.bias"
    assert r.load.missing == []  # a mismatched parameter is listed once, as a mismatch
    assert r.clean is False and r.load.runs == 1
    assert "checkpoint [11, 4], model [10, 4]" in r.render()


def test_dtype_casts_reported_and_incompatible_ones_fail(tmp_path):
    state = tiny_state()
    state["embed.weight"] = zeros(10, 4, dtype=torch.bfloat16)
    r = inspect_checkpoint(save(tmp_path / "a.safetensors", state), model=Tiny)
    assert [(d.name, d.from_dtype, d.to_dtype, d.incompatible) for d in r.load.dtype_casts] == [
        ("embed.weight", "bfloat16", "float32", False)
    ]
    assert r.clean is True
    state["steps"] = zeros(dtype=torch.float32)  # a float into an int64 buffer
    r = inspect_checkpoint(save(tmp_path / "b.safetensors", state), model=Tiny)
    bad = [d for d in r.load.dtype_casts if d.incompatible]
    assert [(d.param, d.from_dtype, d.to_dtype) for d in bad] == [("steps", "float32", "int64")]
    assert r.clean is False and "1 incompatible dtype cast" in r.load.problems()


def test_model_mapper_and_probe_verdicts(tmp_path):
    f = save(tmp_path / "m.safetensors", gemmaish_state())
    assert inspect_checkpoint(f, model=Gemmaish).probe is None  # not a pooling model
    r = inspect_checkpoint(f, model=Gemmaish, probe=True)
    assert r.mapper.source == "Gemmaish.hf_to_vllm_mapper"
    old, new = r.probe["old"], r.probe["new"]
    assert (old.hit, old.walked, old.walked_bytes) == (False, 3, r.checkpoint.total_bytes)
    assert old.cloned is False  # vLLM 0.34.0's default load format: held without a clone
    assert (new.prefix, new.hit_index, new.hit_key, new.walked) == (
        "",
        0,
        "model.language_model.embed.weight",
        1,
    )
    assert new.walked_bytes == 160
    status = {k.name: (k.status, k.mapped, k.target, k.rule) for k in r.load.keys}
    assert status["model.vision_tower.patch.weight"][0] == "dropped by mapper"
    assert status["model.vision_tower.patch.weight"][3] == "substr 'vision_tower'"
    assert status["model.language_model.proj.weight"] == (
        "loaded",
        "language_model.model.proj.weight",
        "language_model.model.proj.weight",
        None,
    )
    assert r.clean is True
    d = json.loads(r.to_json())
    assert d["probe"]["old"]["walked"] == 3 and d["probe"]["new"]["walked"] == 1
    assert d["probe"]["old"]["cloned"] is False and d["probe"]["old"]["load_format"] == "auto"
    assert "no hit: walks all 3 keys" in r.render()


def test_given_mapper_replaces_the_models_own_with_replace_mapper(tmp_path):
    f = save(tmp_path / "m.safetensors", gemmaish_state())
    r = inspect_checkpoint(
        f,
        model=Gemmaish,
        mapper={"orig_to_new_prefix": {"model.": ""}},
        probe=True,
        replace_mapper=True,
    )
    assert r.mapper.source == "given mapper"
    assert r.probe["new"].hit is False  # `language_model.embed.weight` is no parameter
    assert r.clean is False and len(r.load.unexpected) == 3
    assert Gemmaish.hf_to_vllm_mapper.orig_to_new_prefix  # the class is untouched


def test_delegation_tied_weights_and_ignore_rules(tmp_path):
    f = save(tmp_path / "m.safetensors", delegating_state())
    r = inspect_checkpoint(f, model=Delegating)
    status = {k.name: (k.status, k.target, k.rule) for k in r.load.keys}
    assert status["model.embed.weight"] == ("loaded", "model.embed.weight", None)
    assert status["lm_head.weight"] == (
        "skipped",
        None,
        "tied embedding: an alias of 'model.embed.weight'",
    )
    assert status["model.norm.extra"] == ("ignored", None, "ignore_unexpected_suffixes '.extra'")
    assert r.model.parameters == 3  # the tied lm_head counts once
    assert r.clean is True


def test_a_child_that_rejects_a_name(tmp_path):
    state = delegating_state()
    state["model.normm.weight"] = zeros(4)
    r = inspect_checkpoint(save(tmp_path / "m.safetensors", state), model=Delegating)
    (u,) = r.load.unexpected
    assert u.name == "model.normm.weight"
    assert "normm" in u.message and u.suggestions[0] == "model.norm.weight"
    assert r.clean is False


def test_hand_written_loader_with_composed_loader(tmp_path):
    state = {"w": zeros(3), "A_log": zeros(3), "rotary.inv_freq": zeros(2)}
    r = inspect_checkpoint(save(tmp_path / "a.safetensors", state), model=HandWritten)
    status = {k.name: (k.status, k.target) for k in r.load.keys}
    assert status["A_log"] == ("loaded", "A")
    assert status["rotary.inv_freq"] == ("delegated", "HandWritten")
    assert r.clean is True
    state["bogus"] = zeros(1)
    state["A_log"] = zeros(4)
    r = inspect_checkpoint(save(tmp_path / "b.safetensors", state), model=HandWritten)
    assert [u.name for u in r.load.unexpected] == ["bogus"]
    assert "KeyError" in r.load.unexpected[0].message
    assert [s.name for s in r.load.shape_mismatches] == ["A_log"]
    assert r.load.shape_mismatches[0].param == "A"


def test_stacked_rules_and_shard_loaders(tmp_path):
    state = {f"attn.{p}_proj.weight": zeros(2, 4) for p in "qkv"}
    f = save(tmp_path / "m.safetensors", state)
    r = inspect_checkpoint(f, model=Stacked, mapper=STACKED_MAPPER)
    assert {k.target for k in r.load.keys} == {"attn.qkv_proj.weight"}
    assert r.clean is True
    trace = next(t for t in r.mapper.traces if t["name"] == "attn.k_proj.weight")
    assert trace["shard_id"] == "k" and trace["steps"][0]["stage"] == "stacked"


def test_unconsumed_keys_fail(tmp_path):
    f = save(tmp_path / "m.safetensors", {"a": zeros(2), "b": zeros(2)})
    r = inspect_checkpoint(f, model=EarlyStop)
    status = {k.name: k.status for k in r.load.keys}
    assert status == {"a": "loaded", "b": "unconsumed"}
    assert [m.name for m in r.load.missing] == ["b"]
    assert r.clean is False


def test_model_forms_and_the_callers_model_is_untouched(tmp_path):
    f = save(tmp_path / "m.safetensors", tiny_state())
    live = Tiny()
    before = live.embed.weight.detach().clone()
    r = inspect_checkpoint(f, model=live)
    assert r.clean is True and r.model.spec == "Tiny"
    assert not live.embed.weight.is_meta and torch.equal(live.embed.weight, before)
    assert not hasattr(live.embed.weight, "weight_loader")

    def sized(tensors):  # a callable taking the checkpoint's tensors sizes itself from them
        m = Tiny()
        assert tensors["embed.weight"].shape == (10, 4)
        return m

    assert inspect_checkpoint(f, model=sized).clean is True
    with torch.device("meta"):
        meta = Tiny()
    assert inspect_checkpoint(f, model=meta).clean is True
    assert not hasattr(meta.embed.weight, "weight_loader")  # the recording loaders are removed


def test_bad_model_specs(tmp_path):
    f = save(tmp_path / "m.safetensors", tiny_state())
    for spec, words in [
        ("no-such-model", "not a built-in model"),
        ("no_such_module_xyz:build", "no module named"),
        ("json:nothing_here", "has no attribute"),
        ("json:loads", "building the model"),
        ("math:pi", "not callable"),
    ]:
        with pytest.raises(ModelSpecError, match=words):
            inspect_checkpoint(f, model=spec)
    with pytest.raises(ModelSpecError, match="not a torch.nn.Module"):
        inspect_checkpoint(f, model=lambda: 42)
    assert issubclass(ModelSpecError, LoadkitError)


def test_json_round_trip_has_every_section(tmp_path):
    state = gemmaish_state()
    state["model.language_model.proj.weight"] = zeros(5, 4)
    r = inspect_checkpoint(save(tmp_path / "m.safetensors", state), model=Gemmaish)
    d = json.loads(r.to_json())
    assert set(d) == {
        "schema",
        "checkpoint",
        "layout",
        "mapper",
        "model",
        "probe",
        "load",
        "tensor_parallel",
        "suggested_fix",
        "not_offered",
        "rename_fix",
        "loaders",
        "selected_loaders",
        "transformers",
        "clean",
        "exit_status",
    }
    assert d["exit_status"] == 1 and d["clean"] is False
    # A built-in model has one loader: vLLM's (its own loading code), and no transformers column;
    # a shape mismatch names the model's parameter.
    assert d["loaders"] == {
        "vllm": {
            "loader": "vllm",
            "version": VLLM_VERSION,
            "clean": False,
            "outcome": None,  # said in transformers' terms only (loads, warns, raises)
            "problems": ["1 mismatched: language_model.model.proj.weight"],
        }
    }
    assert d["selected_loaders"] == ["vllm"] and d["transformers"] is None
    load = d["load"]
    assert load["shape_mismatches"][0]["param_shape"] == [4, 4]
    assert load["counts"]["checkpoint"]["shape mismatch"] == 1
    assert load["problems"] == ["1 shape mismatch"]
    assert r.as_dict() == d


class Packing(Stacked):
    """Loads with more rules than its hf_to_vllm_mapper holds (as the Gemma4-like model does)."""

    hf_to_vllm_mapper = WeightsMapper(orig_to_new_prefix={"hf.": ""})

    def load_weights(self, weights):
        mapper = self.hf_to_vllm_mapper | WeightsMapper.from_json(STACKED_MAPPER)
        return AutoWeightsLoader(self).load_weights(weights, mapper=mapper)


def test_the_mapper_traced_is_the_one_the_load_uses(tmp_path):
    state = {f"hf.attn.{p}_proj.weight": zeros(2, 4) for p in "qkv"}
    f = save(tmp_path / "m.safetensors", state)
    r = inspect_checkpoint(f, model=Packing, probe=True)
    assert r.clean is True
    assert r.mapper.source == "the mapper Packing.load_weights loads with"
    assert [(u.stage, u.fired) for u in r.mapper.rules] == [("stacked", 1)] * 3 + [("prefix", 3)]
    # The probe reads hf_to_vllm_mapper alone: attn.q_proj.weight is no parameter, no hit.
    assert not r.probe["new"].hit and r.probe["new"].walked == 3
    # A given mapper extends what the load maps with, traced as the load used it ...
    r = inspect_checkpoint(f, model=Packing, mapper={"orig_to_new_suffix": {".nothing": ""}})
    assert r.mapper.source == "Packing's own rules, then given mapper" and r.clean is True
    assert [u.stage for u in r.mapper.rules] == ["stacked"] * 3 + ["prefix", "suffix"]
    # ... or replaces it: without the stacked rules nothing fits.
    r = inspect_checkpoint(
        f, model=Packing, mapper={"orig_to_new_prefix": {"hf.": ""}}, replace_mapper=True
    )
    assert r.mapper.source == "given mapper" and r.mapper.note is None
    assert r.clean is False and len(r.load.unexpected) == 3


def test_a_given_mapper_a_hand_written_loader_ignores_is_flagged(tmp_path):
    f = save(tmp_path / "m.safetensors", {"w": zeros(3), "A_log": zeros(3)})
    r = inspect_checkpoint(f, model=HandWritten, mapper={"orig_to_new_prefix": {"x.": ""}})
    assert "does not load through an AutoWeightsLoader" in r.mapper.note
    assert "note: HandWritten.load_weights" in r.render()
    assert r.clean is True


class ChecksAtTheEnd(nn.Module):
    """Raises after the last weight when something is missing: no key is to blame."""

    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.zeros(2))
        self.b = nn.Parameter(torch.zeros(2))

    def load_weights(self, weights):
        loaded = AutoWeightsLoader(self).load_weights(weights)
        missing = {n for n, _ in self.named_parameters()} - loaded
        if missing:
            raise RuntimeError(f"missing {sorted(missing)}")
        return loaded


def test_a_failure_after_the_last_weight_fails_the_load_as_a_whole(tmp_path):
    r = inspect_checkpoint(save(tmp_path / "m.safetensors", {"a": zeros(2)}), model=ChecksAtTheEnd)
    load = r.load
    assert load.runs == 1 and load.unexpected == [] and load.errors == []
    assert load.failure == "ChecksAtTheEnd.load_weights raised after the last weight: " + (
        "RuntimeError: missing ['b']"
    )
    assert [m.name for m in load.missing] == ["b"]
    assert r.clean is False and load.failure in load.problems()
    assert "load failed: ChecksAtTheEnd.load_weights raised" in r.render()


def test_a_loader_that_fails_before_reading_anything_is_unusable(tmp_path):
    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Parameter(torch.zeros(2))

        def load_weights(self, weights):
            raise TypeError("not today")

    f = save(tmp_path / "m.safetensors", {"a": zeros(2)})
    with pytest.raises(LoadkitError, match="failed before taking any weight.*not today"):
        inspect_checkpoint(f, model=Broken)


def test_a_live_model_is_copied_to_meta_without_its_data():
    from loadkit.loading.meta import meta_copy

    live = HandWritten()
    live.lm = nn.Linear(2, 2)
    live.lm.weight = live.w_tied = nn.Parameter(torch.ones(2, 2))  # a tied pair stays tied
    copy = meta_copy(live)
    assert all(p.is_meta for p in copy.parameters())
    assert copy.A.weight_loader is live.A.weight_loader  # attributes kept
    assert copy.lm.weight is copy.w_tied
    assert not live.A.is_meta and torch.equal(live.lm.weight, torch.ones(2, 2))
