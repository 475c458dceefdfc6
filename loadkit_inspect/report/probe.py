"""The pooling probe section: the probe's verdict under ``"old"`` and ``"new"``
(``loadkit.pooling.probe.ProbeRecord``, the library's record), as JSON and as text. Torch-free.

>>> from loadkit.pooling.probe import predict_probe
>>> probe = {b: predict_probe([("w", 4)], {"model.w"}, behaviour=b) for b in ("old", "new")}
>>> render_probe(probe)[1]
"  old  prefix 'model.' found at key #0 'w': holds 1 tensor (4 B = the whole checkpoint)"
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
        "walked": v.walked,
        "walked_bytes": v.walked_bytes,
        "cloned": v.cloned,
        "load_format": v.load_format,
        "total_keys": v.forwarded,
        "total_bytes": v.forwarded_bytes,
    }


def render_probe(probe: dict[str, ProbeRecord]) -> list[str]:
    """The section's text: one line per behaviour."""
    lines = [
        "pooling probe  (each key walked is held until prefix + name is a parameter; vLLM "
        "0.34.0 clones them only for a load format that may reuse buffers: not for auto)"
    ]
    return lines + [f"  {b:<4} {_verdict(v)}" for b, v in probe.items()]


def _verdict(probe: ProbeRecord) -> str:
    everything = probe.walked == probe.forwarded and probe.forwarded
    whole = " = the whole checkpoint" if everything else ""
    held = "clones" if probe.cloned else "holds"
    cost = f"{held} {plural(probe.walked, 'tensor')} ({format_bytes(probe.walked_bytes)}{whole})"
    if not probe.hit:
        walks = plural(probe.forwarded, "key")
        return f"no hit: walks all {walks}, {cost}; names forwarded unprefixed"
    hit = printable(str(probe.hit_key))
    return f"prefix {probe.prefix!r} found at key #{probe.hit_index} '{hit}': {cost}"
