import warnings

import pytest
import torch
from torch import nn

from loadkit import AutoWeightsLoader, WeightsMapper, ledger_of
from loadkit.errors import NestedWeightError, ShapeMismatchError, UnknownNameError, WeightLoadError
from loadkit.loading.tensors import VocabEmbedding


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 2)
        self.norm = nn.LayerNorm(2)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(5, 3)
        self.layers = nn.ModuleList([Block(), Block()])
        self.bn = nn.BatchNorm1d(2)
        self.register_buffer("scale", torch.zeros(2))
        self.register_buffer("cache", torch.zeros(2), persistent=False)

    def load_weights(self, weights):
        return AutoWeightsLoader(self).load_weights(weights)


def full_state(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=g).to(v.dtype) for k, v in model.state_dict().items()}


def test_loads_everything_and_returns_qualified_names():
    model = Net()
    sd = full_state(model)
    loaded = AutoWeightsLoader(model).load_weights(sd.items())
    assert loaded == set(sd)
    for k, v in model.state_dict().items():
        assert torch.equal(v, sd[k]), k
    assert "cache" not in loaded  # non-persistent buffers are not loadable


def test_batchnorm_stats_and_persistent_buffers_load():
    model = Net()
    sd = {
        "bn.running_mean": torch.ones(2),
        "bn.num_batches_tracked": torch.tensor(7),
        "scale": torch.full((2,), 2.0),
    }
    loaded = AutoWeightsLoader(model).load_weights(sd.items())
    assert loaded == set(sd)
    assert model.bn.num_batches_tracked.item() == 7 and model.scale.tolist() == [2.0, 2.0]


def test_mapper_applied_first_then_drops():
    model = Net()
    mapper = WeightsMapper(
        orig_to_new_prefix={"hf.": "", "lm_head.": None}, orig_to_new_substr={"junk": None}
    )
    w = {
        "hf.embed.weight": torch.ones(5, 3),
        "hf.junk": torch.ones(1),
        "lm_head.weight": torch.ones(1),
    }
    loader = AutoWeightsLoader(model)
    assert loader.load_weights(w.items(), mapper=mapper) == {"embed.weight"}
    assert torch.equal(model.embed.weight.data, torch.ones(5, 3))
    rules = {e.name: (e.status, e.rule) for e in loader.ledger.entries}
    assert rules["lm_head.weight"] == ("dropped by mapper", "prefix 'lm_head.'")
    assert rules["hf.junk"] == ("dropped by mapper", "substr 'junk'")


def test_rotary_buffers_are_dropped_by_the_loaders_own_mapper():
    model = Net()
    w = {
        "layers.0.rotary_emb.inv_freq": torch.ones(1),
        "rotary_pos_emb.inv_freq": torch.ones(1),
        "layers.1.rotary_emb.cos_cached": torch.ones(1),
        "embed.weight": torch.ones(5, 3),
    }
    loader = AutoWeightsLoader(model)
    assert loader.load_weights(w.items()) == {"embed.weight"}
    statuses = {e.name: (e.status, e.rule) for e in loader.ledger.entries}
    assert statuses["layers.0.rotary_emb.inv_freq"] == (
        "dropped by mapper",
        "substr 'rotary_emb.inv_freq' (AutoWeightsLoader's rotary mapper)",
    )
    assert statuses["rotary_pos_emb.inv_freq"][0] == "dropped by mapper"
    # the rotary rules join the caller's mapper for the load; the caller's stays as it was
    mine = WeightsMapper(orig_to_new_prefix={"hf.": ""})
    AutoWeightsLoader(Net()).load_weights(
        [("hf.rotary_emb.sin_cached", torch.ones(1))], mapper=mine
    )
    assert mine.orig_to_new_substr == {}
    assert "skip_prefixes" not in AutoWeightsLoader.__init__.__code__.co_varnames


def test_the_skip_list_loader_of_vllm_0_28_skips_by_prefix_and_substring():
    from loadkit.models.plamo2.skips import AutoWeightsLoaderWithSkips

    model = Net()
    w = {
        "layers.0.rotary_emb.inv_freq": torch.ones(1),
        "foo.x": torch.ones(1),
        "bar.extra_stuff.y": torch.ones(1),
        "embed.weight": torch.ones(5, 3),
    }
    loader = AutoWeightsLoaderWithSkips(model, skip_prefixes=["foo."], skip_substrs=["extra_stuff"])
    assert loader.load_weights(w.items()) == {"embed.weight"}
    statuses = {e.name: (e.status, e.rule) for e in loader.ledger.entries}
    assert statuses["foo.x"] == ("skipped", "skip_prefixes 'foo.'")
    assert statuses["bar.extra_stuff.y"] == ("skipped", "skip_substrs 'extra_stuff'")
    assert statuses["layers.0.rotary_emb.inv_freq"] == (
        "skipped",
        "rotary, always skipped 'rotary_emb.inv_freq'",
    )


def test_callers_lists_are_not_changed():
    from loadkit.models.plamo2.skips import AutoWeightsLoaderWithSkips

    prefixes, substrs, suffixes = ["a."], ["b"], [".c"]
    AutoWeightsLoader(Net(), ignore_unexpected_suffixes=suffixes).load_weights([])
    AutoWeightsLoaderWithSkips(Net(), skip_prefixes=prefixes, skip_substrs=substrs).load_weights([])
    assert prefixes == ["a."] and substrs == ["b"] and suffixes == [".c"]


def test_ignore_unexpected_prefix_and_suffix():
    model = Net()
    w = {
        "vision.x": torch.ones(1),
        "embed.weight_scale": torch.ones(1),
        "embed.weight": torch.ones(5, 3),
    }
    loader = AutoWeightsLoader(
        model, ignore_unexpected_prefixes=["vision."], ignore_unexpected_suffixes=["_scale"]
    )
    assert loader.load_weights(w.items()) == {"embed.weight"}
    ign = {e.name: e.rule for e in loader.ledger.entries_with("ignored")}
    assert ign == {
        "vision.x": "ignore_unexpected_prefixes 'vision.'",
        "embed.weight_scale": "ignore_unexpected_suffixes '_scale'",
    }


def test_unknown_name_error_names_it_and_at_most_five_nearest():
    model = Net()
    with pytest.raises(UnknownNameError) as exc:
        AutoWeightsLoader(model).load_weights([("layers.0.prj.weight", torch.ones(2, 3))])
    msg = str(exc.value)
    assert msg.startswith("There is no module or parameter named 'layers.0.prj' in Net.")
    assert "'layers.0.proj'" in msg
    assert 1 <= len(exc.value.suggestions) <= 5
    assert "embed.weight" not in msg  # no wall of every parameter


def test_nested_name_under_a_parameter_raises():
    with pytest.raises(NestedWeightError, match="embed.weight.extra"):
        AutoWeightsLoader(Net()).load_weights([("embed.weight.extra", torch.ones(1))])


def test_shape_error_reraised_with_qualified_name_and_file():
    t = torch.ones(4, 4)
    t.loadkit_file = "/ckpt/model.safetensors"
    with pytest.raises(ShapeMismatchError) as exc:
        AutoWeightsLoader(Net()).load_weights([("layers.1.proj.weight", t)])
    msg = str(exc.value)
    for part in ("layers.1.proj.weight", "[2, 3]", "[4, 4]", "/ckpt/model.safetensors"):
        assert part in msg


def test_failing_custom_loader_gets_context():
    model = Net()

    def broken(param, loaded_weight):
        raise RuntimeError("boom")

    model.embed.weight.weight_loader = broken
    with pytest.raises(WeightLoadError, match=r"embed\.weight.*boom"):
        AutoWeightsLoader(model).load_weights([("embed.weight", torch.ones(5, 3))])

    def wants_shard_id(param, loaded_weight):
        return loaded_weight.shard_id  # upstream-style packed loader, handed an unmapped weight

    model.embed.weight.weight_loader = wants_shard_id
    with pytest.raises(WeightLoadError, match=r"embed\.weight.*\[5, 3\].*AttributeError") as exc:
        AutoWeightsLoader(model).load_weights([("embed.weight", torch.ones(5, 3))])
    assert isinstance(exc.value.__cause__, AttributeError)


def test_param_weight_loader_attribute_used():
    model = Net()
    calls = []
    model.embed.weight.weight_loader = lambda param, loaded_weight: calls.append(
        loaded_weight.shape
    )
    AutoWeightsLoader(model).load_weights([("embed.weight", torch.ones(5, 3))])
    assert calls == [torch.Size([5, 3])]


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(2))
        self.seen = []

    def load_weights(self, weights):
        for name, t in weights:
            self.seen.append(name)
            if name == "w_renamed":
                self.w.data.copy_(t)
        return {"w"}


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()
        self.head = nn.Linear(2, 2)

    def load_weights(self, weights):
        return AutoWeightsLoader(self).load_weights(weights)


def test_child_load_weights_gets_stripped_names_and_results_reprefixed():
    model = Outer()
    w = [
        ("inner.w_renamed", torch.ones(2)),
        ("inner.other", torch.ones(1)),
        ("head.bias", torch.ones(2)),
    ]
    loaded = model.load_weights(w)
    assert model.inner.seen == ["w_renamed", "other"]
    assert loaded == {"inner.w", "head.bias"}
    ledger = ledger_of(model)
    assert [e.status for e in ledger.entries] == ["delegated", "delegated", "loaded"]
    assert ledger.params["inner.w"].via == "inner"
    assert ledger.never_loaded == ["head.weight"]


def test_root_own_load_weights_is_not_recursed_into():
    # Outer.load_weights builds an AutoWeightsLoader on itself: no infinite recursion.
    assert Outer().load_weights([("head.bias", torch.ones(2))]) == {"head.bias"}


def test_child_returning_none_warns_and_what_it_left_is_walked():
    model = Outer()
    model.inner.load_weights = lambda weights: None  # pulls nothing, reports nothing
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        # As upstream: the walk goes on into the child and loads its group by the generic rules.
        assert model.load_weights([("inner.w", torch.full((2,), 3.0))]) == {"inner.w"}
    assert any("returned None" in str(r.message) for r in rec)
    assert torch.equal(model.inner.w, torch.full((2,), 3.0))
    entry = ledger_of(model).entries[0]
    assert (entry.status, entry.target, entry.left_by) == ("loaded", "inner.w", "inner")
    assert entry.detail == "-> inner.w (left by inner.load_weights)"


def test_child_that_stops_early_leaves_the_rest_of_its_group_to_the_walk():
    class Stops(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Parameter(torch.zeros(1))
            self.b = nn.Parameter(torch.zeros(1))

        def load_weights(self, weights):
            name, w = next(iter(weights))  # takes one name, then returns
            getattr(self, name).data.copy_(w * 10)
            return {name}

    class Root(nn.Module):
        def __init__(self):
            super().__init__()
            self.s = Stops()

    root = Root()
    loader = AutoWeightsLoader(root)
    w = [("s.a", torch.ones(1)), ("s.b", torch.ones(1)), ("s.bias", torch.ones(1))]
    assert loader.load_weights(w) == {"s.a", "s.b"}
    assert root.s.a.item() == 10 and root.s.b.item() == 1  # b by default_weight_loader
    a, b, bias = loader.ledger.entries
    assert (a.status, a.detail) == ("delegated", "-> s.load_weights")
    assert (b.status, b.detail) == ("loaded", "-> s.b (left by s.load_weights)")
    assert (bias.status, bias.detail) == (
        "ignored",
        "upstream's '.bias' suffix rule (left by s.load_weights)",
    )
    with pytest.raises(UnknownNameError, match="'s.c'"):  # a leftover nobody has: raises
        AutoWeightsLoader(Root()).load_weights([("s.a", torch.ones(1)), ("s.c", torch.ones(1))])


def test_unexpected_bias_is_ignored_as_upstream_does():
    model = Outer()
    w = [
        ("head.bias", torch.ones(2)),
        ("inner.bias", torch.ones(1)),
        ("head.weight.bias", torch.ones(1)),
    ]
    suffixes: list[str] = []
    loader = AutoWeightsLoader(model, ignore_unexpected_suffixes=suffixes)
    assert loader.load_weights(w) == {"head.bias", "inner.w"}
    statuses = [(e.name, e.status, e.rule) for e in loader.ledger.entries]
    assert statuses[1:] == [
        ("inner.bias", "delegated", None),  # inner has its own load_weights: its call
        ("head.weight.bias", "ignored", "upstream's '.bias' suffix rule"),
    ]
    assert suffixes == []  # upstream appends ".bias" to the caller's list; loadkit does not
    with pytest.raises(UnknownNameError, match="'bias'"):  # no dot, no rule
        AutoWeightsLoader(model).load_weights([("bias", torch.ones(1))])


def test_interleaved_groups_walk_consecutive_runs():
    model = Outer()
    w = [("inner.a", torch.ones(1)), ("head.bias", torch.ones(2)), ("inner.b", torch.ones(1))]
    model.load_weights(w)
    assert model.inner.seen == ["a", "b"]  # called twice, once per run


def test_a_tied_embeddings_alias_is_skipped_unasked():
    class Head(VocabEmbedding):  # what vLLM's ParallelLMHead is: a vocabulary embedding
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(4, 2))

    class Tied(nn.Module):
        def __init__(self, head):
            super().__init__()
            self.embed = nn.Embedding(4, 2)
            self.lm_head = head
            self.lm_head.weight = self.embed.weight

    w = [("embed.weight", torch.ones(4, 2)), ("lm_head.weight", torch.zeros(4, 2))]
    m = Tied(Head())
    loader = AutoWeightsLoader(m)
    assert loader.aliased_params == {"lm_head.weight": "embed.weight"}
    assert loader.load_weights(w) == {"embed.weight"}
    assert m.embed.weight.sum().item() == 8  # the alias did not overwrite the embedding
    entry = next(e for e in loader.ledger.entries if e.name == "lm_head.weight")
    assert (entry.status, entry.rule) == ("skipped", "tied embedding: an alias of 'embed.weight'")
    assert loader.ledger.params["embed.weight"].aliases == ["lm_head.weight"]
    # a plain nn.Linear head is no vocabulary embedding: upstream loads both, the last wins
    m = Tied(nn.Linear(2, 4, bias=False))
    assert AutoWeightsLoader(m).aliased_params == {}
    AutoWeightsLoader(m).load_weights(w)
    assert m.embed.weight.sum().item() == 0  # overwritten by lm_head
