"""A plain HTTP file server on 127.0.0.1: the standard library's, plus Range requests and Basic auth.

``python -m http.server`` is what many users put in front of a folder; its handler lists folders as
HTML and answers HEAD with ``Content-Length``, but ignores ``Range`` (it sends the whole file). This
one answers single ranges with 206 (``ranges=False`` behaves like the standard one) and, given
``credentials``, refuses requests without them (401), so URLs with ``user:password@`` are exercised.
"""

from __future__ import annotations

import base64
import functools
import http.server
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


@dataclass
class HttpStats:
    """Requests served, by method, and ranged GETs answered with 206."""

    requests: dict[str, int] = field(default_factory=dict)
    ranged: int = 0


class _Handler(http.server.SimpleHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the standard signature
        pass  # a line per request on stderr drowns test output

    def handle(self) -> None:
        try:
            super().handle()
        except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError):
            pass  # the client left mid-body or reset a kept connection: no server error (socketserver prints a traceback)

    def _count(self) -> None:
        with self.server.lock:
            self.server.stats.requests[self.command] = self.server.stats.requests.get(self.command, 0) + 1

    def _authorised(self) -> bool:
        if self.server.credentials is None:
            return True
        expected = "Basic " + base64.b64encode(":".join(self.server.credentials).encode()).decode()
        if self.headers.get("Authorization") == expected:
            return True
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="data"')
        self.send_header("Content-Length", "0")
        self.end_headers()
        return False

    def do_HEAD(self) -> None:
        self._count()
        if self._authorised():
            super().do_HEAD()

    def do_GET(self) -> None:
        self._count()
        if not self._authorised():
            return
        match = _RANGE.match(self.headers.get("Range", ""))
        path = self.translate_path(self.path)
        if not self.server.ranges or match is None or not os.path.isfile(path):
            super().do_GET()
            return
        size = os.path.getsize(path)
        first, last = match.groups()
        if first == "":  # "bytes=-N": the last N bytes
            start, end = max(0, size - int(last or 0)), size
        else:
            start, end = int(first), min(size, int(last) + 1 if last else size)
        if start >= size or start >= end:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        with open(path, "rb") as file:
            file.seek(start)
            body = file.read(end - start)
        with self.server.lock:
            self.server.stats.ranged += 1
        self.send_response(206)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        self.wfile.write(body)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True  # a request thread a client left hanging must not outlive the test
    # socketserver's default listen backlog is 5: a client opening more connections at once (the
    # listing sizes files in parallel) had SYNs dropped, each retried by the kernel 1 s later.
    request_queue_size = 128

    def __init__(self, root: Path, *, ranges: bool, credentials: tuple[str, str] | None) -> None:
        super().__init__(("127.0.0.1", 0), functools.partial(_Handler, directory=str(root)))
        self.ranges = ranges
        self.credentials = credentials
        self.stats = HttpStats()
        self.lock = threading.Lock()


class HttpServer:
    """Serves ``root`` on ``http://127.0.0.1:<free port>``; ``with HttpServer(root) as server: server.url``.

    ``url_for("folder", user="u", password="p")`` gives a URL below ``root``, with credentials in it
    when asked; ``stats()`` counts requests.
    """

    def __init__(self, root: str | os.PathLike, *, ranges: bool = True,
                 credentials: tuple[str, str] | None = None) -> None:
        self._root = Path(root)
        self._ranges = ranges
        self._credentials = credentials
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("HttpServer is not running.")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def url_for(self, relpath: str = "", *, user: str | None = None, password: str | None = None) -> str:
        url = self.url
        if user is not None:
            url = url.replace("http://", f"http://{user}:{password or ''}@", 1)
        return f"{url}/{relpath.lstrip('/')}" if relpath else url

    def stats(self) -> HttpStats:
        if self._server is None:
            raise RuntimeError("HttpServer is not running.")
        with self._server.lock:
            return HttpStats(dict(self._server.stats.requests), self._server.stats.ranged)

    def start(self) -> HttpServer:
        if self._server is not None:
            raise RuntimeError("HttpServer is already running.")
        self._server = _Server(self._root, ranges=self._ranges, credentials=self._credentials)
        self._thread = threading.Thread(target=self._server.serve_forever, name="episodestream-http-server",
                                        kwargs={"poll_interval": 0.05})
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        self._server = self._thread = None

    def __enter__(self) -> HttpServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
