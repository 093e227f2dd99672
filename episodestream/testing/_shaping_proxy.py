"""An HTTP reverse proxy that makes a loopback server behave like a slow, busy or flaky link.

Kernel traffic shaping (``tc netem``, ``tbf``) is not available on the project's machines, so the
link is shaped in user space: the proxy relays each request to the upstream server and paces the
response bodies through a global token bucket (shared by all connections, like the link) and a
per-connection one (like a single TCP stream's ceiling), adds latency, answers 429 beyond a number of
requests in flight or a number of requests per second (as the Hub does), injects 503s and resets connections part-way through a body.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
import socket
import struct
import threading
import time
import urllib.parse
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

_CHUNK_BYTES = 16 * 1024  # pacing granularity: 1.6 ms of a 10 MB/s link
_NO_BODY_STATUSES = frozenset({204, 304})


@dataclass(frozen=True)
class LinkSettings:
    """How the link behaves. Change it while the proxy runs with ``proxy.update(**changes)``.

    Bandwidth (response bodies; None = unlimited):
        rate_bytes_per_s: cap on all connections together.
        per_connection_rate_bytes_per_s: cap on each connection, so a link carries
            min(rate, connections x per-connection rate).
        burst_bytes: how much an idle bucket may save up and then send at once.
    Delay: ``latency_s`` plus a uniform draw in [0, ``jitter_s``] before each request is forwarded.
    Load shedding: beyond ``max_in_flight`` requests in flight, or beyond ``max_requests_per_s``
        requests started in the last second (a rate limit like the Hub's; answered 429s do not
        count), the proxy answers 429, with ``Retry-After`` (whole seconds, rounded up) when
        ``retry_after_s`` is set.
    Faults: ``error_503_rate`` of requests are answered 503 without reaching upstream;
        ``reset_rate`` of responses with a Content-Length of 2+ bytes are cut part-way through the
        body by a TCP reset. Both draw from RNGs seeded by ``seed``, so a run is repeatable.
    """

    rate_bytes_per_s: float | None = None
    per_connection_rate_bytes_per_s: float | None = None
    burst_bytes: int = 64 * 1024
    latency_s: float = 0.0
    jitter_s: float = 0.0
    max_in_flight: int | None = None
    max_requests_per_s: int | None = None
    retry_after_s: float | None = None
    error_503_rate: float = 0.0
    reset_rate: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        checks = (
            ("rate_bytes_per_s", self.rate_bytes_per_s, "a positive number or None", lambda v: v is None or v > 0),
            ("per_connection_rate_bytes_per_s", self.per_connection_rate_bytes_per_s,
             "a positive number or None", lambda v: v is None or v > 0),
            ("burst_bytes", self.burst_bytes, "a non-negative integer", lambda v: v >= 0),
            ("latency_s", self.latency_s, "a non-negative number", lambda v: v >= 0),
            ("jitter_s", self.jitter_s, "a non-negative number", lambda v: v >= 0),
            ("max_in_flight", self.max_in_flight, "a positive integer or None", lambda v: v is None or v >= 1),
            ("max_requests_per_s", self.max_requests_per_s, "a positive integer or None",
             lambda v: v is None or v >= 1),
            ("retry_after_s", self.retry_after_s, "a non-negative number or None", lambda v: v is None or v >= 0),
            ("error_503_rate", self.error_503_rate, "a fraction in [0, 1]", lambda v: 0 <= v <= 1),
            ("reset_rate", self.reset_rate, "a fraction in [0, 1]", lambda v: 0 <= v <= 1),
        )
        for name, value, expected, is_valid in checks:
            if isinstance(value, bool) or not (value is None or isinstance(value, (int, float))) \
                    or not is_valid(value):
                raise ValueError(f"Invalid {name} ({value!r}): expected {expected}.")


@dataclass(frozen=True)
class ProxyStats:
    """Counters since start or the last ``reset_stats()``.

    ``bytes_sent`` counts response bytes relayed to clients (bodies only, as they leave the proxy);
    ``bytes_by_path`` splits them by request path (no query string).
    ``in_flight_series`` holds ``(seconds since start, requests in flight)`` at every change. A request
    leaves flight once its last byte is handed to the socket, which can trail the client's read by a
    moment: poll before asserting ``in_flight == 0``.
    """

    requests: int
    responses_by_status: dict[int, int]
    throttled_429: int
    injected_503: int
    resets: int
    bytes_sent: int
    bytes_by_path: dict[str, int]
    in_flight: int
    peak_in_flight: int
    in_flight_series: list[tuple[float, int]]


class _Bucket:
    """A token bucket kept as one number, the time its debt is paid off (GCRA): no refill task."""

    def __init__(self) -> None:
        self._due_s = 0.0

    async def take(self, n_bytes: int, *, rate_bytes_per_s: float, burst_bytes: int) -> None:
        now_s = asyncio.get_running_loop().time()
        due_s = max(self._due_s, now_s)
        # Reserving before sleeping (no await in between) queues concurrent takers in arrival order.
        self._due_s = due_s + n_bytes / rate_bytes_per_s
        delay_s = due_s - burst_bytes / rate_bytes_per_s - now_s
        if delay_s > 0:
            await asyncio.sleep(delay_s)


class _Request:
    def __init__(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        self.method, self.target, self.version = lines[0].split(" ", 2)
        self.headers = [tuple(part.strip() for part in line.split(":", 1)) for line in lines[1:] if line]

    def header(self, name: str) -> str | None:
        return _header(self.headers, name)


def _header(headers: list[tuple[str, ...]], name: str) -> str | None:
    return next((v for k, v in headers if k.lower() == name), None)


def _simple_response(status: int, reason: str, *, extra: dict[str, str], close: bool) -> bytes:
    body = f'{{"error": "{reason} (answered by ShapingProxy)"}}'.encode()
    lines = [f"HTTP/1.1 {status} {reason}", "Content-Type: application/json", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in extra.items()] + (["Connection: close"] if close else [])
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def _read_body(reader: asyncio.StreamReader, headers: list[tuple[str, ...]]) -> bytes:
    """A request body, framing kept as received (Content-Length or chunked)."""
    if (_header(headers, "transfer-encoding") or "").lower() == "chunked":
        raw = bytearray()
        while True:
            line = await reader.readuntil(b"\r\n")
            raw += line
            size = int(line.split(b";")[0], 16)
            if size == 0:
                while (trailer := await reader.readuntil(b"\r\n")) != b"\r\n":
                    raw += trailer
                return bytes(raw + b"\r\n")
            raw += await reader.readexactly(size + 2)
    return await reader.readexactly(int(_header(headers, "content-length") or 0))


class _Connection:
    """One client connection and the upstream connection it reuses across keep-alive requests."""

    def __init__(self) -> None:
        self.bucket = _Bucket()
        self.path = ""  # the request being answered (its path, no query): bytes are counted by it
        self.upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    def close_upstream(self) -> None:
        if self.upstream is not None:
            self.upstream[1].close()
            self.upstream = None


class ShapingProxy:
    """Relay HTTP to ``upstream_url`` through a shaped link; see ``LinkSettings``.

    Only ``Host`` is rewritten (to the upstream's), and ``X-Forwarded-Host`` added with the original,
    so an upstream that builds absolute links (FakeHub's tree paging) points them back at the proxy.
    Redirects pass through unchanged. Request bodies are buffered, response bodies streamed.

    Start and stop with ``with ShapingProxy(url, settings=LinkSettings(...)) as proxy: proxy.url``,
    or ``start()`` / ``stop()``; the proxy runs its own event loop in its own thread.
    """

    def __init__(self, upstream_url: str, *, settings: LinkSettings | None = None) -> None:
        split = urllib.parse.urlsplit(upstream_url)
        if split.scheme != "http" or not split.hostname or split.port is None:
            raise ValueError(f"Invalid upstream_url ({upstream_url!r}): expected http://HOST:PORT.")
        self.upstream_url = upstream_url
        self._upstream = (split.hostname, split.port)
        self._settings = settings or LinkSettings()
        self._lock = threading.Lock()
        self._seed_rngs(self._settings.seed)
        self._global_bucket = _Bucket()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._port: int | None = None
        self._start_error: BaseException | None = None
        self._t0_s = time.monotonic()
        self._recent_starts: deque[float] = deque()  # forwarded requests' start times, last second
        self.reset_stats()

    # -- control (any thread) ----------------------------------------------------------------------
    @property
    def url(self) -> str:
        if self._port is None:
            raise RuntimeError("ShapingProxy is not running: use `with ShapingProxy(...) as proxy` or start().")
        return f"http://127.0.0.1:{self._port}"

    @property
    def settings(self) -> LinkSettings:
        return self._settings

    def update(self, **changes: Any) -> LinkSettings:
        """Change settings while running, e.g. ``proxy.update(rate_bytes_per_s=1e6)``."""
        with self._lock:
            self._settings = dataclasses.replace(self._settings, **changes)
            if "seed" in changes:
                self._seed_rngs(self._settings.seed)
            return self._settings

    def _seed_rngs(self, seed: int) -> None:
        # One stream per purpose, so turning on resets does not change which requests get a 503.
        self._rng_jitter, self._rng_503, self._rng_reset = (
            random.Random(f"{seed}-{purpose}") for purpose in ("jitter", "503", "reset"))

    def stats(self) -> ProxyStats:
        with self._lock:
            return ProxyStats(
                requests=self._requests, responses_by_status=dict(self._statuses),
                throttled_429=self._statuses[429] - self._upstream_429, injected_503=self._injected_503,
                resets=self._resets, bytes_sent=self._bytes_sent,
                bytes_by_path=dict(self._bytes_by_path), in_flight=self._in_flight,
                peak_in_flight=self._peak_in_flight, in_flight_series=list(self._series))

    def reset_stats(self) -> None:
        with self._lock:
            self._requests = self._injected_503 = self._resets = self._bytes_sent = self._upstream_429 = 0
            self._statuses: Counter[int] = Counter()
            self._bytes_by_path: Counter[str] = Counter()
            self._in_flight = self._peak_in_flight = getattr(self, "_in_flight", 0)
            self._series = [(time.monotonic() - self._t0_s, self._in_flight)]

    def _over_rate(self, limit: int | None) -> bool:
        # Called under the lock. A sliding one-second window of the requests let through.
        if limit is None:
            return False
        now_s = time.monotonic()
        while self._recent_starts and self._recent_starts[0] <= now_s - 1.0:
            self._recent_starts.popleft()
        if len(self._recent_starts) >= limit:
            return True
        self._recent_starts.append(now_s)
        return False

    def _add_in_flight(self, delta: int) -> None:
        with self._lock:
            self._in_flight += delta
            self._peak_in_flight = max(self._peak_in_flight, self._in_flight)
            self._series.append((time.monotonic() - self._t0_s, self._in_flight))

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> ShapingProxy:
        if self._thread is not None:
            raise RuntimeError("ShapingProxy is already running.")
        ready = threading.Event()
        self._start_error = None
        self._thread = threading.Thread(target=self._run, args=(ready,), name="ShapingProxy", daemon=True)
        self._thread.start()
        ready.wait()
        if self._start_error is not None:
            self._thread.join()
            self._thread = None
            raise RuntimeError("ShapingProxy failed to start") from self._start_error
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join()
        self._thread, self._loop, self._port = None, None, None

    def __enter__(self) -> ShapingProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self, ready: threading.Event) -> None:
        try:
            asyncio.run(self._main(ready))
        except BaseException as error:  # noqa: BLE001 - handed to start() in the caller's thread
            self._start_error = self._start_error or error
        finally:
            ready.set()  # never leave start() waiting

    async def _main(self, ready: threading.Event) -> None:
        self._stopping = asyncio.Event()
        tasks: set[asyncio.Task] = set()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            tasks.add(task)
            try:
                await self._serve_client(reader, writer)
            except asyncio.CancelledError:
                pass  # stop() cancels open connections; ending quietly keeps asyncio from logging it
            finally:
                tasks.discard(task)

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        self._port = server.sockets[0].getsockname()[1]
        self._loop = asyncio.get_running_loop()
        ready.set()
        await self._stopping.wait()
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()

    # -- relaying (event-loop thread) ----------------------------------------------------------------
    async def _serve_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection()
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    break  # the client closed between requests
                if not await self._handle(conn, _Request(head), reader, writer):
                    break
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass  # a broken client, a broken upstream or a malformed message ends this connection only
        finally:
            conn.close_upstream()
            writer.close()

    async def _handle(self, conn: _Connection, request: _Request, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> bool:
        """Answer one request; returns whether the client connection stays open."""
        with self._lock:
            self._requests += 1
            settings = self._settings
            delay_s = settings.latency_s + (self._rng_jitter.uniform(0, settings.jitter_s) if settings.jitter_s else 0)
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        client_keeps_alive = (request.header("connection") or "").lower() != "close" and request.version == "HTTP/1.1"
        expects_continue = (request.header("expect") or "").lower() == "100-continue"
        with self._lock:
            settings = self._settings
            rejection = None
            if settings.max_in_flight is not None and self._in_flight >= settings.max_in_flight \
                    or self._over_rate(settings.max_requests_per_s):
                # Whole seconds: huggingface_hub ignores a Retry-After that is not all digits.
                retry_after = settings.retry_after_s
                extra = {} if retry_after is None else {"Retry-After": str(math.ceil(retry_after))}
                rejection = (429, "Too Many Requests", extra)
            elif settings.error_503_rate and self._rng_503.random() < settings.error_503_rate:
                rejection = (503, "Service Unavailable", {})
                self._injected_503 += 1
            if rejection is not None:
                self._statuses[rejection[0]] += 1
        if rejection is not None:
            # A client waiting for "100 Continue" has not sent its body: closing keeps the stream in sync.
            keep_alive = client_keeps_alive and not expects_continue
            if keep_alive:
                await _read_body(reader, request.headers)
            status, reason, extra = rejection
            writer.write(_simple_response(status, reason, extra=extra, close=not keep_alive))
            await writer.drain()
            return keep_alive
        self._add_in_flight(+1)
        try:
            return await self._forward(conn, request, reader, writer, client_keeps_alive, expects_continue)
        finally:
            self._add_in_flight(-1)

    async def _forward(self, conn: _Connection, request: _Request, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter, client_keeps_alive: bool, expects_continue: bool) -> bool:
        if expects_continue:
            # Answer the client's 100-continue here so the body can be buffered before forwarding.
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
        body = await _read_body(reader, request.headers)
        conn.path = urllib.parse.urlsplit(request.target).path
        host = f"{self._upstream[0]}:{self._upstream[1]}"
        headers = [(k, host if k.lower() == "host" else v) for k, v in request.headers if k.lower() != "expect"]
        original_host = request.header("host")
        if original_host and request.header("x-forwarded-host") is None:
            headers.append(("X-Forwarded-Host", original_host))
        head = "\r\n".join([f"{request.method} {request.target} {request.version}"]
                           + [f"{k}: {v}" for k, v in headers]) + "\r\n\r\n"
        try:
            upstream_reader, status_head = await self._exchange(conn, head.encode("latin-1") + body)
        except (ConnectionError, asyncio.IncompleteReadError):
            with self._lock:
                self._statuses[502] += 1
            writer.write(_simple_response(502, "Bad Gateway", extra={}, close=True))
            await writer.drain()
            return False
        status_line, _, rest = status_head.decode("latin-1").partition("\r\n")
        status = int(status_line.split(" ", 2)[1])
        response_headers = [tuple(p.strip() for p in line.split(":", 1)) for line in rest.split("\r\n") if line]
        with self._lock:
            self._statuses[status] += 1
            self._upstream_429 += status == 429
        length = _header(response_headers, "content-length")
        chunked = (_header(response_headers, "transfer-encoding") or "").lower() == "chunked"
        has_body = request.method != "HEAD" and status not in _NO_BODY_STATUSES
        upstream_keeps_alive = (_header(response_headers, "connection") or "").lower() != "close"
        until_close = has_body and not chunked and length is None
        writer.write(status_head)
        cut_after = None
        if has_body and not chunked and length is not None and int(length) >= 2:
            with self._lock:
                if self._settings.reset_rate and self._rng_reset.random() < self._settings.reset_rate:
                    cut_after = 1 + self._rng_reset.randrange(int(length) - 1)
        if not has_body:
            await writer.drain()
        elif chunked:
            await self._relay_chunked(conn, upstream_reader, writer)
        else:
            total = int(length) if length is not None else None
            if not await self._relay(conn, upstream_reader, writer, total_bytes=total, cut_after=cut_after):
                return False
        if not upstream_keeps_alive or until_close:
            conn.close_upstream()
        return client_keeps_alive and not until_close

    async def _exchange(self, conn: _Connection, request_bytes: bytes) -> tuple[asyncio.StreamReader, bytes]:
        """Send a request upstream and read the final response head, reconnecting once if a reused
        keep-alive connection turns out to be closed."""
        for attempt in range(2):
            reused = conn.upstream is not None
            if conn.upstream is None:
                conn.upstream = await asyncio.open_connection(*self._upstream)
            upstream_reader, upstream_writer = conn.upstream
            try:
                upstream_writer.write(request_bytes)
                await upstream_writer.drain()
                while True:
                    status_head = await upstream_reader.readuntil(b"\r\n\r\n")
                    # Interim 1xx answers are dropped: the proxy answered 100-continue itself.
                    if not status_head.split(b" ", 2)[1].startswith(b"1"):
                        return upstream_reader, status_head
            except (ConnectionError, asyncio.IncompleteReadError):
                conn.close_upstream()
                if not reused or attempt:
                    raise
        raise AssertionError("unreachable")

    async def _pace(self, conn: _Connection, n_bytes: int) -> None:
        settings = self._settings
        if settings.per_connection_rate_bytes_per_s:
            await conn.bucket.take(n_bytes, rate_bytes_per_s=settings.per_connection_rate_bytes_per_s,
                                   burst_bytes=settings.burst_bytes)
        settings = self._settings
        if settings.rate_bytes_per_s:
            await self._global_bucket.take(n_bytes, rate_bytes_per_s=settings.rate_bytes_per_s,
                                    burst_bytes=settings.burst_bytes)

    async def _send(self, conn: _Connection, writer: asyncio.StreamWriter, data: bytes) -> None:
        await self._pace(conn, len(data))
        with self._lock:  # counted first, so a client that has the bytes already sees them counted
            self._bytes_sent += len(data)
            self._bytes_by_path[conn.path] += len(data)
        writer.write(data)
        await writer.drain()

    async def _relay(self, conn: _Connection, upstream: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                     total_bytes: int | None, cut_after: int | None) -> bool:
        """Relay a Content-Length (or read-until-close) body; False when the client connection ended."""
        sent = 0
        while total_bytes is None or sent < total_bytes:
            want = _CHUNK_BYTES if total_bytes is None else min(_CHUNK_BYTES, total_bytes - sent)
            data = await upstream.read(want)
            if not data:
                if total_bytes is None:
                    return True
                raise ConnectionResetError("upstream closed part-way through a body")
            if cut_after is not None and sent + len(data) >= cut_after:
                await self._send(conn, writer, data[:cut_after - sent])
                await self._reset(conn, writer)
                return False
            await self._send(conn, writer, data)
            sent += len(data)
        return True

    async def _relay_chunked(self, conn: _Connection, upstream: asyncio.StreamReader,
                             writer: asyncio.StreamWriter) -> None:
        while True:
            line = await upstream.readuntil(b"\r\n")
            size = int(line.split(b";")[0], 16)
            writer.write(line)
            if size == 0:
                while (trailer := await upstream.readuntil(b"\r\n")) != b"\r\n":
                    writer.write(trailer)
                writer.write(b"\r\n")
                await writer.drain()
                return
            remaining = size
            while remaining:
                data = await upstream.readexactly(min(_CHUNK_BYTES, remaining))
                await self._send(conn, writer, data)
                remaining -= len(data)
            writer.write(await upstream.readexactly(2))

    async def _reset(self, conn: _Connection, writer: asyncio.StreamWriter) -> None:
        # Flush what was sent so far to the kernel, then close with SO_LINGER 0: the peer gets a RST
        # ("connection reset by peer"), not a clean FIN.
        writer.transport.set_write_buffer_limits(high=0)
        await writer.drain()
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
        conn.close_upstream()
        with self._lock:
            self._resets += 1
