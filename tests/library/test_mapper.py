import re

import pytest
import torch

from loadkit import WeightsMapper
from loadkit.errors import LoadkitError, MapperConfigError


def test_stage_order_regex_substr_stacked_prefix_suffix():
    m = WeightsMapper(
        orig_to_new_regex={r"^a": "b"},
        orig_to_new_substr={"b": "c"},  # sees the regex result
        orig_to_new_stacked={"c": ("d", 7)},
        orig_to_new_prefix={"d": "e"},
        orig_to_new_suffix={"x": "y"},
    )
    t = m.trace("ax")
    assert t.result == "ey"
    assert [s.stage for s in t.steps] == ["regex", "substr", "stacked", "prefix", "suffix"]
    assert t.shard_id == 7


def test_rules_chain_within_a_stage():
    assert WeightsMapper(orig_to_new_prefix={"a.": "b.", "b.": "c."}).map_name("a.x") == "c.x"
    assert WeightsMapper(orig_to_new_substr={"foo": "bar", "bar": "baz"}).map_name("foo") == "baz"
    assert WeightsMapper(orig_to_new_suffix={".w": ".v", ".v": ".u"}).map_name("m.w") == "m.u"


def test_regex_replaces_every_match_with_backrefs_and_compiled_keys():
    m = WeightsMapper(orig_to_new_regex={r"layers\.(\d+)": r"h.\1", re.compile("z"): "Z"})
    assert m.map_name("layers.1.layers.2.z.z") == "h.1.h.2.Z.Z"


def test_substr_replaces_first_occurrence_only():
    assert WeightsMapper(orig_to_new_substr={"ab": "X"}).map_name("ab.ab") == "X.ab"


def test_prefix_only_at_start_and_empty_prefix_prepends():
    m = WeightsMapper(orig_to_new_prefix={"model.": "m."})
    assert m.map_name("x.model.y") == "x.model.y"
    assert m.map_name("model.model.y") == "m.model.y"
    assert WeightsMapper(orig_to_new_prefix={"": "root."}).map_name("a") == "root.a"


def test_suffix_only_at_end():
    m = WeightsMapper(orig_to_new_suffix={".weight": ".w"})
    assert m.map_name("a.weight.weight") == "a.weight.w"
    assert m.map_name("a.weight.bias") == "a.weight.bias"


def test_empty_suffix_is_a_configuration_error():
    with pytest.raises(MapperConfigError, match="empty suffix"):
        WeightsMapper(orig_to_new_suffix={"": "x"})
    assert issubclass(MapperConfigError, ValueError)


def test_invalid_regex_names_the_pattern():
    with pytest.raises(MapperConfigError, match=r"\(unclosed"):
        WeightsMapper(orig_to_new_regex={"(unclosed": "x"})
    with pytest.raises(LoadkitError, match="invalid replacement"):
        WeightsMapper(orig_to_new_regex={"(a)": r"\2"})


@pytest.mark.parametrize(
    "field,key",
    [
        ("orig_to_new_regex", "dro"),
        ("orig_to_new_substr", "dro"),
        ("orig_to_new_stacked", "dro"),
        ("orig_to_new_prefix", "drop"),
        ("orig_to_new_suffix", "me"),
    ],
)
def test_none_drops_at_once(field, key):
    m = WeightsMapper(**{field: {key: None}})
    assert m.map_name("drop.me") is None
    assert m.map_name_with_shard("drop.me") is None
    assert m.trace("drop.me").dropped_by.stage == field.removeprefix("orig_to_new_")


def test_none_stops_later_stages():
    m = WeightsMapper(orig_to_new_substr={"a": None}, orig_to_new_prefix={"": "p."})
    assert m.map_name("a") is None
    assert m.map_name("b") == "p.b"


def test_stacked_last_matching_rule_wins_shard_id():
    m = WeightsMapper(orig_to_new_stacked={"q_proj": ("qkv_proj", "q"), "qkv_proj": ("qkv", "z")})
    assert m.map_name_with_shard("l.q_proj.weight") == ("l.qkv.weight", "z")
    assert m.map_name_with_shard("l.o_proj.weight") == ("l.o_proj.weight", None)


def test_private_spelling_is_the_same_method():
    m = WeightsMapper(orig_to_new_prefix={"a": "b"})
    assert m._map_name("ax") == m.map_name("ax") == "bx"


def test_apply_is_lazy_drops_none_and_sets_shard_id():
    m = WeightsMapper(
        orig_to_new_stacked={"k_proj": ("qkv_proj", "k")}, orig_to_new_substr={"bad": None}
    )
    pulled = []

    def source():
        for name in ["a.k_proj.weight", "bad.x", "c"]:
            pulled.append(name)
            yield name, torch.zeros(1)

    it = m.apply(source())
    assert pulled == []  # nothing read before the first next()
    name, t = next(it)
    assert (name, t.shard_id) == ("a.qkv_proj.weight", "k")
    assert pulled == ["a.k_proj.weight"]
    rest = list(it)
    assert [n for n, _ in rest] == ["c"]
    assert not hasattr(rest[0][1], "shard_id")


def test_apply_list_and_dict_later_key_wins():
    m = WeightsMapper(orig_to_new_prefix={"a.": "x.", "b.": "x."}, orig_to_new_substr={"z": None})
    assert m.apply_list(["a.1", "z", "b.2"]) == ["x.1", "x.2"]
    assert m.apply_dict({"a.1": 1, "b.1": 2, "z": 3}) == {"x.1": 2}


def test_or_merges_all_five_fields_right_wins():
    a = WeightsMapper(
        orig_to_new_regex={"r": "A"},
        orig_to_new_substr={"s": "A", "shared": "A"},
        orig_to_new_stacked={"t": ("A", 0)},
        orig_to_new_prefix={"p": "A"},
        orig_to_new_suffix={"x": "A"},
    )
    b = WeightsMapper(
        orig_to_new_regex={"r2": "B"},
        orig_to_new_substr={"shared": "B"},
        orig_to_new_stacked={"t2": ("B", 1)},
        orig_to_new_prefix={"p2": "B"},
        orig_to_new_suffix={"x2": "B"},
    )
    c = a | b
    assert dict(c.orig_to_new_regex) == {"r": "A", "r2": "B"}
    assert dict(c.orig_to_new_substr) == {"s": "A", "shared": "B"}
    assert dict(c.orig_to_new_stacked) == {"t": ("A", 0), "t2": ("B", 1)}
    assert dict(c.orig_to_new_prefix) == {"p": "A", "p2": "B"}
    assert dict(c.orig_to_new_suffix) == {"x": "A", "x2": "B"}
    assert c.map_name("x2") == "B"


def test_frozen_and_empty_by_default():
    m = WeightsMapper()
    assert m.is_empty() and m.map_name("anything") == "anything"
    with pytest.raises(AttributeError):
        m.orig_to_new_prefix = {}  # type: ignore[misc]


def test_from_json_checks_fields():
    m = WeightsMapper.from_json({"orig_to_new_stacked": {"q": ["qkv", "q"]}})
    assert m.map_name_with_shard("q") == ("qkv", "q")
    with pytest.raises(MapperConfigError, match="unknown field"):
        WeightsMapper.from_json({"orig_to_new_prefixes": {}})
    with pytest.raises(MapperConfigError, match="str to str or None"):
        WeightsMapper(orig_to_new_prefix={"a": 3})


class Rename:
    """The renaming protocol transformers' ``WeightRenaming`` follows: (new key, what matched)."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new
        self.calls: list[str] = []

    def rename_source_key(self, key: str):
        self.calls.append(key)
        hit = self.old in key
        return (key.replace(self.old, self.new), self.old if hit else None)


def test_renaming_runs_first_in_list_order_and_chains():
    first, second = Rename("LayerNorm", "norm"), Rename("norm.gamma", "norm.weight")
    m = WeightsMapper(
        orig_to_new_renaming=[first, second],
        orig_to_new_regex={r"norm\.weight$": "norm.w"},  # sees the renamed key
        orig_to_new_prefix={"bert.": ""},
    )
    t = m.trace("bert.LayerNorm.gamma")
    assert t.result == "norm.w"
    assert [s.stage for s in t.steps] == ["renaming", "renaming", "regex", "prefix"]
    assert [s.after for s in t.steps[:2]] == ["bert.norm.gamma", "bert.norm.weight"]
    assert first.calls == ["bert.LayerNorm.gamma"] and second.calls == ["bert.norm.gamma"]
    # A renaming that changes nothing leaves no step but is still asked.
    assert m.trace("x").steps == () and first.calls[-1] == "x"


def test_renaming_list_is_copied_merged_in_order_and_checked():
    a, b = Rename("a", "b"), Rename("b", "c")
    rules = [a]
    m = WeightsMapper(orig_to_new_renaming=rules)
    rules.append(b)  # the caller's list changing later does not change the mapper
    assert m.map_name("a") == "b"
    merged = m | WeightsMapper(orig_to_new_renaming=[b])
    assert merged.orig_to_new_renaming == (a, b) and merged.map_name("a") == "c"
    assert not merged.is_empty() and WeightsMapper().is_empty()
    with pytest.raises(MapperConfigError, match="rename_source_key"):
        WeightsMapper(orig_to_new_renaming=["a->b"])


def test_renaming_must_return_a_name():
    class Broken:
        def rename_source_key(self, key):
            return None, None

    with pytest.raises(MapperConfigError, match="returned None"):
        WeightsMapper(orig_to_new_renaming=[Broken()]).map_name("x")


def test_regex_module_patterns_are_accepted():
    import regex  # what vLLM's models compile their rules with (a dev dependency)

    m = WeightsMapper(orig_to_new_regex={regex.compile(r"h\.(\d+)"): r"layers.\1"})
    assert m.map_name("h.3.w") == "layers.3.w"
    with pytest.raises(MapperConfigError, match="invalid replacement"):
        WeightsMapper(orig_to_new_regex={regex.compile("(a)"): r"\2"})


def test_renaming_with_transformers_weight_renaming_and_rules_listing():
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    legacy = get_checkpoint_conversion_mapping("legacy")  # LayerNorm.gamma/beta, weight_g/v, ...
    m = WeightsMapper(orig_to_new_renaming=legacy, orig_to_new_prefix={"bert.": "model."})
    assert m.map_name("bert.encoder.LayerNorm.gamma") == "model.encoder.LayerNorm.weight"
    assert m.map_name("bert.encoder.LayerNorm.beta") == "model.encoder.LayerNorm.bias"
    assert m.map_name("bert.encoder.dense.weight") == "model.encoder.dense.weight"
    step = m.trace("x.LayerNorm.gamma").steps[0]
    assert (step.stage, step.rule) == ("renaming", "LayerNorm.gamma -> LayerNorm.weight")
    rules = list(m.rules())
    assert rules[0] == ("renaming", "LayerNorm.gamma -> LayerNorm.weight", "LayerNorm.weight")
    assert [r[0] for r in rules] == ["renaming"] * len(legacy) + ["prefix"]
    assert rules[-1] == ("prefix", "bert.", "model.")


# --- vLLM 0.31-0.34: ShardIds, weights_transforms, get_rename_mapper ---------------------------


def test_a_list_of_shard_ids_loads_one_tensor_into_each_shard():
    m = WeightsMapper(orig_to_new_stacked={"kv_proj": ("qkv_proj", ["k", "v"])})
    assert m.map_name_with_shard("a.kv_proj.weight") == ("a.qkv_proj.weight", ["k", "v"])
    w = torch.arange(4.0)
    out = list(m.apply([("a.kv_proj.weight", w)]))
    # one yield per shard, each its own tensor object with its own id, one storage for all
    assert [(n, t.shard_id) for n, t in out] == [
        ("a.qkv_proj.weight", "k"),
        ("a.qkv_proj.weight", "v"),
    ]
    assert out[0][1] is w and out[1][1] is not w
    assert out[1][1].untyped_storage().data_ptr() == w.untyped_storage().data_ptr()
    with pytest.raises(MapperConfigError, match="orig_to_new_stacked"):
        WeightsMapper(orig_to_new_stacked={"kv_proj": ("qkv_proj", [])})


def test_weights_transforms_run_in_order_before_any_mapping_and_merge():
    seen: list[str] = []

    def split(weights):  # a fused checkpoint tensor -> its two halves, by raw name
        for name, w in weights:
            seen.append(name)
            if name == "fused.weight":
                yield "a.weight", w[:1]
                yield "b.weight", w[1:]
            else:
                yield name, w

    def negate(weights):
        return ((n, -w) for n, w in weights)

    m = WeightsMapper(orig_to_new_prefix={"a.": "x.a."}, weights_transforms=[split])
    merged = m | WeightsMapper(weights_transforms=[negate])
    assert list(merged.weights_transforms) == [split, negate]
    out = [(n, w.tolist()) for n, w in merged.apply([("fused.weight", torch.tensor([1.0, 2.0]))])]
    assert out == [("x.a.weight", [-1.0]), ("b.weight", [-2.0])]
    assert seen == ["fused.weight"]  # the raw name: no rule ran before the transform
    # names alone never see a transform: map_name has no tensor to hand it
    assert merged.map_name("fused.weight") == "fused.weight"
    assert not WeightsMapper(weights_transforms=[negate]).is_empty()
    with pytest.raises(MapperConfigError, match="weights_transforms"):
        WeightsMapper(weights_transforms=["not callable"])  # type: ignore[list-item]


def test_the_rename_mapper_keeps_only_renames():
    m = WeightsMapper(
        orig_to_new_regex={r"^mtp\.": None, r"layers\.(\d+)": r"h.\1"},
        orig_to_new_substr={"gamma": "weight", "inv_freq": None},
        orig_to_new_stacked={"q_proj": ("qkv_proj", "q")},
        orig_to_new_prefix={"model.": ""},
        orig_to_new_suffix={".bias": None},
        weights_transforms=[lambda w: w],
    )
    r = m.get_rename_mapper()
    assert r.map_name("model.layers.0.q_proj.gamma") == "h.0.q_proj.weight"
    assert r.map_name("mtp.x.bias") == "mtp.x.bias"  # nothing drops
    assert m.map_name("mtp.x") is None and m.map_name("a.bias") is None
    assert not r.orig_to_new_stacked and not r.weights_transforms
    assert r.behaviour == m.behaviour


def test_from_json_takes_a_list_of_shard_ids():
    m = WeightsMapper.from_json({"orig_to_new_stacked": {"kv_proj": ["qkv_proj", ["k", "v"]]}})
    assert m.map_name_with_shard("kv_proj.w") == ("qkv_proj.w", ["k", "v"])
    with pytest.raises(MapperConfigError, match="a shard id is an int or a str"):
        WeightsMapper.from_json({"orig_to_new_stacked": {"kv": ["qkv", ["k", 1.5]]}})
