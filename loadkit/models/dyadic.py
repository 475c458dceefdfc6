"""Checkpoint values that are the same bits on every machine.

torch's float kernels (``randn``, ``log``, ``exp``, ...) are vectorised per CPU family, and their
last bits differ between them (set ``ATEN_CPU_CAPABILITY=default`` to see it). Committed
checkpoints therefore never go through them:

- ``dyadic_uniform``: integers from a seeded ``torch.Generator`` (integer draws are portable)
  scaled by a power of two: every value is exact in float32, float16 and bfloat16;
- ``round_once``: a value that is a function (a logarithm, an inverse softplus) is computed in
  ``decimal`` arithmetic (software, correctly rounded) and rounded to the target dtype once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from decimal import Decimal, localcontext

import torch

from loadkit.errors import LoadkitError

# bfloat16 keeps 8 significant bits: integers up to 256 in magnitude are exact in every float dtype.
MAX_STEPS = 256
_DIGITS = 40  # decimal precision: far beyond float64, so the one rounding is the last one


def is_power_of_two(x: float) -> bool:
    """Whether ``x`` is 2**k for an integer k (``0.25`` yes, ``0.3`` no)."""
    return x > 0 and math.frexp(x)[0] == 0.5


def dyadic_uniform(
    shape: Sequence[int],
    generator: torch.Generator,
    *,
    half_range: float = 1.0,
    steps: int = 128,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Values ``k * half_range / steps``, ``k`` uniform over the integers in ``[-steps, steps]``.

    ``half_range`` and ``steps`` are powers of two (``steps`` at most 256), so every value is
    exact in every float dtype and no float kernel touches it.

    >>> g = torch.Generator().manual_seed(0)
    >>> v = dyadic_uniform((1000,), g, half_range=0.5, steps=64)
    >>> bool((v * 128 == (v * 128).round()).all()), float(v.abs().max()) <= 0.5
    (True, True)
    """
    if not (is_power_of_two(half_range) and is_power_of_two(steps) and steps <= MAX_STEPS):
        raise LoadkitError(
            f"dyadic_uniform needs powers of two (steps <= {MAX_STEPS}), "
            f"got half_range={half_range}, steps={steps}"
        )
    ints = torch.randint(-steps, steps + 1, tuple(shape), generator=generator)
    return (ints.to(torch.float32) * (half_range / steps)).to(dtype)


def draw_integers(generator: torch.Generator, n: int, low: int, high: int) -> list[int]:
    """``n`` integers uniform in ``[low, high]`` (inclusive), from a seeded generator.

    >>> draw_integers(torch.Generator().manual_seed(0), 3, 1, 1) == [1, 1, 1]
    True
    """
    return torch.randint(low, high + 1, (n,), generator=generator).tolist()


def ln(x: int | float | Decimal) -> Decimal:
    """The natural logarithm in 40-digit decimal arithmetic (``ln(1) == 0``)."""
    with localcontext() as ctx:
        ctx.prec = _DIGITS
        return Decimal(x).ln()


def softplus_inverse(y: int | float | Decimal) -> Decimal:
    """``b`` with ``softplus(b) = log(1 + exp(b)) == y``: ``y + ln(1 - exp(-y))``, for ``y > 0``.

    >>> round(float(softplus_inverse(1)), 6)  # log(e - 1)
    0.541325
    """
    with localcontext() as ctx:
        ctx.prec = _DIGITS
        y = Decimal(y)
        if y <= 0:
            raise LoadkitError(f"softplus only reaches positive values, not {y}")
        return y + (1 - (-y).exp()).ln()


def round_once(values: Iterable[int | float | Decimal], dtype: torch.dtype) -> torch.Tensor:
    """A 1-d tensor of ``values`` rounded to ``dtype``.

    Python rounds each value to float64 (correctly, in software), the cast rounds to ``dtype``
    (round-to-nearest-even in every CPU path): the same bits on every machine.

    >>> round_once([ln(2)], torch.float32).item()
    0.6931471824645996
    """
    return torch.tensor([float(v) for v in values], dtype=torch.float64).to(dtype)
