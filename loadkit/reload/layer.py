"""One layer's side of a layerwise reload: its counter, its buffered loads, its finalisation.

A "layer" is a module with direct parameters or buffers. While a reload is open its tensors are
the meta tensors ``record_metadata_for_reloading`` kept (no storage); loads are counted on them
and buffered. Finalising materialises fresh tensors, fills them (``Fill``), replays the buffered
loads onto them and copies them back into the live tensors, whose storage (and so every pointer
into it, such as a captured CUDA graph's) never changes. What no load wrote keeps the fill: a
dropped parameter, and the padding of a weight larger than its checkpoint tensor. As upstream, a
non-persistent buffer is copied back only if loaded (a rotary cache keeps its values).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, cast

import torch
from torch import nn

from loadkit.loading.counting import Padding, get_tensor_load_numel
from loadkit.loading.meta import T
from loadkit.loading.weight_loaders import (
    WeightLoader,
    default_weight_loader,
    loader_of,
    set_weight_attrs,
)
from loadkit.terms import Behaviour

_MISSING = object()  # a tensor that had no weight_loader attribute of its own

# What a materialised tensor holds before the replay writes into it:
# - "zero": vLLM 0.34.0 (``materialize_meta_tensor`` zero-fills: "loaders only write checkpoint
#   regions, so MoE padding would keep garbage");
# - "stale": vLLM 0.33.0 and earlier allocate with ``torch.empty`` and keep whatever the memory
#   held; loadkit stands that in by a fixed pattern (``stale_fill_``), the same on every machine;
# - "nan": loadkit's visible marker, so a tensor no load reached cannot pass for a value.
Fill = Literal["zero", "stale", "nan"]
FILLS: tuple[Fill, ...] = ("zero", "stale", "nan")
FILL_WORDS: dict[str, str] = {"zero": "zeros", "stale": "stale memory", "nan": "NaN"}


def stale_fill_(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` with what stands for stale memory: a fixed ramp that is never 0.

    Floating tensors get -1.75, -1.25, ..., 1.75 repeating in memory order (exact in every
    floating dtype), integers 1 to 7, booleans ``True``.

    >>> stale_fill_(torch.empty(9)).tolist()
    [-1.75, -1.25, -0.75, -0.25, 0.25, 0.75, 1.25, 1.75, -1.75]
    """
    ramp = torch.arange(t.numel(), device=t.device) % 8
    if t.dtype == torch.bool:
        return t.fill_(True)
    if t.is_floating_point() or t.is_complex():
        values = (ramp.to(torch.float32) - 3.5) / 2
    else:
        values = ramp % 7 + 1
    return t.copy_(values.view(t.shape))


def fill_(t: torch.Tensor, fill: Fill) -> torch.Tensor:
    """``t`` filled as a materialised tensor starts (see ``Fill``); NaN is 0 for integers."""
    if fill == "zero":
        return t.zero_()
    if fill == "stale":
        return stale_fill_(t)
    return t.fill_(float("nan") if (t.is_floating_point() or t.is_complex()) else 0)


def materialise(
    meta: T, device: torch.device, fill: Fill = "zero", storage: torch.Tensor | None = None
) -> T:
    """A real tensor shaped, classed and attributed like ``meta``, filled with ``fill``.

    ``storage`` (bytes, e.g. from a ``ScratchArena``) is used instead of a fresh allocation.

    >>> m = torch.nn.Parameter(torch.empty(2, device="meta"), requires_grad=False)
    >>> materialise(m, torch.device("cpu")).tolist(), materialise(m, torch.device("cpu"), "nan")
    ([0.0, 0.0], Parameter containing:
    tensor([nan, nan]))
    """
    if storage is None:
        t = torch.empty_strided(meta.size(), meta.stride(), dtype=meta.dtype, device=device)
    else:
        t = storage.view(meta.dtype).as_strided(meta.size(), meta.stride())
    fill_(t, fill)
    # As upstream: the class is set, not constructed (a plain tensor that needs no grad becomes
    # an nn.Parameter, or the parameter subclass a layer made, by assignment).
    t.__class__ = meta.__class__
    t.__dict__.update(meta.__dict__)
    return cast(T, t)  # its class is now meta's


def _span_bytes(t: torch.Tensor) -> int:
    """Bytes of storage a tensor of ``t``'s size and stride reaches (offset 0)."""
    if t.numel() == 0:
        return 0
    last = sum((n - 1) * s for n, s in zip(t.size(), t.stride(), strict=True))
    return (last + 1) * t.element_size()


class ScratchArena:
    """One reusable buffer that large layers are materialised into, one layer at a time.

    A fresh allocation per large layer costs page faults, and a layer that fits the CPU cache
    stays hot between its fill, the replay and the copy back. A small layer gets fresh memory
    (the allocator's cache serves it faster than the arena's bookkeeping). The fresh tensors
    live only during a layer's finalisation; a nested finalisation gets fresh memory.
    """

    ALIGN = 64
    MIN_BYTES = 1 << 20  # smaller layers: a plain allocation is cheaper

    def __init__(self) -> None:
        self.buffers: dict[torch.device, torch.Tensor] = {}
        self.busy = False

    def take(
        self, metas: Mapping[str, torch.Tensor], device: torch.device
    ) -> dict[str, torch.Tensor]:
        """Byte regions, one per tensor, for ``materialise``; {} when busy or not worth it."""
        if self.busy or sum(t.nbytes for t in metas.values()) < self.MIN_BYTES:
            return {}
        offsets, total = {}, 0
        for name, meta in metas.items():
            offsets[name] = total
            total += -(-_span_bytes(meta) // self.ALIGN) * self.ALIGN
        buf = self.buffers.get(device)
        if buf is None or buf.numel() < total:
            buf = torch.empty(total, dtype=torch.uint8, device=device)
            self.buffers[device] = buf
        self.busy = True
        return {
            n: buf[o : o + max(_span_bytes(metas[n]), metas[n].element_size())]
            for n, o in offsets.items()
        }

    def release(self) -> None:
        self.busy = False


def original_loader(tensor: torch.Tensor) -> WeightLoader:
    """The loader ``tensor`` asks for, with any reload wrapper taken off (upstream's
    ``_get_original_loader``)."""
    loader = loader_of(tensor)
    while getattr(loader, "__name__", "") == "reload_weight_loader":
        loader = loader.__wrapped__  # type: ignore[attr-defined]
    return loader


def _restore_loader(tensor: torch.Tensor, own: object) -> None:
    if own is _MISSING:
        tensor.__dict__.pop("weight_loader", None)
    else:
        set_weight_attrs(tensor, {"weight_loader": own})


# A wrapped loader: (layer, parameter name, unwrapped loader) -> the wrapper.
Wrap = Callable[["LayerReload", str, WeightLoader], WeightLoader]


@dataclass(eq=False, slots=True)
class LayerReload:
    """The reload state of one layer, from ``initialize_layerwise_reload`` to its finalisation."""

    name: str  # qualified module name, "" for the root
    module: nn.Module
    behaviour: Behaviour
    padding: Padding
    fill: Fill
    recorded: dict[str, torch.Tensor]  # the meta tensors: the stand-ins while loading
    live: dict[str, torch.Tensor]  # the parameters and buffers the model runs with: storage kept
    loaders: dict[str, WeightLoader] = field(default_factory=dict)  # the unwrapped loaders
    caps: dict[str, int] = field(default_factory=dict)  # each tensor's elements to load
    own_loader: dict[str, object] = field(default_factory=dict)  # live attrs, restored at close
    meta_loader: dict[str, object] = field(default_factory=dict)  # the stand-ins' own
    slots: dict[str, dict] = field(default_factory=dict)  # the module's table each name is in
    total: int = 0
    count: int = 0
    device: torch.device | None = None  # of every live tensor, None if they differ
    loads: list[tuple[str, tuple, dict]] = field(default_factory=list)  # (name, args, kwargs)
    finalised: bool = False

    @property
    def label(self) -> str:
        return f"'{self.name}' ({type(self.module).__name__})"

    def _put(self, tensors: dict[str, torch.Tensor]) -> None:
        for name, t in tensors.items():
            self.slots[name][name] = t

    def open(self, wrap: Wrap) -> None:
        """Put the layer on meta and route every load of its tensors through ``wrap``."""
        params = self.module._parameters
        for pname, recorded in self.recorded.items():
            live = self.live[pname]
            loader = self.loaders.get(pname) or original_loader(recorded)
            self.loaders[pname] = loader
            self.caps[pname] = get_tensor_load_numel(recorded, self.padding)
            self.slots[pname] = params if pname in params else self.module._buffers
            self.own_loader[pname] = live.__dict__.get("weight_loader", _MISSING)
            self.meta_loader[pname] = recorded.__dict__.get("weight_loader", _MISSING)
            wrapped = wrap(self, pname, loader)
            # Both the stand-in and the live parameter carry the wrapper: a loader that looks
            # the parameter up after finalisation must be dropped too, not written straight in.
            recorded.__dict__["weight_loader"] = wrapped
            live.__dict__["weight_loader"] = wrapped
        # Parameters and buffers, as upstream's get_layer_size counts them.
        self.total = sum(self.caps.values())
        devices = {t.device for t in self.live.values()}
        self.device = devices.pop() if len(devices) == 1 else None
        self._put(self.recorded)

    def finalise(self, arena: ScratchArena | None = None) -> None:
        """Materialise (filled), replay the buffered loads, copy back into the live storage."""
        if all(self.loaders[pname] is default_weight_loader for pname, _, _ in self.loads):
            self.finalise_in_place()
            return
        device = self.device
        regions = arena.take(self.recorded, device) if arena is not None and device else {}
        try:
            fresh = self.materialise(regions)
            with torch.no_grad():
                # Loaders may look their layer up, so the fresh tensors sit in it while replaying.
                self._put(fresh)
                self.replay(fresh)
                self.copy_back(fresh)
        finally:
            self._put(self.live)
            self.loads.clear()  # frees the buffered checkpoint tensors
            self.finalised = True
            if regions:
                arena.release()  # type: ignore[union-attr]

    def finalise_in_place(self) -> None:
        """``finalise`` for a layer whose every load is ``default_weight_loader``'s: the same
        bytes, written straight into the live tensors. Each such load copies its whole tensor
        (a later one over an earlier one, as on a fresh tensor), loads nothing else and looks
        nothing up, so a fresh copy would only be copied back; a tensor no load reached takes
        the fill (a non-persistent buffer keeps its values, as in ``copy_back``)."""
        loaded = set()
        try:
            with torch.no_grad():
                for pname, args, kwargs in self.loads:
                    default_weight_loader(self.live[pname], *args, **kwargs)
                    loaded.add(pname)
                skip = self.module._non_persistent_buffers_set
                for pname, live in self.live.items():
                    if pname not in loaded and pname not in skip:
                        fill_(live, self.fill)
        finally:
            self._put(self.live)
            self.loads.clear()
            self.finalised = True

    def materialise(self, regions: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        fresh = {}
        for pname, meta in self.recorded.items():
            t = materialise(meta, self.live[pname].device, self.fill, regions.get(pname))
            _restore_loader(t, self.meta_loader[pname])  # replayed loaders find their own
            fresh[pname] = t
        return fresh

    def replay(self, fresh: dict[str, torch.Tensor]) -> None:
        for pname, args, kwargs in self.loads:
            self.loaders[pname](fresh[pname], *args, **kwargs)

    def copy_back(self, fresh: dict[str, torch.Tensor]) -> None:
        skip = self.module._non_persistent_buffers_set
        if skip:
            skip = skip - {pname for pname, _, _ in self.loads}
        for pname, live in self.live.items():
            if pname not in skip:
                live.copy_(fresh[pname])  # loaded or not: a dropped one copies the fill

    def restore_untouched(self) -> None:
        """Nothing was loaded: put the live tensors back as they were."""
        self._put(self.live)
        self.loads.clear()

    def close(self) -> None:
        """End of the reload: the live tensors and the stand-ins get their own loaders back."""
        for pname, live in self.live.items():
            _restore_loader(live, self.own_loader.get(pname, _MISSING))
            _restore_loader(self.recorded[pname], self.meta_loader.get(pname, _MISSING))


def first_argument(loader: WeightLoader) -> str | None:
    """The name of ``loader``'s first parameter (``inspect.signature``'s answer, read from the
    code object where that is the same answer: a plain function or a bound method).

    >>> from loadkit import default_weight_loader
    >>> first_argument(default_weight_loader), first_argument(lambda *a: None)
    ('param', 'a')
    """
    fn, skip = loader, 0
    if isinstance(loader, types.MethodType):
        fn, skip = loader.__func__, 1
    code = getattr(fn, "__code__", None)
    plain = isinstance(fn, types.FunctionType) and not hasattr(fn, "__wrapped__")
    if plain and code is not None and code.co_argcount > skip and "__signature__" not in vars(fn):
        return code.co_varnames[skip]
    import inspect  # only for what the code object cannot answer alone

    return next(iter(inspect.signature(loader).parameters), None)
