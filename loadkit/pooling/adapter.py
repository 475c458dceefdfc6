"""The pooling adapter and its checkpoint-prefix probe (docs/api.md, bug 1).

``as_pooling_model(cls)`` turns a generative model class into a pooling one. Its loader must
accept checkpoints saved from ``*ForCausalLM`` (names as the model has them) and from ``*Model``
(names without ``model.``), so it probes: it walks the weights until one name, under ``""`` or
``"model."``, is a parameter, and then hands everything to the parent loader with that prefix
(a parent without ``load_weights`` of its own: ``AutoWeightsLoader`` with the model's
``hf_to_vllm_mapper``, as vLLM 0.29.0 and later).

Weights walked before the hit must be held, and, where the load format's iterator may reuse a
tensor's buffer for the next weight, held as clones (vLLM 0.34.0 clones only then:
``probe.OWNED_TENSOR_LOAD_FORMATS``). So the probe's cost is the bytes it walks: with ``"old"``
and a checkpoint whose names only match after the model's ``hf_to_vllm_mapper`` (Gemma4), it
never hits and holds the whole checkpoint. ``"new"`` looks names up through the mapper and stops
at the first key. The decision over names is ``loadkit.pooling.probe``'s, shared with the
header-only inspector so the two cannot disagree.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any, Literal, NamedTuple, TypeVar, cast

import torch

from loadkit.loading.auto_loader import AutoWeightsLoader
from loadkit.mapper import WeightsMapper
from loadkit.pooling.probe import ProbeRecord, clones_for, lookup_name, match_prefix
from loadkit.terms import Behaviour, check_behaviour

Forward = Literal["original", "mapped"]
M = TypeVar("M", bound=torch.nn.Module)
_GENERATE_SUFFIXES = ("ForConditionalGeneration", "ForCausalLM", "LMHeadModel", "ChatModel")


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def as_pooling_model(
    cls: type[M],
    *,
    behaviour: Behaviour = "new",
    load_format: str = "auto",
    forward: Forward = "original",
) -> type[M]:
    """A subclass of ``cls`` (same constructor) whose ``load_weights`` probes the prefix.

    ``behaviour``: ``"old"`` probes raw checkpoint names, ``"new"`` names as the model's
    ``hf_to_vllm_mapper`` maps them. ``load_format`` is vLLM's (``--load-format``): under one
    whose iterator hands over tensors it never reuses (``"auto"``, ``"safetensors"``, ...) the
    probe holds what it walks as it is; under any other (``"fastsafetensors"``, a plugin's) it
    holds clones, since the iterator may reuse a buffer. Declaring an owned format for an
    iterator that reuses buffers is what corrupts the held weights. ``forward="mapped"``
    reproduces a rejected design: it maps the stream with ``hf_to_vllm_mapper`` before the probe
    and forwards mapped names (the parent maps them again, and the held weights lose the
    ``shard_id`` the mapper set). After a load, ``model.probe_record`` tells what the probe did.

    Args:
        cls: a model class with (or without) its own ``load_weights``.
        behaviour: ``"old"`` or ``"new"`` (see above).
        load_format: vLLM's load format, deciding whether the held weights are clones.
        forward: ``"original"`` names to the parent loader, or ``"mapped"`` (rejected design).

    Returns:
        A subclass of ``cls`` named ``...ForPooling``, one per combination of the arguments.

    >>> import torch
    >>> class TinyForCausalLM(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.model = torch.nn.Linear(2, 2, bias=False)
    >>> model = as_pooling_model(TinyForCausalLM, behaviour="new")()
    >>> model.load_weights([("weight", torch.eye(2))])  # saved headless: found under "model."
    {'model.weight'}
    >>> r = model.probe_record
    >>> type(model).__name__, r.prefix, r.walked, r.cloned
    ('TinyForPooling', 'model.', 1, False)
    """
    check_behaviour(behaviour)
    check_behaviour(forward, ("original", "mapped"), what="forward")
    key = (cls, behaviour, load_format, forward)
    if key not in _CLASSES:  # one class per combination: isinstance and pickling stay sane
        _CLASSES[key] = _pooling_class(*key)
    return cast("type[M]", _CLASSES[key])  # a subclass of cls


def pooling_name(name: str) -> str:
    for suffix in _GENERATE_SUFFIXES:
        name = name.removesuffix(suffix)
    return name + "ForPooling"


_CLASSES: dict[tuple[type[torch.nn.Module], Behaviour, str, Forward], type[torch.nn.Module]] = {}


class _Walk(NamedTuple):
    """What the probe walked and held, and where it stopped."""

    seen: list[tuple[str, torch.Tensor]]
    walked_bytes: int
    prefix: str | None
    hit_index: int | None


def _walk(
    stream: Iterator[tuple[str, torch.Tensor]],
    params: dict[str, Any],
    mapper: WeightsMapper | None,
    behaviour: Behaviour,
    clone: bool,
) -> _Walk:
    """Hold each weight (a clone when the iterator may reuse its buffer) until a name, with a
    candidate prefix, is a parameter."""
    seen: list[tuple[str, torch.Tensor]] = []
    walked_bytes = 0
    for name, weight in stream:
        seen.append((name, weight.clone() if clone else weight))
        walked_bytes += _nbytes(weight)
        lookup = lookup_name(name, mapper, behaviour)
        if lookup is None:
            continue  # the mapper drops this key: it says nothing about the layout
        prefix = match_prefix(lookup, params)
        if prefix is not None:
            return _Walk(seen, walked_bytes, prefix, len(seen) - 1)
    return _Walk(seen, walked_bytes, None, None)


def _pooling_class(
    cls: type[torch.nn.Module], behaviour: Behaviour, load_format: str, forward: Forward
) -> type[torch.nn.Module]:
    parent_load = getattr(cls, "load_weights", None)
    clone = clones_for(load_format)

    def load_weights(self: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> Any:
        mapper = getattr(self, "hf_to_vllm_mapper", None)
        stream: Iterator[tuple[str, torch.Tensor]] = iter(weights)
        if forward == "mapped" and mapper is not None:
            stream = mapper.apply(stream)  # the rejected design: names mapped before the hold
        probe_mapper = None if forward == "mapped" else mapper
        walk = _walk(stream, dict(self.named_parameters()), probe_mapper, behaviour, clone)
        counts = [0, 0]

        def forwarded() -> Iterator[tuple[str, torch.Tensor]]:
            # Lazy: the rest of the stream is read only as the parent pulls it. Original names:
            # the parent maps them itself (mapping twice is a bug) and tags its own shard ids.
            for name, weight in itertools.chain(walk.seen, stream):
                counts[0] += 1
                counts[1] += _nbytes(weight)
                yield (walk.prefix or "") + name, weight

        try:
            if parent_load is not None:
                return parent_load(self, forwarded())
            return AutoWeightsLoader(self).load_weights(forwarded(), mapper=mapper)
        finally:
            hit = walk.hit_index
            self.probe_record = ProbeRecord(
                behaviour=behaviour,
                prefix=walk.prefix,
                hit_index=hit,
                hit_key=None if hit is None else walk.seen[hit][0],
                walked=len(walk.seen),
                walked_bytes=walk.walked_bytes,
                walked_names=tuple(n for n, _ in walk.seen),
                forwarded=counts[0],
                forwarded_bytes=counts[1],
                cloned=clone,
                load_format=load_format,
                forward=forward,
            )

    name = pooling_name(cls.__name__)
    namespace = {
        "load_weights": load_weights,
        "is_pooling_model": True,
        "pooling_behaviour": behaviour,
        "__module__": cls.__module__,
        "__qualname__": name,
        "__doc__": f"{cls.__name__} as a pooling model (prefix probe: {behaviour!r}).",
    }
    return type(name, (cls,), namespace)
