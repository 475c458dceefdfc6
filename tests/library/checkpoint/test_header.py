"""The common header's fast read (``loadkit.checkpoint.header._read_common``) against the careful
path (``parse_header`` then ``check_layout``): fed the same headers, common ones and every kind of
near miss, the fast read either declines (``None``) or gives exactly the careful path's result,
and ``read_header`` (the two together) reads or refuses exactly as the careful path does."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save

from loadkit.checkpoint.dtypes import SAFETENSORS_DTYPES
from loadkit.checkpoint.header import (
    _COMMON_DIMS,
    _COMMON_ENTRY,
    _COMMON_NAME,
    _COMMON_SPACE,
    MAX_ENTRY_CHARS,
    HeaderProblem,
    _read_common,
    check_layout,
    parse_header,
    read_header,
)

EXAMPLES = settings.default.max_examples


def careful(text: str, data_size: int) -> tuple[Any, ...]:
    """What the careful path makes of a header: the entries in data order, or its refusal."""
    try:
        entries, metadata = parse_header(text)
        ordered = check_layout(entries, data_size)
    except HeaderProblem as exc:
        return ("refused", type(exc), exc.message, exc.key)
    return ("read", [tuple(e) for e in ordered], metadata)


def as_read(table: Any) -> tuple[Any, ...]:
    rows = zip(table.names, table.dtypes, table.shapes, table.begins, table.nbytes, strict=True)
    return ("read", [(n, d, s, b, b + size) for n, d, s, b, size in rows], table.metadata)


def through_read_header(text: str, data_size: int) -> tuple[Any, ...]:
    try:
        table = read_header(text, data_size)
    except HeaderProblem as exc:
        return ("refused", type(exc), exc.message, exc.key)
    return as_read(table)


def check_both(text: str, data_size: int) -> bool:
    """Assert the fast read agrees with the careful path; whether it read the header."""
    want = careful(text, data_size)
    fast = _read_common(text, data_size)
    if fast is not None:
        assert as_read(fast) == want, text
    assert through_read_header(text, data_size) == want, text
    return fast is not None


# --- headers as writers write them: the fast read takes them ------------------------------------


def library_header(metadata: dict[str, str] | None) -> tuple[str, int]:
    """The safetensors library's own header of a few tensors (data order, metadata first)."""
    blob = save(
        {
            "b": np.zeros((2, 3), np.float32),
            "a": np.zeros(4, np.int8),
            "c.weight": np.zeros((1, 1, 2), np.float16),
        },
        metadata=metadata,
    )
    n = int.from_bytes(blob[:8], "little")
    return blob[8 : 8 + n].decode(), len(blob) - 8 - n


@pytest.mark.parametrize("metadata", [None, {}, {"format": "pt", "k\n": "v\u00e9"}])
def test_the_librarys_headers_are_read_fast_and_alike(metadata):
    text, size = library_header(metadata)
    assert check_both(text, size)
    table = read_header(text, size)
    assert table.names == ["b", "c.weight", "a"]  # the library writes the widest dtype first
    assert (table.metadata is None) == (metadata is None)


def entries_json(rows: list[tuple[str, str, list[int]]], **dumps: Any) -> tuple[str, int]:
    header, offset = {}, 0
    for name, dtype, shape in rows:
        size = int(np.prod(shape, dtype=object)) * SAFETENSORS_DTYPES[dtype].bits // 8
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    return json.dumps(header, **dumps), offset


ROWS = [
    ("model.embed.weight", "BF16", [8, 4]),
    ("model.layers.0.q_proj.weight", "F8_E4M3", [4, 4]),
    ("model.layers.0.q_proj.weight_scale_inv", "F32", [1, 1]),
    ("lm_head.bias", "F64", [3]),
    ("scalar", "I64", []),
    ("\u00e9t\u00e9 {x}:[1,2],", "U8", [5]),
]


@pytest.mark.parametrize(
    "dumps",
    [{"separators": (",", ":")}, {}, {"indent": 2}, {"indent": "\t"}, {"ensure_ascii": False}],
)
def test_json_dumps_headers_are_read_fast_and_alike(dumps):
    text, size = entries_json(ROWS, **dumps)
    fast = "\\u" not in text  # ensure_ascii escapes the accented name: that one is not common
    assert check_both(text, size) == fast
    assert check_both(text + "       ", size) == fast  # the library pads with spaces


# --- near misses: the careful path decides ------------------------------------------------------

E = '"{n}":{{"dtype":"{d}","shape":[{s}],"data_offsets":[{b},{e}]}}'


def header(*entries: str, before: str = "", after: str = "") -> str:
    return "{" + before + ",".join(entries) + after + "}"


def e(n: str = "w", d: str = "F32", s: str = "1", b: Any = 0, end: Any = 4) -> str:
    return E.format(n=n, d=d, s=s, b=b, e=end)


NEAR_MISSES = {
    "common": (header(e("a"), e("b", b=4, end=8)), 8, True),
    "with metadata": (
        header(e("a"), e("b", b=4, end=8), before='"__metadata__":{"k":"v"},'),
        8,
        True,
    ),
    "null metadata": (header(e("a"), e("b", b=4, end=8), before='"__metadata__":null,'), 8, True),
    "metadata last": (header(e("a"), e("b", b=4, end=8), after=',"__metadata__":{}'), 8, False),
    "metadata twice": (
        header(e("a"), e("b", b=4, end=8), before='"__metadata__":{},', after=',"__metadata__":{}'),
        8,
        False,
    ),
    "bad metadata": (
        header(e("a"), e("b", b=4, end=8), before='"__metadata__":{"k":1},'),
        8,
        False,
    ),
    "tensor named __metadata__": (header(e("a"), e("__metadata__", b=4, end=8)), 8, False),
    "repeated name": (header(e("a"), e("b", b=4, end=8), e("a", b=8, end=12)), 12, False),
    "repeated name, last wins": (
        header(e("a", b=0, end=4), e("b", b=4, end=8), e("a", b=0, end=4)),
        8,
        False,
    ),
    "not in data order": (header(e("b", b=4, end=8), e("a")), 8, False),
    "hole": (header(e("a"), e("b", b=8, end=12)), 12, False),
    "overlap": (header(e("a"), e("b", b=2, end=6)), 6, False),
    "wrong span": (header(e("a"), e("b", b=4, end=9)), 9, False),
    "trailing data": (header(e("a"), e("b", b=4, end=8)), 9, False),
    "truncated": (header(e("a"), e("b", b=4, end=8)), 7, False),
    "zero-size first": (header(e("z", s="0", b=0, end=0), e("a")), 4, False),
    "zero-size inside": (header(e("a", s="2", end=8), e("z", s="0", b=4, end=4)), 8, False),
    "zero-size huge": (header(e("z", s=f"{10**17},{10**17},0", b=0, end=0), e("a")), 4, False),
    "F4": (header(e("a", d="F4", s="2", end=1), e("b", b=1, end=5)), 5, False),
    "F4 odd": (header(e("a", d="F4", s="3", end=1), e("b", b=1, end=5)), 5, False),
    "F6": (header(e("a", d="F6_E2M3", s="4", end=3), e("b", b=3, end=7)), 7, False),
    "unknown dtype": (header(e("a", d="Q4"), e("b", b=4, end=8)), 8, False),
    "lowercase dtype": (header(e("a", d="f32"), e("b", b=4, end=8)), 8, False),
    "leading zero": (header(e("a", end="04"), e("b", b=4, end=8)), 8, False),
    "leading zero in a shape": (header(e("a", s="01"), e("b", b=4, end=8)), 8, False),
    "int64 dimension": (header(e("a", s=f"{2**63 - 1},0", end=0), e("b", end=4)), 4, False),
    "beyond int64": (header(e("a", s=f"{2**63},0", end=0), e("b", end=4)), 4, False),
    "beyond u64": (header(e("a", s=f"{2**64},0", end=0), e("b", end=4)), 4, False),
    "19-digit offset": (
        header(e("a", s="1", end=4), e("b", b=4, end=10**18 + 4)),
        10**18 + 4,
        False,
    ),
    "u64 overflow": (header(e("a", d="F64", s=f"{2**61},{2**3}", end=0), e("b")), 4, False),
    "escaped name": (header(e("a"), e("\\u0062", b=4, end=8)), 8, False),
    "escaped repeat": (header(e("a"), e("\\u0061", b=4, end=8)), 8, False),
    "lone surrogate": (header(e("a"), e("\\ud800", b=4, end=8)), 8, False),
    "control character": (header(e("a"), e("\x01", b=4, end=8)), 8, False),
    "fields reordered": (
        header(e("a"), '"b":{"shape":[1],"dtype":"F32","data_offsets":[4,8]}'),
        8,
        False,
    ),
    "extra field": (
        header(e("a"), '"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8],"x":1}'),
        8,
        False,
    ),
    "array entry": (header(e("a"), '"b":["F32",[1],[4,8]]'), 8, False),
    "trailing comma": (header(e("a"), e("b", b=4, end=8))[:-1] + ",}", 8, False),
    "no closing brace": (header(e("a"), e("b", b=4, end=8))[:-1], 8, False),
    "trailing garbage": (header(e("a"), e("b", b=4, end=8)) + "x", 8, False),
    "two objects": (header(e("a")) + header(e("b", b=4, end=8)), 8, False),
    "NUL after": (header(e("a"), e("b", b=4, end=8)) + "\x00", 8, False),
    "BOM": ("\ufeff" + header(e("a"), e("b", b=4, end=8)), 8, False),
    "not an object": ("[" + e("a") + "]", 4, False),
    "three offsets": (header(e("a"), e("b", b=4, end="8,12")), 8, False),
    "negative": (header(e("a"), e("b", b=4, end=-8)), 8, False),
    "float offset": (header(e("a"), e("b", b=4, end="8.0")), 8, False),
    "NaN": (header(e("a"), e("b", b=4, end="NaN")), 8, False),
    "uncommon entry between": (
        header(e("a"), '"z":["F32",[0],[4,4]]', e("b", b=4, end=8), e("c", b=8, end=12)),
        12,
        False,
    ),
    "metadata between": (
        header(e("a"), '"__metadata__":{}', e("b", b=4, end=8), e("c", b=8, end=12)),
        12,
        False,
    ),
    "long metadata": (
        header(e("a"), e("b", b=4, end=8), before='"__metadata__":{"k":"' + "v" * 2**20 + '"},'),
        8,
        False,
    ),
    "metadata with a long string": (
        header(e("a"), e("b", b=4, end=8), before='"__metadata__":{"k":"' + "v" * 2**16 + '"},'),
        8,
        True,
    ),
    "long space": (header(e("a"), e("b", b=4, end=8)).replace(",", "," + " " * 300, 1), 8, False),
    "long padding": (header(e("a"), e("b", b=4, end=8)) + " " * 300, 8, False),
    "huge padding": (header(e("a"), e("b", b=4, end=8)) + " " * MAX_ENTRY_CHARS, 8, False),
    "long name": (header(e("a"), e("x" * (_COMMON_NAME + 1), b=4, end=8)), 8, False),
    "many dims": (
        header(e("a", s=",".join(["1"] * (_COMMON_DIMS + 1))), e("b", b=4, end=8)),
        8,
        False,
    ),
}


@pytest.mark.parametrize("case", sorted(NEAR_MISSES))
def test_near_misses_read_as_the_careful_path_reads_them(case):
    text, size, fast = NEAR_MISSES[case]
    assert check_both(text, size) == fast


def test_the_longest_common_entry_is_within_the_entry_limit():
    # Every repetition of the grammar at its bound: the careful path's limit on one entry can
    # never be reached by an entry the fast read takes.
    ws = " " * _COMMON_SPACE
    dims = f"{ws},{ws}".join(["9" * 18] * _COMMON_DIMS)
    entry = (
        f'"{"n" * _COMMON_NAME}"{ws}:{ws}{{{ws}"dtype"{ws}:{ws}"{"X" * 16}"{ws},{ws}"shape"{ws}:'
        f'{ws}[{ws}{dims}{ws}]{ws},{ws}"data_offsets"{ws}:{ws}[{ws}{"9" * 18}{ws},{ws}'
        f"{'9' * 18}{ws}]{ws}}}{ws},{ws}"
    )
    assert _COMMON_ENTRY.fullmatch(entry) is not None
    assert len(entry) <= MAX_ENTRY_CHARS
    for longer in (
        entry.replace('"n', '"nn', 1),
        entry.replace(ws, ws + " ", 1),
        entry.replace("[" + ws, "[" + ws + "1,", 1),
        entry.replace('"X', '"XX', 1),
        entry.replace("9" * 18, "9" * 19, 1),
    ):
        assert _COMMON_ENTRY.fullmatch(longer) is None


# --- generated near misses ----------------------------------------------------------------------

NAMES = ["a", "a.b", "model.layers.0.weight", "x}", "é", "", "{", ":[0,4]},"]  # as in the JSON
ODD_NAMES = ["__metadata__", "\\u0061", "\\ud800", '\\"', "\\n", "\x01"]
DTYPES = ["F32", "BF16", "U8", "F8_E4M3", "I64", "BOOL", "C64"]
ODD_DTYPES = ["F4", "F6_E3M2", "Q4", "f32", "", "F8_E4M3FNUZX"]
SPACES = ["", " ", "\n  ", "\t"]
LONG_SPACE = " " * (_COMMON_SPACE + 1)
NUMBERS = ["1", "2", "3", "4", "16"]
ODD_NUMBERS = ["0", "01", "-1", "1.0", str(10**17), str(2**63 - 1), str(2**63), str(2**64), "1e2"]
MUTATIONS = (
    "spelling",
    "name",
    "repeat",
    "dtype",
    "dimension",
    "begin",
    "end",
    "offset text",
    "space",
    "order",
    "metadata",
    "tail",
    "data size",
)


@st.composite
def near_common_headers(draw: st.DrawFn) -> tuple[str, int]:
    """A header as writers write it (the entries tiling in header order), then, most of the
    time, changed once or twice: a name, dtype, dimension or offset of another kind, a repeated
    name, spacing, entries out of order, metadata of any kind anywhere, a tail, the data size."""
    mutations = draw(st.lists(st.sampled_from(MUTATIONS), max_size=2))
    ws = draw(st.sampled_from(SPACES))
    n = draw(st.integers(0, 6) if draw(st.integers(0, 9)) == 0 else st.integers(2, 6))
    at = draw(st.integers(0, max(n - 1, 0)))  # the entry a mutation changes

    def odd(what: str, i: int) -> bool:
        return what in mutations and i == at

    parts, names, offset = [], [], 0
    for i in range(n):
        name = draw(st.sampled_from(NAMES)) + str(i)
        if draw(st.booleans()):
            name = json.dumps(draw(st.text(max_size=4)) + str(i), ensure_ascii=False)[1:-1]
        if odd("name", i):
            name = draw(st.sampled_from(ODD_NAMES))
        if odd("repeat", i) and names:
            name = draw(st.sampled_from(names))
        names.append(name)
        dtype = draw(st.sampled_from(ODD_DTYPES if odd("dtype", i) else DTYPES))
        shape = draw(st.lists(st.sampled_from(NUMBERS), max_size=3))
        if odd("dimension", i):
            shape = [*shape, draw(st.sampled_from(ODD_NUMBERS))]
        numel = 1
        for d in shape:
            numel *= int(float(d))
        bits = SAFETENSORS_DTYPES[dtype].bits if dtype in SAFETENSORS_DTYPES else 8
        begin, end = offset, offset + numel * bits // 8
        begin += draw(st.sampled_from([-1, 1])) if odd("begin", i) else 0
        end += draw(st.sampled_from([-1, 1])) if odd("end", i) else 0
        offset = end
        begin_text = draw(st.sampled_from(ODD_NUMBERS)) if odd("offset text", i) else str(begin)
        sep = draw(st.sampled_from([LONG_SPACE, *SPACES])) if odd("space", i) else ws
        dims = f",{ws}".join(shape)
        if odd("spelling", i):  # another spelling the library reads: fields in another order
            parts.append(
                f'"{name}":{{"data_offsets":[{begin_text},{end}],"shape":[{dims}],"dtype":"{dtype}"}}'
            )
            continue
        parts.append(
            f'"{name}":{sep}{{"dtype":{ws}"{dtype}",{ws}"shape":{ws}[{dims}],{ws}'
            f'"data_offsets":{ws}[{begin_text},{ws}{end}]}}'
        )
    if "order" in mutations and n > 1:
        i = draw(st.integers(0, n - 2))
        parts[i], parts[i + 1] = parts[i + 1], parts[i]
    if draw(st.booleans()) or "metadata" in mutations:
        value = '{"format":"pt"}'
        where = 0
        if "metadata" in mutations:
            value = draw(st.sampled_from(["null", "{}", '{"k":1}', "[]", '{"a":"b","a":"c"}']))
            where = draw(st.sampled_from([0, len(parts), n // 2]))
        parts.insert(where, f'"__metadata__":{ws}{value}')
        if "metadata" in mutations and draw(st.booleans()):
            parts.append('"__metadata__":{}')
    text = "{" + ws + f",{ws}".join(parts) + ws + "}"
    if "tail" in mutations:
        text += draw(st.sampled_from(["   ", LONG_SPACE, "x", "}", ",", "\x00"]))
    elif draw(st.booleans()):
        text += " " * draw(st.integers(0, 7))  # the library's padding
    data_size = offset
    if "data size" in mutations:
        data_size = max(0, offset + draw(st.sampled_from([1, -1])))
    event("mutated" if mutations else "as written")
    return text, max(0, data_size)


@settings(max_examples=10 * EXAMPLES, deadline=None)
@given(near_common_headers())
def test_generated_near_misses_read_as_the_careful_path_reads_them(case):
    text, data_size = case
    event("read fast" if check_both(text, data_size) else "read carefully")
