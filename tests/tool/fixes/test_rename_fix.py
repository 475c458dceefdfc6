"""The rules ``loadkit rename`` is offered with (``loadkit_inspect.fixes.rename_fix``); the
command run and proven on what it writes is ``tests/tool/test_rename.py``."""

from __future__ import annotations

import shlex

import pytest

from loadkit.checkpoint import TensorInfo
from loadkit.errors import LoadkitError
from loadkit.mapper import WeightsMapper
from loadkit_inspect.fixes.rename_fix import (
    RenameFix,
    new_names,
    rename_rules,
    rules_json,
)
from loadkit_inspect.simulate.from_pretrained import FromPretrained


def _info(name: str, shape: tuple[int, ...]) -> TensorInfo:
    n = 4 * (shape[0] * (shape[1] if len(shape) > 1 else 1))
    return TensorInfo(name, "F32", shape, n, "m.safetensors", 8)


def test_unused_keys_and_tensors_at_random_that_differ_the_same_way_give_a_rule():
    infos = [_info("old.layer.0.w", (4, 2)), _info("old.layer.1.w", (4, 2)), _info("b", (3,))]
    # transformers' lists: the keys it leaves unused (one renamed by its own conversions) and
    # the tensors it leaves at random, with their model shapes
    fp = FromPretrained(
        "M", ("layer.0.w", "layer.1.w"), ("old.layer.0.w", "old_layer_1.w"), (), (), False,
        {"old.layer.1.w": "old_layer_1.w"}, "5",
        shapes={"layer.0.w": (4, 2), "layer.1.w": (4, 2)},
    )  # fmt: skip
    (suggestion,) = rename_rules(fp, infos)
    assert (suggestion.rule.stage, suggestion.rule.old, suggestion.rule.new) == (
        "prefix",
        "old.",
        "",
    )
    assert sorted(suggestion.pairs) == [
        ("old.layer.0.w", "layer.0.w"),
        ("old.layer.1.w", "layer.1.w"),
    ]
    rules = rules_json([suggestion])
    assert new_names([i.name for i in infos], WeightsMapper.from_json(rules)) == {
        "old.layer.0.w": "layer.0.w", "old.layer.1.w": "layer.1.w", "b": "b"
    }  # fmt: skip


def test_a_lone_pair_or_shapes_that_differ_give_no_rule():
    infos = [_info("x.w", (4, 2)), _info("x.v", (4, 2))]
    fp = FromPretrained("M", ("w", "v"), ("x.w", "x.v"), (), (), False, {}, "5",
                        shapes={"w": (2, 4), "v": (3, 3)})  # fmt: skip
    assert rename_rules(fp, infos) == []  # element counts differ for v; one pair is no pattern


def test_the_command_is_quoted_for_a_shell():
    rules = {"orig_to_new_substr": {"it's": "it is"}}
    fix = RenameFix("names", rules, [], "my ckpt", {})
    argv = shlex.split(fix.command())
    assert argv == ["loadkit", "rename", "my ckpt", "my ckpt-renamed", "--mapper",
                    '{"orig_to_new_substr": {"it\'s": "it is"}}']  # fmt: skip
    assert shlex.split(RenameFix("layout", None, [], "ck", {}).command("out")) == [
        "loadkit", "rename", "ck", "out"
    ]  # fmt: skip


def test_names_are_changed_never_dropped_or_merged():
    drop = WeightsMapper.from_json({"orig_to_new_prefix": {"a.": None}})
    with pytest.raises(LoadkitError, match="key 'a.w': the rules drop it"):
        new_names(["a.w"], drop)
    merge = WeightsMapper.from_json({"orig_to_new_prefix": {"a.": "b."}})
    with pytest.raises(LoadkitError, match="keys 'a.w' and 'b.w' would both be named 'b.w'"):
        new_names(["a.w", "b.w"], merge)
