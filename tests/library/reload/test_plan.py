"""The load plan (vLLM 0.34.0): why a tensor falls back to its loader, and what the plan
refuses. Its writes against the untraced direct reload, on every model, are in
``test_direct_and_plan.py``."""

import warnings

import pytest
import torch
from torch import nn

from loadkit import AutoWeightsLoader, composed_weight_loader, default_weight_loader
from loadkit.errors import LoadPlanError
from loadkit.models import nemotron_h
from loadkit.reload import (
    ParamMeta,
    finish_reload,
    load_planned,
    param_metas,
    plan_loads,
    record_checkpoint_layout,
    start_reload,
)


def test_plan_reasons_name_what_a_loader_does_besides_copying():
    model = nemotron_h.NemotronHForCausalLM()
    model.load_weights(nemotron_h.make_checkpoint(seed=0).items())
    record_checkpoint_layout(model)
    start_reload(model, mode="direct")
    plan = plan_loads(model, param_metas(nemotron_h.make_checkpoint(seed=1).items()))
    finish_reload(model)
    assert plan.fallbacks() == {
        "its loader reads the destination (aten.exp)": [
            f"backbone.layers.{i}.mixer.A_log" for i in (0, 1, 4, 6)
        ]
    }
    qkv = plan.entries["backbone.layers.2.mixer.q_proj.weight"]
    (write,) = qkv.writes or ()
    assert (write.module, write.tensor, write.dst.offset) == (
        "model.layers.2.mixer.qkv_proj",
        "weight",
        0,
    )


class Two(nn.Module):
    """Two parameters and a loader of each kind the plan must refuse to write directly."""

    def __init__(self, kind: str):
        super().__init__()
        self.a = nn.Parameter(torch.zeros(2, 3), requires_grad=False)
        self.b = nn.Parameter(torch.zeros(2, 3), requires_grad=False)
        loaders = {
            "cast": default_weight_loader,  # a bfloat16 checkpoint into float32
            "computed": lambda param, loaded_weight: param.data.copy_(loaded_weight * 2),
            "reads": composed_weight_loader(default_weight_loader, lambda x: -x),
            "value": lambda param, loaded_weight: param.data.fill_(loaded_weight.sum().item()),
            "step": lambda param, loaded_weight: param.data.copy_(loaded_weight[:, ::2]),
            "overlap": lambda param, loaded_weight: self.a.data.copy_(loaded_weight),
        }
        self.a.weight_loader = default_weight_loader
        self.b.weight_loader = loaders[kind]

    def load_weights(self, weights):
        return AutoWeightsLoader(self).load_weights(weights)


@pytest.mark.parametrize(
    ("kind", "dtype", "shape", "reason"),
    [
        ("cast", torch.bfloat16, (2, 3), "casts torch.bfloat16 to torch.float32 at copy_"),
        ("computed", torch.float32, (2, 3), "applies mul.Tensor to it"),
        ("reads", torch.float32, (2, 3), "its loader reads the destination (aten.neg)"),
        ("value", torch.float32, (2, 3), "its loader reads tensor values (.item(), bool(), ...)"),
        ("step", torch.float32, (2, 6), "source slice has a step or is not a box"),
        ("overlap", torch.float32, (2, 3), "writes overlap with 'a'"),
    ],
)
def test_what_cannot_be_written_directly_falls_back_and_still_loads(kind, dtype, shape, reason):
    model = Two(kind)
    record_checkpoint_layout(model)
    metas = [ParamMeta("a", (2, 3), dtype), ParamMeta("b", shape, dtype)]
    start_reload(model, mode="direct")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = plan_loads(model, metas)
    assert plan.entries["b"].reason == reason
    assert plan.get_dest("b") is None
    update = [("a", torch.full((2, 3), 3.0, dtype=dtype)), ("b", torch.ones(shape, dtype=dtype))]
    if kind == "overlap":  # both fall back: they write the same bytes, arrival order decides
        assert plan.get_dest("a") is None
    elif kind != "cast":
        assert plan.get_dest("a") is not None
    load_planned(model, plan, update)
    finish_reload(model)
    reference = Two(kind)
    reference.load_weights(update)
    assert torch.equal(model.a, reference.a) and torch.equal(model.b, reference.b)


def test_plan_refusals():
    model = Two("cast")
    with pytest.raises(LoadPlanError, match="between start_reload"):
        plan_loads(model, [ParamMeta("a", (2, 3), torch.float32)])
    record_checkpoint_layout(model)
    start_reload(model, mode="direct")
    with pytest.raises(LoadPlanError, match="declared twice"):
        plan_loads(model, [ParamMeta("a", (2, 3), torch.float32)] * 2)
    finish_reload(model)
