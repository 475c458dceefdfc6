"""A safetensors header, read exactly as strictly as the safetensors library reads it.

The library (0.8) parses the header with serde_json into ``{"__metadata__": {str: str} | null,
name: {"dtype": ..., "shape": [...], "data_offsets": [begin, end]}}`` and then checks that the
tensors, sorted by ``(begin, end)``, tile the data section from byte 0 with no hole, and that the
file ends where the last one does. Python's ``json`` is looser than serde_json (``NaN``, lone
surrogates, a duplicated ``dtype``, ``-0`` as an integer), and materialising a hostile 100 MB
header in Python objects takes gigabytes. So this module parses the header itself:

- the header writers produce (an optional ``__metadata__`` first, then two entries or more in
  data order, each ``"name": {"dtype", "shape", "data_offsets"}`` in that order, no escape in a
  name) is validated and read in one regular-expression pass over the whole header, its layout
  checked on whole columns (``read_header``); the slightest doubt hands it to the careful path
  below, which reads the same header to the same result or says precisely what is wrong;
- the careful path: a regular expression reads a whole ``"name": {dtype, shape, data_offsets}``
  entry at a time (fields in any order);
- any other entry (escaped names, extra fields that safetensors ignores, the array form
  ``["F32", [2], [0, 8]]`` that serde also accepts) is decoded on its own, at most
  ``MAX_ENTRY_CHARS`` of it, with hooks that refuse what serde refuses;
- ``__metadata__`` is validated by a regular expression without building anything; it is decoded
  only when someone asks for it.

Memory stays a small multiple of the header (the entries themselves), and every check runs at C
speed per entry. Deliberate differences from the library, each pinned by a test and listed in
docs/hostile-input.md: an entry may not exceed ``MAX_ENTRY_CHARS`` characters of JSON; a shape
dimension must fit in int64 and an F4 tensor's last dimension must be even
(``safetensors.torch.load_file`` fails on both after accepting the header); F6 dtypes are refused
(the same: torch has no such dtype).

>>> entries, meta = parse_header('{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}')
>>> entries
[HeaderEntry(name='w', dtype='F32', shape=(2,), begin=0, end=8)]
>>> read_header('{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}', 8)
HeaderTable(names=['w'], dtypes=['F32'], shapes=[(2,)], begins=[0], nbytes=[8], metadata=None)
"""

from __future__ import annotations

import json
import re
import sys
from itertools import repeat
from math import prod
from operator import itemgetter, mul, sub
from typing import Any, NamedTuple

from loadkit.checkpoint.dtypes import SAFETENSORS_DTYPES, torch_shape
from loadkit.errors import HeaderProblem as HeaderProblem  # raised here; defined with the others

MAX_HEADER_BYTES = 100_000_000  # the safetensors library's limit


class TensorInfo(NamedTuple):
    """What a header says of one tensor; ``offset`` is absolute within ``file`` (a path or a
    URL)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    file: str
    offset: int

    @property
    def numel(self) -> int:
        return prod(self.shape)


LFS_POINTER_MAX = 1024  # a Git LFS pointer file is smaller (the spec's limit)
_LFS_POINTER = re.compile(rb"version https://git-lfs\.github\.com/spec/v1\n(?:.*\n)*?size (\d+)")


def oversized_length(start: bytes, n: int, size: int) -> str:
    r"""What to say of a ``size``-byte file whose first 8 bytes read as a header length ``n``
    over the limit. Past the file's end too, they cannot be a header length: no safetensors
    file at all (a text file named ``x.safetensors`` reads as 8e18 bytes). ``start`` is the
    file's first 8 bytes or more: up to ``LFS_POINTER_MAX`` of them recognise a Git LFS pointer
    (a clone without ``git lfs pull``).

    Example:
        >>> oversized_length(b"hello, t", int.from_bytes(b"hello, t", "little"), 37)[:58]
        "not a safetensors file: its first 8 bytes are text ('hello"
        >>> pointer = b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 90\n"
        >>> oversized_length(pointer, int.from_bytes(pointer[:8], "little"), len(pointer))
        'a Git LFS pointer, not the file (which has 90 bytes): run git lfs pull'
    """
    head = start[:8]
    if n <= size - 8:  # a header really that long: the library refuses it
        return f"header of {n} bytes exceeds the safetensors limit of {MAX_HEADER_BYTES}"
    pointer = _LFS_POINTER.match(start)
    if pointer is not None:
        return (
            f"a Git LFS pointer, not the file (which has {int(pointer[1])} bytes): run git lfs pull"
        )
    if all(32 <= b < 127 or b in (9, 10, 13) for b in head):
        first = "are text (" + repr(head.decode("ascii")) + ")"
    else:
        first = "are " + head.hex(" ")
    return (
        f"not a safetensors file: its first 8 bytes {first}, which as a header length read "
        f"{n} bytes: more than the file's {size}, and that exceeds the safetensors limit of "
        f"{MAX_HEADER_BYTES}"
    )


MAX_ENTRY_CHARS = 1 << 20  # loadkit's own limit on one tensor's entry (safetensors has none)
MAX_DEPTH = 127  # serde_json's recursion limit: nested arrays and objects, the root included
U64_MAX = (1 << 64) - 1
I64_MAX = (1 << 63) - 1

_WS = r"[ \t\n\r]*+"
# A JSON string as serde_json accepts it: no raw control character, only the standard escapes,
# and a \u escape of a surrogate only as a high-low pair.
_STR_BODY = (
    r'(?:[^"\\\x00-\x1f]++|\\["\\/bfnrt]'
    r"|\\u(?:[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
    r"|(?![dD][89a-fA-F])[0-9a-fA-F]{4}))*+"
)
_UINT = r"(?:0|[1-9][0-9]{0,19})"  # 20 digits at most: longer can only be beyond u64
# An array of integers (the group: its inside). At most 1024 of them: a longer shape takes the
# slow path, which stops at MAX_ENTRY_CHARS instead of scanning a 100 MB array first.
_UINTS = rf"\[{_WS}((?:{_UINT}(?:{_WS},{_WS}{_UINT}){{0,1023}}+)?){_WS}\]"
_NAME = r'"([^"\\\x00-\x1f]*+)"'  # a name without escapes
# One "name": {"dtype", "shape", "data_offsets"} member as writers produce it, and the separator
# after it; then the same with the fields in any order.
_CANONICAL = re.compile(
    rf'{_NAME}{_WS}:{_WS}\{{{_WS}"dtype"{_WS}:{_WS}"([A-Z0-9_]++)"{_WS},{_WS}"shape"{_WS}:{_WS}'
    rf'{_UINTS}{_WS},{_WS}"data_offsets"{_WS}:{_WS}\[{_WS}({_UINT}){_WS},{_WS}({_UINT}){_WS}\]'
    rf"{_WS}\}}{_WS}([,}}]){_WS}"
)
_FIELD = rf'"(dtype|shape|data_offsets)"{_WS}:{_WS}(?:"([A-Z0-9_]++)"|{_UINTS})'


class _Lazy:
    """A regular expression compiled on first use: ``loadkit inspect`` pays only for
    the ones an ordinary header needs (each compile costs a fraction of a millisecond)."""

    def __init__(self, pattern: str) -> None:
        self.source = pattern
        self.compiled: re.Pattern[str] | None = None

    def __getattr__(self, name: str) -> Any:
        if self.compiled is None:
            self.compiled = re.compile(self.source)
        return getattr(self.compiled, name)


_STRING = _Lazy(f'"{_STR_BODY}"')  # a name with an escape, or a string to skip
_META = _Lazy(
    rf"null|\{{{_WS}(?:\"{_STR_BODY}\"{_WS}:{_WS}\"{_STR_BODY}\"{_WS}"
    rf"(?:,{_WS}(?!\}})|(?=\}})))*+\}}"
)
_ENTRY = _Lazy(
    rf"{_NAME}{_WS}:{_WS}\{{{_WS}{_FIELD}{_WS},{_WS}{_FIELD}{_WS},{_WS}{_FIELD}"
    rf"{_WS}\}}{_WS}([,}}])"
)
_SPACE = re.compile(_WS)
_VALID_STRINGS = _Lazy(f'(?:[^"]++|"{_STR_BODY}")*+')  # every string in a span is valid
_INNERMOST = _Lazy(r"\[[^\[\]{}]*+\]|\{[^\[\]{}]*+\}")
_KNOWN_FIELDS = ("dtype", "shape", "data_offsets")


class HeaderEntry(NamedTuple):
    """One tensor as its header entry describes it; offsets are relative to the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def parse_header(text: str) -> tuple[list[HeaderEntry], str | None]:
    """The entries of a header (in header order, a repeated name's last entry winning, as in the
    library) and the JSON text of its ``__metadata__`` (``None`` without one). Raises
    ``HeaderProblem`` for anything the safetensors library refuses (see the module docstring).
    """
    entries: dict[str, HeaderEntry] = {}
    metadata: list[str | None] = []  # the __metadata__ text, once met
    pos = _SPACE.match(text).end()  # type: ignore[union-attr]
    if not text.startswith("{", pos):
        raise HeaderProblem(f"the header is not an object ({_found(text, pos)})")
    pos = _SPACE.match(text, pos + 1).end()  # type: ignore[union-attr]
    if text.startswith("}", pos):
        pos += 1
    else:
        pos = _read_entries(text, pos, entries, metadata)
    pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]
    if pos != len(text):
        raise HeaderProblem(
            f"header is not valid JSON: trailing characters after it ({_found(text, pos)})"
        )
    return list(entries.values()), metadata[0] if metadata else None


def _read_entries(
    text: str, pos: int, entries: dict[str, HeaderEntry], metadata: list[str | None]
) -> int:
    """Every entry from ``pos`` (the first name's quote) to the closing brace, into ``entries``
    (``__metadata__`` into ``metadata``); the position after the brace."""
    canonical, dtypes = _CANONICAL.match, SAFETENSORS_DTYPES
    new = tuple.__new__  # a NamedTuple's own __new__ runs Python code: 0.3 us an entry
    while True:
        # The fast path: one regex match per entry (and the separator and space after it),
        # checks only where a value could fail. It cannot read a name with an escape.
        m = canonical(text, pos)
        if m is not None:
            stop = m.end()
            name, dtype, dims, begin, end, sep = m.groups()
            if (
                stop - pos <= MAX_ENTRY_CHARS
                and dtype in dtypes
                and name != "__metadata__"
                and len(dims) < 19
                and len(begin) < 20
                and len(end) < 20
            ):
                shape = tuple(map(int, dims.split(","))) if dims else ()
                entries[name] = new(HeaderEntry, (name, dtype, shape, int(begin), int(end)))
                pos = stop
                if sep == "}":
                    return pos
                continue
        pos, done = _careful_entry(text, pos, m, entries, metadata)
        if done:
            return pos


def _careful_entry(
    text: str,
    pos: int,
    m: re.Match[str] | None,
    entries: dict[str, HeaderEntry],
    metadata: list[str | None],
) -> tuple[int, bool]:
    """One entry the fast path did not take (``m``: its canonical match, if any), read the
    careful way: the position of the next name, or after the closing brace (then ``True``)."""
    m = m or _ENTRY.match(text, pos)
    if m is not None and m.end() - pos > MAX_ENTRY_CHARS:
        raise HeaderProblem(_too_long(m.end() - pos), m.group(1))
    entry, sep = _matched_entry(m) if m is not None else (None, None)
    if m is not None and entry is not None:
        entries[entry.name] = entry  # a repeated name: the last entry wins
        pos = _SPACE.match(text, m.end()).end()  # type: ignore[union-attr]
        if sep == "}":
            return pos, True
    else:
        pos = _keyed_entry(text, pos, entries, metadata)
        pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]
        if text.startswith("}", pos):
            return pos + 1, True
        pos = _expect(text, pos, ",")
        pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]
    if not text.startswith('"', pos):
        raise HeaderProblem(
            f"header is not valid JSON: expected a tensor name, {_found(text, pos)}"
        )
    return pos, False


def _matched_entry(m: re.Match[str]) -> tuple[HeaderEntry | None, str | None]:
    """The entry a whole-entry match holds, if it can be read from the match, and the
    separator after it."""
    if m.re is _CANONICAL:  # a number that may not fit, a name to decode the slow way
        name, dtype, dims, begin, end, sep = m.groups()
        if dtype in SAFETENSORS_DTYPES and name != "__metadata__":
            shape = list(map(int, dims.split(","))) if dims else []
            return _entry(name, dtype, shape, [int(begin), int(end)]), sep
        return None, sep
    return _fast_entry(m), m.group(11)


def _keyed_entry(
    text: str, pos: int, entries: dict[str, HeaderEntry], metadata: list[str | None]
) -> int:
    """One ``"name": value`` read key first (an escaped name, ``__metadata__``, any entry the
    regular expressions do not take); the position after the value."""
    name, pos = _key(text, pos)
    pos = _expect(text, pos, ":")
    if name != "__metadata__":
        entries[name], pos = _slow_entry(text, pos, name)
        return pos
    if metadata:
        raise HeaderProblem("'__metadata__' appears twice", name)
    meta = _META.match(text, pos)
    if meta is None:
        raise HeaderProblem(
            f"__metadata__ must be an object of string values (or null), {_found(text, pos)}",
            name,
        )
    metadata.append(None if meta.group() == "null" else meta.group())
    return meta.end()


def parse_metadata(text: str | None) -> dict[str, str]:
    """The ``__metadata__`` text ``parse_header`` returned, as a dict (``{}`` for none)."""
    return {} if text is None else json.loads(text)


def _found(text: str, pos: int) -> str:
    if pos >= len(text):
        return "found the end of the header"
    return f"found {text[pos : pos + 20]!r} at character {pos}"


def _too_long(chars: int) -> str:
    return (
        f"its entry takes {chars} characters of JSON; loadkit reads entries of at most "
        f"{MAX_ENTRY_CHARS} (the safetensors library has no such limit)"
    )


def _expect(text: str, pos: int, char: str) -> int:
    pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]
    if not text.startswith(char, pos):
        raise HeaderProblem(f"header is not valid JSON: expected {char!r}, {_found(text, pos)}")
    return _SPACE.match(text, pos + 1).end()  # type: ignore[union-attr]


def _key(text: str, pos: int) -> tuple[str, int]:
    m = _STRING.match(text, pos)
    if m is None:
        what = (
            "a name is not a valid JSON string (control character, bad escape or lone surrogate)"
            if text.startswith('"', pos)
            else "expected a tensor name"
        )
        raise HeaderProblem(f"header is not valid JSON: {what}, {_found(text, pos)}")
    raw = m.group()
    name = raw[1:-1] if "\\" not in raw else json.decoder.scanstring(raw, 1)[0]  # type: ignore[attr-defined]
    return name, m.end()


def _ints(inner: str) -> list[int]:
    return [int(x) for x in inner.split(",")] if inner.strip(" \t\n\r") else []


def _fast_entry(m: re.Match[str]) -> HeaderEntry | None:
    """The entry the any-order regex read, or ``None`` to decode it the slow way (which says
    precisely what is wrong)."""
    name = m.group(1)
    if name == "__metadata__":
        return None
    fields: dict[str, Any] = {}
    for i in (2, 5, 8):
        key, string, array = m.group(i, i + 1, i + 2)
        if key in fields or (key == "dtype") != (string is not None):
            return None
        fields[key] = string if string is not None else _ints(array)
    if fields["dtype"] not in SAFETENSORS_DTYPES or len(fields["data_offsets"]) != 2:
        return None
    return _entry(name, fields["dtype"], fields["shape"], fields["data_offsets"])


def _slow_entry(text: str, pos: int, name: str) -> tuple[HeaderEntry, int]:
    """Decode one entry on its own: whatever serde accepts, within ``MAX_ENTRY_CHARS``."""
    value, end = _decode_bounded(text, pos, name)
    if isinstance(value, _Object):
        fields: dict[str, Any] = {}
        for key, item in value:
            if key in _KNOWN_FIELDS:
                if key in fields:
                    raise HeaderProblem(f"duplicate field '{key}' in its entry", name)
                fields[key] = item
        missing = [k for k in _KNOWN_FIELDS if k not in fields]
        if missing:
            raise HeaderProblem(f"its entry has no field '{missing[0]}'", name)
        dtype, shape, offsets = fields["dtype"], fields["shape"], fields["data_offsets"]
    elif isinstance(value, list):
        if len(value) != 3:  # serde also reads a struct from an array of its fields
            raise HeaderProblem(
                f"its entry is an array of {len(value)} items, not [dtype, shape, data_offsets]",
                name,
            )
        dtype, shape, offsets = value
    else:
        raise HeaderProblem(f"its entry is {_kind(value)}, not an object", name)
    if isinstance(dtype, _Object):  # serde's other spelling of an enum: {"F32": null}
        if len(dtype) != 1 or dtype[0][1] is not None:
            raise HeaderProblem(f"dtype {_show(dtype)} is not a dtype name", name)
        dtype = dtype[0][0]
    for what, item in (("shape", shape), ("data_offsets", offsets)):
        if not isinstance(item, list) or isinstance(item, _Object):
            raise HeaderProblem(f"{what} is {_kind(item)}, not an array of integers", name)
        for x in item:
            if type(x) is not int or x < 0 or x > U64_MAX:
                raise HeaderProblem(
                    f"{what} {_show(item)} holds {_show(x)}, not an unsigned integer", name
                )
    return _entry(name, dtype, shape, offsets), end


def _entry(name: str, dtype: Any, shape: list[int], offsets: list[int]) -> HeaderEntry:
    if not isinstance(dtype, str):
        raise HeaderProblem(f"dtype is {_kind(dtype)}, not a dtype name (shape {shape})", name)
    if dtype not in SAFETENSORS_DTYPES:
        raise HeaderProblem(f"unknown dtype {dtype!r} (shape {shape})", name)
    if len(offsets) != 2:
        raise HeaderProblem(f"data_offsets {offsets} are not [begin, end]", name)
    for what, item in (("shape", shape), ("data_offsets", offsets)):
        if any(x > U64_MAX for x in item):
            raise HeaderProblem(f"{what} {item} holds an integer beyond 64 bits", name)
    for d in shape:
        if d > I64_MAX:
            raise HeaderProblem(
                f"shape {shape} has a dimension beyond int64, which torch cannot hold "
                "(safetensors.torch.load_file fails on it too)",
                name,
            )
    return HeaderEntry(name, dtype, tuple(shape), offsets[0], offsets[1])


def check_layout(entries: list[HeaderEntry], data_size: int) -> list[HeaderEntry]:
    """The entries sorted by ``(begin, end)``, checked as the library checks them: they tile
    ``data_size`` bytes from 0, each spanning exactly its shape's bytes. Raises
    ``HeaderProblem`` (``TruncatedData`` when ``data_size`` is shorter than the entries need).
    """
    ordered = sorted(entries, key=_OFFSETS)
    start = 0
    whole_bytes = _WHOLE_BYTES
    for e in ordered:
        _, dtype, shape, begin, end = e  # locals: this loop runs once per tensor
        if begin != start or end < begin:
            where = "a hole before it" if e.begin > start else "it overlaps the tensor before"
            raise HeaderProblem(
                f"data_offsets [{e.begin}, {e.end}] (shape {list(e.shape)}, {e.dtype}) do not "
                f"start where the previous tensor ends ({start}): {where}",
                e.name,
            )
        start = end
        size = whole_bytes.get(dtype)
        numel = prod(shape)
        # A non-zero product that matches the span cannot have overflowed on the way; anything
        # else takes the careful path (which also says what is wrong).
        if size is None or numel == 0 or numel * size != end - begin:
            need = tensor_nbytes(e)
            if e.end - e.begin != need:
                raise HeaderProblem(
                    f"shape {list(e.shape)} of dtype {e.dtype} needs {need} bytes but "
                    f"data_offsets [{e.begin}, {e.end}] span {e.end - e.begin}",
                    e.name,
                )
    if start > data_size:
        last = ordered[-1]
        raise TruncatedData(
            f"tensor of shape {list(last.shape)} ({last.dtype}) ends at data byte {start} but "
            f"the file holds {data_size} bytes of data",
            last.name,
        )
    if start < data_size:
        raise HeaderProblem(
            f"{data_size - start} bytes after the last tensor's data (at {start}): safetensors "
            "requires the tensors to cover the data section exactly"
        )
    return ordered


_OFFSETS = itemgetter(3, 4)  # a HeaderEntry's (begin, end), at C speed

# Bytes per element of the dtypes torch loads element for element (all but F4 and F6).
_WHOLE_BYTES = {
    name: d.bits // 8 for name, d in SAFETENSORS_DTYPES.items() if d.torch and d.bits % 8 == 0
}


class TruncatedData(HeaderProblem):
    """The file ends before the data the header describes."""


def tensor_nbytes(e: HeaderEntry) -> int:
    """Bytes of one entry's data, computed as the library computes it (checked in u64)."""
    numel = 1
    for d in e.shape:
        numel *= d
        if numel > U64_MAX:
            raise HeaderProblem(f"shape {list(e.shape)} overflows 64 bits", e.name)
    dt = SAFETENSORS_DTYPES[e.dtype]
    bits = numel * dt.bits
    if bits > U64_MAX:
        raise HeaderProblem(f"shape {list(e.shape)} of {e.dtype} overflows 64 bits", e.name)
    if bits % 8:
        raise HeaderProblem(
            f"shape {list(e.shape)} of {e.dtype} is {bits} bits, not a whole number of bytes",
            e.name,
        )
    if dt.torch is None:
        raise HeaderProblem(
            f"dtype {e.dtype} (shape {list(e.shape)}) has no torch dtype; "
            "safetensors.torch cannot load it either",
            e.name,
        )
    if dt.bits < 8 and e.shape and torch_shape(e.dtype, e.shape)[-1] * 8 != e.shape[-1] * dt.bits:
        raise HeaderProblem(
            f"shape {list(e.shape)} of {e.dtype}: torch packs {8 // dt.bits} values per element, "
            "so the last dimension must be a multiple of that (safetensors.torch fails too)",
            e.name,
        )
    return bits // 8


# --- the common header, read whole ------------------------------------------------------------


class HeaderTable(NamedTuple):
    """A checked header: its tensors in data order, one sequence per field (offsets relative to
    the data section), and its ``__metadata__`` JSON text (``None`` without one)."""

    names: list[str]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    begins: list[int]
    nbytes: list[int]
    metadata: str | None


def read_header(text: str, data_size: int) -> HeaderTable:
    """``parse_header`` and ``check_layout`` in one: a header's tensors in data order, checked
    against ``data_size`` bytes of data. Raises ``HeaderProblem`` (``TruncatedData``) exactly
    as they do.

    The common header is read whole at C speed (``_read_common``); any other goes the careful
    way, which also says what is wrong.

    >>> table = read_header('{"a": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]}}', 3)
    >>> table.names, table.shapes, table.nbytes
    (['a'], [(3,)], [3])
    """
    table = _read_common(text, data_size)
    if table is not None:
        return table
    entries, metadata = parse_header(text)
    ordered = check_layout(entries, data_size)
    if not ordered:
        return HeaderTable([], [], [], [], [], metadata)
    names, dtypes, shapes, begins, ends = zip(*ordered, strict=True)
    nbytes = list(map(sub, ends, begins))
    return HeaderTable(list(names), list(dtypes), list(shapes), list(begins), nbytes, metadata)


# The common header's grammar is the careful path's canonical entry (``_CANONICAL``) with every
# repetition bounded, so that no entry it reads can exceed MAX_ENTRY_CHARS (the careful path
# refuses one that does) and no number can exceed int64: whitespace runs of at most
# _COMMON_SPACE, names of at most _COMMON_NAME characters, at most _COMMON_DIMS dimensions of at
# most 18 digits (below 2**63), dtype names of at most 16 characters. Its longest entry is far
# below MAX_ENTRY_CHARS (tests/library/checkpoint/test_header.py builds it). Anything
# longer is not an error here, only not common: the careful path reads it.
_COMMON_SPACE = 256
_COMMON_NAME = 65536
_COMMON_DIMS = 64
_CWS = rf"[ \t\n\r]{{0,{_COMMON_SPACE}}}+"
_CUINT = r"(?:0|[1-9][0-9]{0,17}+)"
# "name": {"dtype": "...", "shape": [...], "data_offsets": [begin, end]}; groups: name, dtype,
# the shape's inside, begin, end.
_COMMON_BODY = (
    rf'"([^"\\\x00-\x1f]{{0,{_COMMON_NAME}}}+)"{_CWS}:{_CWS}\{{{_CWS}"dtype"{_CWS}:{_CWS}'
    rf'"([A-Z0-9_]{{1,16}}+)"{_CWS},{_CWS}"shape"{_CWS}:{_CWS}'
    rf"\[{_CWS}((?:{_CUINT}(?:{_CWS},{_CWS}{_CUINT}){{0,{_COMMON_DIMS - 1}}}+)?){_CWS}\]"
    rf'{_CWS},{_CWS}"data_offsets"{_CWS}:{_CWS}\[{_CWS}({_CUINT}){_CWS},{_CWS}({_CUINT}){_CWS}\]'
    rf"{_CWS}\}}{_CWS}"
)
# The opening brace and, when it comes first (as the library writes it), the __metadata__.
_COMMON_START = _Lazy(
    rf'{_CWS}\{{{_CWS}(?:"__metadata__"{_CWS}:{_CWS}({_META.source}){_CWS},{_CWS})?'
)
_COMMON_METADATA_CHARS = 1 << 20  # a longer __metadata__ (or none first) is not common
_COMMON_ENTRY = _Lazy(rf"{_COMMON_BODY},{_CWS}")  # an entry, but the last
_COMMON_LAST = _Lazy(rf"{_COMMON_BODY}\}}{_CWS}")  # the last entry and the closing brace


def _read_common(text: str, data_size: int) -> HeaderTable | None:
    """The header as the careful path reads it, if it is common (see the grammar above) and has
    two entries or more, in data order and checked; ``None`` for any other header, or for any
    doubt: a repeated name, a tensor named ``__metadata__``, entries not already in data order,
    a hole, a zero-size tensor, a sub-byte or unknown dtype, a wrong size, a ``__metadata__`` of
    over ``_COMMON_METADATA_CHARS``. It never raises: what it refuses, the careful path reads (or
    refuses, saying why)."""
    start = _COMMON_START.match(text, 0, _COMMON_METADATA_CHARS)
    if start is None or _COMMON_ENTRY.match(text, start.end()) is None:
        return None  # not common from the start: the careful path reads it, no time lost
    # One pass validates and reads: split at every entry but the last. The header is common
    # exactly when the first entry starts where the start ends, nothing is left between two
    # entries, and what follows them is the last entry.
    pieces = _COMMON_ENTRY.split(text)  # before, 5 groups, between, 5 groups, ..., after
    if len(pieces[0]) != start.end() or any(pieces[6:-1:6]):
        return None
    last = _COMMON_LAST.fullmatch(pieces[-1])
    if last is None:
        return None
    columns = [pieces[i::6] for i in range(1, 6)]
    del pieces
    for column, value in zip(columns, last.groups(), strict=True):
        column.append(value)
    names, dtypes, dims, begin_texts, end_texts = columns
    unique = set(names)
    if len(unique) != len(names) or "__metadata__" in unique:
        return None  # a repeated name (the last entry wins, in the first one's place) or worse
    # In data order and tiling the data section, each tensor starting where the previous one
    # ends. The numbers are written one way only (no leading zero): equal texts, equal numbers.
    if begin_texts[0] != "0" or begin_texts[1:] != end_texts[:-1]:
        return None
    ends = list(map(int, end_texts))
    if ends[-1] != data_size:
        return None
    begins = [0, *ends[:-1]]
    # A checkpoint has few distinct shapes: each is parsed once.
    shape_of = {d: tuple(map(int, d.split(","))) if d else () for d in set(dims)}
    numel_of = {d: prod(shape) for d, shape in shape_of.items()}
    # The bytes each tensor needs; 0 for a dtype not read element for element (or unknown) and
    # for a zero-size tensor, whose overflow checks only the careful path makes.
    itemsizes = map(_WHOLE_BYTES.get, dtypes, repeat(0))
    need = list(map(mul, map(numel_of.__getitem__, dims), itemsizes))
    nbytes = list(map(sub, ends, begins))
    if 0 in need or need != nbytes:
        return None
    # A non-zero size that matches the span cannot have overflowed 64 bits on the way (each
    # partial product is at most the whole), and every dimension fits int64: each check of
    # tensor_nbytes holds.
    metadata = None if start.group(1) == "null" else start.group(1)
    shapes = list(map(shape_of.__getitem__, dims))
    dtypes = list(map(sys.intern, dtypes))  # one string per dtype, not one per tensor
    return HeaderTable(names, dtypes, shapes, begins, nbytes, metadata)


# --- decoding one entry on its own ---------------------------------------------------------------


class _Object(list):
    """A JSON object as its list of (key, value) pairs: duplicates stay visible."""


def _refuse_constant(name: str) -> Any:
    raise HeaderProblem(f"{name} is not JSON (safetensors refuses it)")


def _float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise HeaderProblem(f"number {text[:40]} is out of float64 range (safetensors refuses it)")
    return value


def _int(text: str) -> int | float:
    # serde_json: an integer that fits u64 (i64 when negative) is an integer; "-0" and anything
    # longer is a float (an "invalid type" where an integer is expected).
    if text == "-0" or len(text) > 20:
        return _float(text)
    value = int(text)
    if value > U64_MAX or value < -(1 << 63):
        return _float(text)
    return value


_DECODER = json.JSONDecoder(
    object_pairs_hook=_Object,
    parse_float=_float,
    parse_int=_int,
    parse_constant=_refuse_constant,
)


def _decode_bounded(text: str, pos: int, name: str) -> tuple[Any, int]:
    """Decode the JSON value at ``pos``, reading at most ``MAX_ENTRY_CHARS`` of text."""
    size = 512
    while True:
        stop = min(len(text), pos + size)
        window = text[pos:stop]
        try:
            value, end = _DECODER.raw_decode(window)
            break
        except HeaderProblem as exc:
            raise HeaderProblem(exc.message, name) from None
        except RecursionError:
            raise HeaderProblem(f"its entry nests deeper than {MAX_DEPTH} levels", name) from None
        except ValueError as exc:
            if stop == len(text):
                raise HeaderProblem(f"its entry is not valid JSON ({exc})", name) from None
            if size == MAX_ENTRY_CHARS:
                raise HeaderProblem(
                    f"its entry is not valid JSON within {MAX_ENTRY_CHARS} characters (loadkit "
                    f"reads entries of at most {MAX_ENTRY_CHARS}; safetensors has no limit)",
                    name,
                ) from None
            size = min(4 * size, MAX_ENTRY_CHARS)
    span = window[:end]
    if '"' in span and not _VALID_STRINGS.fullmatch(span):
        raise HeaderProblem("its entry holds a string with a lone surrogate escape", name)
    if span.count("[") + span.count("{") > MAX_DEPTH - 2 and _depth(span) > MAX_DEPTH - 1:
        raise HeaderProblem(f"its entry nests deeper than {MAX_DEPTH} levels", name)
    return value, pos + end


def _depth(span: str) -> int:
    """How deeply arrays and objects nest in a valid JSON ``span`` (strings do not count)."""
    stripped = _STRING.sub("", span)
    depth = 0
    while True:
        stripped, n = _INNERMOST.subn("", stripped)
        if not n:
            return depth
        depth += 1
        if depth > MAX_DEPTH:
            return depth


def _kind(value: Any) -> str:
    if isinstance(value, _Object):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return f"the string {_show(value)}"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    return f"the number {_show(value)}"


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True) if not isinstance(value, _Object) else "{...}"
    return text if len(text) <= 60 else text[:57] + "..."
