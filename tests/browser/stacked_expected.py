"""What notebook 06's toggle must show, computed here with the same public calls the notebook
makes (the mappers, the loads, ``qkv_rows``), independently of the page."""

from __future__ import annotations

from loadkit import AutoWeightsLoader, WeightsMapper, open_checkpoint
from loadkit.models import vision_tower as vt
from loadkit_notebooks.scenario import Record
from loadkit_notebooks.stories.stacked_mapper import (
    CHECKPOINT,
    load_record,
    mapping_figure,
    rows_figure,
)

__all__ = ["main_records", "mapping", "mapping_figure", "rows_figure"]


def mappers() -> dict[str, WeightsMapper]:
    return {b: WeightsMapper(orig_to_new_stacked=vt.QKV_RULES, behaviour=b) for b in ("old", "new")}


def mapping() -> dict[str, dict]:
    """behaviour -> checkpoint key -> trace, as the notebook's mapping chart draws them."""
    names = list(open_checkpoint(CHECKPOINT).tensors)
    return {b: {n: m.trace(n) for n in names} for b, m in mappers().items()}


def main_records() -> dict[str, Record]:
    ck = open_checkpoint(CHECKPOINT)
    checkpoint = dict(ck.weights())
    out = {}
    for behaviour, mapper in mappers().items():
        model = vt.VisionTower(vt.config_from_checkpoint(ck.tensors))
        try:
            loaded = AutoWeightsLoader(model).load_weights(ck.weights(), mapper=mapper)
            error = None
        except ValueError as exc:
            loaded, error = None, exc
        out[behaviour] = load_record(behaviour, vt.qkv_rows(model, checkpoint), error, loaded)
    return out
