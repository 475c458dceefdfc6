"""Which checkpoint rows each parameter received: measured from the copies the loaders make.

A weight loader narrows the checkpoint tensor (a view) and copies it into a slice of the
parameter (another view). ``HoldingsRecorder`` watches every ``aten.copy_`` and ``aten.fill_``
with a dispatch mode while a parameter's loader runs, and reads both views' geometry (storage
offset, shape, strides) relative to the checkpoint tensor and to the parameter: that gives the
checkpoint rows and columns read and the parameter rows and columns written. Nothing is
re-derived from the sharding formulas, so a loader that takes the wrong rows shows up as such.
The same works on the meta device (views keep their geometry without data), which is how one
rank's share is computed without processes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from loadkit.loading.counting import EagerDispatchMode
from loadkit.loading.weight_loaders import default_weight_loader, set_weight_attrs

_COPY = torch.ops.aten.copy_.default
_FILL = torch.ops.aten.fill_.Scalar

Span = tuple[int, int]  # [start, stop)


@dataclass(frozen=True)
class CopyRecord:
    """One copy into a parameter: what it read from which checkpoint key, and where it wrote.

    ``key`` is ``None`` for a fill (``fill_(0)`` of vocabulary padding rows). Spans are
    ``None`` where a view's layout is not a plain block of rows and columns.
    """

    param: str
    key: str | None
    param_rows: Span | None
    param_cols: Span | None
    ckpt_rows: Span | None
    ckpt_cols: Span | None
    numel: int
    ckpt_shape: tuple[int, ...] | None = None

    @property
    def held(self) -> tuple[str, Span] | None:
        """``("rows", span)`` or ``("cols", span)``: the checkpoint block along the axis that
        was split (columns when a copy took part of every row, as row-parallel loaders do)."""
        if self.key is None or self.ckpt_rows is None:
            return None
        shape = self.ckpt_shape or ()
        if self.ckpt_cols is not None and len(shape) == 2 and self.ckpt_cols != (0, shape[1]):
            return "cols", self.ckpt_cols
        return "rows", self.ckpt_rows

    def span_along(self, axis: str) -> Span | None:
        """The checkpoint rows (``"rows"``) or columns (``"cols"``) this copy read; a 1-d key
        has only rows. ``None`` for a copy that read no checkpoint tensor (padding)."""
        if self.key is None:
            return None
        if axis == "cols" and self.ckpt_cols is not None:
            return self.ckpt_cols
        return self.ckpt_rows

    @property
    def layer(self) -> str:
        return self.param.rpartition(".")[0]


def block(view: torch.Tensor, base: torch.Tensor) -> tuple[Span | None, Span | None]:
    """The rows and columns of ``base`` (contiguous, 1-d or 2-d) that ``view`` covers.

    >>> w = torch.arange(12.).reshape(3, 4)
    >>> block(w.narrow(0, 1, 2), w), block(w.narrow(1, 2, 2), w)
    (((1, 3), (0, 4)), ((0, 3), (2, 4)))
    """
    off = int(view.storage_offset() - base.storage_offset())
    if base.ndim <= 1:
        n = int(view.numel())
        return ((off, off + n) if view.ndim <= 1 and off >= 0 else None), None
    if base.ndim != 2 or view.ndim != 2 or off < 0:
        return None, None
    cols = int(base.shape[1])
    rows_v, cols_v = (int(d) for d in view.shape)
    if (rows_v > 1 and view.stride(0) != cols) or (cols_v > 1 and view.stride(1) != 1):
        return None, None
    r0, c0 = divmod(off, cols)
    return (r0, r0 + rows_v), (c0, c0 + cols_v)


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device.type == "meta" or b.device.type == "meta":
        return True  # no data to compare: meta views keep only their geometry
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


class _Watch(EagerDispatchMode):
    def __init__(self, recorder: HoldingsRecorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is _COPY or func is _FILL:
            self.recorder._seen(func is _COPY, args)
        return out


class HoldingsRecorder:
    """Records every copy the model's loaders make, by parameter and checkpoint key.

    >>> from loadkit.loading.auto_loader import AutoWeightsLoader
    >>> from loadkit.parallel import ColumnParallelLinear, stand_in_group, use_group
    >>> with use_group(stand_in_group(1, 2)):  # rank 1 of 2 holds output rows 3-5
    ...     layer = ColumnParallelLinear(4, 6, bias=False)
    ...     with HoldingsRecorder(layer) as rec:
    ...         weights = rec.watch([("weight", torch.ones(6, 4))])
    ...         _ = AutoWeightsLoader(layer).load_weights(weights)
    >>> rec.records[0].key, rec.records[0].ckpt_rows, rec.records[0].param_rows
    ('weight', (3, 6), (0, 3))
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.records: list[CopyRecord] = []
        self._params = dict(model.named_parameters())
        self._key: str | None = None
        self._base: torch.Tensor | None = None
        self._param: tuple[str, torch.Tensor] | None = None
        self._saved: dict[str, object] = {}
        self._mode = _Watch(self)

    # --- what is being loaded right now ---

    def watch(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Pass ``weights`` through, noting the checkpoint key and tensor being loaded."""
        for name, tensor in weights:
            self._key, self._base = name, tensor
            yield name, tensor
        self._key = self._base = None

    def _wrap(self, name: str, param: torch.Tensor) -> None:
        inner = getattr(param, "weight_loader", None)
        self._saved[name] = inner
        loader = inner or default_weight_loader

        def recorded_loader(param: torch.Tensor, loaded_weight: torch.Tensor, *args, **kwargs):
            outer, self._param = self._param, (name, param)
            try:
                return loader(param, loaded_weight, *args, **kwargs)
            finally:
                self._param = outer

        set_weight_attrs(param, {"weight_loader": recorded_loader})

    def __enter__(self) -> HoldingsRecorder:
        for name, param in self._params.items():
            self._wrap(name, param)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)
        for name, param in self._params.items():
            inner = self._saved.pop(name, None)
            if inner is None:
                delattr(param, "weight_loader")
            else:
                set_weight_attrs(param, {"weight_loader": inner})

    # --- the dispatch mode reports here ---

    def _seen(self, is_copy: bool, args: tuple) -> None:
        if self._param is None:
            return  # a copy outside any parameter's loader (a model's own bookkeeping)
        name, param = self._param
        dst = args[0]
        if not _same_storage(dst, param):
            return
        prow, pcol = block(dst, param)
        krow = kcol = key = shape = None
        if is_copy:
            src, key = args[1], self._key
            if self._base is not None and _same_storage(src, self._base):
                krow, kcol = block(src, self._base)
                shape = tuple(self._base.shape)
        self.records.append(CopyRecord(name, key, prow, pcol, krow, kcol, dst.numel(), shape))

    # --- summaries ---

    def loaded_per_layer(self) -> dict[str, int]:
        """Elements copied from the checkpoint into each layer (module), in load order."""
        out: dict[str, int] = defaultdict(int)
        for r in self.records:
            if r.key is not None:
                out[r.layer] += r.numel
        return dict(out)
