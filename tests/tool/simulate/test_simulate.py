"""The dry load's machinery (loadkit_inspect.simulate): passes, observer, meta stand-ins."""

import pytest
import torch
from repo_paths import DATA
from torch import nn

from loadkit import AutoWeightsLoader, as_pooling_model, default_weight_loader, open_checkpoint
from loadkit.checkpoint.reader import TensorInfo
from loadkit_inspect.inspector import inspect_checkpoint
from loadkit_inspect.simulate import dry_load
from loadkit_inspect.simulate.recording import (
    Pass,
    Recorder,
    WriteWatcher,
    premade,
    storage_id,
)
from loadkit_inspect.simulate.weights import meta_weight

ORIGINAL_LOAD_WEIGHTS = AutoWeightsLoader.load_weights


class Loop(nn.Module):
    """A hand-written loop that raises KeyError for a name it lacks; counts what it is fed."""

    def __init__(self, n):
        super().__init__()
        self.p = nn.ParameterList([nn.Parameter(torch.zeros(2)) for _ in range(n)])
        self.fed = 0

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        loaded = set()
        for name, w in weights:
            self.fed += 1
            default_weight_loader(params[name], w)
            loaded.add(name)
        return loaded


def infos(names, shape=(2,)):
    return [TensorInfo(n, "F32", shape, 8, "x.safetensors", 8 * i) for i, n in enumerate(names)]


def test_a_hand_written_loader_is_fed_each_key_a_bounded_number_of_times():
    n, bogus = 200, [f"bogus{i}" for i in range(40)]
    names = [f"p.{i}" for i in range(n)]
    mixed = [x for pair in zip(names[::5], bogus, strict=False) for x in pair] + [
        x for i, x in enumerate(names) if i % 5
    ]
    with torch.device("meta"):
        model = Loop(n)
    report = dry_load(model, infos(mixed)).report
    # One discovery pass per failing key (each resuming right after it), then one full pass:
    # every key is fed at most twice, however many keys fail.
    assert model.fed <= 2 * len(mixed)
    assert report.runs == len(bogus) + 2
    assert sorted(u.name for u in report.unexpected) == sorted(bogus)
    assert report.filled == n and report.missing == []
    assert {k.status for k in report.keys if k.name in names} == {"loaded"}


def test_the_dry_load_patches_no_class():
    class Checks(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Parameter(torch.zeros(2))

        def load_weights(self, weights):
            assert AutoWeightsLoader.load_weights is ORIGINAL_LOAD_WEIGHTS
            return AutoWeightsLoader(self).load_weights(weights)

    with torch.device("meta"):
        model = Checks()
    loaded = dry_load(model, infos(["a"]), mapper=None, replace_mapper=True)
    report, used = loaded.report, loaded.mapper
    assert report.clean and report.keys[0].target == "a" and used is None


def test_a_pooling_model_that_clones_every_key_still_loads_each_under_its_own_key():
    from loadkit.models.gemma4 import Gemma4ForConditionalGeneration, config_from_checkpoint

    ck = open_checkpoint(DATA / "gemma4_like" / "model.safetensors")
    targets = {}
    for behaviour in ("old", "new"):  # old clones every key it walks (all 73), new one
        cls = as_pooling_model(Gemma4ForConditionalGeneration, behaviour=behaviour)
        r = inspect_checkpoint(ck, model=lambda cls=cls: cls(config_from_checkpoint(ck.tensors)))
        assert r.clean is True and r.model.pooling is True, r.render()
        assert {k.status for k in r.load.keys} == {"loaded"}
        targets[behaviour] = {k.name: k.target for k in r.load.keys}
    assert targets["old"] == targets["new"]
    assert targets["old"]["model.language_model.norm.weight"] == "language_model.model.norm.weight"


def test_meta_weights_carry_their_key_through_what_loaders_do_to_them():
    """Inside the dry load's dispatch mode every tensor computed from a weight keeps its key;
    an in-place copy into a model tensor does not give it one."""
    w = meta_weight(TensorInfo("k", "F16", (2, 3), 12, "f.safetensors", 8))
    other = meta_weight(TensorInfo("j", "F16", (2, 3), 12, "f.safetensors", 20))
    assert w.is_meta and w.dtype == torch.float16 and w.shape == (2, 3) and w is not other
    param = torch.empty(2, 3, dtype=torch.float16, device="meta")
    with WriteWatcher({"p": param}, Recorder()):
        derived = [w.clone(), w.t(), w.reshape(6), -w.exp(), w[0], w.float(), torch.cat([w, w])]
        derived += [*w.chunk(2, dim=1), torch.add(param, w), param.copy_(w)]
        mixed = (w + other, other + w)
        scratch = torch.empty(2, 3, dtype=torch.float16, device="meta")
        torch.add(w, w, out=scratch)
    assert [d.loadkit_key for d in derived[:-1]] == ["k"] * (len(derived) - 1)
    assert derived[-1] is param and "loadkit_key" not in param.__dict__
    assert "loadkit_key" not in scratch.__dict__  # an out= argument is not computed from w
    assert derived[-2].loadkit_file == "f.safetensors"
    assert [m.loadkit_key for m in mixed] == ["k", "j"]
    assert "loadkit_key" not in w.clone().__dict__  # outside the dry load: a plain meta tensor


def test_a_full_pass_makes_each_key_its_own_tensor_before_it_starts():
    infos = [TensorInfo(f"k{i}", "BF16", (4, 2), 16, "f.safetensors", 8 + 16 * i) for i in range(4)]
    made = premade(infos, {"k2": None})
    assert [w.loadkit_key for w in reversed(made)] == ["k0", "k1", "k3"]  # fed from the end
    assert len({storage_id(w) for w in made}) == 3  # a storage each, as real tensors have
    fed = list(Pass().stream(infos, {"k2": None}, weights=made))
    assert [name for name, _ in fed] == ["k0", "k1", "k3"] and made == []
    assert [w.loadkit_key for _, w in fed] == ["k0", "k1", "k3"]


def test_what_makes_no_aten_call_passes_no_key():
    """``nn.Parameter(w)`` and another thread make no aten call the dry load's mode sees: their
    tensors carry no key (the load is then credited to the key last fed)."""
    from concurrent.futures import ThreadPoolExecutor

    w = meta_weight(TensorInfo("k", "F32", (2, 2), 16, "f.safetensors", 8))
    with WriteWatcher({}, Recorder()), ThreadPoolExecutor(1) as pool:
        wrapped = nn.Parameter(w, requires_grad=False)
        elsewhere = pool.submit(lambda: w.t().contiguous()).result()
        here = w.t().contiguous()
    assert "loadkit_key" not in wrapped.__dict__ and "loadkit_key" not in elsewhere.__dict__
    assert here.loadkit_key == "k"


def test_storage_id_is_shared_by_views_and_only_by_views():
    with torch.device("meta"):
        a, b = torch.empty(4), torch.empty(4)
    assert storage_id(a) == storage_id(a[1:3]) == storage_id(a.view(2, 2))
    assert storage_id(a) != storage_id(b)
    p = nn.Parameter(torch.zeros(3))
    assert storage_id(p) == storage_id(p.data) != storage_id(p.detach().clone())


def test_a_failure_in_a_discovery_pass_after_the_end_is_confirmed_by_a_full_pass():
    class StrictLoop(Loop):
        def load_weights(self, weights):
            loaded = super().load_weights(weights)
            if len(loaded) != len(self.p):
                raise RuntimeError(f"only {len(loaded)} of {len(self.p)} loaded")
            return loaded

    with torch.device("meta"):
        model = StrictLoop(3)
    report = dry_load(model, infos(["p.0", "bogus", "p.1", "p.2"])).report
    # The discovery pass after 'bogus' sees two keys and fails its final check; the full pass
    # without 'bogus' loads all three and passes it: the load is clean but for 'bogus'.
    assert report.failure is None and [u.name for u in report.unexpected] == ["bogus"]
    assert report.runs == 3 and report.filled == 3


def test_a_loader_failing_at_once_is_unusable():
    class Broken(Loop):
        def load_weights(self, weights):
            raise TypeError("no")

    with torch.device("meta"):
        model = Broken(1)
    with pytest.raises(ValueError, match="before taking any weight"):
        dry_load(model, infos(["p.0"]))
