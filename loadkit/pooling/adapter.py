"""The pooling adapter and its checkpoint-prefix probe (docs/api.md, bug 1).

``as_pooling_model(cls)`` turns a generative model class into a pooling one. Its loader must
accept checkpoints saved from ``*ForCausalLM`` (names as the model has them) and from ``*Model``
(names without ``model.``), so it probes: it walks the weights until one name, under ``""`` or
``"model."``, is a parameter, and then hands everything to the parent loader with that prefix.

Weights walked before the hit must be held, and held as clones, because a streaming iterator
may hand out views into one reused buffer. So the probe's cost is the bytes it walks: with
``"old"`` and a checkpoint whose names only match after the model's ``hf_to_vllm_mapper``
(Gemma4), it never hits and clones the whole checkpoint. ``"new"`` looks names up through the
mapper and stops at the first key. The decision over names is ``loadkit.pooling.probe``'s,
shared with the header-only inspector so the two cannot disagree.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any, Literal, TypeVar, cast

import torch

from loadkit.loading.auto_loader import AutoWeightsLoader
from loadkit.pooling.probe import ProbeRecord, lookup_name, match_prefix
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
    clone: bool = True,
    forward: Forward = "original",
) -> type[M]:
    """A subclass of ``cls`` (same constructor) whose ``load_weights`` probes the prefix.

    ``behaviour``: ``"old"`` probes raw checkpoint names, ``"new"`` names as the model's
    ``hf_to_vllm_mapper`` maps them. The two other knobs reproduce rejected designs for
    teaching: ``clone=False`` holds the walked weights without cloning them (what buffer-reusing
    iterators corrupt); ``forward="mapped"`` maps the stream with ``hf_to_vllm_mapper`` before
    the probe and forwards mapped names (the parent maps them again, and the clones lose the
    ``shard_id`` the mapper set). After a load, ``model.probe_record`` tells what the probe did.

    Args:
        cls: a model class with (or without) its own ``load_weights``.
        behaviour: ``"old"`` or ``"new"`` (see above).
        clone: hold clones of the walked weights (``False``: the rejected design).
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
    >>> type(model).__name__, model.probe_record.prefix, model.probe_record.clones
    ('TinyForPooling', 'model.', 1)
    """
    check_behaviour(behaviour)
    check_behaviour(forward, ("original", "mapped"), what="forward")
    key = (cls, behaviour, bool(clone), forward)
    if key not in _CLASSES:  # one class per combination: isinstance and pickling stay sane
        _CLASSES[key] = _pooling_class(*key)
    return cast("type[M]", _CLASSES[key])  # a subclass of cls


def pooling_name(name: str) -> str:
    for suffix in _GENERATE_SUFFIXES:
        name = name.removesuffix(suffix)
    return name + "ForPooling"


_CLASSES: dict[tuple[type[torch.nn.Module], Behaviour, bool, Forward], type[torch.nn.Module]] = {}


def _pooling_class(
    cls: type[torch.nn.Module], behaviour: Behaviour, clone: bool, forward: Forward
) -> type[torch.nn.Module]:
    parent_load = getattr(cls, "load_weights", None)

    def load_weights(self: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> Any:
        mapper = getattr(self, "hf_to_vllm_mapper", None)
        params = dict(self.named_parameters())
        stream: Iterator[tuple[str, torch.Tensor]] = iter(weights)
        if forward == "mapped" and mapper is not None:
            stream = mapper.apply(stream)  # the rejected design: names mapped before the clone
            probe_mapper = None
        else:
            probe_mapper = mapper

        seen: list[tuple[str, torch.Tensor]] = []
        prefix = hit_key = hit_index = None
        walked_bytes = clones = cloned_bytes = 0
        for name, weight in stream:
            # Hold a clone: the iterator may reuse this tensor's buffer for the next weight.
            held = weight.clone() if clone else weight
            seen.append((name, held))
            walked_bytes += _nbytes(weight)
            if clone:
                clones += 1
                cloned_bytes += _nbytes(held)
            lookup = lookup_name(name, probe_mapper, behaviour)
            if lookup is None:
                continue  # the mapper drops this key: it says nothing about the layout
            prefix = match_prefix(lookup, params)
            if prefix is not None:
                hit_key, hit_index = name, len(seen) - 1
                break

        counts = [0, 0]

        def forwarded() -> Iterator[tuple[str, torch.Tensor]]:
            # Lazy: the rest of the stream is read only as the parent pulls it. Original names:
            # the parent maps them itself (mapping twice is a bug) and tags its own shard ids.
            for name, weight in itertools.chain(seen, stream):
                counts[0] += 1
                counts[1] += _nbytes(weight)
                yield (prefix or "") + name, weight

        try:
            if parent_load is not None:
                return parent_load(self, forwarded())
            return AutoWeightsLoader(self).load_weights(forwarded())
        finally:
            self.probe_record = ProbeRecord(
                behaviour=behaviour,
                prefix=prefix,
                hit_index=hit_index,
                hit_key=hit_key,
                walked=len(seen),
                walked_bytes=walked_bytes,
                walked_names=tuple(n for n, _ in seen),
                clones=clones,
                cloned_bytes=cloned_bytes,
                forwarded=counts[0],
                forwarded_bytes=counts[1],
                clone=clone,
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
