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
    """Each mapper's load with the broken names set aside (as the notebook's toggle shows them),
    and what vLLM 0.34.0's check after the load refuses."""
    from loadkit.loading.track import track_weights_loading

    ck = open_checkpoint(CHECKPOINT)
    checkpoint = dict(ck.weights())
    out = {}
    for behaviour, mapper in mappers().items():
        model = vt.VisionTower(vt.config_from_checkpoint(ck.tensors))
        loader = AutoWeightsLoader(model, ignore_unexpected_suffixes=["qkqkv_proj"])
        loaded = loader.load_weights(ck.weights(), mapper=mapper)
        refused = track_weights_loading(model, loaded).refused
        rows = vt.qkv_rows(model, checkpoint)
        out[behaviour] = load_record(behaviour, rows, None, loaded, refused=refused)
    return out
