import pytest
import torch

from loadkit import composed_weight_loader, default_weight_loader
from loadkit.errors import LoadkitError, ShapeMismatchError
from loadkit.loading.weight_loaders import loader_of


def test_default_copies_into_param_data():
    p = torch.nn.Parameter(torch.zeros(2, 3))
    ptr = p.data_ptr()
    w = torch.arange(6.0).reshape(2, 3)
    default_weight_loader(p, w)
    assert torch.equal(p.data, w) and p.data_ptr() == ptr


@pytest.mark.parametrize("pshape,wshape", [((), (1,)), ((1,), ()), ((1, 1), (1,)), ((), ())])
def test_default_scalars_mix_shapes(pshape, wshape):
    p = torch.nn.Parameter(torch.zeros(pshape))
    default_weight_loader(p, torch.full(wshape, 3.5))
    assert p.shape == pshape and p.item() == 3.5


def test_default_shape_mismatch_names_both_shapes():
    p = torch.nn.Parameter(torch.zeros(2, 3))
    with pytest.raises(ShapeMismatchError) as exc:
        default_weight_loader(p, torch.zeros(3, 2))
    assert "[2, 3]" in str(exc.value) and "[3, 2]" in str(exc.value)
    assert isinstance(exc.value, ValueError) and isinstance(exc.value, LoadkitError)
    assert torch.equal(p.data, torch.zeros(2, 3))  # nothing half-loaded


def test_default_casts_dtype_as_copy_does():
    p = torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))
    default_weight_loader(p, torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    assert p.dtype == torch.bfloat16 and p.tolist() == [1.0, 2.0, 3.0]


def test_composed_runs_fn_on_loaded_param_and_copies_twice():
    p = torch.nn.Parameter(torch.zeros(4))
    seen = []

    def fn(x):
        seen.append(x.detach().clone())
        return -torch.exp(x)

    loader = composed_weight_loader(default_weight_loader, fn)
    w = torch.tensor([0.0, 1.0, 2.0, 3.0])
    from loadkit import CopyCounter

    with CopyCounter() as c:
        loader(p, w)
    assert torch.equal(seen[0], w)  # fn saw the loaded value
    assert torch.allclose(p.data, -torch.exp(w))
    assert c.count == 2 and c.copied_numel == 8


def test_loader_of_prefers_param_attribute():
    p = torch.nn.Parameter(torch.zeros(1))
    assert loader_of(p) is default_weight_loader

    def mine(param, loaded_weight):
        pass

    p.weight_loader = mine
    assert loader_of(p) is mine


def test_every_loader_names_param_first():
    import inspect

    composed = composed_weight_loader(default_weight_loader, lambda x: x)
    for fn in (default_weight_loader, composed):
        assert list(inspect.signature(fn).parameters)[0] == "param"


def test_load_param_names_parameter_key_and_shapes():
    from loadkit.errors import WeightLoadError
    from loadkit.loading.weight_loaders import load_param, weight_source

    p = torch.nn.Parameter(torch.zeros(2, 3))
    w = torch.ones(3, 2)
    w.loadkit_file = "/ck/m.safetensors"
    src = weight_source("hf.w", w)
    assert src == "checkpoint key 'hf.w' in /ck/m.safetensors"
    with pytest.raises(ShapeMismatchError, match=r"'layer.w'.*hf\.w.*\[2, 3\].*\[3, 2\]"):
        load_param(p, w, name="layer.w", source=src)

    def needs_shard(param, loaded_weight):
        return loaded_weight.shard_id

    p.weight_loader = needs_shard
    with pytest.raises(WeightLoadError, match=r"'layer.w'.*hf\.w.*AttributeError") as exc:
        load_param(p, w, name="layer.w", source=src)
    assert isinstance(exc.value.__cause__, AttributeError)
