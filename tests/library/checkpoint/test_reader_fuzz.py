"""Differential fuzzing against the safetensors library (the anchor; issue 13).

Hypothesis writes safetensors files byte by byte: valid headers and mutated ones (offsets with
holes, overlaps and trailing bytes, zero-size tensors anywhere, every dtype and unknown ones,
shapes of all sizes, metadata of every type, the array and map spellings serde also accepts, and
the JSON that Python reads but serde refuses: NaN, lone surrogates, duplicate fields, deep
nesting, huge numbers, ``-0``). For each:

- ``open_checkpoint`` (and reading every tensor) succeeds exactly when
  ``safetensors.torch.load_file`` does, and otherwise raises a ``loadkit.errors`` error;
- an accepted file reads back bit-identical to ``load_file``: names, dtypes, shapes, bytes;
- ``loadkit inspect`` exits 0, 1 or 2, never with a traceback, and prints no raw
  control character.

Folders with ``model.safetensors.index.json`` get the same treatment, with a reference reader of
the index written here (an index is transformers' format: every shard it names must load in
safetensors, every key must be in its shard, no key in two shards, and no shard outside the
folder).

The documented deviations (docs/hostile-input.md) are never generated here; each has its own
test in ``tests/library/checkpoint/test_reader_hostile.py``. ``make test`` runs these derandomized;
``make test-deep`` runs them with random seeds and ten times the examples.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from repo_paths import DATA as DATA_PATH
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from loadkit import open_checkpoint
from loadkit.checkpoint.dtypes import SAFETENSORS_DTYPES
from loadkit.errors import LoadkitError
from loadkit_inspect.cli.main import main
from loadkit_inspect.sources.index import open_lenient

EXAMPLES = settings.default.max_examples  # 100 in `make test`, 1000 in `make test-deep`
FUZZ = settings(
    max_examples=4 * EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def workdir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="loadkit-fuzz-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


# --- a JSON writer that can also write what Python's json would not -----------------------------


class Raw(str):
    """JSON text written as is (NaN, a lone surrogate escape, a huge number, ...)."""


class Obj(list):  # type: ignore[type-arg]
    """A JSON object as a list of (key, value) pairs: order and duplicates are kept."""


def emit(value: Any, ws: str = "", ascii: bool = True) -> str:
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, Obj):
        inner = f",{ws}".join(f"{emit(k, ws, ascii)}:{ws}{emit(v, ws, ascii)}" for k, v in value)
        return "{" + ws + inner + ws + "}"
    if isinstance(value, list):
        return "[" + f",{ws}".join(emit(v, ws, ascii) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ascii)


# --- strategies ---------------------------------------------------------------------------------

DTYPE_NAMES = sorted(SAFETENSORS_DTYPES)
# Names of every kind: dotted paths, digits, unicode, quotes and backslashes, control characters.
names = st.one_of(
    st.sampled_from(["w", "model.layers.0.weight", "a.b", "", "__metadata__", "l.{0}.v", "#"]),
    st.text(alphabet=st.sampled_from('ab.0129_#{}-"\\/ \n\t\x01\x7fé€😀\u202e'), max_size=12),
    st.text(max_size=6),
)
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=5),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.lists(st.tuples(st.text(max_size=3), inner), max_size=3)
    ).map(lambda v: Obj(v) if v and isinstance(v[0], tuple) else v),
    max_leaves=8,
)
# JSON that Python's json reads and serde_json refuses, or the reverse, or both read.
oddities = st.sampled_from(
    [
        "NaN",
        "Infinity",
        "-Infinity",
        '"\\ud800"',
        '"\\udc00\\ud800"',
        '"\\ud83d\\ude00"',
        '"\\\\ud800"',
        "1e400",
        "-1e400",
        "1e-400",
        "0e999999999",
        "1" + "0" * 308,
        "18" + "0" * 307,
        "9" * 5000,
        "-0",
        "-0.0",
        "1.0",
        "01",
        "[1,]",
        "[" * 125 + "]" * 125,
        "[" * 126 + "]" * 126,
        "{" * 40 + "}" * 40,
        '{"a":1,"a":2}',
        "tru",
        '"\x01"',
        '"\\x"',
    ]
).map(Raw)
small_dims = st.integers(0, 4)
odd_dims = st.one_of(
    st.sampled_from([2**31, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -1, 10**20]),
    st.sampled_from(["1", 1.0, True, None, [1]]),
    oddities,
)
shapes = st.one_of(
    st.lists(small_dims, max_size=3),
    st.lists(st.one_of(small_dims, odd_dims), min_size=1, max_size=3),
)


def element_bits(dtype: str) -> int:
    return SAFETENSORS_DTYPES[dtype].bits if dtype in SAFETENSORS_DTYPES else 8


def nbytes(dtype: str, shape: list[Any]) -> int:
    """The bytes a header entry needs (best effort for odd shapes: the generator's guess)."""
    n = 1
    for d in shape:
        n *= d if type(d) is int and 0 <= d < 2**20 else 1
    return n * element_bits(dtype) // 8


CORRUPTIONS = (
    "offset",  # a hole, an overlap or a wrong span
    "data size",  # trailing bytes, or a short file
    "swap",  # two tensors swap their data
    "offset type",  # an offset of another type or size
    "dtype",  # an unknown dtype
    "shape",  # a dimension of another type or size
    "field",  # a field missing, repeated, or an odd value in an ignored one
    "metadata",  # __metadata__ of another type, or twice
    "tail",  # characters after the JSON
    "utf-8",  # a byte that is not UTF-8
    "length",  # the header length field
)


@st.composite
def safetensors_files(draw: st.DrawFn) -> tuple[bytes, dict[str, Any]]:
    """(file bytes, what was generated): a valid file (every spelling serde accepts: fields in
    any order, unknown fields, the array and map forms, repeated names, zero-size tensors,
    metadata or none), or one with a single corruption."""
    corruption = draw(st.sampled_from(CORRUPTIONS)) if draw(st.booleans()) else None
    n = draw(st.integers(0, 5))
    entries = []
    for _ in range(n):
        dtype = draw(st.sampled_from(DTYPE_NAMES))
        shape = draw(st.lists(small_dims, max_size=3))
        entries.append({"name": draw(names), "dtype": dtype, "shape": shape})
    if corruption == "dtype" and entries:
        entries[0]["dtype"] = draw(st.sampled_from(["Q4", "f32", "", "C128", "F8_E4M3FN"]))
    if corruption == "shape" and entries:
        entries[0]["shape"] = draw(
            st.lists(st.one_of(small_dims, odd_dims), min_size=1, max_size=3)
        )
    order = draw(st.permutations(range(n)))
    offset = 0
    for i in order:
        size = nbytes(entries[i]["dtype"], entries[i]["shape"])
        entries[i]["offsets"] = [offset, offset + size]
        offset += size
    data_size = offset
    for _ in range(draw(st.integers(0, 2))):  # zero-size tensors anywhere
        at = draw(st.sampled_from(sorted({0, offset, *(e["offsets"][0] for e in entries)})))
        zero = {"name": draw(names), "dtype": draw(st.sampled_from(DTYPE_NAMES)), "shape": [0]}
        zero["offsets"] = [at, at] if corruption != "offset" else [at + 1, at + 1]
        entries.insert(draw(st.integers(0, len(entries))), zero)
    if draw(st.integers(0, 4)) == 0 and entries:  # a repeated name: the last entry wins
        again = dict(draw(st.sampled_from(entries)))
        entries.append(again)
    if corruption == "offset" and entries:
        e = draw(st.sampled_from(entries))
        which = draw(st.integers(0, 1))
        e["offsets"] = list(e["offsets"])
        e["offsets"][which] = max(0, e["offsets"][which] + draw(st.integers(-3, 3)))
    elif corruption == "data size":
        data_size = max(0, data_size + draw(st.sampled_from([-3, -1, 1, 2, 8])))
    elif corruption == "swap" and len(entries) > 1:
        a, b = draw(st.permutations(entries))[:2]
        a["offsets"], b["offsets"] = b["offsets"], a["offsets"]
    elif corruption == "offset type" and entries:
        entries[0]["offsets"] = draw(
            st.sampled_from([[0], [0, 0, 0], Raw("[0,1.0]"), Raw("[-0,0]"), [0, 2**64], "0", None])
        )
    members: list[tuple[Any, Any]] = []
    for e in entries:
        dtype: Any = e["dtype"]
        if draw(st.integers(0, 9)) == 0:
            dtype = Obj([(dtype, None)])  # serde's map spelling of an enum
        fields = [("dtype", dtype), ("shape", e["shape"]), ("data_offsets", e["offsets"])]
        if draw(st.integers(0, 9)) == 0:
            value: Any = [dtype, e["shape"], e["offsets"]]  # serde reads a struct from an array
        else:
            fields = draw(st.permutations(fields))
            if draw(st.integers(0, 4)) == 0:  # a field safetensors ignores
                fields.append((draw(st.sampled_from(["x", "DTYPE", "offsets"])), draw(json_values)))
            value = Obj(fields)
        members.append((e["name"], value))
    if corruption == "field" and members:
        name, value = members[0]
        fields = list(value) if isinstance(value, Obj) else [("dtype", value[0])]
        kind = draw(st.integers(0, 2))
        if kind == 0:
            fields = fields[: draw(st.integers(0, 2))]  # a field missing
        elif kind == 1:
            fields.append(draw(st.sampled_from(fields)))  # a field twice
        else:
            fields.append(("extra", draw(oddities)))  # JSON oddities where serde skips a value
        members[0] = (name, Obj(fields))
    meta_kind = draw(st.integers(0, 3))
    if meta_kind == 1:
        meta = Obj(draw(st.lists(st.tuples(st.text(max_size=4), st.text(max_size=4)), max_size=3)))
        members.insert(draw(st.integers(0, len(members))), ("__metadata__", meta))
    elif meta_kind == 2:
        members.insert(0, ("__metadata__", None))
    if corruption == "metadata":
        bad = draw(
            st.one_of(
                json_values,
                oddities,
                st.just(Obj([("k", 1)])),
                st.just(Obj([("k", Raw('"\\ud800"'))])),
            )
        )
        members.insert(0, ("__metadata__", bad))
        if draw(st.booleans()):
            members.append(("__metadata__", Obj()))
    ws = draw(st.sampled_from(["", " ", "\n\t", "\r\n  "]))
    text = emit(Obj(members), ws, ascii=draw(st.booleans()))
    if corruption == "tail":
        text += draw(st.sampled_from(["x", ",", "\x00", "}", "{}", "\x0c"]))
    header = text.encode("utf-8")
    if corruption == "utf-8":
        at = draw(st.integers(0, len(header)))
        header = (
            header[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80"])) + header[at:]
        )
    header += b" " * draw(st.sampled_from([0, -len(header) % 8]))
    length = len(header)
    if corruption == "length":
        length += draw(st.sampled_from([1, -1, 2**40, 100_000_001]))
    pattern = draw(st.integers(0, 255))
    data = bytes((pattern + 7 * i) % 256 for i in range(data_size))
    blob = struct.pack("<Q", max(0, length)) + header + data
    return blob, {"members": members, "text": text, "corruption": corruption}


# --- the two readers ----------------------------------------------------------------------------


def reference(path: str) -> tuple[dict[str, torch.Tensor], dict[str, str]] | None:
    """What safetensors reads, or ``None`` when it refuses the file: its ``SafetensorError``,
    torch's ``TypeError`` on a shape it cannot hold, or a Rust panic (pyo3's
    ``PanicException``, a ``BaseException``). Anything else it raises fails the test."""
    try:
        tensors = load_file(path)
        with safe_open(path, "pt") as f:
            metadata = f.metadata() or {}
    except (SafetensorError, TypeError):
        return None
    except BaseException as exc:  # a Rust panic is a BaseException, named only by its class
        if type(exc).__name__ != "PanicException":
            raise
        return None
    return tensors, metadata


def ours(
    path: str, strict_index: bool = False
) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, str]]] | None:
    """What loadkit reads, or ``None`` when it refuses with a ``loadkit.errors`` error."""
    try:
        ck = open_checkpoint(path, strict_index=strict_index)
        tensors = dict(ck.weights())  # each its own buffer (a clone would turn bool 7 into 1)
        assert list(tensors) == list(ck.tensors)
        return tensors, ck.metadata
    except LoadkitError:
        return None


def assert_identical(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        mine = got[name]
        assert (mine.dtype, mine.shape) == (t.dtype, t.shape), name
        assert torch.equal(mine.reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8))


def no_raw_control(text: str) -> bool:
    return all(c.isprintable() or c == "\n" for c in text)


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


# --- the properties -----------------------------------------------------------------------------


@FUZZ
@given(case=safetensors_files())
def test_loadkit_accepts_exactly_what_safetensors_loads(workdir, case):
    blob, generated = case
    path = os.path.join(workdir, "fuzz.safetensors")
    with open(path, "wb") as f:
        f.write(blob)
    want, got = reference(path), ours(path)
    event("safetensors loads it" if want is not None else "safetensors refuses it")
    event(f"corruption: {generated['corruption']}")
    assert (got is not None) == (want is not None), (want is not None, blob[:400])
    if want is not None and got is not None:
        assert_identical(got[0], want[0])
        assert got[1][path] == want[1]


@FUZZ
@given(case=safetensors_files(), as_json=st.booleans())
def test_inspect_exits_0_1_or_2_without_a_traceback(workdir, case, as_json):
    blob, _ = case
    path = os.path.join(workdir, "cli.safetensors")
    with open(path, "wb") as f:
        f.write(blob)
    status, out, err = run_cli("inspect", path, *(["--json"] if as_json else []))
    assert status in (0, 2), (status, err)  # no model: headers valid (0) or unusable (2)
    assert "Traceback" not in err
    assert no_raw_control(out) and no_raw_control(err)
    if status == 2:
        assert err.count("\n") == 1 and err.startswith("loadkit inspect: error: "), err
    elif as_json:
        json.loads(out)


# Headers that are valid for the library but shaped to break a model's sizing: a built-in
# model's own checkpoint (data/) with some shapes replaced by shapes of any rank and size. The
# data is a hole (a sparse file), so a tensor of 2**40 bytes costs nothing.
DATA = str(DATA_PATH)
BUILTIN_CHECKPOINTS = {
    "plamo2": "plamo2/untied.safetensors",
    "nemotron-h": "nemotron_h/initial.safetensors",
    "gemma4-like": "gemma4_like/model.safetensors",
}


@st.composite
def builtin_cases(draw: st.DrawFn) -> tuple[str, dict[str, tuple[str, list[int]]]]:
    model = draw(st.sampled_from(sorted(BUILTIN_CHECKPOINTS)))
    tensors = open_checkpoint(os.path.join(DATA, BUILTIN_CHECKPOINTS[model])).tensors
    header = {name: (t.dtype, list(t.shape)) for name, t in tensors.items()}
    dims = st.one_of(st.integers(0, 5), st.sampled_from([7, 64, 2**20, 2**31, 2**40]))
    for name in draw(st.lists(st.sampled_from(sorted(header)), max_size=4, unique=True)):
        dtype, shape = header[name]
        if draw(st.booleans()):  # the same rank, other sizes
            shape = [draw(dims) for _ in shape]
        else:
            shape = draw(st.lists(dims, max_size=4))
        header[name] = (draw(st.sampled_from([dtype, dtype, "F32", "U8", "F4"])), shape)
    if draw(st.integers(0, 4)) == 0:  # a name gone
        header.pop(draw(st.sampled_from(sorted(header))))
    return model, header


def write_sparse(path: str, header: dict[str, tuple[str, list[int]]]) -> bool:
    """Write ``header`` with zero data as a hole; ``False`` if no header can describe it."""
    doc, offset = {}, 0
    for name, (dtype, shape) in header.items():
        n = 1
        for d in shape:
            n *= d
        size = n * element_bits(dtype) // 8
        doc[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    if offset > 2**42:  # ext4 files end at 16 TiB
        return False
    text = json.dumps(doc).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + offset)
    return True


@settings(FUZZ, max_examples=EXAMPLES // 2)
@given(case=builtin_cases())
def test_builtin_models_size_from_any_valid_shapes_without_a_traceback(workdir, case):
    model, header = case
    path = os.path.join(workdir, "builtin.safetensors")
    assume(write_sparse(path, header))
    status, _, err = run_cli("inspect", path, "--model", model)
    event(f"{model}: exit {status}")
    assert status in (0, 1, 2), (status, err)
    assert "Traceback" not in err and "internal error" not in err, err


# --- folders with an index ----------------------------------------------------------------------


SPELLINGS = st.sampled_from(
    [
        "{s}",
        "./{s}",
        "{s}",
        ".//{s}",
        "sub/../{s}",
        "../{s}",
        "/tmp/{s}",
        "{s}.missing",
        "",
        ".",
    ]
)


@st.composite
def sharded_folders(draw: st.DrawFn) -> tuple[dict[str, bytes], Any]:
    """(file name -> bytes of each shard, the index document)."""
    shards: dict[str, bytes] = {}
    keys: dict[str, list[str]] = {}
    for i in range(draw(st.integers(1, 3))):
        shard = f"model-{i}.safetensors"
        names_here = draw(st.lists(st.sampled_from(["a", "b", "c", "d.w", "e"]), unique=True))
        header, offset = {}, 0
        for n in names_here:
            header[n] = {"dtype": "F32", "shape": [2], "data_offsets": [offset, offset + 8]}
            offset += 8
        text = json.dumps(header).encode()
        shards[shard] = struct.pack("<Q", len(text)) + text + bytes(range(offset))
        keys[shard] = names_here
    weight_map: list[tuple[str, Any]] = []
    for shard, names_here in keys.items():
        for n in names_here:
            if draw(st.integers(0, 5)) == 0:
                continue  # a key the index leaves out (it is still in the shard)
            spelling = draw(SPELLINGS).format(s=shard)
            weight_map.append((n, spelling if draw(st.integers(0, 19)) else draw(json_scalars)))
    if draw(st.integers(0, 5)) == 0:
        weight_map.append(("ghost", draw(st.sampled_from(sorted(shards)))))
    document: Any = Obj([("metadata", Obj([("total_size", 8)])), ("weight_map", Obj(weight_map))])
    kind = draw(st.integers(0, 9))
    if kind == 0:
        document = Obj([("weight_map", draw(st.one_of(json_values, oddities)))])
    elif kind == 1:
        document = Raw("[" * 5000 + "]" * 5000)
    elif kind == 2:
        document = Obj([("metadata", Raw("9" * 5000)), ("weight_map", Obj(weight_map))])
    return shards, document


def reference_folder(folder: str) -> dict[str, torch.Tensor] | None:
    """A strict reading of a sharded folder (safetensors reading every shard): no key stored
    twice, every key where the index says; ``open_checkpoint(strict_index=True)``'s contract."""
    try:
        with open(os.path.join(folder, "model.safetensors.index.json")) as f:
            index = json.load(f)
        weight_map = index["weight_map"]
        assert isinstance(weight_map, dict)
    except (OSError, ValueError, KeyError, TypeError, AssertionError, RecursionError):
        return None
    root = os.path.realpath(folder)
    files: dict[str, str] = {}
    for shard in weight_map.values():
        if not isinstance(shard, str) or os.path.isabs(shard) or ".." in shard.split("/"):
            return None
        path = os.path.normpath(os.path.join(root, shard))
        if path == root or not os.path.isfile(path):
            return None
        files[shard] = path
    tensors: dict[str, torch.Tensor] = {}
    holder: dict[str, str] = {}
    for path in sorted(set(files.values())):
        read = reference(path)
        if read is None:
            return None
        for name, t in read[0].items():
            if name in tensors:
                return None  # a key in two shards
            tensors[name], holder[name] = t, path
    for key, shard in weight_map.items():
        if holder.get(key) != files[shard]:
            return None  # the index names a shard that does not hold the key
    return tensors


@FUZZ
@given(case=sharded_folders())
def test_sharded_folders_open_exactly_when_the_index_and_shards_are_sound(workdir, case):
    shards, document = case
    folder = os.path.join(workdir, "sharded")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(os.path.join(folder, "sub"))
    for name, blob in shards.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(blob)
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        f.write(emit(document))
    want, got = reference_folder(folder), ours(folder, strict_index=True)
    event("the folder loads" if want is not None else "the folder is refused")
    assert (got is not None) == (want is not None), emit(document)[:300]
    if want is not None and got is not None:
        assert_identical(got[0], want)
    status, _, err = run_cli("inspect", folder)
    # inspect reads a folder as far as it can: an index that disagrees with its shards is listed
    # problem by problem; exit 1 where a tensor cannot be read, 0 where every tensor still loads
    # (a key in two shards, in another shard than the index says: what loaders read anyway);
    # one it cannot read at all, or cannot trust, is exit 2. Of a folder the reference loads, it
    # can only add what the reference never checks (a key the index does not list, the index's
    # metadata.total_size, a key its JSON names twice): inconsistencies, never a failure.
    if want is None and status == 0:
        found = open_lenient(folder)[1]
        assert found and not any(p.fails for p in found), err
    elif want is None:
        assert status in (1, 2), err
    else:
        found = open_lenient(folder)[1]
        assert {p.kind for p in found if p.severity != "note"} <= {
            "not in index",
            "total_size",
            "listed twice",
        }
        assert not any(p.fails for p in found) and status == 0, err
    assert "Traceback" not in err and no_raw_control(err)
    # the CLI and the library agree on which folders load: open_checkpoint opens exactly the
    # folders inspect passes (exit 0), and refuses every other
    assert (ours(folder) is not None) == (status == 0), err
