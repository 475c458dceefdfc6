import pytest

from loadkit import WeightsMapper
from loadkit.errors import LoadkitError
from loadkit.pooling.probe import lookup_name, match_prefix, predict_probe

PARAMS = {"language_model.model.embed.weight", "language_model.model.layer0.weight"}
GEMMA = WeightsMapper(orig_to_new_prefix={"model.language_model.": "language_model.model."})
KEYS = [(f"model.language_model.{n}", 100) for n in ("embed.weight", "layer0.weight", "x", "y")]


def test_old_never_hits_with_mapped_layout_and_holds_everything():
    v = predict_probe(KEYS, PARAMS, mapper=GEMMA, behaviour="old")
    assert not v.hit and v.prefix is None
    assert (v.walked, v.walked_bytes, v.forwarded, v.forwarded_bytes) == (4, 400, 4, 400)
    assert v.walked_names == tuple(k for k, _ in KEYS)


def test_clones_only_for_a_load_format_that_may_reuse_buffers():
    # vLLM 0.34.0's _OWNED_TENSOR_LOAD_FORMATS: held as they are; any other format: clones
    for fmt, cloned in (("auto", False), ("safetensors", False), ("fastsafetensors", True)):
        v = predict_probe(KEYS, PARAMS, mapper=GEMMA, behaviour="old", load_format=fmt)
        assert (v.cloned, v.load_format, v.walked_bytes) == (cloned, fmt, 400)


def test_new_hits_first_key_through_the_mapper():
    v = predict_probe(KEYS, PARAMS, mapper=GEMMA, behaviour="new")
    assert (v.prefix, v.hit_index, v.hit_key, v.walked, v.walked_bytes) == (
        "",
        0,
        KEYS[0][0],
        1,
        100,
    )
    assert (v.forwarded, v.walked_names) == (4, (KEYS[0][0],))


def test_headless_checkpoint_found_under_model_prefix():
    params = {"model.embed.weight"}
    for b in ("old", "new"):
        v = predict_probe([("embed.weight", 8)], params, behaviour=b)
        assert v.prefix == "model." and v.walked == 1


def test_mapper_none_keys_are_walked_and_skipped():
    m = WeightsMapper(orig_to_new_substr={"vision": None}, orig_to_new_prefix={"hf.": ""})
    keys = [("hf.vision.a", 1), ("hf.vision.b", 1), ("hf.w", 1)]
    v = predict_probe(keys, {"w"}, mapper=m, behaviour="new")
    assert (v.prefix, v.hit_index, v.walked) == ("", 2, 3)
    assert lookup_name("hf.vision.a", m, "new") is None
    assert lookup_name("hf.vision.a", m, "old") == "hf.vision.a"


def test_prefix_order_empty_first():
    assert match_prefix("w", {"w", "model.w"}) == ""
    assert match_prefix("w", {"model.w"}) == "model."
    assert match_prefix("w", set()) is None
    with pytest.raises(LoadkitError, match="behaviour must be 'old' or 'new'"):
        lookup_name("w", None, "newer")
