import inspect

import pytest
import torch

from loadkit import (
    CloneCounter,
    CopyCounter,
    composed_weight_loader,
    default_weight_loader,
    get_numel_loaded,
)
from loadkit.errors import LoadkitError


def test_copy_counter_counts_destination_numel_any_device():
    a, b = torch.zeros(3, 4), torch.ones(3, 4)
    m = torch.empty(5, device="meta")
    with CopyCounter() as c:
        a.copy_(b)
        a[0].copy_(b[0])  # a view: counts its own 4 elements
        m.copy_(torch.empty(5, device="meta"))
        torch.add(a, b)  # not a copy
    assert c.count == 3
    assert c.copied_numel == 12 + 4 + 5


def test_copy_counter_sees_param_data_copy():
    p = torch.nn.Parameter(torch.zeros(6))
    with CopyCounter() as c:
        p.data.copy_(torch.ones(6))
    assert (c.count, c.copied_numel) == (1, 6)


def test_clone_counter_counts_calls_and_bytes():
    x = torch.zeros(10, dtype=torch.bfloat16)
    with CloneCounter() as c:
        x.clone()
        torch.zeros(3, dtype=torch.float32).clone()
        x.add(1)
    assert c.count == 2 and c.cloned_bytes == 20 + 12


def _bind(loader, param, weight):
    return inspect.signature(loader).bind(param, weight)


def test_get_numel_loaded_composed_twenty_vs_ten():
    p = torch.nn.Parameter(torch.zeros(10))
    loader = composed_weight_loader(default_weight_loader, lambda x: -torch.exp(x))
    old, _ = get_numel_loaded(loader, _bind(loader, p, torch.zeros(10)), behaviour="old")
    new, _ = get_numel_loaded(loader, _bind(loader, p, torch.zeros(10)), behaviour="new")
    assert (old, new) == (20, 10)


def test_get_numel_loaded_default_and_return_value():
    p = torch.nn.Parameter(torch.zeros(7))

    def loader(param, loaded_weight):
        param.data.copy_(loaded_weight)
        return "done"

    assert get_numel_loaded(loader, _bind(loader, p, torch.ones(7))) == (7, "done")


def test_get_numel_loaded_no_cap_without_a_tensor_param():
    dest = torch.zeros(3)

    def odd_loader(param, loaded_weight):
        dest.copy_(loaded_weight)
        dest.copy_(loaded_weight)

    args = _bind(odd_loader, "not a tensor", torch.ones(3))
    assert get_numel_loaded(odd_loader, args, behaviour="new")[0] == 6


def test_get_numel_loaded_rejects_unknown_behaviour():
    p = torch.nn.Parameter(torch.zeros(1))
    with pytest.raises(LoadkitError, match="behaviour must be 'old' or 'new'"):
        get_numel_loaded(default_weight_loader, _bind(default_weight_loader, p, p), behaviour="x")


@pytest.mark.parametrize(
    ("shape", "loaded"),
    [((3, 4), (3, 4)), ((), ()), ((1,), ()), ((), (1,)), ((2, 1, 5), (2, 1, 5)), ((0, 3), (0, 3))],
)
def test_default_loader_counted_without_the_mode_counts_what_the_mode_sees(shape, loaded):
    from loadkit.loading.counting import count_copies

    for device in ("cpu", "meta"):
        param = torch.nn.Parameter(torch.zeros(shape, device=device), requires_grad=False)
        weight = torch.ones(loaded)
        with CopyCounter() as c:
            default_weight_loader(param, weight)
        assert c.count == 1
        assert count_copies(default_weight_loader, param, (weight,), {}, None) == (
            c.copied_numel,
            None,
        )
    with pytest.raises(LoadkitError):  # a shape that does not fit raises, counted or not
        count_copies(default_weight_loader, torch.zeros(2), (torch.zeros(3),), {}, None)
