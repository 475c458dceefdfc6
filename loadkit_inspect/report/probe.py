"""The pooling probe section: the probe's verdict under ``"old"`` and ``"new"``
(``loadkit.pooling.probe.ProbeRecord``, the library's record), as JSON and as text. Torch-free.

>>> from loadkit.pooling.probe import predict_probe
>>> probe = {b: predict_probe([("w", 4)], {"model.w"}, behaviour=b) for b in ("old", "new")}
>>> render_probe(probe)[1]
"  old  prefix 'model.' found at key #0 'w': clones 1 tensor (4 B = the whole checkpoint)"
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loadkit.errors import printable
from loadkit.fmt import format_bytes, plural

if TYPE_CHECKING:
    from loadkit.pooling import ProbeRecord


def probe_as_dict(probe: dict[str, ProbeRecord]) -> dict[str, dict[str, Any]]:
    """The section in ``--json``: one object per behaviour."""
    return {b: _record(v) for b, v in probe.items()}


def _record(v: ProbeRecord) -> dict[str, Any]:
    return {
        "hit": v.hit,
        "prefix": v.prefix,
        "hit_index": v.hit_index,
        "hit_key": v.hit_key,
        "clones": v.clones,
        "cloned_bytes": v.cloned_bytes,
        "total_keys": v.forwarded,
        "total_bytes": v.forwarded_bytes,
    }


def render_probe(probe: dict[str, ProbeRecord]) -> list[str]:
    """The section's text: one line per behaviour."""
    lines = ["pooling probe  (each key walked is cloned until prefix + name is a parameter)"]
    return lines + [f"  {b:<4} {_verdict(v)}" for b, v in probe.items()]


def _verdict(probe: ProbeRecord) -> str:
    everything = probe.walked == probe.forwarded and probe.forwarded
    whole = " = the whole checkpoint" if everything else ""
    cost = f"clones {plural(probe.clones, 'tensor')} ({format_bytes(probe.cloned_bytes)}{whole})"
    if not probe.hit:
        walks = plural(probe.forwarded, "key")
        return f"no hit: walks all {walks}, {cost}; names forwarded unprefixed"
    hit = printable(str(probe.hit_key))
    return f"prefix {probe.prefix!r} found at key #{probe.hit_index} '{hit}': {cost}"
