"""What the report says is what was checked (issue 24): errors named for what they are."""

import torch
from safetensors.torch import save_file
from torch import nn

from loadkit.inspection.inspector import inspect_checkpoint


def test_a_text_file_is_not_a_safetensors_file(tmp_path, loadkit_cli):
    f = tmp_path / "x.safetensors"
    f.write_text("hello, this is text not a checkpoint\n")
    res = loadkit_cli("inspect", f)
    assert res.returncode == 2
    assert "not a safetensors file: its first 8 bytes are text ('hello, t')" in res.stderr


class OwnTable(nn.Module):
    """A hand-written loader whose own lookup table lacks a name the model has."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 2)

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        table = {"a.weight": 0}
        for name, w in weights:
            table[name]  # the loader's own KeyError, for a.bias
            params[name].data.copy_(w)


def test_a_loaders_own_key_error_on_a_valid_name_is_its_error_not_an_unexpected_name(tmp_path):
    f = tmp_path / "m.safetensors"
    save_file({"a.weight": torch.zeros(2, 2), "a.bias": torch.zeros(2)}, str(f))
    r = inspect_checkpoint(f, model=OwnTable)
    assert r.load.unexpected == []  # not "unexpected, nearest: a.bias"
    (err,) = r.load.errors
    assert err.name == "a.bias" and "the loader raised KeyError: 'a.bias'" in err.message
    assert "its own error" in err.message
    assert [(m.name, m.suggestions) for m in r.load.missing] == [("a.bias", [])]
    assert r.load.problems() == ["1 load error", "1 model tensor never filled"]  # singular


def test_counts_are_singular_and_plural_right(tmp_path, loadkit_cli):
    f = tmp_path / "m.safetensors"
    save_file(
        {"a": torch.zeros(2, dtype=torch.int64), "b": torch.zeros(2), "c": torch.zeros(1)}, str(f)
    )
    out = loadkit_cli("inspect", f).stdout
    assert "  1 file, 3 tensors" in out
    assert "dtypes  F32 2 tensors (12 B), I64 1 tensor (16 B)" in out
