"""A checkpoint tensor without data, that remembers how a loader slices it (vLLM 0.34.0's
``reload/trace.py``).

While the load plan traces ``load_weights``, each checkpoint tensor is a ``TraceTensor``: a meta
tensor subclass of the checkpoint's shape and dtype. A view op on it (``VIEW_OPS``) returns a
child whose ``geom`` is the same view taken of a contiguous meta tensor of the checkpoint shape,
so its offset and strides say which checkpoint element each of its elements is. What a trace
cannot settle alone (a ``copy_`` from it, any other op, a read of its values) goes to the bake's
sink (``loadkit.reload.bake``), which decides what it means for the plan. Nothing moves data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn, Protocol

import torch
from torch.utils import _pytree as pytree


class Sink(Protocol):
    """What a trace hands over (the bake's ``PlanSink``)."""

    def accept_copy(self, dest: torch.Tensor, src: TraceTensor) -> torch.Tensor: ...

    def value_read(self, trace: TraceTensor) -> NoReturn: ...

    def unsupported(
        self, func: Callable, args: tuple, kwargs: dict, traces: list[TraceTensor]
    ) -> Any: ...


# Pure views of their input; ``contiguous`` copies, but keeps each element where it was.
VIEW_OPS = frozenset(
    {
        torch.Tensor.narrow,
        torch.Tensor.view,
        torch.Tensor.reshape,
        torch.Tensor.__getitem__,
        torch.Tensor.unsqueeze,
        torch.Tensor.squeeze,
        torch.Tensor.transpose,
        torch.Tensor.t,
        torch.Tensor.permute,
        torch.Tensor.flatten,
        torch.Tensor.unflatten,
        torch.Tensor.contiguous,
        torch.Tensor.chunk,
        torch.Tensor.split,
        torch.Tensor.unbind,
    }
)

# Calls that need the values on the host.
VALUE_READS = frozenset(
    {
        torch.Tensor.item,
        torch.Tensor.tolist,
        torch.Tensor.numpy,
        torch.Tensor.__bool__,
        torch.Tensor.__int__,
        torch.Tensor.__float__,
        torch.Tensor.__index__,
    }
)


class TraceTensor(torch.Tensor):
    """A storage-less stand-in for (part of) the checkpoint tensor named ``key``.

    ``geom`` is a meta view over a contiguous meta tensor of the checkpoint's shape, or ``None``
    once this tensor no longer is a view of the checkpoint tensor (``lost`` says why).
    """

    key: str
    sink: Sink
    geom: torch.Tensor | None
    lost: str | None

    @staticmethod
    def __new__(
        cls,
        name: str,
        shape: torch.Size,
        dtype: torch.dtype,
        sink: Sink,
        geom: torch.Tensor | None,
        lost: str | None = None,
    ) -> TraceTensor:
        t = torch.Tensor._make_wrapper_subclass(
            cls, shape, dtype=dtype, device=torch.device("meta"), requires_grad=False
        )
        t.key, t.sink, t.geom, t.lost = name, sink, geom, lost
        return t

    @classmethod
    def checkpoint(
        cls, name: str, shape: torch.Size, dtype: torch.dtype, sink: Sink
    ) -> TraceTensor:
        """The whole checkpoint tensor ``name``."""
        geom = torch.empty(shape, dtype=dtype, device="meta")
        return cls(name, shape, dtype, sink, geom)

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return f"TraceTensor({self.key!r}, {list(self.shape)}, {self.dtype})"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.copy_:
            src = args[1] if len(args) > 1 else kwargs.get("src")
            if isinstance(src, cls) and not isinstance(args[0], cls):
                return src.sink.accept_copy(args[0], src)
        first = args[0] if args else None
        if isinstance(first, cls):
            if func in VIEW_OPS:
                return first._view(func, args[1:], kwargs)
            if func is torch.Tensor.to and first._keeps_bytes(args[1:], kwargs):
                return first
            if func in VALUE_READS:
                return first.sink.value_read(first)
        # Metadata (shape, dtype, numel) is answered by the subclass itself; an op that needs
        # data reaches __torch_dispatch__ below.
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    def _keeps_bytes(self, args: tuple, kwargs: dict) -> bool:
        """``.to(...)`` that keeps the dtype (``.to(param.device)``): a trace has no device."""
        kwargs = {k: v for k, v in kwargs.items() if k != "copy"}
        try:
            _, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        except (TypeError, RuntimeError):
            return False
        return dtype is None or dtype == self.dtype

    def _view(self, func: Callable, args: tuple, kwargs: dict) -> Any:
        """The view op run on ``geom`` for the children's shapes and geometry (on a plain meta
        tensor once the geometry is lost or the op fails on it)."""
        op = func.__name__
        out: Any = None
        lost = self.lost
        with torch._C.DisableTorchFunctionSubclass():
            if self.geom is not None:
                try:
                    out = self.geom if op == "contiguous" else func(self.geom, *args, **kwargs)
                except Exception:
                    out = None
            if out is None:
                lost = lost or f"{op} that is not a view of the checkpoint tensor"
                meta = torch.empty(self.shape, dtype=self.dtype, device="meta")
                out = func(meta, *args, **kwargs)
        base = self.geom if lost is None else None
        if isinstance(out, torch.Tensor):
            return self._child(out, base, lost, op)
        return type(out)(self._child(o, base, lost, op) for o in out)

    def _child(
        self, out: torch.Tensor, base: torch.Tensor | None, lost: str | None, op: str
    ) -> TraceTensor:
        if base is not None and (
            out.untyped_storage()._cdata != base.untyped_storage()._cdata
            or out.dtype.itemsize != base.dtype.itemsize
        ):
            reason = f"{op} that copies or reinterprets elements"
            return TraceTensor(self.key, out.shape, out.dtype, self.sink, None, reason)
        geom = out if base is not None else None
        return TraceTensor(self.key, out.shape, out.dtype, self.sink, geom, lost)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[override]
        # A trace reaching aten means an op outside VIEW_OPS.
        kwargs = kwargs or {}
        traces = [a for a in pytree.arg_tree_leaves(*args, **kwargs) if isinstance(a, cls)]
        return traces[0].sink.unsupported(func, args, kwargs, traces)
