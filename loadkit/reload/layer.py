"""One layer's side of a layerwise reload: its counter, its buffered loads, its finalisation.

A "layer" is a module with direct parameters or buffers. While a reload is open its tensors are
meta stand-ins (no storage); loads are counted on them and buffered. Finalising materialises fresh
tensors, fills the floating ones with NaN, replays the buffered loads onto them and copies them
back into the live tensors, whose storage (and so every pointer into it, such as a captured CUDA
graph's) never changes. A tensor no load reached keeps its NaN: that is how a dropped parameter
shows up in the live model. As upstream, a non-persistent buffer is copied back only if loaded
(nothing in a checkpoint is meant for it: a rotary cache keeps its values).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import cast

import torch
from torch import nn

from loadkit.loading.meta import T, to_meta
from loadkit.loading.weight_loaders import WeightLoader, loader_of, set_weight_attrs
from loadkit.terms import Behaviour

_MISSING = object()  # a live parameter that had no weight_loader attribute of its own


def materialise(meta: T, device: torch.device, storage: torch.Tensor | None = None) -> T:
    """A real tensor shaped like ``meta``: NaN for floating dtypes (visible, deterministic), else 0.

    Upstream allocates with ``torch.empty``; whatever was in that memory would reach the model.
    ``storage`` (bytes, e.g. from a ``ScratchArena``) is used instead of a fresh allocation.
    """
    if storage is None:
        t = torch.empty_strided(meta.size(), meta.stride(), dtype=meta.dtype, device=device)
    else:
        t = storage.view(meta.dtype).as_strided(meta.size(), meta.stride())
    t.fill_(float("nan") if (t.is_floating_point() or t.is_complex()) else 0)
    if isinstance(meta, nn.Parameter):
        t = nn.Parameter(t, requires_grad=False)
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
    """One reusable buffer that every layer is materialised into, one layer at a time.

    A fresh allocation per layer costs page faults, and a layer that fits the CPU cache stays hot
    between its NaN fill, the replay and the copy back: the reload then moves about the same DRAM
    bytes as a plain copy. The fresh tensors live only during a layer's finalisation; a nested
    finalisation (a loader that loads another layer while being replayed) gets fresh memory.
    """

    ALIGN = 64

    def __init__(self) -> None:
        self.buffers: dict[torch.device, torch.Tensor] = {}
        self.busy = False

    def take(
        self, metas: Mapping[str, torch.Tensor], device: torch.device
    ) -> dict[str, torch.Tensor]:
        """Byte regions, one per tensor, for ``materialise``; {} when the arena is busy."""
        if self.busy:
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


@dataclass
class LayerReload:
    """The reload state of one layer, from ``initialize_layerwise_reload`` to its finalisation."""

    name: str  # qualified module name, "" for the root
    module: nn.Module
    behaviour: Behaviour
    recorded: dict[str, torch.Tensor]  # meta tensors from record_metadata_for_reloading
    live: dict[str, torch.Tensor]  # the parameters and buffers the model runs with: storage kept
    meta: dict[str, torch.Tensor] = field(default_factory=dict)  # stand-ins while loading
    loaders: dict[str, WeightLoader] = field(default_factory=dict)  # the unwrapped loaders
    own_loader: dict[str, object] = field(default_factory=dict)  # live attrs, restored at close
    total: int = 0
    count: int = 0
    loads: list[tuple[str, inspect.BoundArguments]] = field(default_factory=list)
    finalised: bool = False

    @property
    def label(self) -> str:
        return f"'{self.name}' ({type(self.module).__name__})"

    def _slots(self, name: str) -> dict:
        """The module's own table ``name`` lives in: its parameters or its buffers."""
        return self.module._buffers if name in self.module._buffers else self.module._parameters

    def _put(self, tensors: dict[str, torch.Tensor]) -> None:
        for name, t in tensors.items():
            self._slots(name)[name] = t

    def open(self, wrap: Callable[[LayerReload, str, WeightLoader], WeightLoader]) -> None:
        """Put the layer on meta and route every load of its tensors through ``wrap``."""
        # Parameters and buffers, as vLLM 0.28.0's get_layer_size counts them.
        self.total = sum(t.numel() for t in self.recorded.values())
        for pname, recorded in self.recorded.items():
            live = self.live[pname]
            self.loaders[pname] = loader_of(recorded)
            self.own_loader[pname] = live.__dict__.get("weight_loader", _MISSING)
            stand_in = to_meta(recorded)
            wrapped = wrap(self, pname, self.loaders[pname])
            # Both the stand-in and the live parameter carry the wrapper: a loader that looks
            # the parameter up after finalisation must be dropped too, not written straight in.
            set_weight_attrs(stand_in, {"weight_loader": wrapped})
            set_weight_attrs(live, {"weight_loader": wrapped})
            self.meta[pname] = stand_in
        self._put(self.meta)

    def finalise(self, arena: ScratchArena | None = None) -> None:
        """Materialise (NaN), replay the buffered loads, copy back into the live storage."""
        device = next(iter(self.live.values())).device
        same = all(p.device == device for p in self.live.values())
        regions = arena.take(self.recorded, device) if arena is not None and same else {}
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

    def materialise(self, regions: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {
            pname: materialise(self.recorded[pname], self.live[pname].device, regions.get(pname))
            for pname in self.recorded
        }

    def replay(self, fresh: dict[str, torch.Tensor]) -> None:
        for pname, bound in self.loads:
            bound.arguments["param"] = fresh[pname]
            self.loaders[pname](*bound.args, **bound.kwargs)

    def copy_back(self, fresh: dict[str, torch.Tensor]) -> None:
        loaded = {pname for pname, _ in self.loads}
        skip = self.module._non_persistent_buffers_set - loaded
        for pname, live in self.live.items():
            if pname not in skip:
                live.data.copy_(fresh[pname])  # loaded or not: a dropped one copies its NaN

    def restore_untouched(self) -> None:
        """Nothing was loaded: put the live tensors back as they were."""
        self._put(self.live)
        self.loads.clear()

    def close(self) -> None:
        """End of the reload: the live tensors get their own loaders back."""
        for pname, live in self.live.items():
            own = self.own_loader.get(pname, _MISSING)
            if own is _MISSING:
                live.__dict__.pop("weight_loader", None)
            else:
                set_weight_attrs(live, {"weight_loader": own})
