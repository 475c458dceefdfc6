"""The dry load: a load simulated on the meta device. The one part of ``loadkit_inspect``
that imports torch (imported only when a model is inspected).

The model is built on ``meta``; the checkpoint becomes meta tensors of its shapes and dtypes, in
the order ``Checkpoint.weights()`` would yield them; then the model's own ``load_weights`` (or an
``AutoWeightsLoader`` with the mapper) runs on them. Copying into a meta tensor does nothing, so
the real loading code runs, with the real mapper, skip rules and ``weight_loader``s, and the
ledgers it leaves say where each name went: the report agrees with a real load. Where a real load
stops at the first problem, this one collects them all.

- ``weights``: the checkpoint as meta tensors that carry their key;
- ``recording``: each pass's ``weight_loader`` calls and writes into the model;
- ``observer``: which ledger took which key (``loadkit.loading.observe``), no class patched;
- ``run``: the passes, linear in the number of names;
- ``outcome``: from what was recorded to the report's load section.
"""

from __future__ import annotations

from loadkit.errors import require_torch

require_torch(__name__)  # one line naming the extra, not "No module named torch"

from collections.abc import Sequence
from typing import NamedTuple

from torch import nn

from loadkit.checkpoint import TensorInfo
from loadkit.loading import (
    Tracked,
    forget_parts,
    loadable_tensors,
    meta_copy,
    track_weights_loading,
)
from loadkit.mapper import WeightsMapper
from loadkit_inspect.options import LoadRules
from loadkit_inspect.progress import Count
from loadkit_inspect.report.records import LoadReport
from loadkit_inspect.simulate.outcome import assemble, model_summary
from loadkit_inspect.simulate.run import run_passes

__all__ = ["DryLoad", "dry_load", "model_summary"]


class DryLoad(NamedTuple):
    report: LoadReport
    mapper: WeightsMapper | None  # the mapper the root AutoWeightsLoader loaded with
    auto_loader_at_root: bool  # did the model load through an AutoWeightsLoader rooted at it?
    # The load as vLLM 0.34.0's track_weights_loading judges it (loadkit.loading.track).
    tracked: Tracked | None = None


def dry_load(
    model: nn.Module,
    infos: Sequence[TensorInfo],
    *,
    mapper: WeightsMapper | None = None,
    replace_mapper: bool = False,
    extend: WeightsMapper | None = None,
    rules: LoadRules | None = None,
    progress: Count | None = None,
) -> DryLoad:
    """Simulate loading ``infos`` into ``model`` (on ``meta``) and account for both sides.

    Args:
        model: the model (copied to ``meta`` unless it is all on ``meta`` already).
        infos: the checkpoint's tensors, in the order ``Checkpoint.weights()`` yields them.
        mapper: the mapper to load with when the model has no ``load_weights`` of its own; with
            ``replace_mapper``, the one its root ``AutoWeightsLoader`` uses in place of its own.
        extend: rules the root ``AutoWeightsLoader`` applies after its own, stage by stage.
        rules: rules added to the root AutoWeightsLoader's, and rules for the verdict.
        progress: called with (names fed, names in all) as each pass feeds the model.

    Returns:
        The load report, the mapper the root ``AutoWeightsLoader`` used, and whether there was
        one (a hand-written ``load_weights`` may load without).

    Example:
        >>> import torch
        >>> from loadkit.checkpoint.reader import TensorInfo
        >>> info = TensorInfo("wieght", "F32", (2, 2), 16, "m.safetensors", 8)
        >>> report = dry_load(torch.nn.Linear(2, 2, bias=False), [info]).report
        >>> [(u.name, u.suggestions) for u in report.unexpected]
        [('wieght', ['weight'])]
    """
    rules = rules or LoadRules()
    model = meta_copy(model)
    forget_parts(model)  # the shards and experts an earlier load recorded
    tensors = loadable_tensors(model)
    sim = run_passes(
        model,
        infos,
        mapper=mapper,
        replace_mapper=replace_mapper,
        rules=rules,
        tensors=tensors,
        extend=extend,
        progress=progress,
    )
    used = sim.observer.root_mapper()
    ran = bool(sim.observer.used)
    report = assemble(sim.tensors, infos, sim, used if ran else mapper, rules)
    tracked = track_weights_loading(model, unfilled=[m.name for m in report.missing])
    return DryLoad(report, used, ran, tracked)
