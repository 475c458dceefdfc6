"""loadkit.models.dyadic: the values committed checkpoints are made of."""

import math
import struct
from decimal import Decimal

import pytest
import torch

from loadkit.errors import LoadkitError
from loadkit.models.dyadic import (
    draw_integers,
    dyadic_uniform,
    is_power_of_two,
    ln,
    round_once,
    softplus_inverse,
)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("half_range", "steps"), [(1.0, 256), (0.125, 16), (2.0, 128)])
def test_values_are_grid_points_exact_in_every_dtype(dtype, half_range, steps):
    v = dyadic_uniform((64, 64), gen(), half_range=half_range, steps=steps, dtype=dtype)
    assert v.dtype == dtype and v.shape == (64, 64)
    k = v.double() * steps / half_range
    assert torch.equal(k, k.round()) and k.abs().max() <= steps
    assert len(k.unique()) > steps  # both signs, most grid points drawn
    f32 = dyadic_uniform((64, 64), gen(), half_range=half_range, steps=steps)
    assert torch.equal(v.float(), f32)  # the same draw, exact in the narrower dtype


def test_seeds_repeat_and_differ():
    a, b = dyadic_uniform((100,), gen(1)), dyadic_uniform((100,), gen(1))
    assert torch.equal(a, b) and not torch.equal(a, dyadic_uniform((100,), gen(2)))
    assert draw_integers(gen(3), 50, 1, 16) == draw_integers(gen(3), 50, 1, 16)
    drawn = draw_integers(gen(3), 200, 1, 16)
    assert min(drawn) == 1 and max(drawn) == 16  # inclusive at both ends


@pytest.mark.parametrize(("half_range", "steps"), [(0.3, 128), (1.0, 100), (1.0, 512), (-1.0, 2)])
def test_grids_that_are_not_exact_are_refused(half_range, steps):
    with pytest.raises(LoadkitError, match="powers of two"):
        dyadic_uniform((2,), gen(), half_range=half_range, steps=steps)


def test_is_power_of_two():
    assert [is_power_of_two(x) for x in (1, 2, 0.25, 2**-30)] == [True] * 4
    assert [is_power_of_two(x) for x in (0, 3, 0.3, -2, 1.5)] == [False] * 5


def test_functions_agree_with_float_math():
    assert ln(1) == 0 and abs(float(ln(16)) - math.log(16)) < 1e-15
    for y in (2**-10, 0.05, 0.1, 1.0, 5.0):
        b = float(softplus_inverse(y))
        assert math.isclose(math.log1p(math.exp(b)), y, rel_tol=1e-12), y
    with pytest.raises(LoadkitError, match="positive"):
        softplus_inverse(0)


def test_round_once_is_the_float32_nearest_to_the_float64():
    values = [ln(a) for a in range(1, 17)] + [Decimal(1) / 3]
    got = round_once(values, torch.float32)
    want = [struct.unpack("<f", struct.pack("<f", float(v)))[0] for v in values]
    assert got.dtype == torch.float32 and got.tolist() == want
    assert round_once([0.1], torch.bfloat16).item() == 0.10009765625
