import pytest
import torch

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
