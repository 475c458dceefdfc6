"""What every section's text shares: names printed escaped, lists capped at ``--limit`` rows,
shapes in one order. Torch-free.

>>> capped(["    a", "    b", "    c"], 3, 2)
['    a', '    b', '    ... 1 more (--json lists them all)']
>>> shapes((128, 32), (32, 128))
'checkpoint [128, 32], model [32, 128] (transposed?)'
"""

from __future__ import annotations

from collections.abc import Sequence

from loadkit.errors import printable
from loadkit.fmt import plural


def joined_names(names: Sequence[str]) -> str:
    """Names, each printed escaped, separated by commas."""
    return ", ".join(printable(n) for n in names)


def joined_problems(problems: Sequence[str]) -> str:
    """A verdict's problems, each printed escaped, separated by semicolons."""
    return "; ".join(printable(p) for p in problems)


def capped(rows: list[str], total: int, limit: int, indent: str = "    ") -> list[str]:
    """The first ``limit`` of ``rows`` (``total`` in all), and a line saying how many more."""
    out = rows[:limit]
    if total > limit and not out:  # --limit 0: the count alone, no "more" than nothing
        out.append(f"{indent}{plural(total, 'row')}, none shown (--json lists them all)")
    elif total > limit:
        out.append(f"{indent}... {total - limit} more (--json lists them all)")
    return out


def shapes(checkpoint: Sequence[int], model: Sequence[int] | None) -> str:
    """A shape mismatch in one order everywhere, the checkpoint's first (as the file reads)."""
    shown = f"checkpoint {list(checkpoint)}, model {list(model) if model is not None else '?'}"
    flipped = model is not None and len(model) == 2 and tuple(checkpoint) == tuple(model)[::-1]
    return shown + (" (transposed?)" if flipped else "")
