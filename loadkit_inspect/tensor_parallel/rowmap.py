"""Per-rank row maps: for each checkpoint key, which of its rows (or columns) each rank took.

Built from ``CopyRecord``s, of real ranks (``RankResult.records``) or dry-loaded ones
(``RankShare.records``), so the same table shows a real run and a header-only plan.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from loadkit.parallel import CopyRecord, Span


@dataclass
class RowMapEntry:
    """One checkpoint key: the parameter it fed, the axis split, and each rank's spans."""

    key: str
    param: str
    axis: str  # "rows" or "cols"
    size: int  # the checkpoint tensor's length along ``axis``
    spans: list[list[Span]] = field(default_factory=list)  # per rank


def row_map(records_by_rank: Sequence[Sequence[CopyRecord]]) -> list[RowMapEntry]:
    """Entries in checkpoint order (first seen on any rank), one list of spans per rank."""
    tp = len(records_by_rank)
    entries: dict[str, RowMapEntry] = {}
    for rank, records in enumerate(records_by_rank):
        for rec in records:
            held = rec.held
            if held is None or rec.key is None:  # a fill (no key) holds nothing
                continue
            axis, span = held
            entry = entries.get(rec.key)
            if entry is None:
                shape = rec.ckpt_shape or (0,)
                size = shape[1] if axis == "cols" else shape[0]
                entry = entries[rec.key] = RowMapEntry(
                    rec.key, rec.param, axis, size, [[] for _ in range(tp)]
                )
            entry.spans[rank].append(span)
    return list(entries.values())


def span_text(spans: Sequence[Span]) -> str:
    """``[(0, 16)]`` -> ``"0-15"`` (inclusive, as people count rows)."""
    return ",".join(f"{a}-{b - 1}" if b - a > 1 else str(a) for a, b in spans)


_LAYER = re.compile(r"\.layers\.(\d+)\.")


def render_row_map(
    entries: Sequence[RowMapEntry],
    *,
    layer: int | None = 0,
    failed: dict[int, str] | None = None,
    width: int = 9,
) -> str:
    """A table: one line per checkpoint key, one column per rank.

    ``layer``: show only that decoder layer's keys (with every key outside the layers), since
    the other layers split alike; ``None`` shows all. ``failed``: ranks whose load stopped
    (their missing spans read ``failed``, not ``-``).
    """
    failed = failed or {}
    tp = max((len(e.spans) for e in entries), default=0)
    shown = []
    for e in entries:
        m = _LAYER.search(e.key)
        if layer is None or m is None or int(m[1]) == layer:
            shown.append(e)
    key_w = max([len(e.key) for e in shown] + [len("checkpoint key")])
    head = f"{'checkpoint key'.ljust(key_w)}  axis       " + "".join(
        f"rank {r}".ljust(width) for r in range(tp)
    )
    lines = [head]
    for e in shown:
        cells = []
        for r in range(tp):
            text = span_text(e.spans[r]) if e.spans[r] else ("failed" if r in failed else "-")
            cells.append(text.ljust(width))
        lines.append(f"{e.key.ljust(key_w)}  {e.axis:<4} {e.size:<5} " + "".join(cells))
    return "\n".join(line.rstrip() for line in lines)
