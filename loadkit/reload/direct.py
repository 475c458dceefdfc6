"""Direct reload (vLLM 0.34.0's ``VLLM_RELOAD_MODE=direct``): checkpoint tensors written straight
into the live storage, then the post-load processing run again, in place.

At cold start, after the first load and before post-load processing, ``record_checkpoint_layout``
remembers each tensor's checkpoint layout (shape, stride, dtype, offset), its loader attributes
and its storage. ``begin_direct_reload`` views every tensor the processing re-laid out back to
that layout on its own storage, zero-fills the padded weights a module names
(``padding_fill_params()``), and the model's own ``load_weights`` writes the update in place.
``finish_direct_reload`` runs every module's post-load hook again (``finalize_model_weights``),
which must keep the storage and refill what it derives.

Nothing is counted, buffered or materialised: no layer is finalised early (bug 3 cannot happen),
and nothing is filled either. A tensor the update does not deliver keeps the value it had (a
dropped ``D`` keeps its stale value, silently); between begin and finish the model must not run,
and there is no rollback. Upstream's delivery contract: an update sends every checkpoint tensor
of a module whose processing changes its layout or is not idempotent, and of every padded weight.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from loadkit.errors import DirectReloadError
from loadkit.loading.postload import finalize_model_weights

__all__ = [
    "begin_direct_reload",
    "direct_reload_active",
    "finish_direct_reload",
    "record_checkpoint_layout",
    "storage_view",
]

# Loader attributes post-load processing may retag on a kept parameter (a repack along another
# dim); the checkpoint loaders shard with them, so begin puts the recorded ones back.
LOADER_ATTRS = (
    "input_dim",
    "output_dim",
    "packed_dim",
    "packed_factor",
    "pack_factor",
)

_LOADER_ATTR_SET = frozenset(LOADER_ATTRS)

Layout = tuple[tuple[int, ...], tuple[int, ...], torch.dtype, int]


class CheckpointRecord(NamedTuple):
    """What ``record_checkpoint_layout`` keeps on a tensor (as its ``_ckpt`` attribute)."""

    owner: object  # the recording model's tag: a tensor shared from another model is not ours
    layout: Layout  # shape, stride, dtype, storage offset
    attrs: dict  # LOADER_ATTRS as they were
    storage: int  # the storage's data_ptr then


def _layout(t: torch.Tensor) -> Layout:
    return tuple(t.shape), t.stride(), t.dtype, int(t.storage_offset())


def _same_layout(t: torch.Tensor, layout: Layout) -> bool:
    shape, stride, dtype, offset = layout
    return (
        t.shape == shape
        and t.dtype == dtype
        and t.stride() == stride
        and (t.storage_offset() == offset)
    )


def storage_view(
    storage: torch.UntypedStorage,
    offset: int,
    shape: tuple[int, ...],
    stride: tuple[int, ...],
    dtype: torch.dtype,
) -> torch.Tensor:
    """A ``dtype`` tensor on ``storage`` at element ``offset`` (no bounds check: callers check).

    >>> s = torch.arange(6.0).untyped_storage()
    >>> storage_view(s, 1, (2, 2), (1, 2), torch.float32).tolist()
    [[1.0, 3.0], [2.0, 4.0]]
    """
    view = torch.empty(0, dtype=dtype, device=storage.device)
    return view.set_(storage, offset, shape, stride)


Slot = tuple[nn.Module, str, str, torch.Tensor]  # (module, "param" or "buffer", name, tensor)


def _slots(model: nn.Module) -> tuple[list[nn.Module], list[Slot]]:
    """Every module once, and every parameter and persistent buffer slot of theirs: what
    ``loadable_tensors`` walks, without building names (begin runs on every update)."""
    modules: list[nn.Module] = []
    slots: list[Slot] = []
    seen: set[int] = set()
    stack = [model]
    while stack:
        m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        modules.append(m)
        for n, p in m._parameters.items():
            if p is not None:
                slots.append((m, "param", n, p))
        if m._buffers:
            skip = m._non_persistent_buffers_set
            for n, b in m._buffers.items():
                if b is not None and n not in skip:
                    slots.append((m, "buffer", n, b))
        if m._modules:
            stack.extend(c for c in reversed(m._modules.values()) if c is not None)
    return modules, slots


def direct_reload_active(model: nn.Module) -> bool:
    """Whether ``model`` is between ``begin_direct_reload`` and its finish."""
    return bool(model.__dict__.get("_direct_reload_begun", False))


def _ckpt(t: torch.Tensor) -> CheckpointRecord | None:
    return t.__dict__.get("_ckpt")


def record_checkpoint_layout(model: nn.Module) -> None:
    """Cold start, before post-load processing: remember each tensor's checkpoint layout, which
    tensors this model owns, which parameter names hold checkpoint tensors, and which padded
    weights to zero-fill. Runs once; every reload reuses it.

    Args:
        model: the model after its first load, before ``finalize_model_weights``.

    Returns:
        ``None``.

    >>> model = torch.nn.Linear(2, 2)
    >>> record_checkpoint_layout(model)
    >>> model.weight._ckpt.layout[:2], sorted(model._ckpt_param_names)
    (((2, 2), (2, 1)), ['bias', 'weight'])
    """
    if "_ckpt_param_names" in model.__dict__:
        return
    owner = model.__dict__["_ckpt_owner"] = object()  # tags owned tensors (ids of freed ones recur)
    for *_, t in _slots(model)[1]:
        if not t.is_meta and _ckpt(t) is None:
            attrs = {k: t.__dict__[k] for k in LOADER_ATTRS if k in t.__dict__}
            record = CheckpointRecord(owner, _layout(t), attrs, t.untyped_storage().data_ptr())
            t.__dict__["_ckpt"] = record
    model.__dict__["_ckpt_padding_fill"] = [
        (module, name)
        for module in model.modules()
        if callable(fill := getattr(module, "padding_fill_params", None))
        for name in fill()
    ]
    # Every name, aliases included: post-load processing may replace either.
    model.__dict__["_ckpt_param_names"] = frozenset(
        name for name, p in model.named_parameters(remove_duplicate=False) if _ckpt(p) is not None
    )
    modules, slots = _slots(model)
    # The module tree and the parameter slots as recorded: while the tree is the same objects,
    # begin checks the slots instead of every name.
    model.__dict__["_ckpt_tree"] = (
        modules,
        [(m, n) for m, kind, n, t in slots if kind == "param" and _ckpt(t) is not None],
        any(t.device.type != "cpu" for *_, t in slots),
    )


def _owned(model: nn.Module, t: torch.Tensor) -> bool:
    record = _ckpt(t)
    return record is not None and record.owner is model.__dict__["_ckpt_owner"]


def _check_params_kept(model: nn.Module, modules: list[nn.Module]) -> None:
    recorded, param_slots, _ = model.__dict__["_ckpt_tree"]
    same_tree = len(recorded) == len(modules) and all(
        a is b for a, b in zip(recorded, modules, strict=True)
    )
    if same_tree and all(
        (p := m._parameters.get(n)) is None or _ckpt(p) is not None for m, n in param_slots
    ):
        return
    replaced = [
        name
        for name, p in model.named_parameters(remove_duplicate=False)
        if name in model.__dict__["_ckpt_param_names"] and _ckpt(p) is None
    ]
    if replaced:
        raise DirectReloadError(
            f"direct reload: post-load processing replaced the parameter object of "
            f"{len(replaced)} checkpoint tensors (e.g. {replaced[:3]}); keep the parameter and "
            "set its .data instead"
        )


def _checkpoint_views(
    model: nn.Module, slots: list[Slot]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(tensor, its storage viewed in its checkpoint layout) for every tensor post-load
    processing re-laid out; raises if a storage cannot hold its checkpoint layout."""
    views, seen = [], set()
    for module, _, leaf, t in slots:
        record = t.__dict__.get("_ckpt")
        if record is None or id(t) in seen or _same_layout(t, record.layout):
            continue  # derived by post-load processing, an alias, or still in checkpoint layout
        seen.add(id(t))
        name = _name_of(model, module, leaf)
        if not _owned(model, t):
            raise DirectReloadError(
                f"direct reload: {name} is shared from another model and its post-load "
                "processing changed its layout"
            )
        shape, stride, dtype, offset = record.layout
        storage = t.untyped_storage()
        if storage.data_ptr() != record.storage:  # moved into another buffer
            offset = int(t.storage_offset())
        span = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True))
        need = (offset + span) * dtype.itemsize
        if need > storage.nbytes():
            raise DirectReloadError(
                f"direct reload: {name} has a storage of {storage.nbytes()} bytes; its "
                f"checkpoint layout {list(shape)} {dtype} needs {need}"
            )
        views.append((t, storage_view(storage, offset, shape, stride, dtype)))
    return views


def _name_of(model: nn.Module, module: nn.Module, leaf: str) -> str:
    """``module``'s ``leaf`` by its qualified name in ``model`` (for messages)."""
    path = next((n for n, m in model.named_modules() if m is module), "?")
    return f"{path}.{leaf}" if path else leaf


@torch.no_grad()
def begin_direct_reload(model: nn.Module) -> None:
    """Make every tensor writable by its checkpoint weight loader, in place.

    Everything that can refuse the reload is checked first and raises with the model
    untouched; once this returns, the model holds checkpoint-layout bytes until a finish.

    Args:
        model: a model whose checkpoint layout was recorded (``record_checkpoint_layout``).

    Returns:
        ``None``; the model's own ``load_weights`` then writes the update in place.

    >>> model = torch.nn.Linear(2, 2)
    >>> record_checkpoint_layout(model)
    >>> begin_direct_reload(model)
    >>> _ = model.load_state_dict({"weight": torch.eye(2), "bias": torch.ones(2)})
    >>> finish_direct_reload(model)  # the modules whose post-load hook ran: none here
    []
    >>> model.bias.tolist()
    [1.0, 1.0]
    """
    if "_ckpt_param_names" not in model.__dict__:
        raise DirectReloadError(
            f"{type(model).__name__}: no checkpoint layout was recorded; call "
            "record_checkpoint_layout(model) after the first load"
        )
    if direct_reload_active(model):
        raise DirectReloadError(f"{type(model).__name__}: a direct reload is already begun")
    modules, slots = _slots(model)
    _check_params_kept(model, modules)
    views = _checkpoint_views(model, slots)
    # Nothing above changed the model.
    model.__dict__["_direct_reload_begun"] = True  # one finish per begin
    for t, view in views:
        t.data = view  # no zeroing: the full update rewrites the checkpoint region
    owner = model.__dict__["_ckpt_owner"]
    for *_, t in slots:
        attrs = t.__dict__
        record = attrs.get("_ckpt")
        if record is None or record.owner is not owner:
            continue
        if record.attrs or not _LOADER_ATTR_SET.isdisjoint(attrs):
            for k in LOADER_ATTRS:
                attrs.pop(k, None)
            attrs.update(record.attrs)
    # Padding the loaders skip is reset whole; that erases the checkpoint region too, so an
    # update must resend every padded weight.
    for module, name in model.__dict__["_ckpt_padding_fill"]:
        t = module._parameters.get(name)
        if t is not None and _owned(model, t):
            t.data.zero_()


@torch.no_grad()
def finish_direct_reload(model: nn.Module) -> list[str]:
    """Run the post-load processing again (every module's hook, children first).

    Args:
        model: a model between ``begin_direct_reload`` and this call.

    Returns:
        The modules whose post-load hook ran (``finalize_model_weights``).
    """
    if not model.__dict__.pop("_direct_reload_begun", False):
        # e.g. a retry after a failed finish, which may have processed some modules already
        raise DirectReloadError(
            f"{type(model).__name__}: direct reload finish without a begin; start a new update"
        )
    if model.__dict__["_ckpt_tree"][2]:  # a tensor off the CPU when the layout was recorded
        torch.accelerator.synchronize()  # loaders may have written on other streams
    return finalize_model_weights(model)
