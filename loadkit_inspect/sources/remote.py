"""A remote checkpoint read header-only: Range requests for each shard's header, never its data.

A URL names a ``.safetensors`` file or a ``model.safetensors.index.json``. The index is fetched
whole (bounded as a local one is); each shard then costs two Range requests: bytes ``0-7`` (the
header's length, and from ``Content-Range`` the file's size) and bytes ``8-(8+n-1)`` (the header,
at most the safetensors limit of 100,000,000 bytes). The header is then checked exactly as a local
one is (``loadkit.checkpoint.header``), against the file size the server reports: a 600 GB
checkpoint is checked by reading megabytes.

Every way a server can disappoint is a ``loadkit.errors.CheckpointError`` naming the URL: no
answer within the timeout, a 404 (or any other error status), a redirect loop, a server that
ignores ``Range`` (it answers 200 with the whole file: the connection is closed at once, the data
never read), a ``Content-Range`` that is not the range asked for, or a body longer than asked for.
Only ``http`` and ``https`` are followed, redirects included. The standard library only (urllib);
the usual proxy variables apply, except to the loopback (``127.0.0.1``, ``localhost``).

>>> remote_kind("https://host/org/name/resolve/main/model.safetensors?download=true")
'file'
>>> remote_kind("http://127.0.0.1:8000/model.safetensors.index.json")
'index'
"""

from __future__ import annotations

import http.client
import posixpath
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from loadkit.checkpoint import (
    INDEX_NAME,
    MAX_INDEX_BYTES,
    Checkpoint,
    Layout,
    TensorInfo,
    index_entries,
    parse_index,
    read_header_ranges,
    read_layout,
)
from loadkit.errors import CheckpointError, TruncatedCheckpointError

if TYPE_CHECKING:
    from collections.abc import Iterator
    from http.client import HTTPResponse

    import torch

__all__ = ["DEFAULT_TIMEOUT", "Fetched", "RemoteCheckpoint", "open_remote", "remote_kind"]

DEFAULT_TIMEOUT = 30.0  # seconds for one request, from connecting to its last byte
MAX_SMALL_FILE_BYTES = 10_000_000  # a file fetched whole beside the weights (config.json)
_CHUNK = 1 << 16
_LOOPBACK = ("localhost", "::1")  # and 127.0.0.0/8: never through a proxy
_START = 4096  # the header's first bytes, checked before the rest is read
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_UNSATISFIED = re.compile(r"bytes \*/(\d+)")


def remote_kind(url: str) -> str:
    """``"index"`` or ``"file"``: what the URL's path names (its query string aside)."""
    path = urllib.parse.urlsplit(url).path
    if path.endswith(".json"):
        return "index"
    if path.endswith(".safetensors"):
        return "file"
    raise CheckpointError(
        url, f"a URL must name a .safetensors file or a {INDEX_NAME} (its path ends in neither)"
    )


class Fetched:
    """What reading a remote checkpoint cost: requests made, body bytes received, and the size
    of everything it names (the index and every shard file, as the server reports them)."""

    __slots__ = ("bytes", "requests", "size")

    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0
        self.size = 0

    def as_dict(self) -> dict[str, int]:
        return {"requests": self.requests, "bytes": self.bytes, "size": self.size}

    def __repr__(self) -> str:
        return f"<Fetched {self.bytes} of {self.size} bytes in {self.requests} requests>"


class RemoteCheckpoint(Checkpoint):
    """A checkpoint known from its headers alone: ``tensors`` and ``files`` (URLs) as a local
    one has them, and ``fetched`` (what reading them cost). Its data is never read."""

    def __init__(
        self,
        url: str,
        files: list[str],
        tensors: dict[str, TensorInfo],
        metadata_text: dict[str, str | None],
        client: _Client,
    ) -> None:
        super().__init__(url, files, tensors, metadata_text)
        self._client = client
        self.fetched = client.fetched
        self._beside: dict[str, tuple[str, bytes]] = {}

    def fetch_beside(self, name: str, limit: int = MAX_SMALL_FILE_BYTES) -> tuple[str, bytes]:
        """``(URL, bytes)`` of the small file ``name`` beside the checkpoint (``config.json``
        for ``--model hf``), fetched once and counted in ``fetched``."""
        if name not in self._beside:
            base = urllib.parse.urlsplit(self.path)
            path = posixpath.join(posixpath.dirname(base.path), urllib.parse.quote(name))
            url = urllib.parse.urlunsplit((base.scheme, base.netloc, path, "", ""))
            raw = self._client.get(url, limit)
            if len(raw) > limit:
                raise CheckpointError(url, f"larger than loadkit's limit of {limit} bytes")
            self.fetched.size += len(raw)
            self._beside[name] = (url, raw)
        return self._beside[name]

    def weights(self, *, reuse_buffer: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        raise CheckpointError(
            self.path,
            "a remote checkpoint is read header-only: loadkit never fetches its tensor data "
            "(download it to load its weights)",
        )


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects to ``http``/``https`` only (urllib's own also follows ``ftp``), at most
    ``max_redirections`` of them; the ``Range`` header goes along."""

    max_redirections = 10
    codes = (301, 302, 303, 307, 308)

    def redirect_request(
        self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> Any:
        scheme = urllib.parse.urlsplit(newurl).scheme.lower()
        if scheme not in ("http", "https"):
            raise CheckpointError(
                req.full_url, f"redirected (HTTP {code}) to a {scheme or 'relative'} URL: {newurl}"
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class _Client:
    """One opener for every request of one checkpoint, with the timeout and the tally."""

    def __init__(self, timeout: float, *, direct: bool = False) -> None:
        self.timeout = timeout
        self.fetched = Fetched()
        # The proxy variables apply, except to this machine's own loopback (``direct``).
        handlers = [urllib.request.ProxyHandler({})] if direct else []
        self.opener = urllib.request.build_opener(_Redirects(), *handlers)

    def _open(self, url: str, headers: dict[str, str]) -> HTTPResponse:
        request = urllib.request.Request(
            url, headers={"Accept-Encoding": "identity", "User-Agent": "loadkit", **headers}
        )
        self.fetched.requests += 1
        try:
            return self.opener.open(request, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code in _Redirects.codes:  # urllib gives up on a loop, or after too many
                raise CheckpointError(
                    url,
                    f"redirect loop: HTTP {exc.code} redirects that come back to a URL already "
                    f"visited, or more than {_Redirects.max_redirections} of them",
                ) from None
            raise _status_error(url, exc.code, exc.reason, exc.headers) from None
        except urllib.error.URLError as exc:
            raise CheckpointError(url, _network_problem(exc.reason, self.timeout)) from None
        except (OSError, http.client.HTTPException) as exc:  # TimeoutError is an OSError
            raise CheckpointError(url, _network_problem(exc, self.timeout)) from None
        except ValueError as exc:  # http.client.InvalidURL, a control character in the URL
            raise CheckpointError(url, f"not a valid URL ({exc})") from None

    def _body(
        self,
        url: str,
        response: HTTPResponse,
        limit: int,
        deadline: float,
        check_start: Callable[[bytearray], None] | None = None,
    ) -> bytearray:
        """At most ``limit + 1`` bytes of the body (one more says it is longer), each read
        bounded by the timeout and all of them by ``deadline``; ``check_start`` sees the first
        ``_START`` bytes (or all, if fewer) as soon as they are in, and may refuse them."""
        out = bytearray()
        try:
            while len(out) <= limit:
                if check_start is not None and len(out) >= min(_START, limit):
                    check_start(out[:_START])
                    check_start = None
                if time.monotonic() > deadline:
                    raise CheckpointError(
                        url, f"no complete answer within {self.timeout:g} s (got {len(out)} bytes)"
                    )
                chunk = response.read1(min(_CHUNK, limit + 1 - len(out)))
                if not chunk:
                    break
                out += chunk
                self.fetched.bytes += len(chunk)
        except (OSError, http.client.HTTPException) as exc:
            raise CheckpointError(url, _network_problem(exc, self.timeout)) from None
        if check_start is not None:
            check_start(out[:_START])
        return out

    def get(self, url: str, limit: int) -> bytes:
        """The whole body of a small file (an index), at most ``limit`` bytes (one more if it
        is longer, for the caller to refuse)."""
        deadline = time.monotonic() + self.timeout
        with self._open(url, {}) as response:
            return bytes(self._body(url, response, limit, deadline))

    def get_range(
        self,
        url: str,
        start: int,
        length: int,
        check_start: Callable[[bytearray], None] | None = None,
    ) -> tuple[bytearray, int]:
        """Bytes ``start .. start+length-1`` and the file's total size, by a Range request
        (``check_start``: as for ``_body``)."""
        deadline = time.monotonic() + self.timeout
        end = start + length - 1
        response = self._open(url, {"Range": f"bytes={start}-{end}"})
        with response:
            if response.status != 206:
                announced = response.headers.get("Content-Length")
                whole = f"the whole file, {announced} bytes" if announced else "the whole file"
                raise CheckpointError(
                    url,
                    f"the server does not support Range requests (asked for bytes {start}-{end}, "
                    f"it answered {response.status} with {whole}); loadkit reads remote "
                    "checkpoints header-only and fetched none of it; download the file and "
                    "inspect the local copy, or use a URL whose server honours Range (the "
                    "Hugging Face hub's resolve URLs do)",
                )
            got = _CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
            if got is None or int(got.group(1)) != start or int(got.group(2)) > end:
                shown = response.headers.get("Content-Range")
                raise CheckpointError(
                    url,
                    f"asked for bytes {start}-{end}, the server answered 206 with Content-Range "
                    f"{shown!r}",
                )
            if got.group(3) == "*":
                raise CheckpointError(
                    url, "the server does not say the file's size (Content-Range .../*)"
                )
            size = int(got.group(3))
            declared = response.headers.get("Content-Length")
            if declared is not None and declared.strip().isdigit() and int(declared) > length:
                raise CheckpointError(
                    url,
                    f"asked for {length} bytes ({start}-{end}), the server announces a body of "
                    f"{int(declared)} bytes",
                )
            body = self._body(url, response, length, deadline, check_start)
        if len(body) > length:
            raise CheckpointError(
                url, f"asked for {length} bytes ({start}-{end}), the server sent more"
            )
        expected = min(end, size - 1) - start + 1
        if len(body) != expected:
            raise TruncatedCheckpointError(
                url, f"asked for bytes {start}-{end} of {size}, got {len(body)} bytes"
            )
        return body, size


def _status_error(url: str, code: int, reason: str, headers: Any) -> CheckpointError:
    if code == 416:  # a range past the end: the server says the file's size
        got = _UNSATISFIED.fullmatch((headers.get("Content-Range") or "").strip())
        size = f"is {got.group(1)} bytes" if got else "is shorter"
        return TruncatedCheckpointError(
            url, f"the file {size}, too short for the bytes asked for (HTTP 416)"
        )
    if code == 404:
        return CheckpointError(url, "not found (HTTP 404)")
    return CheckpointError(url, f"the server answered HTTP {code} ({reason})")


def _network_problem(reason: object, timeout: float) -> str:
    if isinstance(reason, TimeoutError) or "timed out" in str(reason):
        return f"no answer within {timeout:g} s (the timeout)"
    if isinstance(reason, OSError) and reason.strerror:
        return f"cannot connect: {reason.strerror}"
    return f"cannot connect: {reason}"


def _read_header(client: _Client, url: str) -> tuple[dict[str, TensorInfo], str | None]:
    """A shard's header by Range requests: its length, then the header (checked as a local
    one is); the file's size, as the server reports it, counted in ``fetched``."""
    sizes: list[int] = []

    def read_range(
        start: int, length: int, check_start: Callable[[bytearray], None] | None
    ) -> tuple[bytearray, int]:
        body, size = client.get_range(url, start, length, check_start)
        if not sizes:
            sizes.append(size)
            client.fetched.size += size
        return body, size

    return read_header_ranges(url, read_range)


def _index_layout(client: _Client, url: str) -> Layout:
    """The shards an index names (by file name, each once), each its URL beside the index."""
    raw = client.get(url, MAX_INDEX_BYTES)
    client.fetched.size += len(raw)
    data = parse_index(raw, url)
    weight_map = index_entries(data, url, "beside the index")
    base = urllib.parse.urlsplit(url)
    folder = posixpath.dirname(base.path)
    urls = {}
    for plain in set(weight_map.values()):
        path = posixpath.join(folder, urllib.parse.quote(plain))
        urls[plain] = urllib.parse.urlunsplit((base.scheme, base.netloc, path, "", ""))
    order = sorted(urls, key=lambda plain: (posixpath.basename(urls[plain]), urls[plain]))
    return Layout(url, url, {plain: urls[plain] for plain in order}, {}, weight_map)


def open_remote(
    url: str,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Callable[[int, int], None] | None = None,
) -> RemoteCheckpoint:
    """Open a remote ``.safetensors`` file or ``model.safetensors.index.json`` header-only.

    Args:
        url: an ``http://`` or ``https://`` URL.
        timeout: seconds each request may take, from connecting to its last byte.
        progress: called with (shards read, shards in all) before each shard and at the end.

    Returns:
        A ``RemoteCheckpoint``: ``tensors`` as ``open_checkpoint`` gives them (``file`` is the
        shard's URL), and ``fetched``: requests made and bytes received against the size of
        everything the URL names. Problems raise ``CheckpointError`` naming the URL.

    Example (a loopback server, as the tests start one):
        >>> ck = open_remote("http://127.0.0.1:8000/model.safetensors")  # doctest: +SKIP
        >>> ck.fetched  # doctest: +SKIP
        <Fetched 1250 of 4194562 bytes in 2 requests>
    """
    kind = remote_kind(url)
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    client = _Client(timeout, direct=host in _LOOPBACK or host.startswith("127."))
    if kind == "file":
        layout = Layout(url, None, {url: url}, {}, {})
    else:
        layout = _index_layout(client, url)
    # An index read over HTTP is held to every consistency check (there is no listing beside
    # it to report the problems against): its first inconsistency raises.
    merged = read_layout(
        layout, lambda file: _read_header(client, file), strict_index=True, progress=progress
    )
    return RemoteCheckpoint(url, merged.files, merged.tensors, merged.metadata_text, client)
