"""Direct reload and the load plan (vLLM 0.34.0), on every model loadkit has: an integration test
of ``loadkit.reload.direct`` and ``loadkit.reload.plan`` (the plan alone: ``test_plan.py``).

The oracle for direct reload is an ordinary load of the same checkpoints one after the other; the
oracle for the plan is the untraced direct reload: the same bytes in the same places.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import NamedTuple

import pytest
import torch
from torch import nn

from loadkit import AutoWeightsLoader, WeightsMapper
from loadkit.errors import DirectReloadError
from loadkit.models import gemma4, llama, nemotron_h, padded_moe, plamo2, vision_tower
from loadkit.parallel import stand_in_group, use_group
from loadkit.reload import (
    finish_reload,
    load_planned,
    param_metas,
    plan_loads,
    record_checkpoint_layout,
    start_reload,
)

Weights = list[tuple[str, torch.Tensor]]


class Case(NamedTuple):
    build: Callable[[], nn.Module]  # a fresh model
    checkpoint: Callable[[int], Weights]  # the checkpoint of a seed
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext


def _plamo2(tied: bool) -> Case:
    config = plamo2.Plamo2Config(tie_word_embeddings=tied)
    return Case(
        lambda: plamo2.Plamo2ForCausalLM(config),
        lambda seed: list(plamo2.make_checkpoint(config, seed).items()),
    )


def _llama(rank: int) -> Case:
    config = llama.LlamaLikeConfig()
    return Case(
        lambda: llama.LlamaForCausalLM(config),
        lambda seed: list(llama.make_checkpoint(config, seed).items()),
        lambda: use_group(stand_in_group(rank, 2)),  # built and loaded as rank ``rank``
    )


class FixedTower(vision_tower.VisionTower):
    """The vision tower with bug 5's fix (its checkpoint does not load under the old stage)."""

    hf_to_vllm_mapper = WeightsMapper(orig_to_new_stacked=vision_tower.QKV_RULES, behaviour="new")


def _transformers(arch: str) -> Case:
    """vLLM's Transformers backend over transformers' own ``arch`` at a tiny size; a seed's
    checkpoint is what transformers' own class holds after its seeded initialisation."""

    def checkpoint(seed: int) -> Weights:
        import transformers
        from hf_cases import ARCHS

        torch.manual_seed(seed)
        model = getattr(transformers, ARCHS[arch].cls)(ARCHS[arch].config())
        return [(n, t.detach().clone()) for n, t in model.state_dict().items()]

    def build() -> nn.Module:
        from hf_cases import ARCHS

        from loadkit.models.transformers import from_config

        return from_config(ARCHS[arch].config())

    return Case(build, checkpoint)


# Every model loadkit has (the Transformers backend where the hf extra is installed).
MODELS = {
    "nemotron_h": Case(
        lambda: nemotron_h.NemotronHForCausalLM(),
        lambda seed: list(nemotron_h.make_checkpoint(seed=seed).items()),
    ),
    "padded_moe": Case(
        lambda: padded_moe.PaddedMoeForCausalLM(),
        lambda seed: list(padded_moe.make_checkpoint(seed=seed).items()),
    ),
    "gemma4": Case(
        lambda: gemma4.Gemma4ForConditionalGeneration(gemma4.Gemma4Config()),
        lambda seed: list(gemma4.make_checkpoint(gemma4.Gemma4Config(), seed).items()),
    ),
    "plamo2 untied": _plamo2(tied=False),
    "plamo2 tied": _plamo2(tied=True),
    "llama tp rank 0 of 2": _llama(0),
    "llama tp rank 1 of 2": _llama(1),
    "transformers llama": _transformers("llama"),
    "transformers gpt2": _transformers("gpt2"),
    "vision_tower": Case(
        lambda: FixedTower(vision_tower.VisionTowerConfig()),
        lambda seed: list(
            vision_tower.make_checkpoint(vision_tower.VisionTowerConfig(), seed).items()
        ),
    ),
}


def _copies(weights: Weights) -> Weights:
    # Some loaders change the tensors they are handed (Plamo2's norm offsets): one copy each.
    return [(n, w.clone()) for n, w in weights]


def _loaded(build, checkpoint, *seeds) -> nn.Module:
    model = build()
    for seed in seeds:
        model.load_weights(_copies(checkpoint(seed)))
    return model


def _state(model: nn.Module) -> dict[str, tuple[int, torch.Tensor]]:
    return {n: (t.data_ptr(), t.detach().clone()) for n, t in model.state_dict().items()}


def _same_values(a: nn.Module, b: nn.Module) -> list[str]:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    return [n for n in sa if not torch.equal(sa[n], sb[n])]


@pytest.mark.parametrize("name", list(MODELS))
def test_direct_reload_equals_loading_both_checkpoints_and_keeps_storage(name):
    if name.startswith("transformers"):
        pytest.importorskip("transformers")
    build, checkpoint, context = MODELS[name]
    with context():
        _direct_equals_both(build, checkpoint)


def _direct_equals_both(build, checkpoint):
    model = _loaded(build, checkpoint, 0)
    record_checkpoint_layout(model)
    pointers = {n: t.data_ptr() for n, t in model.state_dict().items()}
    start_reload(model, mode="direct")
    model.load_weights(_copies(checkpoint(1)))
    finish_reload(model)
    assert _same_values(model, _loaded(build, checkpoint, 0, 1)) == []
    assert {n: t.data_ptr() for n, t in model.state_dict().items()} == pointers


@pytest.mark.parametrize("name", list(MODELS))
def test_the_plan_writes_the_same_bytes_in_the_same_places_as_the_untraced_path(name):
    if name.startswith("transformers"):
        pytest.importorskip("transformers")
    build, checkpoint, context = MODELS[name]
    with context():
        _planned_equals_untraced(build, checkpoint)


def _planned_equals_untraced(build, checkpoint):
    untraced, planned = _loaded(build, checkpoint, 0), _loaded(build, checkpoint, 0)
    for model in (untraced, planned):
        record_checkpoint_layout(model)
    start_reload(planned, mode="direct")
    plan = plan_loads(planned, param_metas(checkpoint(1)))  # traced once, nothing loaded
    finish_reload(planned)
    assert plan.summary()["direct"][0] > 0
    for seed in (1, 2):  # the plan holds for every later update
        start_reload(untraced, mode="direct")
        untraced.load_weights(_copies(checkpoint(seed)))
        finish_reload(untraced)
        start_reload(planned, mode="direct")
        load_planned(planned, plan, _copies(checkpoint(seed)))
        finish_reload(planned)
        want, got = _state(untraced), _state(planned)
        assert [n for n in want if not torch.equal(want[n][1], got[n][1])] == [], seed
    fresh = _state(_loaded(build, checkpoint, 0))  # and the planned model's storage is its own
    assert {n: p for n, (p, _) in got.items()} != {n: p for n, (p, _) in fresh.items()}


class Transposed(nn.Module):
    """A layer whose post-load processing re-lays its weight out (a kernel's layout)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(2, 3), requires_grad=False)

    def process_weights_after_loading(self):
        # Transposed into its own bytes: the parameter object and its storage are kept.
        w = self.weight.data
        relaid = w.reshape(-1).view(w.shape[::-1])
        relaid.copy_(w.t().contiguous())
        self.weight.data = relaid

    def load_weights(self, weights):
        return AutoWeightsLoader(self).load_weights(weights)


def test_direct_reload_views_a_relaid_tensor_back_to_its_checkpoint_layout():
    from loadkit.loading.postload import finalize_model_weights

    model = Transposed()
    model.load_weights([("weight", torch.arange(6.0).view(2, 3))])
    record_checkpoint_layout(model)  # cold start: before post-load processing
    finalize_model_weights(model)
    assert model.weight.shape == (3, 2)
    pointer = model.weight.data_ptr()
    start_reload(model, mode="direct")
    assert model.weight.shape == (2, 3)  # viewed back: the loader sees the checkpoint layout
    model.load_weights([("weight", torch.arange(6.0, 12.0).view(2, 3))])
    finish_reload(model)
    assert torch.equal(model.weight, torch.arange(6.0, 12.0).view(2, 3).t())
    assert model.weight.data_ptr() == pointer


def test_direct_reload_refusals_leave_the_model_untouched():
    model = Transposed()
    with pytest.raises(DirectReloadError, match="no checkpoint layout was recorded"):
        start_reload(model, mode="direct")
    record_checkpoint_layout(model)
    model.weight = nn.Parameter(torch.zeros(2, 3), requires_grad=False)  # replaced, not kept
    with pytest.raises(DirectReloadError, match="replaced the parameter object"):
        start_reload(model, mode="direct")
    with pytest.raises(DirectReloadError, match="finish without a begin"):
        from loadkit.reload import finish_direct_reload

        finish_direct_reload(model)
    grown = Transposed()
    record_checkpoint_layout(grown)
    grown.weight.data = torch.zeros(1)  # post-load processing shrank its storage below the layout
    with pytest.raises(DirectReloadError, match="storage of 4 bytes"):
        start_reload(grown, mode="direct")
    assert grown.weight.shape == (1,)


def test_direct_reload_zero_fills_the_padded_weights_a_layer_names():
    model = padded_moe.PaddedMoeForCausalLM()
    model.load_weights(padded_moe.make_checkpoint(seed=0).items())
    record_checkpoint_layout(model)
    experts = model.model.layers[0].experts
    experts.w13_weight.data[:, 12:16] = 7.0  # whatever stale bytes the padding held
    start_reload(model, mode="direct")
    assert float(experts.w13_weight.abs().max()) == 0  # zeroed whole: the update must resend it
    model.load_weights(padded_moe.make_checkpoint(seed=1).items())
    finish_reload(model)
    assert float(experts.w13_weight[:, 12:16].abs().max()) == 0


# --- vLLM's native classes (loadkit.models.native), on checkpoints transformers wrote ------------


@pytest.fixture(scope="module")
def native_clean(tmp_path_factory, quiet_transformers):
    pytest.importorskip("transformers")
    from native_cases import clean_checkpoints

    return clean_checkpoints(tmp_path_factory.mktemp("native"))


def _native_case(arch: str, native_clean) -> Case:
    """The native class vLLM 0.34.0 uses for ``arch``; the seed-0 checkpoint is the one
    transformers wrote, a later seed the same tensors times ``seed + 1`` (exact)."""
    from native_cases import ARCHS, read_tensors

    from loadkit.models.native import native_class
    from loadkit.models.transformers.config import load_config

    folder = native_clean(arch)
    tensors = read_tensors(folder)
    config, _ = load_config(folder)
    cls = native_class(ARCHS[arch].vllm_class or ARCHS[arch].cls)

    def checkpoint(seed: int) -> Weights:
        return [(n, t * (seed + 1) if t.is_floating_point() else t) for n, t in tensors.items()]

    return Case(lambda: cls(config), checkpoint)


def _native_archs() -> list[str]:
    try:
        from native_cases import ARCHS
    except ImportError:  # no transformers: the cases cannot be written
        return []
    return sorted(ARCHS)


@pytest.mark.parametrize("arch", _native_archs())
def test_native_classes_reload_directly_and_by_plan_as_the_untraced_path(arch, native_clean):
    build, checkpoint, _ = _native_case(arch, native_clean)
    _direct_equals_both(build, checkpoint)
    _planned_equals_untraced(build, checkpoint)
