"""notebooks/sanitize.cfg, read by nbval's own parser and applied as nbval applies it."""

import re

import pytest
from nbval.plugin import get_sanitize_patterns
from repo_paths import NOTEBOOKS

CFG = NOTEBOOKS / "sanitize.cfg"


def sanitize(text: str) -> str:
    patterns = dict(get_sanitize_patterns(CFG.read_text()))  # nbval keeps them in a dict too
    for regex, replace in patterns.items():
        text = re.sub(regex, replace, text)
    return text


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("max |Δ|: 1.9940927028656006", "max |Δ|: 1.9940927028656008"),
        ("y=[1.926281213760376, 0.0]", "y=[1.9262812137603761, 0.0]"),
        ("A: -12.3456789", "A: -12.3456001"),
        ("dt 0.000976562518", "dt 0.000976562499"),
        ("bytes 97880.123456", "bytes 97880.123999"),
        ("at <Figure at 0x7f3a2b> and 0x55d1", "at <Figure at 0x7f00ff> and 0x1234"),
        ("'uid': '5a7606e5-7e78', x", "'uid': '93a9e3ed-4271', x"),
    ],
)
def test_what_may_differ_between_machines_compares_equal(a, b):
    assert a != b and sanitize(a) == sanitize(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("max |Δ|: 1.9941", "max |Δ|: 2.1398"),  # a finding, to 4 digits
        ("values exact : 61 of 61", "values exact : 60 of 61"),  # counts stay strict
        ("73 97880", "73 97881"),
        ("y=[0.0, 0.0, 1.9492, 0.0]", "y=[0.0, 0.0, 1.9502, 0.0]"),
        ("ratio 0.001234", "ratio 0.001235"),
        ("torch 2.13.0", "torch 2.13.1"),
    ],
)
def test_findings_still_differ(a, b):
    assert sanitize(a) != sanitize(b)


def test_floats_keep_four_significant_digits():
    text = "1.9940927 -12.345678 123.456789 0.000976562518 12345.678 2.5 0.1"
    assert sanitize(text) == "1.994 -12.34 123.4 0.0009765 12345 2.5 0.1"
