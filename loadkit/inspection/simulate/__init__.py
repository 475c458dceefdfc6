"""The dry load: a load simulated on the meta device. The one part of ``loadkit.inspection``
that imports torch (imported only when a model is inspected).

The model is built on ``meta``; the checkpoint becomes meta tensors of its shapes and dtypes, in
the order ``Checkpoint.weights()`` would yield them; then the model's own ``load_weights`` (or an
``AutoWeightsLoader`` with the mapper) runs on them. Copying into a meta tensor does nothing, so
the real loading code runs, with the real mapper, skip rules and ``weight_loader``s, and the
ledgers it leaves say where each name went: the report agrees with a real load. Where a real load
stops at the first problem, this one collects them all.

- ``meta``: the model and the checkpoint as meta tensors;
- ``recording``: each pass's ``weight_loader`` calls and writes into the model;
- ``observer``: which ledger took which key (``loadkit.loading.observe``), no class patched;
- ``run``: the passes, linear in the number of names;
- ``outcome``: from what was recorded to the report's load section.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from loadkit.checkpoint.reader import TensorInfo
from loadkit.inspection.records import LoadReport
from loadkit.inspection.simulate.meta import meta_copy, model_summary
from loadkit.inspection.simulate.outcome import assemble
from loadkit.inspection.simulate.run import simulate
from loadkit.mapper import WeightsMapper

__all__ = ["dry_load", "meta_copy", "model_summary"]


def dry_load(
    model: nn.Module,
    infos: Sequence[TensorInfo],
    *,
    mapper: WeightsMapper | None = None,
    replace_mapper: bool = False,
) -> tuple[LoadReport, WeightsMapper | None]:
    """Simulate loading ``infos`` into ``model`` (on ``meta``) and account for both sides.

    With its own ``load_weights`` the model loads itself (with its own mapper, or ``mapper`` in
    its place when ``replace_mapper``); without, ``AutoWeightsLoader(model).load_weights(weights,
    mapper=mapper)`` does. Returns the report and the mapper the root ``AutoWeightsLoader`` used
    (``None`` when the model loads without one).
    """
    model = meta_copy(model)
    sim = simulate(model, infos, mapper=mapper, replace_mapper=replace_mapper)
    used = sim.observer.root_mapper()
    return assemble(model, infos, sim, used if sim.observer.used else mapper), used
