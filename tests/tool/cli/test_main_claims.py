"""What the report says is what was checked (issue 24): errors named for what they are."""

import torch
from safetensors.torch import save_file
from torch import nn

from loadkit_inspect.inspector import inspect_checkpoint


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


def test_usage_errors_are_two_lines_and_limit_rejects_negatives(loadkit_cli, tmp_path):
    for argv, said in [
        (["inspect", "x", "--limit", "-3"], "argument --limit: must be 0 or more, not -3"),
        (["inspect", "x", "--limit", "abc"], "argument --limit: invalid int value: 'abc'"),
        (["inspect"], "the following arguments are required: CHECKPOINT"),
    ]:
        res = loadkit_cli(*argv)
        assert res.returncode == 2 and res.stdout == ""
        assert res.stderr.splitlines() == [
            f"loadkit inspect: error: {said}",
            "see: loadkit inspect --help",
        ]


def test_limit_0_lists_no_rows_but_every_count(tmp_path, loadkit_cli):
    f = tmp_path / "m.safetensors"
    save_file({"a.weight": torch.zeros(2, 2), "b.weight": torch.zeros(2)}, str(f))
    model = tmp_path / "lin.py"
    model.write_text("from torch import nn\ndef build():\n    return nn.Linear(2, 2)\n")
    out = loadkit_cli("inspect", f, "--model", f"{model}:build", "--limit", "0").stdout
    assert "  unexpected names (2)\n    2 rows, none shown (--json lists them all)" in out
    assert "more" not in out  # nothing was shown, so nothing is "more"
    assert "a.weight" not in out.split("unexpected names")[1].split("missing")[0]
    assert "  missing: model tensors never filled (2)\n    2 rows, none shown" in out
    one = loadkit_cli("inspect", f, "--model", f"{model}:build", "--limit", "1").stdout
    after = one.split("missing: model tensors never filled (2)\n")[1].splitlines()
    rows = after[: next(i for i, line in enumerate(after) if not line.startswith("    "))]
    shown = [r for r in rows if not r.startswith("     ")]  # one tensor and the "more" line
    assert len(shown) == 2 and shown[1] == "    ... 1 more (--json lists them all)", rows


def test_debug_shows_the_traceback_of_the_users_own_code(tmp_path, loadkit_cli):
    f = tmp_path / "m.safetensors"
    save_file({"a": torch.zeros(2)}, str(f))
    (tmp_path / "boom.py").write_text(
        "def build():\n    raise RuntimeError('my model is broken')\n"
    )
    spec = f"{tmp_path / 'boom.py'}:build"
    quiet = loadkit_cli("inspect", f, "--model", spec)
    assert quiet.returncode == 2 and "Traceback" not in quiet.stderr
    loud = loadkit_cli("inspect", f, "--model", spec, "--debug")
    assert loud.returncode == 2 and "Traceback (most recent call last)" in loud.stderr
    assert f'File "{tmp_path / "boom.py"}", line 2, in build' in loud.stderr
    assert loud.stderr.splitlines()[-1].startswith("loadkit inspect: error: --model")


LFS_POINTER = (
    "version https://git-lfs.github.com/spec/v1\n"
    "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
    "size 12345\n"
)


def test_a_git_lfs_pointer_says_so_as_a_file_and_in_a_folder(tmp_path, loadkit_cli):
    (tmp_path / "model.safetensors").write_text(LFS_POINTER)
    for target in (tmp_path / "model.safetensors", tmp_path):
        res = loadkit_cli("inspect", target)
        assert res.returncode == 2, res.stderr
        assert "a Git LFS pointer, not the file (which has 12345 bytes): run git lfs pull" in (
            res.stderr
        )
        assert len(res.stderr.splitlines()) == 1


def test_an_unreadable_folder_gives_each_files_reason(tmp_path, loadkit_cli):
    save_file({"w": torch.zeros(8)}, str(tmp_path / "model.safetensors"))
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:-10])  # 10 bytes short
    res = loadkit_cli("inspect", tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip() == (
        f"loadkit inspect: error: {tmp_path}: its one .safetensors file cannot be read; nothing "
        "to inspect: model.safetensors, key 'w': tensor of shape [8] (F32) ends at data byte 32 "
        "but the file holds 22 bytes of data"
    )


def test_a_folder_of_many_unreadable_files_caps_the_reasons(tmp_path, loadkit_cli):
    for i in range(5):
        (tmp_path / f"{i}.safetensors").write_bytes(b"ab")
    res = loadkit_cli("inspect", tmp_path)
    assert res.returncode == 2
    assert "none of its 5 .safetensors files can be read; nothing to inspect: 0.safetensors: " in (
        res.stderr
    )
    assert res.stderr.count("too short for the 8-byte header length") == 3
    assert res.stderr.rstrip().endswith("; and 2 more")


def test_a_folder_without_safetensors_names_what_it_holds(tmp_path, loadkit_cli):
    (tmp_path / "config.json").write_text("{}")
    res = loadkit_cli("inspect", tmp_path)
    assert res.returncode == 2
    assert "no .safetensors file at all (found: config.json); nothing to inspect" in res.stderr
    torch.save({"w": torch.zeros(1)}, tmp_path / "pytorch_model.bin")
    res = loadkit_cli("inspect", tmp_path)
    assert res.returncode == 2
    assert (
        "no .safetensors file at all (found pytorch_model.bin: loadkit reads safetensors only)"
        in res.stderr
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (
        "no .safetensors file at all (the folder is empty)" in loadkit_cli("inspect", empty).stderr
    )
