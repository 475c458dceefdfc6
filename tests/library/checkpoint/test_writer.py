import math
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loadkit import open_checkpoint
from loadkit.checkpoint.writer import safetensors_dtype, save_in_order, write_safetensors
from loadkit.errors import LoadkitError


def test_save_in_order_keeps_order_values_and_dtypes(tmp_path):
    tensors = {
        "z.weight": torch.arange(6.0).reshape(2, 3),
        "a.bias": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
        "m.idx": torch.tensor([7, 8], dtype=torch.int64),
    }
    path = save_in_order(tmp_path / "o.safetensors", tensors, metadata={"seed": "3"})
    ck = open_checkpoint(path)
    got = list(ck.weights())
    assert [n for n, _ in got] == list(tensors)  # not sorted by name
    for (name, t), want in zip(got, tensors.values(), strict=True):
        assert t.dtype == want.dtype and torch.equal(t, want), name
    assert ck.metadata[str(path)] == {"format": "pt", "seed": "3"}
    assert not list(tmp_path.glob("*.part"))


def test_same_input_same_bytes(tmp_path):
    t = {"b": torch.ones(3), "a": torch.zeros(2, 2)}
    one = save_in_order(tmp_path / "1.safetensors", t).read_bytes()
    assert one == save_in_order(tmp_path / "2.safetensors", t).read_bytes()


def test_produced_tensor_must_match_its_spec(tmp_path):
    with pytest.raises(LoadkitError, match=r"key 'w'.*F32 \[3\].*F32 \[2\]"):
        write_safetensors(tmp_path / "x.safetensors", [("w", "F32", (2,))], lambda n: torch.ones(3))
    assert not (tmp_path / "x.safetensors").exists()  # never half-written under its name


def test_unknown_dtypes(tmp_path):
    with pytest.raises(LoadkitError, match="unknown safetensors dtype 'Q4'"):
        write_safetensors(tmp_path / "q.safetensors", [("w", "Q4", (2,))], lambda n: None)
    with pytest.raises(LoadkitError, match="complex128"):  # safetensors has C64, not C128
        safetensors_dtype(torch.complex128)
    assert safetensors_dtype(torch.bfloat16) == "BF16"


# --- refusing what safetensors would refuse; never a .part left behind (issue 13) ---------------


@pytest.mark.parametrize(
    "specs, metadata, words",
    [
        ([("w", "F32", (1,)), ("w", "F32", (2,))], None, "appears twice"),
        ([("__metadata__", "F32", (1,))], None, "reserved for metadata"),
        ([("w", "F32", (1,))], {"n": 1}, "metadata must map str to str"),
        ([("w", "F32", (1,))], {1: "x"}, "metadata must map str to str"),
        ([("w\ud800", "F32", (1,))], None, "valid UTF-8"),
        ([("w", "F32", (1,))], {"k": "\udc00"}, "not valid UTF-8"),
        ([("w", "F32", (-1,))], None, "int64 sizes"),
        ([("w", "F32", (2**63,))], None, "int64 sizes"),
        ([("w", "F32", (True,))], None, "int64 sizes"),
    ],
)
def test_what_safetensors_would_refuse_is_never_written(tmp_path, specs, metadata, words):
    path = tmp_path / "x.safetensors"
    with pytest.raises(LoadkitError, match=words):
        write_safetensors(path, specs, lambda n: torch.zeros(1), metadata=metadata)
    assert list(tmp_path.iterdir()) == []


def test_the_part_file_is_removed_on_any_error(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"the previous file")

    def produce(name):
        if name == "b":
            raise KeyboardInterrupt  # not even an Exception
        return torch.zeros(2)

    with pytest.raises(KeyboardInterrupt):
        write_safetensors(path, [("a", "F32", (2,)), ("b", "F32", (2,))], produce)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.safetensors"]
    assert path.read_bytes() == b"the previous file"  # untouched until the rename


spec_names = st.one_of(
    st.sampled_from(["w", "__metadata__", "a.b", "w\ud800"]), st.text(max_size=4)
)


@settings(max_examples=settings.default.max_examples, deadline=None)
@given(
    specs=st.lists(
        st.tuples(
            spec_names,
            st.sampled_from(["F32", "BF16", "U8", "I64", "BOOL", "F4", "Q4"]),
            st.lists(st.integers(0, 3), max_size=3).map(tuple),
        ),
        max_size=4,
    ),
    metadata=st.one_of(
        st.none(),
        st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
        st.dictionaries(st.text(max_size=3), st.integers(), min_size=1, max_size=1),
    ),
)
def test_whatever_the_writer_writes_safetensors_reads_back(specs, metadata):
    from safetensors import safe_open
    from safetensors.torch import load_file

    from loadkit.checkpoint.dtypes import DTYPES

    def produce(name):
        _, dtype, shape = next(s for s in reversed(specs) if s[0] == name)
        n = math.prod(shape) * DTYPES[dtype][1]
        raw = torch.arange(n, dtype=torch.int64).remainder(256).to(torch.uint8)
        return raw.view(getattr(torch, DTYPES[dtype][0])).reshape(shape)

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "p.safetensors"
        try:
            write_safetensors(path, specs, produce, metadata=metadata)
        except LoadkitError:
            assert list(Path(folder).iterdir()) == []  # nothing written, no .part
            names = [s[0] for s in specs]
            sound = (
                len(set(names)) == len(names)
                and "__metadata__" not in names
                and all("\ud800" not in n for n in names)  # the strategy's one lone surrogate
                and all(s[1] in DTYPES for s in specs)
                and all(isinstance(v, str) for v in (metadata or {}).values())
            )
            assert not sound, specs  # refused only what safetensors could not read back
            return
        got = load_file(str(path))
        assert set(got) == {s[0] for s in specs}
        for name, t in got.items():
            want = produce(name)
            assert t.dtype == want.dtype and t.shape == want.shape, name
            assert torch.equal(t.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8))
        with safe_open(str(path), "pt") as f:
            assert f.metadata() == {"format": "pt", **(metadata or {})}
