"""Observing a load from outside (loadkit.loading.observe): no class patched, no global kept."""

import pytest
import torch
from torch import nn

from loadkit import AutoWeightsLoader, WeightsMapper, ledger_of
from loadkit.errors import UnknownNameError
from loadkit.loading.observe import LoadObserver, current_observer, observing


class Child(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(2))

    def load_weights(self, weights):
        return AutoWeightsLoader(self).load_weights(weights)


class Root(nn.Module):
    def __init__(self):
        super().__init__()
        self.child = Child()
        self.b = nn.Parameter(torch.zeros(3))

    def load_weights(self, weights):
        mapper = WeightsMapper(orig_to_new_prefix={"hf.": ""})
        return AutoWeightsLoader(self).load_weights(weights, mapper=mapper)


class Recorder(LoadObserver):
    def __init__(self, accept=True, replace=None):
        self.opened_at, self.took_names, self.mappers, self.rejected = [], [], [], []
        self.accept, self.replace = accept, replace

    def opened(self, ledger, module):
        self.opened_at.append(type(module).__name__)

    def took(self, ledger, entry, tensor):
        self.took_names.append((ledger.root, entry.name))

    def loading(self, loader, mapper):
        self.mappers.append((type(loader.module).__name__, mapper))
        return self.replace or mapper

    def unexpected(self, ledger, name, entries, reason):
        self.rejected.append((name, [e.name for e in entries], reason))
        return self.accept


def weights():
    return [("hf.child.w", torch.ones(2)), ("hf.b", torch.ones(3))]


def test_every_ledger_reports_to_the_scopes_observer():
    model = Root()
    with observing(Recorder()) as obs:
        assert current_observer() is obs
        assert model.load_weights(weights()) == {"child.w", "b"}
    assert current_observer() is None
    assert obs.opened_at == ["Root", "Child"]
    assert obs.took_names == [("Root", "hf.child.w"), ("Child", "w"), ("Root", "hf.b")]
    assert [m for m, _ in obs.mappers] == ["Root", "Child"]
    assert obs.mappers[0][1].orig_to_new_prefix == {"hf.": ""}


def test_an_observer_may_replace_the_mapper():
    model = Root()
    with observing(Recorder(replace=WeightsMapper(orig_to_new_prefix={"x.": ""}))):
        assert model.load_weights([("x.b", torch.ones(3))]) == {"b"}
    assert model.b.sum().item() == 3


def test_unknown_names_are_recorded_and_the_walk_goes_on():
    model = Root()
    stream = [("hf.bogus.a", torch.ones(1)), ("hf.bogus.b", torch.ones(1)), ("hf.b", torch.ones(3))]
    with observing(Recorder()) as obs:
        assert model.load_weights(stream) == {"b"}
    assert obs.rejected == [
        ("bogus", ["hf.bogus.a", "hf.bogus.b"], "no module or parameter named 'bogus' in Root")
    ]
    ledger = ledger_of(model)
    assert [e.status for e in ledger.entries] == ["unexpected", "unexpected", "loaded"]
    # An observer that declines lets the load raise as usual; without one it always raises.
    with observing(Recorder(accept=False)), pytest.raises(UnknownNameError):
        Root().load_weights(stream)
    with pytest.raises(UnknownNameError):
        Root().load_weights(stream)


def test_an_explicit_observer_and_nested_names():
    model = nn.Linear(2, 2)
    obs = Recorder()
    loader = AutoWeightsLoader(model, observer=obs)
    assert loader.load_weights([("weight.extra", torch.ones(1)), ("bias", torch.ones(2))]) == {
        "bias"
    }
    assert obs.rejected == [
        ("weight.extra", ["weight.extra"], "nested under the parameter 'weight'")
    ]
    assert current_observer() is None


def test_the_ledger_lives_on_the_model():
    model = Root()
    model.load_weights(weights())
    assert ledger_of(model).never_loaded == []
    assert ledger_of(model.child).entries[0].name == "w"
    assert ledger_of(Root()) is None
