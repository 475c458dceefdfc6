"""What vLLM 0.34.0's loader checks after ``load_weights``: ``track_weights_loading``.

``DefaultModelLoader.track_weights_loading`` (vllm/model_executor/model_loader/default_loader.py)
raises ``ValueError: Following weights were not initialized from checkpoint: {...}`` for the
parameters the load did not report, with two twists that decide what a user sees:

- every parameter of a module whose ``quant_method`` has ``process_weights_after_loading``
  counts as loaded, on an unquantized model too ("the module-wide exemption"): a linear,
  embedding, LM head or expert weight the checkpoint never filled raises nothing and is left
  uninitialised. Only the rest (norms, sinks, a bare parameter) can fail the load;
- a stacked layer (``qkv_proj``, ``gate_up_proj``) that got some shards but not all adds
  ``"<name>.weight.<shard>"`` for each missing one (``pop_missing_shards``): that always fails.

loadkit adds what vLLM does not track: the expert slices of a fused expert weight that no
checkpoint tensor filled (``pop_missing_experts``), which vLLM leaves uninitialised without a
word. Buffers are never required (vLLM counts parameters only).

>>> from torch import nn
>>> class Norm(nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.weight = nn.Parameter(torch.ones(2))
>>> tracked = track_weights_loading(Norm(), loaded=set())
>>> tracked.refused, tracked.quiet
(['weight'], [])
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import torch
from torch import nn

from loadkit.loading.tensors import qualname


class Tracked(NamedTuple):
    """A finished load as vLLM 0.34.0's loader judges it.

    ``refused``: what its ``ValueError`` lists (parameters never loaded that it checks, and
    ``<param>.<shard>`` for each missing shard of a partly loaded stacked parameter); the load
    fails. ``quiet``: parameters never loaded that it counts as loaded (the module-wide
    exemption), and expert slices no tensor filled (``<param>[expert E, wN]``): the load goes
    on and they hold whatever the memory held.
    """

    refused: list[str]
    quiet: list[str]

    @property
    def fails(self) -> bool:
        return bool(self.refused)


def exempt_parameters(model: nn.Module) -> set[str]:
    """Parameters vLLM counts as loaded whatever the checkpoint held: those of every module
    with a ``quant_method`` that has ``process_weights_after_loading`` (or loads online)."""
    out: set[str] = set()
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if getattr(method, "uses_meta_device", False) or getattr(
            method, "process_weights_after_loading", None
        ):
            out.update(qualname(name, p) for p, _ in module.named_parameters())
    return out


def missing_parts(model: nn.Module) -> tuple[list[str], list[str]]:
    """``(shards, expert slices)`` the last load left out of partly filled parameters, by
    qualified name; each layer's record is then forgotten (vLLM's ``pop_missing_shards``)."""
    shards: list[str] = []
    experts: list[str] = []
    for name, module in model.named_modules():
        pop = getattr(module, "pop_missing_shards", None)
        if callable(pop):
            shards.extend(qualname(name, s) for s in pop())
        pop = getattr(module, "pop_missing_experts", None)
        if callable(pop):
            experts.extend(qualname(name, s) for s in pop())
    return shards, experts


def forget_parts(model: nn.Module) -> None:
    """Clear every layer's record of loaded shards and experts (before a new load)."""
    missing_parts(model)


def track_weights_loading(
    model: nn.Module, loaded: Iterable[str] | None = None, *, unfilled: Iterable[str] = ()
) -> Tracked:
    """vLLM 0.34.0's check of a finished unquantized load.

    Args:
        model: the model just loaded (its stacked and expert layers still hold their records).
        loaded: the qualified names ``load_weights`` returned; or ``None`` to judge by
            ``unfilled`` instead (the parameters no checkpoint tensor was written into).
        unfilled: with ``loaded=None``, the parameters never filled.

    Returns:
        ``Tracked``: what fails the load, and what is left uninitialised without an error.
    """
    params = [n for n, _ in model.named_parameters()]
    if loaded is not None:
        done = set(loaded)
        never = [n for n in params if n not in done]
    else:
        names = set(params)
        never = [n for n in unfilled if n in names]
    exempt = exempt_parameters(model)
    shards, experts = missing_parts(model)
    refused = [n for n in never if n not in exempt] + shards
    quiet = [n for n in never if n in exempt] + experts
    return Tracked(refused, quiet)


def weights_not_initialized(tracked: Tracked) -> str:
    """vLLM's error for a refused load, as it words it.

    >>> weights_not_initialized(Tracked(["model.norm.weight"], []))
    "Following weights were not initialized from checkpoint: {'model.norm.weight'}"
    """
    return f"Following weights were not initialized from checkpoint: {set(tracked.refused)}"


def _is_param(tensor: torch.Tensor) -> bool:
    return isinstance(tensor, nn.Parameter)
