"""The stacked stage, old (vLLM 0.28.0) and new (whole components, one rule), and its properties."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from stacked_cases import LEAVES, MODULES, PACKING, PREFIXES, SUFFIXES, names, packing_rules

from loadkit import WeightsMapper
from loadkit.errors import LoadkitError, MapperConfigError
from loadkit.mapper import Rematch, rematch_examples, stacked_rematches

QKV = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v")}
KEY = "vision.layers.0.self_attn.{}.weight"


def test_default_is_old_the_qkqkv_proj_of_vllm_0_28_0():
    m = WeightsMapper(orig_to_new_stacked=QKV)
    assert m.behaviour == "old"
    assert m.map_name_with_shard(KEY.format("q_proj")) == (KEY.format("qkqkv_proj"), "v")
    assert m.map_name_with_shard(KEY.format("k_proj")) == (KEY.format("qkqkv_proj"), "v")
    assert m.map_name_with_shard(KEY.format("v_proj")) == (KEY.format("qkv_proj"), "v")
    # An already fused checkpoint key is mangled too (vLLM #48423).
    assert m.map_name_with_shard(KEY.format("qkv_proj")) == (KEY.format("qkqkv_proj"), "v")
    steps = m.trace(KEY.format("q_proj")).steps
    assert [(s.rule, s.after) for s in steps] == [
        ("q_proj", KEY.format("qkv_proj")),
        ("v_proj", KEY.format("qkqkv_proj")),
    ]


def test_new_matches_whole_components_once():
    m = WeightsMapper(orig_to_new_stacked=QKV, behaviour="new")
    for proj, shard in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v")):
        assert m.map_name_with_shard(KEY.format(proj)) == (KEY.format("qkv_proj"), shard)
        assert len(m.trace(KEY.format(proj)).steps) == 1
    assert m.map_name_with_shard(KEY.format("qkv_proj")) == (KEY.format("qkv_proj"), None)
    # Not inside a component: "xq_proj" and "q_proj_a" are other names.
    assert m.map_name("a.xq_proj.weight") == "a.xq_proj.weight"
    assert m.map_name("a.q_proj_a.weight") == "a.q_proj_a.weight"
    assert m.map_name("q_proj.bias") == "qkv_proj.bias"  # at the start of a name too


def test_new_dots_only_mark_component_edges():
    dotted = {".q_proj": (".qkv_proj", "q"), "k_proj.": ("qkv_proj.", "k")}
    m = WeightsMapper(orig_to_new_stacked=dotted, behaviour="new")
    assert m.map_name_with_shard("a.q_proj.weight") == ("a.qkv_proj.weight", "q")
    # A prefix-stripped name (what a submodule's own load_weights sees) matches too; the old
    # stage misses it: the 'k_proj' error of vLLM #51842 on MiniCPM-V 4.6.
    assert m.map_name_with_shard("q_proj.weight") == ("qkv_proj.weight", "q")
    old = WeightsMapper(orig_to_new_stacked=dotted)
    assert old.map_name_with_shard("q_proj.weight") == ("q_proj.weight", None)
    assert m.map_name_with_shard("a.k_proj") == ("a.qkv_proj", "k")


def test_new_prefers_the_longest_key_then_table_order():
    rules = {"q_proj": ("qkv_proj", "short"), "self_attn.q_proj": ("self_attn.qkv_proj", "long")}
    m = WeightsMapper(orig_to_new_stacked=rules, behaviour="new")
    assert m.map_name_with_shard("l.self_attn.q_proj.w") == ("l.self_attn.qkv_proj.w", "long")
    assert m.map_name_with_shard("l.attn.q_proj.w") == ("l.attn.qkv_proj.w", "short")
    tie = {"a": ("x", 1), "b": ("y", 2)}  # equal length: the table's order
    assert WeightsMapper(orig_to_new_stacked=tie, behaviour="new").map_name_with_shard("b.a") == (
        "b.x",
        1,
    )
    # Old: every rule in the table's order, the last match's shard id.
    old = WeightsMapper(orig_to_new_stacked=rules)
    assert old.map_name_with_shard("l.self_attn.q_proj.w") == ("l.self_attn.qkv_proj.w", "short")


def test_new_first_occurrence_only_and_drops():
    m = WeightsMapper(orig_to_new_stacked={"a": ("b", 0), "z": None}, behaviour="new")
    assert m.map_name("a.a.w") == "b.a.w"
    assert m.map_name("x.z.w") is None
    assert m.trace("x.z.w").dropped_by.rule == "z"
    # An empty target removes the component.
    assert WeightsMapper(orig_to_new_stacked={"a": ("", 0)}, behaviour="new").map_name("x.a.w") == (
        "x.w"
    )


@pytest.mark.parametrize("key", ["", ".", "a..b", ".."])
def test_new_refuses_keys_that_are_not_components(key):
    with pytest.raises(MapperConfigError, match="not dotted name components"):
        WeightsMapper(orig_to_new_stacked={key: ("x", 0)}, behaviour="new")
    WeightsMapper(orig_to_new_stacked={key: ("x", 0)})  # old builds it, as upstream


def test_behaviour_is_checked_and_keyword_only():
    with pytest.raises(LoadkitError, match="behaviour must be 'old' or 'new'"):
        WeightsMapper(behaviour="newest")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        WeightsMapper([], {}, {}, {}, {}, {}, [], "new")  # type: ignore[misc]


OTHER_STAGES = {
    "orig_to_new_regex": {r"layers\.(\d+)": r"h.\1"},
    "orig_to_new_substr": {"self_attn": "attn"},
    "orig_to_new_prefix": {"vision.": "tower.", "": "root."},
    "orig_to_new_suffix": {".weight": ".w", "bias": None},
}


def test_other_stages_do_not_depend_on_behaviour():
    old = WeightsMapper(**OTHER_STAGES)
    new = WeightsMapper(**OTHER_STAGES, behaviour="new")
    for name in ["vision.layers.0.self_attn.q_proj.weight", "x.bias", "layers.2.self_attn", "a"]:
        assert old.trace(name) == new.trace(name)
    assert new.map_name("vision.layers.0.self_attn.q_proj.weight") == "root.tower.h.0.attn.q_proj.w"


@given(name=names, regex_on=st.booleans())
def test_property_other_stages_equal_under_both(name, regex_on):
    rules = dict(OTHER_STAGES) if regex_on else {"orig_to_new_substr": {"proj": "p"}}
    assert WeightsMapper(**rules).trace(name) == WeightsMapper(**rules, behaviour="new").trace(name)


def test_merge_carries_behaviour():
    new = WeightsMapper(orig_to_new_stacked=QKV, behaviour="new")
    plain = WeightsMapper(orig_to_new_prefix={"m.": ""})  # no stacked rules: old by default
    for merged in (new | plain, plain | new):
        assert merged.behaviour == "new"
        assert merged.map_name_with_shard("m.a.q_proj.w") == ("a.qkv_proj.w", "q")
    assert (WeightsMapper(orig_to_new_stacked=QKV) | plain).behaviour == "old"
    assert (plain | WeightsMapper(behaviour="new")).behaviour == "new"  # neither: other's
    assert (
        new | WeightsMapper(orig_to_new_stacked={"up_proj": ("gu", 1)}, behaviour="new")
    ).behaviour == "new"
    with pytest.raises(MapperConfigError, match="one with behaviour 'new', the other 'old'"):
        new | WeightsMapper(orig_to_new_stacked={"up_proj": ("gate_up_proj", 1)})


def test_from_json_takes_behaviour():
    rules = {"orig_to_new_stacked": {k: list(v) for k, v in QKV.items()}}
    assert WeightsMapper.from_json(rules).map_name(KEY.format("q_proj")) == KEY.format("qkqkv_proj")
    new = WeightsMapper.from_json({**rules, "behaviour": "new"})
    assert new.behaviour == "new" and new.map_name(KEY.format("q_proj")) == KEY.format("qkv_proj")
    for bad in ("newest", 1, None):
        with pytest.raises(MapperConfigError, match="behaviour must be 'old' or 'new'"):
            WeightsMapper.from_json({**rules, "behaviour": bad})


def test_rematches_name_both_rules():
    old = WeightsMapper(orig_to_new_stacked=QKV)
    assert stacked_rematches(old.trace(KEY.format("q_proj"))) == [
        Rematch("q_proj", "v_proj", KEY.format("q_proj"), KEY.format("qkqkv_proj"))
    ]
    assert stacked_rematches(old.trace(KEY.format("v_proj"))) == []
    # A fused key mangled by one rule is not a re-match of another rule's output.
    assert stacked_rematches(old.trace(KEY.format("qkv_proj"))) == []
    # The text a rule wrote is followed through later replacements elsewhere in the name.
    two = WeightsMapper(orig_to_new_stacked={"a": ("aaaa", 0), "q_proj": ("qkv_proj", "q"),
                                             "v_proj": ("x", "v")})  # fmt: skip
    assert [r[:2] for r in stacked_rematches(two.trace("a.q_proj"))] == [("q_proj", "v_proj")]
    # v first: q_proj's output is never seen by v_proj (the order gemma4-like packs in).
    v_first = WeightsMapper(orig_to_new_stacked=dict(reversed(QKV.items())))
    assert all(not stacked_rematches(v_first.trace(KEY.format(p))) for p in PACKING)


def test_rematch_examples_prefer_real_names():
    m = WeightsMapper(orig_to_new_stacked=QKV, behaviour="new")
    found = rematch_examples(m, [KEY.format("k_proj"), KEY.format("q_proj")])
    assert [(r.first, r.then, r.name) for r in found] == [
        ("k_proj", "v_proj", KEY.format("k_proj")),
        ("q_proj", "v_proj", KEY.format("q_proj")),
    ]
    assert rematch_examples(WeightsMapper(orig_to_new_stacked=dict(reversed(QKV.items())))) == []
    assert rematch_examples(WeightsMapper(orig_to_new_prefix={"a": "aa"})) == []


# --- the properties ------------------------------------------------------------------------------


@given(rules=packing_rules(), name=names)
def test_property_new_is_idempotent_and_never_rematches(rules, name):
    m = WeightsMapper(orig_to_new_stacked=rules, behaviour="new")
    once = m.map_name_with_shard(name)
    assert once is not None
    twice = m.map_name_with_shard(once[0])
    assert twice is not None and twice[0] == once[0]
    trace = m.trace(name)
    assert len(trace.steps) <= 1 and stacked_rematches(trace) == []
    if trace.steps:  # the one rule that fired wrote a fused name, with its shard id
        assert trace.shard_id == rules[trace.steps[0].rule][1]


# The cases above, under vLLM 0.28.0's stage: mapping twice changes the name again, and a rule
# matches inside another's output.
BROKEN_BY_OLD = [
    (QKV, KEY.format("q_proj")),
    (QKV, KEY.format("k_proj")),
    ({"gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}, "mlp.gate_proj.weight"),
    ({".q_proj": (".qkv_proj", "q"), "v_proj": ("qkv_proj", "v")}, "a.q_proj.weight"),
]


@pytest.mark.parametrize("rules,name", BROKEN_BY_OLD)
def test_old_breaks_both_properties(rules, name):
    old = WeightsMapper(orig_to_new_stacked=rules)
    once = old.map_name(name)
    assert once is not None and old.map_name(once) != once
    assert stacked_rematches(old.trace(name))
    new = WeightsMapper(orig_to_new_stacked=rules, behaviour="new")
    assert new.map_name(new.map_name(name)) == new.map_name(name)
    assert not stacked_rematches(new.trace(name))


def test_old_breaks_them_across_the_generated_names():
    """Not a corner: every name of the generator, under the packing rules in table order."""
    rules = {
        split: PACKING[split] for split in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
    }
    old = WeightsMapper(orig_to_new_stacked=rules)
    new = WeightsMapper(orig_to_new_stacked=rules, behaviour="new")
    every = [
        p + m + leaf + s for p, m, leaf, s in itertools.product(PREFIXES, MODULES, LEAVES, SUFFIXES)
    ]

    def leaves(found):
        return {leaf for leaf in LEAVES if any(f".{leaf}." in f".{n}." for n in found)}

    rematched = [n for n in every if stacked_rematches(old.trace(n))]
    not_idempotent = [n for n in every if old.map_name(old.map_name(n)) != old.map_name(n)]
    # v_proj inside the qkv_proj that q_proj or k_proj wrote; up_proj inside gate_up_proj.
    assert leaves(rematched) == {"q_proj", "k_proj", "gate_proj"}
    # A second pass mangles every fused name (written, or found in the checkpoint).
    assert leaves(not_idempotent) == {"q_proj", "k_proj", "v_proj", "qkv_proj", "kv_proj",
                                      "gate_proj", "up_proj", "gate_up_proj"}  # fmt: skip
    assert len(rematched) == len(every) * 3 // len(LEAVES)
    assert all(new.map_name(new.map_name(n)) == new.map_name(n) for n in every)
    assert not any(stacked_rematches(new.trace(n)) for n in every)
