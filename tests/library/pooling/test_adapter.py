"""The pooling adapter's prefix probe, on real safetensors files read through a
buffer-reusing iterator."""

import dataclasses

import pytest
import torch
from repo_paths import DATA
from torch import nn

from loadkit import (
    AutoWeightsLoader,
    CloneCounter,
    WeightsMapper,
    as_pooling_model,
    open_checkpoint,
)
from loadkit.checkpoint.writer import save_in_order
from loadkit.errors import LoadkitError, UnknownNameError, WeightLoadError
from loadkit.models import gemma4 as g4
from loadkit.pooling.probe import predict_probe

G4 = g4.Gemma4ForConditionalGeneration
BEHAVIOURS = ("old", "new")
# A load format vLLM 0.34.0 does not trust to hand over tensors it never reuses: the probe clones
# what it holds. Every buffer-reusing read below (``weights(reuse_buffer=True)``) declares one.
REUSES = "fastsafetensors"


def write_raw(path, tensors):
    """A safetensors file with the data in the given order (``save_file`` sorts by name)."""
    return save_in_order(path, tensors)


def state(model):
    return dict(model.named_parameters()) | dict(model.named_buffers())


def wrong(model, expected):
    got = state(model)
    assert got.keys() >= expected.keys()
    return sorted(n for n, t in expected.items() if not torch.equal(got[n], t))


@pytest.fixture(scope="module")
def ckpt():
    return open_checkpoint(GEMMA4_DATA)


@pytest.fixture(scope="module")
def config(ckpt):
    return g4.config_from_checkpoint(ckpt.tensors)


@pytest.fixture(scope="module")
def expected(ckpt, config):
    return g4.expected_parameters(config, dict(ckpt.weights()))


# --- a packed parent as upstream writes them: stacked mapper, shard_id-reading loader ----------

STACKED = WeightsMapper(
    orig_to_new_stacked={
        ".q_proj.": (".qkv_proj.", "q"),
        ".k_proj.": (".qkv_proj.", "k"),
        ".v_proj.": (".qkv_proj.", "v"),
    }
)

GEMMA4_DATA = DATA / "gemma4_like" / "model.safetensors"
SHARDS = {"q": (0, 4), "k": (4, 2), "v": (6, 2)}


def qkv_loader(param, loaded_weight):
    start, size = SHARDS[loaded_weight.shard_id]  # AttributeError without shard_id
    param.data.narrow(0, start, size).copy_(loaded_weight)


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv_proj = nn.Module()
        self.qkv_proj.weight = nn.Parameter(torch.zeros(8, 3), requires_grad=False)
        self.qkv_proj.weight.weight_loader = qkv_loader
        self.o_proj = nn.Module()
        self.o_proj.weight = nn.Parameter(torch.zeros(3, 4), requires_grad=False)


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = Attn()


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Layer()])
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.zeros(3), requires_grad=False)


class PackedForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Inner()
        self.seen: list[str] = []

    def load_weights(self, weights):
        def record(ws):
            for name, w in ws:
                self.seen.append(name)
                yield name, w

        return AutoWeightsLoader(self).load_weights(record(weights), mapper=STACKED)


def packed_checkpoint(prefix):
    g = torch.Generator().manual_seed(1)
    a = f"{prefix}layers.0.self_attn."
    # q_proj and k_proj come before the first name that is a parameter (o_proj).
    return {
        f"{a}q_proj.weight": torch.randn(4, 3, generator=g),
        f"{a}k_proj.weight": torch.randn(2, 3, generator=g),
        f"{a}o_proj.weight": torch.randn(3, 4, generator=g),
        f"{a}v_proj.weight": torch.randn(2, 3, generator=g),
        f"{prefix}norm.weight": torch.randn(3, generator=g),
    }


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
@pytest.mark.parametrize("prefix", ["model.", ""])
def test_packed_weights_held_before_the_hit_load_exactly(tmp_path, behaviour, prefix):
    tensors = packed_checkpoint(prefix)
    path = write_raw(tmp_path / "packed.safetensors", tensors)
    model = as_pooling_model(PackedForCausalLM, behaviour=behaviour, load_format=REUSES)()
    loaded = model.load_weights(open_checkpoint(path).weights(reuse_buffer=True))

    a = f"{prefix}layers.0.self_attn."
    rec = model.probe_record
    assert rec.walked_names == (f"{a}q_proj.weight", f"{a}k_proj.weight", f"{a}o_proj.weight")
    found = "" if prefix else "model."  # *ForCausalLM names as they are; *Model's under model.
    assert (rec.prefix, rec.hit_index, rec.walked, rec.cloned) == (found, 2, 3, True)
    assert model.seen == [found + n for n in tensors]  # original names, in order, once
    qkv = model.model.layers[0].self_attn.qkv_proj.weight
    want = torch.cat([tensors[f"{a}{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(qkv, want)
    assert torch.equal(model.model.layers[0].self_attn.o_proj.weight, tensors[f"{a}o_proj.weight"])
    assert loaded == {
        "model.layers.0.self_attn.qkv_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.norm.weight",
    }


def test_a_reusing_iterator_under_an_owned_load_format_is_corrupted(tmp_path):
    # The control: the same stream, declared as a format whose tensors are owned (vLLM 0.34.0
    # holds those without a clone), overwrites q_proj and k_proj.
    tensors = packed_checkpoint("model.")
    path = write_raw(tmp_path / "packed.safetensors", tensors)
    model = as_pooling_model(PackedForCausalLM, behaviour="new", load_format="safetensors")()
    model.load_weights(open_checkpoint(path).weights(reuse_buffer=True))
    qkv = model.model.layers[0].self_attn.qkv_proj.weight
    assert not torch.equal(qkv[:4], tensors["model.layers.0.self_attn.q_proj.weight"])
    assert torch.equal(qkv[6:], tensors["model.layers.0.self_attn.v_proj.weight"])  # not held


def test_mapping_before_the_clone_loses_shard_id(tmp_path):
    # Why the probe forwards original names: a mapper's shard_id does not survive clone().
    tensors = packed_checkpoint("model.")
    path = write_raw(tmp_path / "packed.safetensors", tensors)

    class MapsInProbe(PackedForCausalLM):
        hf_to_vllm_mapper = STACKED

        def load_weights(self, weights):  # this parent trusts the names it gets
            return AutoWeightsLoader(self).load_weights(weights)

    model = as_pooling_model(MapsInProbe, behaviour="new", load_format=REUSES, forward="mapped")()
    with pytest.raises(WeightLoadError, match="shard_id") as exc:
        model.load_weights(open_checkpoint(path).weights(reuse_buffer=True))
    assert isinstance(exc.value.__cause__, AttributeError)
    assert model.probe_record.hit_key == "model.layers.0.self_attn.qkv_proj.weight"


# --- the Gemma4-like model on the committed checkpoint ------------------------------------------


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_exact_values_after_a_buffer_reusing_iterator(ckpt, config, expected, behaviour):
    model = as_pooling_model(G4, behaviour=behaviour, load_format=REUSES)(config)
    loaded = model.load_weights(ckpt.weights(reuse_buffer=True))
    assert wrong(model, expected) == []
    assert loaded == {n for n, _ in model.named_parameters()} | {
        n for n, _ in model.named_buffers()
    }


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_an_owned_load_format_holds_without_a_clone(ckpt, config, expected, behaviour):
    # vLLM 0.34.0: "auto" (safetensors' own iterator) hands over tensors it never reuses
    model = as_pooling_model(G4, behaviour=behaviour)(config)
    with CloneCounter() as counter:
        model.load_weights(ckpt.weights())
    assert wrong(model, expected) == []
    assert counter.count == 0 and model.probe_record.cloned is False
    assert model.probe_record.walked == (len(ckpt) if behaviour == "old" else 1)


def test_without_clone_old_corrupts_all_but_the_last_key(ckpt, config, expected):
    model = as_pooling_model(G4, behaviour="old", load_format="safetensors")(config)
    model.load_weights(ckpt.weights(reuse_buffer=True))
    last = g4.GEMMA4_MAPPER.map_name(list(ckpt.tensors)[-1])
    assert set(wrong(model, expected)) == set(expected) - {last}


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_clone_counts_with_a_mapper(ckpt, config, behaviour):
    model = as_pooling_model(G4, behaviour=behaviour, load_format=REUSES)(config)
    with CloneCounter() as counter:
        model.load_weights(ckpt.weights(reuse_buffer=True))
    rec = model.probe_record
    first = next(iter(ckpt.tensors.values()))
    if behaviour == "old":  # one clone per tensor: the whole checkpoint
        assert (counter.count, counter.cloned_bytes) == (len(ckpt), ckpt.total_bytes)
        assert (rec.prefix, rec.hit_key, rec.walked) == (None, None, len(ckpt))
    else:  # exactly one: the first key maps to a parameter
        assert (counter.count, counter.cloned_bytes) == (1, first.nbytes)
        assert (rec.prefix, rec.hit_key, rec.hit_index) == ("", first.name, 0)
    assert (rec.walked, rec.walked_bytes, rec.cloned) == (counter.count, counter.cloned_bytes, True)
    assert (rec.forwarded, rec.forwarded_bytes) == (len(ckpt), ckpt.total_bytes)


class Spy(G4):
    """Records the names its loader receives and how far the source had read by then."""

    reads: list[str]

    def load_weights(self, weights):
        self.seen, self.lag = [], []

        def watch(ws):
            for i, (name, w) in enumerate(ws, 1):
                self.seen.append(name)
                self.lag.append(len(self.reads) - i)  # keys read ahead of the parent
                yield name, w

        return super().load_weights(watch(weights))


def spied_load(cls_behaviour, config, ckpt):
    model = as_pooling_model(Spy, behaviour=cls_behaviour, load_format=REUSES)(config)
    model.reads = []

    def source():
        for name, w in ckpt.weights(reuse_buffer=True):
            model.reads.append(name)
            yield name, w

    model.load_weights(source())
    return model


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_parent_sees_original_names_in_order_once(ckpt, config, behaviour):
    model = spied_load(behaviour, config, ckpt)
    assert model.seen == model.reads == [n for n, _ in ckpt.weights()]


def test_forwarding_is_lazy(ckpt, config):
    # After the hit the parent gets each weight before the next is read: nothing is drained
    # into a tuple. Old, never hitting, has read everything before the parent starts.
    assert spied_load("new", config, ckpt).lag == [0] * len(ckpt)
    lag = spied_load("old", config, ckpt).lag
    assert lag[0] == len(ckpt) - 1 and lag[-1] == 0


def test_keys_the_mapper_drops_are_walked_and_skipped(tmp_path, config):
    drop = WeightsMapper(orig_to_new_prefix={"model.audio_tower.": None})

    class WithDrops(G4):
        hf_to_vllm_mapper = g4.GEMMA4_MAPPER | drop

        def load_weights(self, weights):
            return AutoWeightsLoader(self).load_weights(
                weights, mapper=self.hf_to_vllm_mapper | g4.PACKING_MAPPER
            )

    extra = {f"model.audio_tower.w{i}": torch.ones(2, dtype=torch.bfloat16) for i in range(3)}
    fresh = g4.make_checkpoint(config, seed=7)  # not the committed file's values
    expected = g4.expected_parameters(config, fresh)
    tensors = extra | fresh  # the dropped keys come first
    path = write_raw(tmp_path / "drops.safetensors", tensors)
    for behaviour, walked in (("new", 4), ("old", len(tensors))):
        model = as_pooling_model(WithDrops, behaviour=behaviour, load_format=REUSES)(config)
        model.load_weights(open_checkpoint(path).weights(reuse_buffer=True))
        assert model.probe_record.walked == walked
        assert wrong(model, expected) == []
    assert model.probe_record.hit_index is None


def test_parent_without_load_weights_uses_auto_weights_loader(tmp_path):
    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = nn.Linear(2, 2, bias=False)

    w = torch.arange(4.0).reshape(2, 2)
    path = write_raw(tmp_path / "headless.safetensors", {"weight": w})
    model = as_pooling_model(Plain, load_format=REUSES)()
    assert model.load_weights(open_checkpoint(path).weights(reuse_buffer=True)) == {"model.weight"}
    assert torch.equal(model.model.weight, w)
    assert model.probe_record.prefix == "model."


def test_parent_without_load_weights_loads_with_its_mapper(tmp_path):
    # vLLM 0.29.0: the probe's default loader hands the model's hf_to_vllm_mapper to
    # AutoWeightsLoader (before, the names were loaded unmapped)
    class Renamed(nn.Module):
        hf_to_vllm_mapper = WeightsMapper(orig_to_new_substr={".gamma": ".weight"})

        def __init__(self):
            super().__init__()
            self.model = nn.LayerNorm(2)
            self.model.bias = None

    w = torch.tensor([1.5, -2.0])
    path = write_raw(tmp_path / "gamma.safetensors", {"model.gamma": w})
    model = as_pooling_model(Renamed)()
    assert model.load_weights(open_checkpoint(path).weights()) == {"model.weight"}
    assert torch.equal(model.model.weight, w)


@pytest.mark.parametrize("order", ["file", "attention-first"])
@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_adapter_and_header_only_verdict_agree(tmp_path, config, order, behaviour):
    path = GEMMA4_DATA
    if order != "file":
        ckpt = g4.make_checkpoint(config)
        ordered = {n: ckpt[n] for n in _attention_first(config)}
        path = save_in_order(tmp_path / "a.safetensors", ordered)
    ck = open_checkpoint(path)
    model = as_pooling_model(G4, behaviour=behaviour, load_format=REUSES)(config)
    model.load_weights(ck.weights(reuse_buffer=True))
    header = predict_probe(
        [(t.name, t.nbytes) for t in sorted(ck.tensors.values(), key=lambda t: t.offset)],
        {n for n, _ in model.named_parameters()},
        mapper=model.hf_to_vllm_mapper,
        behaviour=behaviour,
        load_format=REUSES,
    )
    assert header == model.probe_record


def _attention_first(config):
    first = [f"{g4.TEXT_CKPT}layers.0.self_attn.{p}_proj.weight" for p in "qkvo"]
    return first + [n for n, _ in g4.checkpoint_layout(config) if n not in first]


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_full_scale_layout_on_meta(behaviour):
    config = g4.full_scale_config()
    with torch.device("meta"):
        model = as_pooling_model(G4, behaviour=behaviour, load_format=REUSES)(config)
    weights = g4.make_checkpoint(config, device="meta")
    with CloneCounter() as counter:
        model.load_weights(weights.items())
    total = sum(t.numel() * t.element_size() for t in weights.values())
    if behaviour == "old":
        assert (counter.count, counter.cloned_bytes) == (len(weights), total)
    else:
        assert counter.count == 1 and counter.cloned_bytes < 2**20
    assert model.probe_record.forwarded == len(weights)


def test_forwarding_mapped_names_maps_twice(ckpt, config):
    packing = dataclasses.replace(config, packing_in_mapper=True)
    model = as_pooling_model(G4, behaviour="new", load_format=REUSES, forward="mapped")(packing)
    with pytest.raises(UnknownNameError, match="gate_gate_up_proj|qkqkv_proj"):
        model.load_weights(ckpt.weights(reuse_buffer=True))
    assert model.probe_record.forward == "mapped"  # recorded even when the load fails
    # With Gemma4's prefix-only mapper the shortcut happens to work, which is why it tempts.
    model = as_pooling_model(G4, behaviour="new", load_format=REUSES, forward="mapped")(config)
    assert len(model.load_weights(ckpt.weights(reuse_buffer=True))) == 61


def test_fix_works_when_the_mapper_packs(ckpt, config, expected):
    packing = dataclasses.replace(config, packing_in_mapper=True)
    model = as_pooling_model(G4, behaviour="new", load_format=REUSES)(packing)
    model.load_weights(ckpt.weights(reuse_buffer=True))
    assert wrong(model, expected) == [] and model.probe_record.walked == 1


def test_subclass_keeps_constructor_and_is_cached(config):
    cls = as_pooling_model(G4, behaviour="old")
    assert issubclass(cls, G4) and cls.__name__ == "Gemma4ForPooling"
    assert cls is as_pooling_model(G4, behaviour="old")
    assert cls is not as_pooling_model(G4, behaviour="new")
    assert cls(config).config == config and cls.is_pooling_model
    with pytest.raises(LoadkitError, match="behaviour"):
        as_pooling_model(G4, behaviour="newer")
    with pytest.raises(LoadkitError, match="forward must be"):
        as_pooling_model(G4, forward="both")
