"""Each row of the README table "Where loadkit deviates from vLLM 0.28.0, and why", shown.

Every test runs the same input through upstream's code and loadkit's and asserts both sides of
the difference, so a row whose difference disappears (either side changed) fails here.
"""

from __future__ import annotations

import re

import pytest

from loadkit import WeightsMapper
from loadkit.errors import MapperConfigError


def test_mapper_build_empty_suffix(up):
    rules = {"orig_to_new_suffix": {"": ".w"}}
    upstream = up.WeightsMapper(**rules)  # builds
    with pytest.raises(ValueError, match="empty separator"):  # and fails on the first name
        upstream._map_name("a.b")
    with pytest.raises(MapperConfigError, match="empty suffix"):
        WeightsMapper(**rules)


def test_mapper_build_bad_regex_replacement(up):
    rules = {"orig_to_new_regex": {re.compile("(a)"): r"\2"}}
    upstream = up.WeightsMapper(**rules)
    assert upstream._map_name("b") == "b"  # fine until a name matches
    with pytest.raises(re.error):
        upstream._map_name("a")
    with pytest.raises(MapperConfigError, match="invalid replacement"):
        WeightsMapper(**rules)


def test_stacked_rule_may_drop(up):
    rules = {"orig_to_new_stacked": {"q_proj": None}}
    with pytest.raises(TypeError, match="cannot unpack non-iterable NoneType"):
        up.WeightsMapper(**rules)._map_name("k_proj.weight")  # any name, even one not matching
    mapper = WeightsMapper(**rules)
    assert mapper.map_name("q_proj.weight") is None
    assert mapper.map_name("k_proj.weight") == "k_proj.weight"


def test_regex_keys_may_be_strings(up):
    rules = {"orig_to_new_regex": {r"layers\.(\d+)": r"h.\1"}}
    with pytest.raises(AttributeError, match="'str' object has no attribute 'search'"):
        up.WeightsMapper(**rules)._map_name("layers.0.w")
    assert WeightsMapper(**rules).map_name("layers.0.w") == "h.0.w"
