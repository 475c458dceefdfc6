"""The load plan's bake (vLLM 0.34.0's ``reload/bake.py``): ``load_weights`` run once over
``TraceTensor``s on the model's real tensors, as ``begin_direct_reload`` left them, recording
each ``copy_`` from a trace and every reason a name cannot be written directly.

A trace has no data, so nothing it feeds reaches memory: its ``copy_`` is recorded, and any other
op on it runs on meta copies of its arguments. Ops on real tensors alone run for real: a loader
that reads a checkpoint tensor (``composed_weight_loader``'s ``param.copy_(fn(param))``) makes the
name that last wrote it a fallback (``TargetGuard``), and constant writes (``fill_``,
``zero_``) happen, mid-update, and stay out of the plan.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, NoReturn, cast

import torch
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from loadkit.errors import LoadPlanError, TraceStopped
from loadkit.loading.tensors import loadable_tensors
from loadkit.reload.trace import TraceTensor

_META = torch.device("meta")
VALUE_READ = "its loader reads tensor values (.item(), bool(), ...)"


class ParamMeta(NamedTuple):
    """A checkpoint tensor as declared to the plan: its name, shape and dtype (upstream's
    ``weight_transfer.base.ParamMeta``)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


def storage_key(t: torch.Tensor) -> int:
    """The identity of ``t``'s storage (two views of one storage share it)."""
    return t.untyped_storage()._cdata


@dataclass
class Target:
    """A checkpoint tensor of the model, as a write destination."""

    module: str
    tensor: str
    real: torch.Tensor
    byte_offset: int  # in its storage, as begin_direct_reload viewed it


class Targets:
    """Every checkpoint tensor (one ``record_checkpoint_layout`` recorded), by storage and by
    name. Writes into a storage are labelled with its first target."""

    def __init__(self, model: nn.Module) -> None:
        self.by_storage: dict[int, Target] = {}
        self.by_name: dict[tuple[str, str], Target] = {}
        for name, t in loadable_tensors(model).items():
            if "_ckpt" in t.__dict__:
                module, _, leaf = name.rpartition(".")
                target = Target(module, leaf, t, int(t.storage_offset()) * t.dtype.itemsize)
                self.by_storage.setdefault(storage_key(t), target)
                self.by_name[(module, leaf)] = target


class Copy(NamedTuple):
    """One ``dest.copy_(src)`` from a trace."""

    src: TraceTensor
    storage: int  # the destination's storage key
    byte_offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


@dataclass
class PlanSink:
    """One bake's record: copies per name, fallbacks and why, names that stopped their loader."""

    targets: Targets
    copies: dict[str, list[Copy]] = field(default_factory=lambda: defaultdict(list))
    fallback: dict[str, str] = field(default_factory=dict)
    # Names that stopped their loader, kept even though they also raise: a loader may catch the
    # exception and carry on, and the name must fall back all the same.
    stops: dict[str, str] = field(default_factory=dict)
    wrote: set[str] = field(default_factory=set)  # names that copied anywhere
    last_writer: dict[int, str] = field(default_factory=dict)  # per storage
    # The name last handed to load_weights, or last copied from: blamed for a read of a
    # destination that no copy preceded.
    current: str | None = None
    closed: bool = False  # a trace kept by a loader must not be used after the bake

    def mark(self, name: str, reason: str) -> None:
        self.fallback.setdefault(name, reason)

    def _check_open(self, trace: TraceTensor) -> None:
        if self.closed:
            raise LoadPlanError(
                f"load plan: a planning trace of {trace.key!r} was used after planning: a "
                "loader keeps an incoming tensor across load_weights calls"
            )

    def accept_copy(self, dest: torch.Tensor, src: TraceTensor) -> torch.Tensor:
        self._check_open(src)
        name = self.current = src.key
        self.wrote.add(name)
        key = storage_key(dest)
        self.last_writer[key] = name
        offset = int(dest.storage_offset()) * dest.dtype.itemsize
        copy = Copy(src, key, offset, tuple(dest.shape), dest.stride(), dest.dtype)
        self.copies[name].append(copy)
        return dest

    def value_read(self, trace: TraceTensor) -> NoReturn:
        self._check_open(trace)
        self.stops.setdefault(trace.key, VALUE_READ)
        raise TraceStopped(trace.key, VALUE_READ)

    def unsupported(
        self, func: Callable, args: tuple, kwargs: dict, traces: list[TraceTensor]
    ) -> Any:
        """Mark the names fallbacks and run ``func`` on meta copies of its arguments (it writes
        no real tensor); tensor results become traces of the first name, without geometry."""
        self._check_open(traces[0])
        if _writes_a_real_tensor(func, args, kwargs):
            reason = f"writes it without Tensor.copy_ ({func.__name__})"
            self.wrote.update(t.key for t in traces)
        else:
            reason = f"applies {func.__name__} to it"
        for t in traces:
            self.mark(t.key, reason)
        first = traces[0]
        flat, spec = pytree.tree_flatten((args, kwargs))
        metas = [_to_meta(a) for a in flat]
        meta_args, meta_kwargs = pytree.tree_unflatten(metas, spec)
        try:
            out = func(*meta_args, **meta_kwargs)
        except Exception as exc:  # no meta kernel, a shape error, ...
            why = f"{func.__name__} fails on meta"
            self.stops.setdefault(first.key, why)
            raise TraceStopped(first.key, why) from exc
        originals = {id(m): a for m, a in zip(metas, flat, strict=True)}

        def wrap(o: Any) -> Any:
            if not isinstance(o, torch.Tensor):
                return o
            if id(o) in originals:  # in place: the argument itself
                return originals[id(o)]
            return TraceTensor(first.key, o.shape, o.dtype, self, None, reason)

        return pytree.tree_map(wrap, out)


def _to_meta(a: Any) -> Any:
    if isinstance(a, TraceTensor):
        return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=_META)
    return a.to(_META) if isinstance(a, torch.Tensor) else a


def _writes_a_real_tensor(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether ``func`` writes an argument that is not a trace (in place, or ``out=``)."""
    schema = getattr(func, "_schema", None)
    for i, arg in enumerate(getattr(schema, "arguments", ())):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        leaves = pytree.tree_leaves(value)
        if any(isinstance(t, torch.Tensor) for t in leaves) and not any(
            isinstance(t, TraceTensor) for t in leaves
        ):
            return True
    return False


# Ops that read only a tensor's metadata.
_METADATA_OPS = {
    torch.ops.aten.empty_like,
    torch.ops.aten.zeros_like,
    torch.ops.aten.ones_like,
    torch.ops.aten.full_like,
    torch.ops.aten.new_empty,
    torch.ops.aten.new_empty_strided,
    torch.ops.aten.new_zeros,
    torch.ops.aten.new_ones,
    torch.ops.aten.new_full,
}
# Writes into a tensor that do not read it: their first argument is written, not read.
_CONSTANT_WRITES = {
    torch.ops.aten.copy_,
    torch.ops.aten.fill_,
    torch.ops.aten.zero_,
    torch.ops.aten.index_put_,
}


class TargetGuard(TorchDispatchMode):
    """Ops on real tensors run for real; one that reads a checkpoint tensor (not a view, not
    only its metadata) makes the name last written into that storage (or the name being
    loaded) a fallback: the direct path would skip that read. Reads that bypass the dispatcher
    (``tolist()`` of a CPU tensor) go unseen."""

    def __init__(self, sink: PlanSink) -> None:
        super().__init__()
        self.sink = sink

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = [a for a in pytree.arg_tree_leaves(*args, **kwargs) if isinstance(a, torch.Tensor)]
        if not any(isinstance(a, TraceTensor) for a in leaves):
            packet = func.overloadpacket
            if not func.is_view and packet not in _METADATA_OPS:
                read = args[1:] if packet in _CONSTANT_WRITES else args
                self._check_reads(packet, pytree.arg_tree_leaves(*read, **kwargs))
        return func(*args, **kwargs)

    def _check_reads(self, packet: Any, leaves: list) -> None:
        for a in leaves:
            if not isinstance(a, torch.Tensor) or isinstance(a, TraceTensor):
                continue
            key = storage_key(a)
            if key in self.sink.targets.by_storage:
                name = self.sink.last_writer.get(key, self.sink.current)
                if name is not None:
                    self.sink.mark(name, f"its loader reads the destination ({packet})")
                return


def _stopped(exc: BaseException) -> TraceStopped | None:
    """The ``TraceStopped`` behind ``exc`` (a loader may have wrapped it), or ``None``."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, TraceStopped):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def bake(model: nn.Module, metas: Mapping[str, ParamMeta], targets: Targets) -> PlanSink:
    """Trace ``model.load_weights`` over every name in one pass. A name that stops its loader
    unwinds ``load_weights``; it falls back, and ``load_weights`` is called again with the names
    after it, on the same sink. State a loader sets on modules stays, as after a load."""
    sink = PlanSink(targets)
    names = list(metas)

    def weights(rest: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
        for name in rest:
            meta = metas[name]
            sink.current = name
            yield name, TraceTensor.checkpoint(name, torch.Size(meta.shape), meta.dtype, sink)

    start = 0
    try:
        with torch.no_grad(), TargetGuard(sink):
            while start < len(names):
                try:
                    cast(Any, model).load_weights(weights(names[start:]))
                    break
                except Exception as exc:
                    stop = _stopped(exc)
                    if stop is None:
                        raise
                    at = names.index(stop.name)  # resume after it (a loader may read ahead)
                    if at < start:
                        raise LoadPlanError(
                            f"load plan: a loader reads the values of {stop.name!r} after "
                            "later names arrived (it keeps an incoming tensor across names)"
                        ) from exc
                    start = at + 1
    finally:
        sink.closed = True
    return sink


@dataclass
class Traced:
    copies: dict[str, list[Copy]]  # per name
    reasons: dict[str, str]  # fallback names and why
    lonely: list[str]  # fallbacks that wrote nothing themselves


def trace_loads(model: nn.Module, metas: Mapping[str, ParamMeta], targets: Targets) -> Traced:
    """``bake`` every name; a name that stopped its loader falls back and what it recorded
    before stopping is dropped."""
    try:
        sink = bake(model, metas, targets)
    except LoadPlanError:
        raise
    except Exception as exc:
        raise LoadPlanError(f"load plan: tracing load_weights failed: {exc!r}") from exc
    reasons = dict(sink.stops)
    for name in reasons:
        sink.copies.pop(name, None)
    lonely = [n for n in sink.fallback if n not in sink.wrote and n not in reasons]
    for name, reason in sink.fallback.items():
        reasons.setdefault(name, reason)
    return Traced(dict(sink.copies), reasons, lonely)
