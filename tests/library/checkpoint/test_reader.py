import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from loadkit import open_checkpoint
from loadkit.errors import CheckpointError, HeaderError, TruncatedCheckpointError


def raw_file(path, header, data=b""):
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)
    return path


@pytest.fixture
def tensors():
    g = torch.Generator().manual_seed(0)
    return {
        "b.weight": torch.randn(3, 4, generator=g),
        "a.bias": torch.randn(4, generator=g).to(torch.bfloat16),
        "c.idx": torch.arange(5, dtype=torch.int64),
        "d.mask": torch.tensor([True, False]),
    }


def test_single_file_header_and_weights(tmp_path, tensors):
    f = tmp_path / "model.safetensors"
    save_file(tensors, str(f))
    ck = open_checkpoint(f)
    info = ck.tensors["a.bias"]
    assert (info.dtype, info.shape, info.nbytes, info.file) == ("BF16", (4,), 8, str(f))
    got = dict(ck.weights())
    assert got.keys() == tensors.keys()
    for k, v in tensors.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
    offsets = [ck.tensors[n].offset for n, _ in ck.weights()]
    assert offsets == sorted(offsets)  # data-offset order
    assert got["b.weight"].loadkit_file == str(f)


def test_header_only_does_not_read_tensor_bytes(tmp_path):
    # A "100 GB" tensor: the header claims it; the file is sparse, so it opens instantly.
    f = tmp_path / "huge.safetensors"
    n = 25 * 2**30
    header = {"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}
    raw_file(f, header)
    with open(f, "r+b") as fh:
        fh.truncate(f.stat().st_size + 4 * n)
    ck = open_checkpoint(f)
    assert ck.total_bytes == 100 * 2**30


def test_weights_is_lazy(tmp_path, tensors):
    f = tmp_path / "m.safetensors"
    save_file(tensors, str(f))
    it = open_checkpoint(f).weights()
    f.unlink()  # nothing is opened until the first next()
    with pytest.raises(CheckpointError, match="m.safetensors: cannot read"):
        next(it)


def test_reuse_buffer_views_are_overwritten(tmp_path):
    f = tmp_path / "m.safetensors"
    save_file({"x": torch.full((4,), 1.0), "y": torch.full((4,), 2.0)}, str(f))
    held = list(open_checkpoint(f).weights(reuse_buffer=True))
    assert held[0][1].tolist() == [2.0] * 4  # the first view now shows the second tensor
    cloned = [(n, t.clone()) for n, t in open_checkpoint(f).weights(reuse_buffer=True)]
    assert cloned[0][1].tolist() == [1.0] * 4


def test_truncated_file(tmp_path, tensors):
    f = tmp_path / "t.safetensors"
    save_file(tensors, str(f))
    data = f.read_bytes()
    f.write_bytes(data[:-3])
    with pytest.raises(TruncatedCheckpointError) as exc:
        open_checkpoint(f)
    msg = str(exc.value)
    assert "t.safetensors" in msg and "key '" in msg and "shape" in msg


@pytest.mark.parametrize("blob", [b"", b"\x01\x02"])
def test_too_short_for_length(tmp_path, blob):
    f = tmp_path / "s.safetensors"
    f.write_bytes(blob)
    with pytest.raises(TruncatedCheckpointError, match="s.safetensors"):
        open_checkpoint(f)


def test_header_longer_than_file(tmp_path):
    f = tmp_path / "h.safetensors"
    f.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(TruncatedCheckpointError, match="header claims 1000 bytes"):
        open_checkpoint(f)


def test_header_not_json(tmp_path):
    f = tmp_path / "j.safetensors"
    f.write_bytes(struct.pack("<Q", 5) + b"{nope")
    with pytest.raises(HeaderError, match=r"j\.safetensors.*not valid JSON"):
        open_checkpoint(f)


def test_header_not_an_object(tmp_path):
    with pytest.raises(HeaderError, match="not an object"):
        open_checkpoint(raw_file(tmp_path / "l.safetensors", [1, 2]))


def test_shape_and_offsets_disagree(tmp_path):
    header = {"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}}
    f = raw_file(tmp_path / "x.safetensors", header, b"\0" * 20)
    with pytest.raises(HeaderError) as exc:
        open_checkpoint(f)
    msg = str(exc.value)
    assert "x.safetensors" in msg and "'w'" in msg and "[2, 3]" in msg and "24 bytes" in msg


def test_unknown_dtype(tmp_path):
    header = {"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 2]}}
    with pytest.raises(HeaderError, match=r"key 'w'.*unknown dtype 'Q4'"):
        open_checkpoint(raw_file(tmp_path / "q.safetensors", header, b"\0\0"))


def test_overlapping_data(tmp_path):
    header = {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
    }
    with pytest.raises(HeaderError, match="overlap"):
        open_checkpoint(raw_file(tmp_path / "o.safetensors", header, b"\0" * 12))


def test_missing_path_and_empty_folder(tmp_path):
    with pytest.raises(CheckpointError, match="no such file"):
        open_checkpoint(tmp_path / "nothing")
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        open_checkpoint(tmp_path)


def test_metadata_kept(tmp_path):
    f = tmp_path / "m.safetensors"
    save_file({"w": torch.zeros(1)}, str(f), metadata={"format": "pt"})
    assert open_checkpoint(f).metadata[str(f)] == {"format": "pt"}
