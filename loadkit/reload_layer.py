"""One layer's side of a layerwise reload: its counter, its buffered loads, its finalisation.

A "layer" is a module with direct parameters. While a reload is open its parameters are meta
stand-ins (no storage); loads are counted on them and buffered. Finalising materialises fresh
tensors, fills the floating ones with NaN, replays the buffered loads onto them and copies every
tensor back into the live parameters, whose storage (and so every pointer into it, such as a
captured CUDA graph's) never changes. A tensor no load reached keeps its NaN: that is how a
dropped parameter shows up in the live model.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from loadkit.weight_loaders import WeightLoader, loader_of

_MISSING = object()  # a live parameter that had no weight_loader attribute of its own


def to_meta(tensor: torch.Tensor) -> torch.Tensor:
    """A meta copy of ``tensor`` keeping its class, ``requires_grad`` and attributes."""
    meta = tensor.data.to("meta")
    if isinstance(tensor, nn.Parameter):
        meta = nn.Parameter(meta, requires_grad=tensor.requires_grad)
    meta.__class__ = tensor.__class__
    meta.__dict__.update(tensor.__dict__)
    return meta


def materialise(meta: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A real tensor shaped like ``meta``: NaN for floating dtypes (visible, deterministic), else 0.

    Upstream allocates with ``torch.empty``; whatever was in that memory would reach the model.
    """
    t = torch.empty_strided(meta.size(), meta.stride(), dtype=meta.dtype, device=device)
    t.fill_(float("nan") if (t.is_floating_point() or t.is_complex()) else 0)
    if isinstance(meta, nn.Parameter):
        t = nn.Parameter(t, requires_grad=False)
    t.__class__ = meta.__class__
    t.__dict__.update(meta.__dict__)
    return t


@dataclass
class LayerReload:
    """The reload state of one layer, from ``initialize_layerwise_reload`` to its finalisation."""

    name: str  # qualified module name, "" for the root
    module: nn.Module
    behaviour: str
    recorded: dict[str, torch.Tensor]  # meta tensors from record_metadata_for_reloading
    live: dict[str, nn.Parameter]  # the parameters the model runs with: storage kept
    meta: dict[str, torch.Tensor] = field(default_factory=dict)  # stand-ins while loading
    loaders: dict[str, WeightLoader] = field(default_factory=dict)  # the unwrapped loaders
    own_loader: dict[str, object] = field(default_factory=dict)  # live attrs, restored at close
    total: int = 0
    count: int = 0
    loads: list[tuple[str, inspect.BoundArguments]] = field(default_factory=list)
    finalised: bool = False
    dropped: list[str] = field(default_factory=list)  # excessive loads, by parameter name

    @property
    def label(self) -> str:
        return f"'{self.name}' ({type(self.module).__name__})"

    def open(self, wrap: Callable[[LayerReload, str, WeightLoader], WeightLoader]) -> None:
        """Put the layer on meta and route every load of its parameters through ``wrap``."""
        self.total = sum(t.numel() for t in self.recorded.values())
        for pname, recorded in self.recorded.items():
            live = self.live[pname]
            self.loaders[pname] = loader_of(recorded)
            self.own_loader[pname] = live.__dict__.get("weight_loader", _MISSING)
            stand_in = to_meta(recorded)
            wrapped = wrap(self, pname, self.loaders[pname])
            # Both the stand-in and the live parameter carry the wrapper: a loader that looks
            # the parameter up after finalisation must be dropped too, not written straight in.
            stand_in.weight_loader = wrapped
            live.weight_loader = wrapped
            self.meta[pname] = stand_in
            self.module._parameters[pname] = stand_in

    def finalise(self) -> None:
        """Materialise (NaN), replay the buffered loads, copy back into the live storage."""
        fresh = {
            pname: materialise(self.recorded[pname], self.live[pname].device)
            for pname in self.recorded
        }
        try:
            with torch.no_grad():
                # Loaders may look their layer up, so the fresh tensors sit in it while replaying.
                self.module._parameters.update(fresh)
                for pname, bound in self.loads:
                    bound.arguments["param"] = fresh[pname]
                    self.loaders[pname](*bound.args, **bound.kwargs)
                for pname, live in self.live.items():
                    live.data.copy_(fresh[pname])  # loaded or not: a dropped one copies its NaN
        finally:
            self.module._parameters.update(self.live)
            self.loads.clear()  # frees the buffered checkpoint tensors
            self.finalised = True

    def restore_untouched(self) -> None:
        """Nothing was loaded: put the live parameters back as they were."""
        self.module._parameters.update(self.live)
        self.loads.clear()

    def close(self) -> None:
        """End of the reload: the live parameters get their own loaders back."""
        for pname, live in self.live.items():
            own = self.own_loader.get(pname, _MISSING)
            if own is _MISSING:
                live.__dict__.pop("weight_loader", None)
            else:
                live.weight_loader = own
