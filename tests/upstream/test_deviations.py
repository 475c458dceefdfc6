"""Each row of docs/fidelity.md's table "Where loadkit deviates from vLLM 0.34.0, and why", shown.

Every test runs the same input through upstream's code and loadkit's and asserts both sides of
the difference, so a row whose difference disappears (either side changed) fails here.
"""

from __future__ import annotations

import inspect
import re
import threading
import warnings

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from loadkit import (
    AutoWeightsLoader,
    WeightsMapper,
    default_weight_loader,
    finalize_layerwise_reload,
    get_numel_loaded,
    initialize_layerwise_reload,
    record_metadata_for_reloading,
)
from loadkit.errors import (
    DirectReloadError,
    MapperConfigError,
    ShapeMismatchError,
    UnknownNameError,
    WeightLoadError,
)
from loadkit.reload import (
    begin_direct_reload,
    finish_reload,
    record_checkpoint_layout,
    start_reload,
    weight_update_active,
)
from loadkit.reload.layerwise import ReloadStateError, reload_log


def test_mapper_build_empty_suffix(up):
    rules = {"orig_to_new_suffix": {"": ".w"}}
    upstream = up.WeightsMapper(**rules)  # builds
    with pytest.raises(ValueError, match="empty separator"):  # and fails on the first name
        upstream._map_name("a.b")
    with pytest.raises(MapperConfigError, match="empty suffix"):
        WeightsMapper(**rules)


def test_mapper_build_bad_regex_replacement(up):
    rules = {"orig_to_new_regex": {re.compile("(a)"): r"\2"}}
    upstream = up.WeightsMapper(**rules)
    assert upstream._map_name("b") == "b"  # fine until a name matches
    with pytest.raises(re.error):
        upstream._map_name("a")
    with pytest.raises(MapperConfigError, match="invalid replacement"):
        WeightsMapper(**rules)


def test_stacked_rule_may_drop(up):
    rules = {"orig_to_new_stacked": {"q_proj": None}}
    with pytest.raises(TypeError, match="cannot unpack non-iterable NoneType"):
        up.WeightsMapper(**rules)._map_name("k_proj.weight")  # any name, even one not matching
    mapper = WeightsMapper(**rules)
    assert mapper.map_name("q_proj.weight") is None
    assert mapper.map_name("k_proj.weight") == "k_proj.weight"


def test_regex_keys_may_be_strings(up):
    rules = {"orig_to_new_regex": {r"layers\.(\d+)": r"h.\1"}}
    with pytest.raises(AttributeError, match="'str' object has no attribute 'search'"):
        up.WeightsMapper(**rules)._map_name("layers.0.w")
    assert WeightsMapper(**rules).map_name("layers.0.w") == "h.0.w"


# --- loading ---------------------------------------------------------------------------------


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(2, 2)


def test_caller_lists_are_not_changed(up, up_old):
    for cls, changed in ((up.AutoWeightsLoader, True), (AutoWeightsLoader, False)):
        suffixes = [".x"]
        cls(Two(), ignore_unexpected_suffixes=suffixes).load_weights([])
        # upstream extends it in place on every load: the next model gets these rules too
        assert suffixes == ([".x", ".bias"] if changed else [".x"])
    # vLLM 0.28.0's skip lists (bug 2's loader keeps them), extended the same way
    from loadkit.models.plamo2.skips import AutoWeightsLoaderWithSkips

    for cls, changed in ((up_old.AutoWeightsLoader, True), (AutoWeightsLoaderWithSkips, False)):
        skip = ["x."]
        cls(Two(), skip_substrs=skip).load_weights([])
        rotary = list(up_old.AutoWeightsLoader.ROTARY_EMBEDS_UNUSED_WEIGHTS)
        assert skip == (["x.", *rotary] if changed else ["x."])


def test_no_log_line_for_a_weight_of_another_dtype(up):
    # vLLM 0.32.0+: a warning for a narrowing load, a debug line for an exact widening
    for weight, level in (
        (torch.zeros(2, 2), "warning"),
        (torch.zeros(2, 2, dtype=torch.bfloat16), "debug"),
    ):
        model = Two().to(torch.bfloat16 if level == "warning" else torch.float32)
        up.log.clear()
        up.AutoWeightsLoader(model).load_weights([("proj.weight", weight)])
        said = [lv for _, lv, m in up.log.records if "with dtype" in m]
        assert said == [level]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # loadkit says nothing (its ledger and inspect do)
        AutoWeightsLoader(Two().to(torch.bfloat16)).load_weights(
            [("proj.weight", torch.zeros(2, 2))]
        )


def test_every_nn_embedding_is_a_vocabulary_embedding(up):
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(4, 2)  # two vocabulary tables, one tensor
            self.lm_head = nn.Embedding(4, 2)
            self.lm_head.weight = self.embed.weight

    # upstream counts only its VocabParallelEmbedding (its backend puts one in place of each
    # vocabulary nn.Embedding); loadkit also takes nn.Embedding: the alias is skipped
    assert up.AutoWeightsLoader(Tied()).aliased_params == {}
    assert AutoWeightsLoader(Tied()).aliased_params == {"lm_head.weight": "embed.weight"}


def test_shape_errors_are_loadkit_errors(up):
    param = nn.Parameter(torch.zeros(2, 3), requires_grad=False)
    with pytest.raises(
        AssertionError, match=r"Attempted to load weight \(torch.Size\(\[3, 2\]\)\)"
    ):
        up.default_weight_loader(param, torch.zeros(3, 2))
    with pytest.raises(ShapeMismatchError) as err:
        default_weight_loader(param, torch.zeros(3, 2))
    assert isinstance(err.value, ValueError)
    assert (err.value.param_shape, err.value.weight_shape) == ((2, 3), (3, 2))


def test_custom_loader_errors_keep_their_cause(up):
    def refuses(param, loaded_weight):
        raise RuntimeError("no")

    def model():
        m = Two()
        m.proj.weight.weight_loader = refuses
        return m

    with pytest.raises(RuntimeError, match="^no$"):
        up.AutoWeightsLoader(model()).load_weights([("proj.weight", torch.zeros(2, 2))])
    with pytest.raises(WeightLoadError, match="proj.weight") as err:
        AutoWeightsLoader(model()).load_weights([("proj.weight", torch.zeros(2, 2))])
    assert type(err.value.__cause__) is RuntimeError and str(err.value.__cause__) == "no"


def test_unknown_names_list_the_nearest_names(up):
    weights = [("proj.weigth", torch.zeros(2, 2))]
    with pytest.raises(ValueError, match="The available parameters belonging to") as upstream:
        up.AutoWeightsLoader(Two()).load_weights(iter(weights))
    assert "{'proj.weight', 'proj.bias'}" in str(upstream.value) or "{'proj.bias'," in str(
        upstream.value
    )
    with pytest.raises(UnknownNameError) as ours:
        AutoWeightsLoader(Two()).load_weights(iter(weights))
    assert ours.value.suggestions[0] == "proj.weight"
    assert "available parameters" not in str(ours.value)


def test_kv_scale_names_map_without_a_deprecation_warning(up):
    up.log.clear()
    assert up.WeightsMapper()._map_name("attn.kv_scale") == "attn.kv_scale"
    assert [lv for _, lv, _ in up.log.records] == ["warning_once"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert WeightsMapper().map_name("attn.kv_scale") == "attn.kv_scale"


# --- counting --------------------------------------------------------------------------------


def test_broadcasting_copies_are_counted(up):
    def broadcast(param, loaded_weight):
        param.data.copy_(loaded_weight[0])  # one value into every element

    param = torch.zeros(4)
    args = inspect.signature(broadcast).bind(param, torch.ones(2))
    with pytest.raises(AssertionError):  # upstream's CopyCounter asserts equal numel
        up.get_numel_loaded(broadcast, args)
    assert get_numel_loaded(broadcast, args) == (4, None)


# --- layerwise reload, direct reload (against vLLM 0.34.0) ---------------------------------------

REFERENCE = "0.34.0"


@pytest.fixture
def up34(up_at):
    return up_at(REFERENCE)


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.full((2,), 5.0), requires_grad=False)
        self.bias = nn.Parameter(torch.full((2,), 6.0), requires_grad=False)


class Reload:
    """The reload lifecycle of one side: upstream's (given ``up``) or loadkit's."""

    def __init__(self, up=None, **rules) -> None:
        if up is None:
            self.record = record_metadata_for_reloading
            self.init = lambda model: initialize_layerwise_reload(model, **rules)
            self.finalize = finalize_layerwise_reload
            self.default, self.auto = default_weight_loader, AutoWeightsLoader
        else:
            self.record = up.reload.record_metadata_for_reloading
            self.init = up.reload.initialize_layerwise_reload
            self.finalize = lambda model: up.reload.finalize_layerwise_reload(model, None)
            self.default, self.auto = up.default_weight_loader, up.AutoWeightsLoader

    def __call__(self, model, loads, *, held=True):
        """Open a reload, load ``loads`` [(name, value)], finalise."""
        self.record(model)
        self.init(model)
        params = dict(model.named_parameters())  # the stand-ins, looked up once
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name, value in loads:
                t = params[name] if held else model.get_parameter(name)
                getattr(t, "weight_loader", self.default)(t, value)
            self.finalize(model)
        return model


class Ops(TorchDispatchMode):
    """The aten ops run, with their arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((func.__name__, args))
        return func(*args, **(kwargs or {}))


def _half_loaded(side):
    m = nn.Module()
    m.a = nn.Parameter(torch.zeros(2), requires_grad=False)
    m.b = nn.Parameter(torch.zeros(2), requires_grad=False)
    side.record(m)
    side.init(m)
    m.a.weight_loader(m.a, torch.ones(2))
    with warnings.catch_warnings(), Ops() as ops:
        warnings.simplefilter("ignore")
        side.finalize(m)  # b never loaded: materialised, then copied back
    assert torch.equal(m.a, torch.ones(2))
    return m, [f for f, _ in ops.calls if f.startswith(("fill_", "zero_", "copy_"))]


def test_stale_memory_is_a_fixed_pattern(up_at):
    # vLLM 0.31.0 materialises with torch.empty and copies back whatever that memory held;
    # loadkit's fill="stale" stands for it by a fixed pattern (0.34.0 zero-fills, as loadkit's
    # default: the property compares those exactly).
    _, ops = _half_loaded(Reload(up_at("0.31.0")))
    assert not any(f.startswith(("fill_", "zero_")) for f in ops)  # nothing written into b
    ours, ops = _half_loaded(Reload(fill="stale"))
    assert ours.b.tolist() == [-1.75, -1.25] and "copy_.default" in ops


def test_a_parameter_named_bias_goes_on_meta_like_any_other(up34):
    upstream = Reload(up34)(Layer(), [("weight", torch.ones(2))])
    assert torch.equal(upstream.bias, torch.full((2,), 6.0))  # never on meta: kept
    ours = Reload()(Layer(), [("weight", torch.ones(2))])
    assert torch.equal(ours.bias, torch.zeros(2))  # materialised, zero-filled like the rest


def test_a_load_after_finalisation_is_dropped_even_when_looked_up_late(up34):
    loads = [("weight", torch.ones(2)), ("bias", torch.ones(2)), ("weight", torch.full((2,), 9.0))]
    # Looked up once before loading (the stand-ins): both drop the late load.
    for side in (Reload(up34), Reload()):
        assert torch.equal(side(Layer(), loads).weight, torch.ones(2))
    # Looked up at each load: upstream gets the live tensor back and writes straight into it.
    assert torch.equal(Reload(up34)(Layer(), loads, held=False).weight, torch.full((2,), 9.0))
    assert torch.equal(Reload()(Layer(), loads, held=False).weight, torch.ones(2))


def test_tied_parameters_are_refused(up34):
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = Layer()
            self.head = nn.Module()
            self.head.weight = self.embed.weight

    upstream = Reload(up34)(Tied(), [("embed.weight", torch.ones(2))])
    assert torch.equal(upstream.head.weight, torch.ones(2))  # reloads (its limitation 2)
    with pytest.raises(ReloadStateError, match="tied"):
        Reload()(Tied(), [("embed.weight", torch.ones(2))])


def test_a_load_that_raised_is_not_replayed(up34):
    def refuses(param, loaded_weight):
        raise RuntimeError("refused")

    def start(side):
        m = Layer()
        m.bias.weight_loader = refuses
        live = m.weight
        side.record(m)
        side.init(m)
        m.weight.weight_loader(m.weight, torch.ones(2))  # half the layer: not finalised yet
        with pytest.raises(RuntimeError, match="refused"):
            m.bias.weight_loader(m.bias, torch.ones(2))
        return m, live

    m, live = start(Reload(up34))
    # Upstream buffered the failed load before counting it: finalising replays it, raises
    # again, and leaves the layer materialised, its live storage no longer in the model.
    with pytest.raises(RuntimeError, match="refused"):
        Reload(up34).finalize(m)
    assert m.weight is not live
    m, live = start(Reload())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        finalize_layerwise_reload(m)
    assert m.weight is live and torch.equal(m.weight, torch.ones(2))
    assert torch.equal(m.bias, torch.zeros(2))


def test_batchnorm_stats_reload_through_auto_weights_loader(up34):
    weights = [
        ("bn.weight", torch.ones(2)),
        ("bn.bias", torch.ones(2)),
        ("bn.running_mean", torch.full((2,), 3.0)),
        ("bn.running_var", torch.full((2,), 4.0)),
        ("bn.num_batches_tracked", torch.tensor(7)),
    ]
    stats = {}
    for name, side in (("upstream", Reload(up34)), ("loadkit", Reload())):
        m = nn.Module()
        m.bn = nn.BatchNorm1d(2)
        side.record(m)
        side.init(m)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            side.auto(m).load_weights([(n, w.clone()) for n, w in weights])
            side.finalize(m)
        stats[name] = m.bn
    # Upstream's AutoWeightsLoader hands the stats over as detached state_dict copies (no
    # reload wrapper on them): they load into nothing and the layer keeps its zero fill.
    assert torch.equal(stats["upstream"].running_mean, torch.zeros(2))
    assert torch.equal(stats["loadkit"].running_mean, torch.full((2,), 3.0))
    assert int(stats["loadkit"].num_batches_tracked) == 7
    assert torch.equal(stats["upstream"].weight, torch.ones(2))  # parameters load on both


def test_expert_bookkeeping_tensors_are_counted_like_any_other(up34):
    def model():
        m = nn.Module()
        m.weight = nn.Parameter(torch.zeros(2), requires_grad=False)
        m.register_buffer("expert_mask", torch.ones(2))  # upstream: SKIP_LOAD_TENSORS
        return m

    up34.log.clear()
    upstream = Reload(up34)(model(), [("weight", torch.ones(2))])
    assert "Module: 2 / 2" in up34.log.messages("debug")  # the mask is not part of the total
    assert torch.equal(upstream.expert_mask, torch.ones(2))
    ours = model()
    Reload()(ours, [("weight", torch.ones(2))])
    assert [(s.running, s.total) for s in reload_log(ours)][0] == (2, 4)
    assert torch.equal(ours.expert_mask, torch.zeros(2))


def test_the_reload_mode_is_chosen_per_call_and_the_update_flag_per_context(up34):
    # Upstream: the mode is VLLM_RELOAD_MODE, read by start_reload and finish_reload, and the
    # "update running" flag is a module global, seen by every thread.
    assert up34.module("envs").VLLM_RELOAD_MODE == "layerwise"
    assert inspect.signature(up34.reload.start_reload).parameters.keys() == {"model"}
    m = Layer()
    up34.reload.record_metadata_for_reloading(m)
    up34.reload.start_reload(m)
    seen = []
    thread = threading.Thread(target=lambda: seen.append(up34.reload.weight_update_active()))
    thread.start()
    thread.join()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        up34.reload.finish_reload(m, None, torch.device("cpu"))
    # loadkit: the mode is start_reload's keyword; another thread does not see this update.
    ours = Layer()
    record_checkpoint_layout(ours)
    start_reload(ours, mode="direct")
    thread = threading.Thread(target=lambda: seen.append(weight_update_active()))
    thread.start()
    thread.join()
    seen.append(weight_update_active())
    finish_reload(ours)
    assert seen == [True, False, True]


def test_direct_reload_refusals_are_loadkit_errors(up34):
    for begin in (up34.reload.direct.begin_direct_reload, begin_direct_reload):
        m = Layer()  # no checkpoint layout recorded
        with pytest.raises(Exception, match="layout was recorded") as caught:
            begin(m)
        assert isinstance(caught.value, RuntimeError) == (begin is not begin_direct_reload)
    assert isinstance(caught.value, DirectReloadError) and isinstance(caught.value, ValueError)


def test_a_tuple_shard_id_is_refused(up):
    # vLLM 0.34.0's merged layers take a tuple of consecutive shard ids (one tensor spanning
    # several shards); loadkit's merged loader loads one shard, or all of them (None)
    from loadkit.errors import ShardIdError
    from loadkit.parallel import MergedColumnParallelLinear
    from upstream.test_shard_tracking_upstream import _twin

    ours = MergedColumnParallelLinear(4, [4, 4, 4], bias=False)
    theirs = _twin(up, ours)
    assert theirs.validate_shard_id((0, 1), ours.weight)
    assert theirs.pop_missing_shards() == ["weight.2"]
    with pytest.raises(ShardIdError, match=r"shard id \(0, 1\) is not one of 0, 1, 2"):
        ours.validate_shard_id((0, 1), ours.weight)
