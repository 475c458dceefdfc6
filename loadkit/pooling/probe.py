"""The pooling adapter's checkpoint-prefix probe, as a decision over names (docs/api.md, bug 1).

The pooling adapter must know whether a checkpoint was saved from ``*ForCausalLM`` (names start
with ``model.``) or from ``*Model`` (no prefix). It walks the stream until one name, with a
candidate prefix, is a parameter of the model. Everything walked before that is held, so how
soon the probe hits decides how much memory it costs. Held as clones, unless the load format's
iterator hands over tensors it never reuses (``OWNED_TENSOR_LOAD_FORMATS``, vLLM 0.34.0; before,
always cloned). This module holds the decision; the adapter that walks real tensors
(``loadkit.pooling.adapter``) and the header-only inspector both use it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from loadkit.mapper import WeightsMapper
from loadkit.terms import Behaviour, check_behaviour

CANDIDATE_PREFIXES = ("", "model.")

# vLLM 0.34.0's load formats whose weight iterators yield tensors they never reuse: the probe
# holds those as they are, no clone (models/adapters.py _OWNED_TENSOR_LOAD_FORMATS).
OWNED_TENSOR_LOAD_FORMATS = frozenset(
    {
        "auto",
        "hf",
        "safetensors",
        "mistral",
        "pt",
        "npcache",
        "instanttensor",
        "tensorizer",
        "sharded_state",
        "modelexpress",
        "runai_streamer",
        "runai_streamer_sharded",
    }
)


def clones_for(load_format: str) -> bool:
    """Does the probe clone what it holds under ``load_format`` (vLLM 0.34.0: only where the
    format's iterator may reuse a tensor's buffer for the next weight)?

    >>> clones_for("safetensors"), clones_for("fastsafetensors")
    (False, True)
    """
    return load_format not in OWNED_TENSOR_LOAD_FORMATS


def lookup_name(name: str, mapper: WeightsMapper | None, behaviour: Behaviour) -> str | None:
    """The name the probe checks for ``name``; ``None`` means skip this key and keep probing.

    ``"old"`` checks the checkpoint name as it is. ``"new"`` checks the model's own mapping of it,
    because a model with ``hf_to_vllm_mapper`` only matches after mapping.
    """
    check_behaviour(behaviour)
    if behaviour == "new" and mapper is not None:
        return mapper.map_name(name)
    return name


def match_prefix(lookup: str, params: Collection[str]) -> str | None:
    """The first candidate prefix under which ``lookup`` is a parameter, else ``None``."""
    for prefix in CANDIDATE_PREFIXES:
        if prefix + lookup in params:
            return prefix
    return None


@dataclass(frozen=True)
class ProbeRecord:
    """What the probe does over one checkpoint: where it stops and what it holds on the way.

    A real load (``model.probe_record`` after ``load_weights``) and the header-only prediction
    (``predict_probe``) give the same record for the same checkpoint and model.
    """

    behaviour: str
    prefix: str | None  # the prefix found; None: no hit (names forwarded unprefixed)
    hit_index: int | None  # position of the key that hit, in stream order, from 0
    hit_key: str | None
    walked: int  # keys the probe walked, each held until the parent loader takes it
    walked_bytes: int
    walked_names: tuple[str, ...]
    forwarded: int  # weights handed to the parent loader (held ones and the rest of the stream)
    forwarded_bytes: int
    cloned: bool = False  # each held key a clone (a load format that may reuse buffers)
    load_format: str = "auto"
    forward: str = "original"

    @property
    def hit(self) -> bool:
        return self.prefix is not None


def predict_probe(
    keys: Iterable[tuple[str, int]],
    params: Collection[str],
    *,
    mapper: WeightsMapper | None = None,
    behaviour: Behaviour = "new",
    load_format: str = "auto",
) -> ProbeRecord:
    """The probe's record for ``(name, nbytes)`` pairs, without touching a tensor.

    The same walk as the adapter's: each key is held (cloned when ``clones_for(load_format)``)
    before it is checked, the walk stops at the first hit, and every key is then forwarded.
    ``keys`` is consumed fully.

    >>> r = predict_probe([("a.weight", 8), ("b.weight", 4)], {"model.b.weight"})
    >>> r.prefix, r.hit_key, r.walked, r.walked_bytes, r.cloned, r.forwarded
    ('model.', 'b.weight', 2, 12, False, 2)
    """
    walked: list[str] = []
    walked_bytes = total_keys = total_bytes = 0
    prefix = hit_key = hit_index = None
    for name, nbytes in keys:
        total_keys += 1
        total_bytes += nbytes
        if prefix is not None:
            continue
        walked.append(name)
        walked_bytes += nbytes
        lookup = lookup_name(name, mapper, behaviour)
        if lookup is None:
            continue
        found = match_prefix(lookup, params)
        if found is not None:
            prefix, hit_key, hit_index = found, name, total_keys - 1
    return ProbeRecord(
        behaviour=behaviour,
        prefix=prefix,
        hit_index=hit_index,
        hit_key=hit_key,
        walked=len(walked),
        walked_bytes=walked_bytes,
        walked_names=tuple(walked),
        forwarded=total_keys,
        forwarded_bytes=total_bytes,
        cloned=clones_for(load_format),
        load_format=load_format,
    )
