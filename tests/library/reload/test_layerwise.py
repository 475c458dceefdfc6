import inspect
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from loadkit import composed_weight_loader, default_weight_loader
from loadkit.errors import LoadkitError, ShapeMismatchError
from loadkit.reload.layerwise import (
    ExcessiveLoadWarning,
    PartialLayerWarning,
    ReloadStateError,
    UnloadedLayerWarning,
    finalize_layerwise_reload,
    initialize_layerwise_reload,
    max_layer_reload_bytes,
    record_metadata_for_reloading,
    reload_log,
)

LOADED = {"A": torch.full((4,), 0.5), "dt_bias": torch.full((4,), 3.0), "D": torch.full((4,), 7.0)}


class Mixer(torch.nn.Module):
    """The upstream case: A, D, dt_bias of 4 each, A through a composed loader."""

    def __init__(self, n: int = 4):
        super().__init__()
        self.A = torch.nn.Parameter(torch.zeros(n), requires_grad=False)
        self.D = torch.nn.Parameter(torch.ones(n), requires_grad=False)
        self.dt_bias = torch.nn.Parameter(torch.ones(n), requires_grad=False)
        self.A.weight_loader = composed_weight_loader(
            default_weight_loader, lambda x: -torch.exp(x.float())
        )
        self.conv1d = torch.nn.Linear(3, 2)  # a child: a layer of its own


def reload(model, weights, order, behaviour, params=None, fill="nan"):
    """Record, initialise, load ``order`` through each parameter's loader, finalise (with NaN
    where no load wrote, unless ``fill`` says otherwise)."""
    record_metadata_for_reloading(model)
    initialize_layerwise_reload(model, behaviour=behaviour, fill=fill)
    params = params or dict(model.named_parameters())  # resolved once, as load paths do
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name in order:
            params[name].weight_loader(params[name], weights[name])
        partly = finalize_layerwise_reload(model)
    return partly, caught


def test_old_finalises_after_dt_bias_and_leaves_d_nan():
    mixer = Mixer()
    partly, caught = reload(mixer, LOADED, ["A", "dt_bias", "D"], "old")
    assert torch.isnan(mixer.D).all()
    assert torch.equal(mixer.A, -torch.exp(LOADED["A"]))
    assert torch.equal(mixer.dt_bias, LOADED["dt_bias"])
    assert partly == []  # finalised by its count, so finalize sees nothing wrong
    excessive = [w for w in caught if w.category is ExcessiveLoadWarning]
    assert len(excessive) == 1 and "excessive loading of 'D'" in str(excessive[0].message)
    assert [w.category for w in caught if w not in excessive] == [UnloadedLayerWarning]


def test_old_log_counts_a_twice():
    model = torch.nn.Sequential(Mixer())
    reload(model, {"0." + k: v for k, v in LOADED.items()}, ["0.A", "0.dt_bias", "0.D"], "old")
    steps = [
        (s.parameter, s.counted, s.running, s.total, s.finalised, s.dropped)
        for s in reload_log(model)
    ]
    assert steps == [
        ("A", 8, 8, 12, False, False),
        ("dt_bias", 4, 12, 12, True, False),
        ("D", 0, 12, 12, False, True),
    ]
    assert {s.layer for s in reload_log(model)} == {"0"}


def test_new_loads_everything_and_keeps_pointers():
    mixer = Mixer()
    model = torch.nn.Sequential(mixer)
    ptrs = {n: p.data_ptr() for n, p in model.named_parameters()}
    ids = {n: id(p) for n, p in model.named_parameters()}
    weights = {"0." + k: v for k, v in LOADED.items()}
    weights |= {"0.conv1d.weight": torch.full((2, 3), 2.0), "0.conv1d.bias": torch.ones(2)}
    partly, caught = reload(model, weights, list(weights), "new")
    assert partly == [] and caught == []
    assert torch.equal(mixer.A, -torch.exp(LOADED["A"]))
    assert torch.equal(mixer.dt_bias, LOADED["dt_bias"])
    assert torch.equal(mixer.D, LOADED["D"])
    assert torch.equal(mixer.conv1d.weight, weights["0.conv1d.weight"])
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == ptrs
    assert {n: id(p) for n, p in model.named_parameters()} == ids
    assert [s.finalised for s in reload_log(model)] == [False, False, True, False, True]


@pytest.mark.parametrize(
    ("order", "dropped", "final_running"),
    [
        (["A", "dt_bias", "D"], "D", 12),  # upstream
        (["dt_bias", "A", "D"], "D", 12),
        (["D", "A", "dt_bias"], "dt_bias", 12),  # moving D first only moves the victim
        (["A", "D", "dt_bias"], "dt_bias", 12),
        (["D", "dt_bias", "A"], None, 16),  # A last: overshoots to 16, nothing dropped
        (["dt_bias", "D", "A"], None, 16),
    ],
)
def test_orders_behave_as_counts_predict(order, dropped, final_running):
    for behaviour in ("old", "new"):
        mixer = Mixer()
        reload(mixer, LOADED, order, behaviour)
        steps = reload_log(mixer)
        victim = dropped if behaviour == "old" else None
        nan = [n for n in ("A", "D", "dt_bias") if torch.isnan(getattr(mixer, n)).all()]
        assert nan == ([victim] if victim else [])
        assert [s.parameter for s in steps if s.dropped] == nan
        fin = [s for s in steps if s.finalised]
        assert len(fin) == 1
        assert fin[0].running == (final_running if behaviour == "old" else 12)
        for n in {"A", "D", "dt_bias"} - set(nan):
            want = -torch.exp(LOADED[n]) if n == "A" else LOADED[n]
            assert torch.equal(getattr(mixer, n), want)


def test_wrapped_loader_keeps_param_first_and_counts_on_meta():
    mixer = Mixer()
    record_metadata_for_reloading(mixer)
    live_d = mixer.D
    initialize_layerwise_reload(mixer, fill="nan")
    stand_in = mixer.D
    assert stand_in.is_meta and not live_d.is_meta
    wrapped = stand_in.weight_loader
    assert next(iter(inspect.signature(wrapped).parameters)) == "param"
    assert wrapped.__wrapped__ is default_weight_loader
    before = live_d.clone()
    live_d.weight_loader(live_d, torch.full((4,), 9.0))  # handed the live tensor: still buffered
    assert torch.equal(live_d, before)
    with pytest.warns(PartialLayerWarning):
        assert finalize_layerwise_reload(mixer) == [""]
    assert torch.equal(mixer.D, torch.full((4,), 9.0)) and mixer.D is live_d
    assert torch.isnan(mixer.A).all() and torch.isnan(mixer.dt_bias).all()
    assert "weight_loader" not in live_d.__dict__  # the live parameter's own loader is back
    assert mixer.A.weight_loader.__qualname__.startswith("composed_weight_loader")


def test_live_parameter_loads_after_finalisation_are_dropped():
    mixer = Mixer()
    record_metadata_for_reloading(mixer)
    initialize_layerwise_reload(mixer, behaviour="old", fill="nan")
    for n in ("A", "dt_bias"):
        getattr(mixer, n).weight_loader(getattr(mixer, n), LOADED[n])
    assert not mixer.D.is_meta  # finalised: the live parameters are back in the layer
    with pytest.warns(ExcessiveLoadWarning):
        mixer.D.weight_loader(mixer.D, LOADED["D"])  # looked up afresh: dropped all the same
    with pytest.warns(UnloadedLayerWarning, match="conv1d"):
        finalize_layerwise_reload(mixer)
    assert torch.isnan(mixer.D).all()


def test_packed_parameter_finalises_when_all_its_elements_arrived():
    lin = torch.nn.Linear(4, 6, bias=False)

    def shard_loader(param, loaded_weight, shard_id):
        param.data.narrow(0, 2 * "qkv".index(shard_id), 2).copy_(loaded_weight)

    lin.weight.weight_loader = shard_loader
    record_metadata_for_reloading(lin)
    initialize_layerwise_reload(lin)
    for i, s in enumerate("qkv"):
        lin.weight.weight_loader(lin.weight, torch.full((2, 4), float(i)), shard_id=s)
    steps = reload_log(lin)
    assert [(s.counted, s.running, s.finalised) for s in steps] == [
        (8, 8, False),
        (8, 16, False),
        (8, 24, True),
    ]
    finalize_layerwise_reload(lin)
    assert torch.equal(lin.weight[:, 0], torch.tensor([0.0, 0, 1, 1, 2, 2]))


def test_finalize_partly_loaded_and_untouched_layers():
    model = torch.nn.Sequential(Mixer(), torch.nn.Linear(2, 2))
    keep = model[1].weight.detach().clone()
    record_metadata_for_reloading(model)
    initialize_layerwise_reload(model, fill="nan")
    model[0].A.weight_loader(model[0].A, LOADED["A"])
    with pytest.warns(PartialLayerWarning) as rec:
        partly = finalize_layerwise_reload(model)
    assert partly == ["0"]
    assert [w.category for w in rec] == [PartialLayerWarning, UnloadedLayerWarning]
    assert torch.isnan(model[0].D).all() and not torch.isnan(model[0].A).any()
    assert torch.equal(model[1].weight, keep)
    assert reload_log(model)[-1].reason == "finalize_layerwise_reload"


def test_lifecycle_errors():
    mixer = Mixer()
    with pytest.raises(ReloadStateError, match="record_metadata_for_reloading"):
        initialize_layerwise_reload(mixer)
    with pytest.raises(ReloadStateError, match="no reload is open"):
        finalize_layerwise_reload(mixer)
    record_metadata_for_reloading(mixer)
    with pytest.raises(LoadkitError, match="behaviour"):
        initialize_layerwise_reload(mixer, behaviour="newer")
    initialize_layerwise_reload(mixer)
    with pytest.raises(ReloadStateError, match="already open"):
        initialize_layerwise_reload(mixer)
    with pytest.raises(ReloadStateError, match="is open"):
        record_metadata_for_reloading(mixer)
    with pytest.warns(PartialLayerWarning):
        finalize_layerwise_reload(mixer)
    assert not any(p.is_meta for p in mixer.parameters())


def test_tied_parameters_and_bad_loaders_are_refused():
    a, b = torch.nn.Linear(2, 2, bias=False), torch.nn.Linear(2, 2, bias=False)
    b.weight = a.weight
    tied = torch.nn.Sequential(a, b)
    record_metadata_for_reloading(tied)
    with pytest.raises(ReloadStateError, match="tied"):
        initialize_layerwise_reload(tied)
    assert not a.weight.is_meta  # nothing was changed

    odd = torch.nn.Linear(2, 2, bias=False)
    odd.weight.weight_loader = lambda p, w: p.data.copy_(w)
    record_metadata_for_reloading(odd)
    with pytest.raises(ReloadStateError, match="first argument is 'p'"):
        initialize_layerwise_reload(odd)

    grown = torch.nn.Linear(2, 2)
    record_metadata_for_reloading(grown)
    grown.weight = torch.nn.Parameter(torch.zeros(3, 3))
    with pytest.raises(ReloadStateError, match=r"shape \[3, 3\].*\[2, 2\]"):
        initialize_layerwise_reload(grown)


def test_second_reload_reuses_the_recording():
    mixer = Mixer()
    reload(mixer, LOADED, ["A", "dt_bias", "D"], "old")
    assert torch.isnan(mixer.D).all()
    initialize_layerwise_reload(mixer, behaviour="new")  # recorded once, reloaded again
    for n in ("A", "dt_bias", "D"):
        getattr(mixer, n).weight_loader(getattr(mixer, n), LOADED[n])
    with pytest.warns(UnloadedLayerWarning):
        finalize_layerwise_reload(mixer)
    assert torch.equal(mixer.D, LOADED["D"])
    assert len(reload_log(mixer)) == 3  # the log of the last reload only


@given(
    sizes=st.lists(st.integers(1, 5), min_size=3, max_size=3),
    order=st.permutations(["A", "D", "dt_bias"]),
    behaviour=st.sampled_from(["old", "new"]),
)
def test_outcome_matches_a_count_simulation(sizes, order, behaviour):
    mixer = Mixer()
    for name, n in zip(("A", "D", "dt_bias"), sizes, strict=True):
        p = getattr(mixer, name)
        new = torch.nn.Parameter(torch.zeros(n), requires_grad=False)
        new.__dict__.update(p.__dict__)
        setattr(mixer, name, new)
    size = dict(zip(("A", "D", "dt_bias"), sizes, strict=True))
    weights = {n: torch.arange(1.0, size[n] + 1) for n in size}
    # the prediction: count (A twice under "old") until the total, drop what comes after
    total, running, expect_nan = sum(sizes), 0, []
    for name in order:
        if running >= total:
            expect_nan.append(name)
            continue
        running += size[name] * (2 if name == "A" and behaviour == "old" else 1)
    reload(mixer, weights, order, behaviour)
    nan = sorted(n for n in size if torch.isnan(getattr(mixer, n)).all())
    assert nan == sorted(expect_nan)
    for n in set(size) - set(nan):
        want = -torch.exp(weights[n]) if n == "A" else weights[n]
        assert torch.equal(getattr(mixer, n), want)


def test_layers_are_materialised_one_after_another_in_one_scratch_buffer():
    n = 512  # 1 MiB of float32 per layer: large enough for the arena
    model = torch.nn.Sequential(
        torch.nn.Linear(n, n, bias=False), torch.nn.Linear(n, n, bias=False)
    )
    seen = []

    def loader(param, loaded_weight):
        if not param.is_meta:  # the replay, on the materialised tensor
            seen.append((param.data_ptr(), bool(torch.isnan(param).all())))
        param.data.copy_(loaded_weight)

    for lin in model:
        lin.weight.weight_loader = loader
    live = [lin.weight.data_ptr() for lin in model]
    record_metadata_for_reloading(model)
    initialize_layerwise_reload(model, fill="nan")
    for i, lin in enumerate(model):
        lin.weight.weight_loader(lin.weight, torch.full((n, n), float(i)))
    finalize_layerwise_reload(model)
    assert seen[0][0] == seen[1][0] and seen[0][0] not in live  # reused, and not the live storage
    assert seen[0][1] and seen[1][1]  # NaN before each replay, though the buffer was reused
    assert [float(lin.weight.detach()[0, 0]) for lin in model] == [0.0, 1.0]


def test_a_finalisation_nested_in_a_replay_gets_its_own_memory():
    first, second = torch.nn.Linear(2, 2, bias=False), torch.nn.Linear(2, 2, bias=False)
    model = torch.nn.Sequential(first, second)

    def first_loader(param, loaded_weight):
        param.data.copy_(loaded_weight)
        if not param.is_meta:  # only while replaying: load the other layer from inside
            second.weight.weight_loader(second.weight, torch.full((2, 2), 5.0))

    first.weight.weight_loader = first_loader
    record_metadata_for_reloading(model)
    initialize_layerwise_reload(model)
    first.weight.weight_loader(first.weight, torch.full((2, 2), 3.0))
    finalize_layerwise_reload(model)
    assert torch.equal(first.weight, torch.full((2, 2), 3.0))
    assert torch.equal(second.weight, torch.full((2, 2), 5.0))
    assert [(s.layer, s.finalised) for s in reload_log(model)] == [("0", True), ("1", True)]


def test_a_failing_load_is_not_replayed_and_finalize_restores_the_model():
    mixer = Mixer()
    keep = mixer.dt_bias.detach().clone()
    record_metadata_for_reloading(mixer)
    initialize_layerwise_reload(mixer)
    with pytest.raises(ShapeMismatchError, match=r"\[4\].*\[5\]"):
        mixer.dt_bias.weight_loader(mixer.dt_bias, torch.zeros(5))
    assert reload_log(mixer) == []
    with pytest.raises(ReloadStateError, match="another open reload"):
        initialize_layerwise_reload(torch.nn.Sequential(mixer))
    with pytest.warns(UnloadedLayerWarning):
        assert finalize_layerwise_reload(mixer) == []
    assert torch.equal(mixer.dt_bias, keep) and not mixer.dt_bias.is_meta


def test_a_layers_total_counts_its_buffers_too():
    """As vLLM 0.28.0 counts: direct parameters and buffers (non-persistent ones included), so a
    layer whose loads fill only its parameters is never finalised by its count."""

    class Normed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(4), requires_grad=False)
            self.register_buffer("scale", torch.ones(3))
            self.register_buffer("cache", torch.ones(2), persistent=False)

    layer = Normed()
    record_metadata_for_reloading(layer)
    initialize_layerwise_reload(layer, behaviour="new")
    layer.weight.weight_loader(layer.weight, torch.full((4,), 2.0))  # the wrapped loader
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        partly = finalize_layerwise_reload(layer)
    step = reload_log(layer)[0]
    assert (step.parameter, step.counted, step.running, step.total) == ("weight", 4, 4, 9)
    assert not step.finalised and partly == [""]  # 4 of 9: still open when finalize came


# --- vLLM 0.31.0 to 0.34.0: padding, fills, deferred processing, post-load hooks --------------


class Padded(torch.nn.Module):
    """A weight of 2 x 8 whose checkpoint tensor is 2 x 6: rows 6 and 7 are padding, which the
    loader never writes and ``weight_loader_numel`` leaves out (as vLLM's unquantized MoE)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(2, 8), requires_grad=False)
        self.w.weight_loader_numel = 12
        self.w.weight_loader = self.load_w
        self.b = torch.nn.Parameter(torch.zeros(2), requires_grad=False)

    @staticmethod
    def load_w(param, loaded_weight):
        param.data[:, :6].copy_(loaded_weight)


PADDED_UPDATE = {"w": torch.arange(12.0).view(2, 6) + 1, "b": torch.tensor([5.0, 6.0])}


def _reload_padded(**rules):
    layer = Padded()
    record_metadata_for_reloading(layer)
    initialize_layerwise_reload(layer, **rules)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name in ("w", "b"):
            p = getattr(layer, name)
            p.weight_loader(p, PADDED_UPDATE[name])
        partly = finalize_layerwise_reload(layer)
    return layer, partly, caught


@pytest.mark.parametrize(
    ("padding", "fill", "finalised_by", "pad"),
    [
        ("counted", "stale", "finalize_layerwise_reload", [1.25, 1.75, 1.25, 1.75]),  # 0.30.0
        ("excluded", "stale", "count reached total", [1.25, 1.75, 1.25, 1.75]),  # 0.31.0
        ("excluded", "zero", "count reached total", [0.0, 0.0, 0.0, 0.0]),  # 0.34.0
    ],
)
def test_padding_is_counted_or_excluded_and_keeps_the_fill(padding, fill, finalised_by, pad):
    layer, partly, _ = _reload_padded(padding=padding, fill=fill)
    steps = reload_log(layer)
    total = 18 if padding == "counted" else 14
    assert [(s.parameter, s.counted, s.total) for s in steps[:2]] == [
        ("w", 12, total),
        ("b", 2, total),
    ]
    assert [s.reason for s in steps if s.finalised] == [finalised_by]
    assert partly == ([""] if padding == "counted" else [])
    assert torch.equal(layer.w[:, :6], PADDED_UPDATE["w"])
    assert layer.w[:, 6:].flatten().tolist() == pad  # elements 6, 7, 14, 15 of the ramp


def test_the_stale_fill_is_a_fixed_non_zero_pattern_in_every_dtype():
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool):
        from loadkit.reload.layer import stale_fill_

        t = stale_fill_(torch.zeros(16, dtype=dtype))
        assert bool((t != 0).all()), dtype
        assert torch.equal(t[:8], t[8:])
    assert stale_fill_(torch.zeros(8, dtype=torch.int32)).tolist() == [1, 2, 3, 4, 5, 6, 7, 1]


def test_zero_is_the_default_fill_and_nan_and_stale_are_chosen():
    for fill, check in (
        ("zero", lambda d: bool((d == 0).all())),
        ("nan", lambda d: bool(d.isnan().all())),
        ("stale", lambda d: d.tolist() == [-1.75, -1.25, -0.75, -0.25]),
    ):
        mixer = Mixer()
        keywords = {} if fill == "zero" else {"fill": fill}
        record_metadata_for_reloading(mixer)
        initialize_layerwise_reload(mixer, behaviour="old", **keywords)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for n in ("A", "dt_bias", "D"):
                getattr(mixer, n).weight_loader(getattr(mixer, n), LOADED[n])
            finalize_layerwise_reload(mixer)
        assert check(mixer.D.detach()), fill  # D was dropped: it shows the fill


def test_deferred_processing_finalises_only_in_finalize():
    mixer = Mixer()
    record_metadata_for_reloading(mixer)
    initialize_layerwise_reload(mixer, defer_processing=True)
    for n in ("A", "dt_bias", "D"):
        getattr(mixer, n).weight_loader(getattr(mixer, n), LOADED[n])
    assert mixer.D.is_meta  # complete, but not finalised
    with pytest.warns(UnloadedLayerWarning):
        assert finalize_layerwise_reload(mixer) == []  # complete: not "partly loaded"
    assert [(s.parameter, s.reason) for s in reload_log(mixer)][-1] == (
        "",
        "finalize_layerwise_reload",
    )
    assert torch.equal(mixer.D, LOADED["D"])


def test_finalize_runs_post_load_hooks_children_first():
    ran = []

    class Hooked(torch.nn.Module):
        def __init__(self, name, *children):
            super().__init__()
            self.name = name
            self.w = torch.nn.Parameter(torch.zeros(1), requires_grad=False)
            self.kids = torch.nn.ModuleList(children)

        def process_weights_after_loading(self):
            ran.append((self.name, float(self.w)))

    shared = Hooked("shared")
    model = Hooked("root", Hooked("a", shared), Hooked("b", shared))
    record_metadata_for_reloading(model)
    initialize_layerwise_reload(model)
    for name, p in model.named_parameters():
        p.weight_loader(p, torch.full((1,), float(len(name))))
    finalize_layerwise_reload(model)
    # Children first; the module two parents share runs once, before both; each sees its load.
    assert ran == [("shared", 15.0), ("a", 8.0), ("b", 8.0), ("root", 1.0)]  # len(name)


def test_max_layer_reload_bytes_is_the_largest_recorded_layer():
    model = torch.nn.Sequential(Mixer(), torch.nn.Linear(8, 8, dtype=torch.bfloat16))
    assert max_layer_reload_bytes(model) == 0  # nothing recorded yet
    record_metadata_for_reloading(model)
    assert max_layer_reload_bytes(model) == (64 + 8) * 2  # the bfloat16 Linear: 144 bytes


@pytest.mark.parametrize("fill", ["zero", "nan", "stale"])
def test_a_layer_of_plain_loads_is_finalised_in_place_with_the_same_bytes(fill):
    """Every load default_weight_loader's: replayed into the live tensors (no fresh copy); the
    bytes are those of materialise, replay, copy back (the Mixer's composed A takes that path)."""
    plain = torch.nn.Linear(1, 8)  # a total of 8 + 8 + 2: two weight loads do not reach it
    plain.register_buffer("cache", torch.full((2,), 4.0), persistent=False)
    general = torch.nn.Linear(1, 8)
    general.register_buffer("cache", torch.full((2,), 4.0), persistent=False)
    general.weight.weight_loader = lambda param, loaded_weight: param.data.copy_(loaded_weight)
    results = []
    for layer in (plain, general):
        pointers = {n: t.data_ptr() for n, t in [*layer.named_parameters(), *layer.named_buffers()]}
        record_metadata_for_reloading(layer)
        initialize_layerwise_reload(layer, fill=fill)
        for w in (torch.full((8, 1), 1.0), torch.full((8, 1), 2.0)):  # the later load wins
            layer.weight.weight_loader(layer.weight, w)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert finalize_layerwise_reload(layer) == [""]  # no bias: partly loaded
        after = {n: t.data_ptr() for n, t in [*layer.named_parameters(), *layer.named_buffers()]}
        assert after == pointers
        results.append([layer.weight.detach().clone(), layer.bias.detach().clone(), layer.cache])
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b) or (a.isnan().all() and b.isnan().all())
    assert torch.equal(plain.weight, torch.full((8, 1), 2.0))
    assert torch.equal(plain.cache, torch.full((2,), 4.0))  # not loaded, non-persistent: kept
