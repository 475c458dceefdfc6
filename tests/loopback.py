"""A real HTTP server on the loopback (127.0.0.1, a port the OS picks) serving a folder, with the
ways servers misbehave as switches. The tests that read remote checkpoints start one and stop it
(``with serve(folder) as server``); it never outlives them and never leaves the machine.

What it does with ``Range: bytes=a-b`` (RFC 9110): 206 with ``Content-Range: bytes a-b'/size``
(``b'`` clipped to the file), 416 with ``Content-Range: bytes */size`` past the end. Every
request is recorded (path, range asked, status, body bytes sent), so a test can check that no
tensor data was ever served.

Modes:

- ``"ranges"``: the above;
- ``"no-ranges"``: ignores Range, 200 with the whole file;
- ``"slow"``: waits ``delay`` seconds before answering;
- ``"trickle"``: answers at once, then sends the body one byte every ``delay`` seconds;
- ``"redirect-loop"``: every path redirects to another that redirects back;
- ``"redirect"``: every path but ``/real/...`` redirects there once (as the hub's ``resolve``
  URLs redirect to a CDN);
- ``"long-body"``: 206 with more bytes than the range asked for, announced by Content-Length;
- ``"long-body-unannounced"``: the same without Content-Length, the connection closed after it;
- ``"wrong-range"``: 206 for another range than the one asked for.

A path that names no file is a 404 in every mode.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


@dataclass
class Served:
    path: str
    range: tuple[int, int | None] | None  # (first, last) as asked
    status: int
    sent: int  # body bytes written


@dataclass
class Server:
    folder: Path
    mode: str = "ranges"
    delay: float = 0.0
    log: list[Served] = field(default_factory=list)
    port: int = 0
    stopping: threading.Event = field(default_factory=threading.Event)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    @property
    def sent(self) -> int:
        return sum(s.sent for s in self.log)


def _handler(server: Server) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def _send(self, status: int, body: bytes, headers: dict[str, str], rng=None) -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            sent = 0
            try:
                if server.mode == "trickle":
                    for i in range(len(body)):
                        if server.stopping.wait(server.delay):
                            break
                        self.wfile.write(body[i : i + 1])
                        self.wfile.flush()
                        sent += 1
                else:
                    self.wfile.write(body)
                    sent = len(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client closed the connection (it refused the answer)
            server.log.append(Served(self.path, rng, status, sent))

        def do_GET(self) -> None:
            mode = server.mode
            if mode == "slow":
                server.stopping.wait(server.delay)  # ends at once when the server stops
            path = unquote(urlsplit(self.path).path)
            if mode == "redirect-loop":
                other = "/b" + path if not path.startswith("/b/") else path[2:]
                self.close_connection = True
                return self._send(302, b"", {"Location": other, "Content-Length": "0"})
            if mode == "redirect":
                if not path.startswith("/real/"):
                    headers = {"Location": "/real" + path, "Content-Length": "0"}
                    return self._send(302, b"", headers)
                path = path[len("/real") :]
            file = server.folder / path.lstrip("/")
            if not file.is_file() or not file.resolve().is_relative_to(server.folder.resolve()):
                body = b"not found"
                return self._send(404, body, {"Content-Length": str(len(body))})
            size = file.stat().st_size
            asked = _RANGE.fullmatch(self.headers.get("Range", "").strip())
            if asked is None or mode == "no-ranges":
                return self._send(200, file.read_bytes(), {"Content-Length": str(size)})
            first = int(asked.group(1))
            last = int(asked.group(2)) if asked.group(2) else None
            rng = (first, last)
            if first >= size:
                headers = {"Content-Range": f"bytes */{size}", "Content-Length": "0"}
                return self._send(416, b"", headers, rng)
            end = size - 1 if last is None else min(last, size - 1)
            if mode == "wrong-range":
                first, end = first + 1, min(end + 1, size - 1)
            with open(file, "rb") as f:  # only the range: a sparse 100 GB file costs nothing
                f.seek(first)
                body = f.read(end + 1 - first)
            headers = {"Content-Range": f"bytes {first}-{end}/{size}"}
            if mode in ("long-body", "long-body-unannounced"):
                body += b"x" * 200
                headers["Content-Length"] = str(len(body))
            if mode == "long-body-unannounced":
                del headers["Content-Length"]
                self.close_connection = True
                headers["Connection"] = "close"
            else:
                headers["Content-Length"] = str(len(body))
            return self._send(206, body, headers, rng)

    return Handler


@contextlib.contextmanager
def serve(folder: str | Path, mode: str = "ranges", delay: float = 0.0) -> Iterator[Server]:
    """Serve ``folder`` on 127.0.0.1 (a free port) until the block ends."""
    server = Server(Path(folder), mode, delay)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(server))
    httpd.daemon_threads = False  # server_close() joins every request's thread
    server.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server
    finally:
        server.stopping.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)
