"""A remote checkpoint read header-only, from a real HTTP server on the loopback
(``tests/loopback.py``): the same tensors as the local files, only header bytes ever served, and
one clear error for each way a server can disappoint."""

from __future__ import annotations

import json
import socket
import struct
import time
from pathlib import Path

import pytest
from loopback import serve
from repo_paths import DATA

from loadkit import open_checkpoint
from loadkit.checkpoint.header import MAX_HEADER_BYTES
from loadkit.errors import (
    CheckpointError,
    DuplicateKeyError,
    HeaderError,
    ShardIndexError,
    TruncatedCheckpointError,
)
from loadkit_inspect.sources.remote import RemoteCheckpoint, open_remote, remote_kind
from loadkit_inspect.sources.resolve import open_source

SHARDED = DATA / "plamo2" / "tied-with-lm-head"


def _header_end(path: Path) -> int:
    """Where a safetensors file's data starts: 8 + the header's length."""
    return 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]


def _as_local(ck):
    return {
        n: (t.dtype, t.shape, t.nbytes, Path(t.file).name, t.offset) for n, t in ck.tensors.items()
    }


def _only_headers_served(server, folder: Path) -> None:
    for served in server.log:
        name = served.path.rsplit("/", 1)[-1]
        if name.endswith(".safetensors"):
            first, last = served.range
            assert served.status == 206 and last < _header_end(folder / name), served
            assert served.sent == last - first + 1


def _raw(path: Path, header: object, data: bytes = b"") -> Path:
    blob = json.dumps(header).encode() if not isinstance(header, bytes) else header
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)
    return path


def test_one_file_header_only():
    file = DATA / "plamo2" / "untied.safetensors"
    with serve(file.parent) as server:
        ck = open_remote(server.url(file.name))
    assert isinstance(ck, RemoteCheckpoint)
    assert _as_local(ck) == _as_local(open_checkpoint(file))
    assert ck.files == [server.url(file.name)] and ck.path == server.url(file.name)
    assert list(ck.metadata.values()) == list(open_checkpoint(file).metadata.values())
    # two requests: the length, then exactly the header; nothing of the data
    assert [s.range for s in server.log] == [(0, 7), (8, _header_end(file) - 1)]
    assert (ck.fetched.requests, ck.fetched.bytes) == (2, _header_end(file))
    assert ck.fetched.size == file.stat().st_size and ck.fetched.bytes < file.stat().st_size
    _only_headers_served(server, file.parent)


def test_sharded_index_header_only():
    with serve(SHARDED) as server:
        ck = open_remote(server.url("model.safetensors.index.json"))
    local = open_checkpoint(SHARDED)
    assert _as_local(ck) == _as_local(local)
    assert [Path(f).name for f in ck.files] == [Path(f).name for f in local.files]
    index = SHARDED / "model.safetensors.index.json"
    shards = sorted(SHARDED.glob("*.safetensors"))
    assert ck.fetched.bytes == index.stat().st_size + sum(_header_end(s) for s in shards)
    assert ck.fetched.size == index.stat().st_size + sum(s.stat().st_size for s in shards)
    assert ck.fetched.requests == 1 + 2 * len(shards) == len(server.log)
    assert server.sent == ck.fetched.bytes
    _only_headers_served(server, SHARDED)


def test_open_source_takes_urls_and_a_redirect_keeps_the_range(tmp_path):
    with serve(SHARDED, "redirect") as server:
        ck, problems, source = open_source(server.url("model.safetensors.index.json"))
    assert source.kind == "url" and source.fetched is ck.fetched and problems == []
    assert _as_local(ck) == _as_local(open_checkpoint(SHARDED))
    assert [s.status for s in server.log].count(302) == 5  # each request moved, once
    moved = [s for s in server.log if s.path.startswith("/real/") and "index" not in s.path]
    assert len(moved) == 4 and all(s.status == 206 and s.range is not None for s in moved)


def test_the_loopback_never_goes_through_a_proxy(monkeypatch):
    """With a proxy set (a port where nothing listens) and no ``no_proxy``, the loopback is
    still reached directly."""
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with serve(DATA / "plamo2") as server:
        ck = open_remote(server.url("untied.safetensors"))
    assert len(ck.tensors) == 30 and len(server.log) == 2


def test_remote_weights_are_refused():
    with serve(DATA / "plamo2") as server:
        ck = open_remote(server.url("untied.safetensors"))
    with pytest.raises(CheckpointError, match="read header-only: loadkit never fetches"):
        next(ck.weights())


def test_server_without_range_support():
    with serve(DATA / "plamo2", "no-ranges") as server:
        url = server.url("untied.safetensors")
        with pytest.raises(CheckpointError) as err:
            open_remote(url)
    size = (DATA / "plamo2" / "untied.safetensors").stat().st_size
    assert str(err.value) == (
        f"{url}: the server does not support Range requests (asked for bytes 0-7, it answered "
        f"200 with the whole file, {size} bytes); loadkit reads remote checkpoints header-only "
        "and fetched none of it; download the file and inspect the local copy, or use a URL "
        "whose server honours Range (the Hugging Face hub's resolve URLs do)"
    )


def test_slow_server_hits_the_timeout():
    with serve(DATA / "plamo2", "slow", delay=30) as server:
        start = time.monotonic()
        with pytest.raises(CheckpointError, match=r"no answer within 0\.3 s \(the timeout\)"):
            open_remote(server.url("untied.safetensors"), timeout=0.3)
        assert time.monotonic() - start < 5


def test_a_trickling_server_hits_the_timeout_of_the_whole_request():
    """Each byte comes within the socket's timeout, but the request as a whole does not."""
    with serve(DATA / "plamo2", "trickle", delay=0.1) as server:
        start = time.monotonic()
        with pytest.raises(CheckpointError, match=r"no complete answer within 0\.5 s \(got "):
            open_remote(server.url("untied.safetensors"), timeout=0.5)
        assert time.monotonic() - start < 3


def test_not_found_and_a_missing_shard(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "gone.safetensors"}})
    )
    with serve(tmp_path) as server:
        with pytest.raises(CheckpointError) as err:
            open_remote(server.url("nope.safetensors"))
        assert str(err.value) == f"{server.url('nope.safetensors')}: not found (HTTP 404)"
        with pytest.raises(CheckpointError) as err:
            open_remote(server.url("model.safetensors.index.json"))
        assert str(err.value) == f"{server.url('gone.safetensors')}: not found (HTTP 404)"


def test_redirect_loop():
    with serve(DATA / "plamo2", "redirect-loop") as server:
        url = server.url("untied.safetensors")
        with pytest.raises(CheckpointError) as err:
            open_remote(url)
    assert str(err.value).startswith(f"{url}: redirect loop: HTTP 302 redirects")
    assert len(server.log) <= 11


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("long-body", "asked for 8 bytes (0-7), the server announces a body of 208 bytes"),
        ("long-body-unannounced", "asked for 8 bytes (0-7), the server sent more"),
        (
            "wrong-range",
            "asked for bytes 0-7, the server answered 206 with Content-Range 'bytes 1-8/",
        ),
    ],
)
def test_a_body_that_is_not_the_range_asked_for(mode, says):
    with serve(DATA / "plamo2", mode) as server:
        url = server.url("untied.safetensors")
        with pytest.raises(CheckpointError) as err:
            open_remote(url)
    assert str(err.value).startswith(f"{url}: {says}")


def test_header_limit_and_truncation_before_any_header_byte(tmp_path):
    over = tmp_path / "over.safetensors"
    over.write_bytes(struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}")
    short = tmp_path / "short.safetensors"
    short.write_bytes(struct.pack("<Q", 500) + b"{}")
    tiny = tmp_path / "tiny.safetensors"
    tiny.write_bytes(b"abc")
    (tmp_path / "empty.safetensors").write_bytes(b"")
    with serve(tmp_path) as server:
        with pytest.raises(TruncatedCheckpointError, match="the file is 0 bytes, too short for"):
            open_remote(server.url("empty.safetensors"))  # HTTP 416
        with pytest.raises(HeaderError, match="exceeds the safetensors limit of 100000000"):
            open_remote(server.url(over.name))
        with pytest.raises(TruncatedCheckpointError, match="header claims 500 bytes but only 2"):
            open_remote(server.url(short.name))
        with pytest.raises(TruncatedCheckpointError, match="file is 3 bytes, too short for the"):
            open_remote(server.url(tiny.name))
    assert all(s.range == (0, 7) for s in server.log)  # never a header request


def test_a_header_that_is_no_object_is_refused_from_its_start(tmp_path):
    """A 50 MB header starting with '[': refused after its first chunk, not after 50 MB."""
    n = 50_000_000
    (tmp_path / "array.safetensors").write_bytes(struct.pack("<Q", n) + b"[" + b" " * (n - 1))
    with serve(tmp_path) as server:
        with pytest.raises(HeaderError, match=r"the header is not an object \(it starts b'\['\)"):
            open_remote(server.url("array.safetensors"))
    assert [s.range for s in server.log] == [(0, 7), (8, 8 + n - 1)]
    assert server.log[-1].sent < n  # the client hung up: the server could not write it all


def test_strict_header_checks_name_the_url_and_key(tmp_path):
    _raw(tmp_path / "notobj.safetensors", b"[1, 2]   ")
    _raw(
        tmp_path / "bad.safetensors",
        {"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},
        b"\0" * 8,
    )
    with serve(tmp_path) as server:
        with pytest.raises(HeaderError, match="the header is not an object"):
            open_remote(server.url("notobj.safetensors"))
        with pytest.raises(HeaderError) as err:
            open_remote(server.url("bad.safetensors"))
    assert str(err.value) == (
        f"{server.url('bad.safetensors')}, key 'w': shape [3] of dtype F32 needs 12 bytes but "
        "data_offsets [0, 8] span 8"
    )


def test_index_problems_are_errors_naming_the_index(tmp_path):
    header = {"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    _raw(tmp_path / "a.safetensors", header, b"\0" * 4)
    _raw(tmp_path / "b.safetensors", header, b"\0" * 4)
    (tmp_path / "escape.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "../a.safetensors"}})
    )
    (tmp_path / "twice.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "a.safetensors", "v": "b.safetensors"}})
    )
    (tmp_path / "wrong.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "a.safetensors", "v": "a.safetensors"}})
    )
    with serve(tmp_path) as server:
        with pytest.raises(ShardIndexError, match="not a plain file name beside the index"):
            open_remote(server.url("escape.safetensors.index.json"))
        with pytest.raises(DuplicateKeyError, match="key 'w': also stored in"):
            open_remote(server.url("twice.safetensors.index.json"))
        with pytest.raises(ShardIndexError) as err:
            open_remote(server.url("wrong.safetensors.index.json"))
    assert "key 'v': says shard 'a.safetensors' holds it, but no shard does" in str(err.value)


def test_urls_that_name_no_checkpoint_and_a_closed_port():
    with pytest.raises(CheckpointError, match="must name a .safetensors file or a model"):
        remote_kind("http://127.0.0.1:1/model.bin")
    with socket.socket() as s:  # a port nobody listens on (bound, then closed)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(CheckpointError, match="cannot connect: Connection refused"):
        open_remote(f"http://127.0.0.1:{port}/model.safetensors", timeout=2)


def test_a_git_lfs_pointer_is_named_remotely_too(tmp_path):
    pointer = b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 777\n"
    (tmp_path / "model.safetensors").write_bytes(pointer)
    with serve(tmp_path) as server, pytest.raises(HeaderError, match="a Git LFS pointer, not the"):
        open_remote(server.url("model.safetensors"))
