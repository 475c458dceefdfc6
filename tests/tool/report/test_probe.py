"""The pooling probe section (loadkit_inspect.report.probe): the library's records, as the report
shows them."""

from loadkit.pooling import predict_probe
from loadkit_inspect.report.probe import probe_as_dict, render_probe

KEYS = [("embed.weight", 64), ("norm.weight", 16), ("lm_head.weight", 64)]
PARAMS = {"model.norm.weight"}  # the second key, under the prefix "model."


def probe(keys=KEYS, params=PARAMS):
    return {b: predict_probe(keys, params, behaviour=b) for b in ("old", "new")}


def test_each_behaviour_is_a_line_under_the_sections_title():
    lines = render_probe(probe())
    assert lines[0] == (
        "pooling probe  (each key walked is held until prefix + name is a parameter; vLLM 0.34.0 "
        "clones them only for a load format that may reuse buffers: not for auto)"
    )
    assert [line[:7] for line in lines[1:]] == ["  old  ", "  new  "]


def test_a_hit_names_the_prefix_the_key_and_what_the_walk_held():
    old = render_probe(probe())[1]
    assert old == "  old  prefix 'model.' found at key #1 'norm.weight': holds 2 tensors (80 B)"
    cloning = {"old": predict_probe(KEYS, PARAMS, behaviour="old", load_format="fastsafetensors")}
    assert render_probe(cloning)[1].endswith("'norm.weight': clones 2 tensors (80 B)")


def test_no_hit_walks_and_holds_the_whole_checkpoint():
    records = probe(params={"unrelated.weight"})
    old = render_probe(records)[1]
    assert old == (
        "  old  no hit: walks all 3 keys, holds 3 tensors (144 B = the whole checkpoint); "
        "names forwarded unprefixed"
    )


def test_the_json_holds_every_number_the_text_gives():
    records = probe(params={"unrelated.weight"})
    doc = probe_as_dict(records)
    assert set(doc) == {"old", "new"}
    assert doc["old"] == {
        "hit": False,
        "prefix": records["old"].prefix,
        "hit_index": records["old"].hit_index,
        "hit_key": records["old"].hit_key,
        "walked": 3,
        "walked_bytes": 144,
        "cloned": False,
        "load_format": "auto",
        "total_keys": 3,
        "total_bytes": 144,
    }
