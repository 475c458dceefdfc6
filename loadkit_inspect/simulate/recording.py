"""What one pass of the dry load saw: each ``weight_loader`` call and each write into the model.

Every parameter's ``weight_loader`` is wrapped (on the meta copy, for the run only): a weight
loader that fails (a shape mismatch) is recorded with the checkpoint key it was handed, and the
walk goes on. A ``TorchDispatchMode`` sees every ``copy_`` into a model tensor, so a
``load_weights`` that bypasses ``weight_loader`` (``param.data.copy_``) still counts as filling
its parameter.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from loadkit.checkpoint import TensorInfo
from loadkit.loading import EagerDispatchMode, default_weight_loader
from loadkit_inspect.progress import Count
from loadkit_inspect.simulate.weights import carry_key, meta_weight


@dataclass
class Call:
    """One ``weight_loader`` call."""

    param: str
    key: str | None
    param_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]
    param_dtype: torch.dtype
    weight_dtype: torch.dtype
    error: BaseException | None = None


@dataclass
class Pass:
    """One run of the model's ``load_weights`` over (part of) the checkpoint."""

    start: int = 0  # index of the first key fed; 0: a full pass
    current: str | None = None  # the key last pulled from the stream
    pulled: list[str] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    writes: list[tuple[str, str | None]] = field(default_factory=list)  # (tensor, current key)
    # Copies into a storage the model did not have when the pass began (a tensor the load
    # registers itself, as upstream's lm_head bias): resolved against the model afterwards.
    # Holding the destination keeps its storage from being freed and its id reused meanwhile.
    late_writes: list[tuple[torch.Tensor, str | None]] = field(default_factory=list)
    exhausted: bool = False  # every weight was read

    def stream(
        self,
        infos: Sequence[TensorInfo],
        excluded: dict[str, Any],
        progress: Count | None = None,
        weights: list[torch.Tensor] | None = None,
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The checkpoint from ``start`` on, as meta tensors, leaving ``excluded`` keys out;
        ``progress`` is called with (names passed, names in all) before each name and at the
        end. ``weights``: the meta tensors made beforehand (``premade``), last key first; each is
        let go as it is fed. Without them each is made as it is fed."""
        total = len(infos)
        for done, info in enumerate(infos[self.start :], self.start):
            if progress is not None:
                progress(done, total)
            if info.name in excluded:
                continue
            self.current = info.name
            self.pulled.append(info.name)
            yield info.name, meta_weight(info) if weights is None else weights.pop()
        self.exhausted = True
        if progress is not None:
            progress(total, total)


def premade(infos: Sequence[TensorInfo], excluded: dict[str, Any]) -> list[torch.Tensor]:
    """The meta tensors of a full pass (every key not ``excluded``), last key first, made before
    the pass starts: outside the dry load's dispatch mode a ``torch.empty`` costs a tenth of
    what it costs inside (2 against 18 µs: 200,000 keys, 3 s). Each key has a storage of its own,
    as a real tensor has."""
    return [meta_weight(info) for info in reversed(infos) if info.name not in excluded]


class Recorder:
    """The pass being recorded; the wrapped loaders and the write watcher report to it."""

    def __init__(self) -> None:
        self.now = Pass()

    def call(self, name: str, param: torch.Tensor, weight: Any) -> Call:
        key = getattr(weight, "loadkit_key", None) or self.now.current
        call = Call(
            name,
            key,
            tuple(param.shape),
            tuple(getattr(weight, "shape", ())),
            param.dtype,
            getattr(weight, "dtype", param.dtype),
        )
        self.now.calls.append(call)
        return call


def _recording_weight_loader(name: str, loader: Any, recorder: Recorder) -> Any:
    def recording_weight_loader(param: torch.Tensor, loaded_weight: Any, *args, **kwargs) -> Any:
        call = recorder.call(name, param, loaded_weight)
        try:
            return loader(param, loaded_weight, *args, **kwargs)
        except (Exception, SystemExit) as exc:  # collected: the report lists every failing load
            call.error = exc
            return None

    recording_weight_loader.wrapped = loader  # type: ignore[attr-defined]
    return recording_weight_loader


@contextmanager
def recording_weight_loaders(
    tensors: dict[str, torch.Tensor], recorder: Recorder
) -> Iterator[None]:
    """Give every tensor (the model's, by name) a recording ``weight_loader`` for the block."""
    restore: list[tuple[torch.Tensor, Any]] = []
    for name, tensor in tensors.items():
        original = getattr(tensor, "weight_loader", None)
        restore.append((tensor, original))
        loader = original or default_weight_loader
        tensor.weight_loader = _recording_weight_loader(name, loader, recorder)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for tensor, original in restore:
            if original is None:
                del tensor.weight_loader  # type: ignore[attr-defined]
            else:
                tensor.weight_loader = original  # type: ignore[attr-defined]


def storage_id(tensor: torch.Tensor) -> int | None:
    """An id shared by a tensor and every view of it (meta tensors included); ``None`` for a
    tensor without storage. Wraps torch's private ``_cdata``: tested in test_simulate.py."""
    try:
        return tensor.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return None


_COPY = torch.ops.aten.copy_.default  # looked up once: every op of the dry load comes here


class WriteWatcher(EagerDispatchMode):
    """Sees every ``copy_`` into a model tensor, by storage, whichever path made it; and hands
    each weight's key on to what is computed from it (``weights.carry_key``).

    Meta tensors have storage objects too, and views of a parameter (``param.data[0:2]``) share
    its storage.
    """

    def __init__(self, tensors: dict[str, torch.Tensor], recorder: Recorder) -> None:
        super().__init__()
        self.storages = {storage_id(t): name for name, t in tensors.items()}
        self.storages.pop(None, None)
        self.names = set(tensors)
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _COPY:
            ident = storage_id(args[0])
            if ident is not None:
                now = self.recorder.now
                name = self.storages.get(ident)
                if name is not None:
                    now.writes.append((name, now.current))
                else:
                    now.late_writes.append((args[0], now.current))
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        carry_key(args, kwargs, out)  # what a loader computes from a weight keeps its key
        return out

    def resolve_late_writes(self, tensors: dict[str, torch.Tensor], now: Pass) -> None:
        """Credit ``now``'s copies into tensors the load registered itself: ``tensors`` are the
        model's after the pass."""
        if not now.late_writes:
            return
        added = {storage_id(t): n for n, t in tensors.items() if n not in self.names}
        for tensor, key in now.late_writes:
            name = added.get(storage_id(tensor))
            if name is not None:
                now.writes.append((name, key))
        now.late_writes.clear()
