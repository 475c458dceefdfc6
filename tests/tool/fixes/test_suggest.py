"""Mapper rules inferred from paired leftovers (loadkit_inspect.fixes.suggest)."""

import pytest

from loadkit.mapper import WeightsMapper
from loadkit_inspect.fixes.suggest import Rule, infer_rules, mapper_json

MODEL = [f"encoder.layer.{i}.attention.{p}.weight" for i in range(3) for p in ("q", "k")]


def rules(pairs):
    return [(s.rule, len(s.pairs)) for s in infer_rules(pairs)]


@pytest.mark.parametrize(
    ("key_of", "rule"),
    [
        (lambda n: "bert." + n, Rule("prefix", "bert.", "")),
        (lambda n: n.removeprefix("encoder."), Rule("prefix", "", "encoder.")),
        (lambda n: n.replace(".weight", ".w"), Rule("suffix", ".w", ".weight")),
        (lambda n: n.replace(".attention.", ".attn."), Rule("substr", ".attn.", ".attention.")),
        (
            lambda n: n.replace("encoder.layer.", "h_"),
            Rule("regex", "^h_(\\d+)\\.", "encoder.layer.\\g<1>."),
        ),
    ],
)
def test_one_rule_explains_a_systematic_rename(key_of, rule):
    pairs = [(key_of(n), n) for n in MODEL]
    assert rules(pairs) == [(rule, len(MODEL))]
    mapper = WeightsMapper.from_json(mapper_json({}, [rule]))  # a valid --mapper
    assert [mapper.map_name(k) for k, _ in pairs] == MODEL


def test_a_lone_rename_is_no_pattern_and_rules_explain_each_pair_once():
    assert infer_rules([("a.gamma", "a.weight")]) == []
    pairs = [("x.ln.gamma", "x.ln.weight"), ("y.ln.gamma", "y.ln.weight")]
    pairs += [("x.ln.beta", "x.ln.bias"), ("y.ln.beta", "y.ln.bias"), ("z.q", "zz.q")]
    found = rules(pairs)
    assert found == [
        (Rule("suffix", ".beta", ".bias"), 2),
        (Rule("suffix", ".gamma", ".weight"), 2),
    ]


def test_new_rules_append_after_the_models_own():
    base = {"orig_to_new_prefix": {"model.": ""}}
    out = mapper_json(base, [Rule("prefix", "bert.", "")])
    assert out == {"orig_to_new_prefix": {"model.": "", "bert.": ""}}
    assert base == {"orig_to_new_prefix": {"model.": ""}}  # the caller's rules are not changed
