"""A fake Hugging Face Hub on 127.0.0.1 that serves dataset folders to huggingface_hub's real client.

It serves ``ROOT/datasets/<owner>/<name>/`` through the endpoints that ``HfFileSystem``,
``hf_hub_download`` and ``snapshot_download`` call (repo info, tree listing with paging, paths-info,
ranged ``/resolve/``), with the Hub's error headers, so tests and benchmarks exercise the real client
code paths without a network. Optionally ``/resolve/`` answers a redirect to a second server (another
origin, like the Hub's CDN) and a bearer token is required.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_SHA_RE = re.compile(r"[0-9a-f]{40}")
_RANGE_RE = re.compile(r"bytes=(\d*)-(\d*)")
_COPY_CHUNK_BYTES = 256 * 1024
# An idle keep-alive connection is dropped after this long so a handler thread never waits forever.
_IDLE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class PathStats:
    """What one URL path (or one repo file) cost: requests answered and body bytes sent."""

    requests: int = 0
    bytes_sent: int = 0


@dataclass(frozen=True)
class HubStats:
    """A snapshot of the counters since start or the last ``reset_stats()``.

    ``by_path`` is keyed by URL path (no query) on either origin. ``by_file`` is keyed by
    ``"<owner>/<name>/<path in repo>"`` and counts only GETs that sent file bytes (200 or 206), on
    whichever origin served them, so "each file was fetched once" is ``by_file[key].requests == 1``.
    """

    requests: int
    bytes_sent: int
    by_path: dict[str, PathStats]
    by_file: dict[str, PathStats]


class _Stats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._requests = 0
            self._bytes = 0
            self._by_path: dict[str, list[int]] = {}
            self._by_file: dict[str, list[int]] = {}

    # Counted before the bytes go out, so a client that has its response already sees them counted.
    def count_request(self, *, path: str | None = None, file_key: str | None = None) -> None:
        with self._lock:
            self._requests += path is not None
            for table, key in ((self._by_path, path), (self._by_file, file_key)):
                if key is not None:
                    table.setdefault(key, [0, 0])[0] += 1

    def count_bytes(self, n_bytes: int, *, path: str, file_key: str | None = None) -> None:
        with self._lock:
            self._bytes += n_bytes
            for table, key in ((self._by_path, path), (self._by_file, file_key)):
                if key is not None:
                    table.setdefault(key, [0, 0])[1] += n_bytes

    def snapshot(self) -> HubStats:
        with self._lock:
            return HubStats(
                requests=self._requests, bytes_sent=self._bytes,
                by_path={k: PathStats(*v) for k, v in self._by_path.items()},
                by_file={k: PathStats(*v) for k, v in self._by_file.items()})


class _HubError(Exception):
    def __init__(self, status: int, message: str, *, error_code: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.error_code, self.headers = status, error_code, dict(headers or {})


def _oid(*parts: object) -> str:
    # A stand-in for git's blob id: hashing names, sizes and mtimes instead of contents keeps listing
    # a benchmark-sized dataset cheap; the client only uses it as an opaque cache key and ETag.
    return hashlib.sha1("\0".join(map(str, parts)).encode()).hexdigest()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default listen backlog is 5: a client opening more connections at once (the
    # listing sizes files in parallel) had SYNs dropped, each retried by the kernel 1 s later.
    request_queue_size = 128

    def __init__(self, hub: FakeHub, role: str) -> None:
        self.hub, self.role = hub, role
        self.live: dict[threading.Thread, socket.socket] = {}
        self.live_lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn(), a DNS lookup we neither need nor can rely on.
        self.socket.bind(self.server_address)
        self.server_address = self.socket.getsockname()
        self.server_name, self.server_port = self.server_address[:2]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the Hub
    disable_nagle_algorithm = True  # header and body writes must not wait for delayed ACKs
    timeout = _IDLE_TIMEOUT_S
    server: _Server

    def setup(self) -> None:
        super().setup()
        with self.server.live_lock:
            self.server.live[threading.current_thread()] = self.connection

    def finish(self) -> None:
        with self.server.live_lock:
            self.server.live.pop(threading.current_thread(), None)
        try:
            super().finish()
        except OSError:
            pass  # the peer (or stop()) already closed the socket

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass

    def handle(self) -> None:
        try:
            super().handle()
        except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError):
            # The client left: a keep-alive connection reset while this waited for its next request
            # (ShapingProxy's reset closes its upstream with the body unread). A client's disconnect is
            # no server error; socketserver would print it as one, a traceback amid the test output.
            pass

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        hub = self.server.hub
        split = urllib.parse.urlsplit(self.path)
        self._stats_path = split.path
        hub._stats.count_request(path=split.path)
        try:
            body = self._read_body()
            if self.server.role == "cdn":
                hub._route_cdn(self, split)
            else:
                hub._check_token(self.headers.get("Authorization"))
                hub._route(self, split, body)
        except _HubError as error:
            self._send_error(error)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self.close_connection = True
            raise _HubError(411, "chunked request bodies are not supported; send Content-Length")
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def base_url(self) -> str:
        # Behind ShapingProxy the Host header names the upstream: links must point back at the proxy.
        host = self.headers.get("X-Forwarded-Host") or self.headers.get("Host")
        return f"http://{host}" if host else self.server.hub.url

    def send_json(self, payload: object, *, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.write_body(data)

    def write_body(self, data: bytes) -> None:
        if self.command != "HEAD":
            self.server.hub._stats.count_bytes(len(data), path=self._stats_path)
            self.wfile.write(data)

    def send_file_bytes(self, path: Path, *, file_key: str, start: int, length: int) -> None:
        stats = self.server.hub._stats
        stats.count_request(file_key=file_key)
        with open(path, "rb") as file:
            file.seek(start)
            while length > 0:
                chunk = file.read(min(_COPY_CHUNK_BYTES, length))
                if not chunk:
                    break
                stats.count_bytes(len(chunk), path=self._stats_path, file_key=file_key)
                self.wfile.write(chunk)
                length -= len(chunk)

    def _send_error(self, error: _HubError) -> None:
        data = json.dumps({"error": str(error)}).encode()
        self.send_response(error.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if error.error_code:
            self.send_header("X-Error-Code", error.error_code)
        # Header values must be latin-1; a message may quote a non-ASCII path.
        self.send_header("X-Error-Message", str(error).encode("ascii", "backslashreplace").decode())
        for key, value in error.headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.write_body(data)


class FakeHub:
    """Serve ``root/datasets/<owner>/<name>/`` as Hugging Face Hub dataset repos on 127.0.0.1.

    What to serve:
        root: folder holding ``datasets/<owner>/<name>/``. Files are read when requested.
        revisions: extra git-like revisions, name -> 40-hex sha, valid for every repo and serving the
            same files; ``main`` (and its sha, derived from file names and sizes) always exists.

    How to serve it:
        redirect_resolve: answer ``/resolve/`` with a 302 to a second server (another origin, as the
            Hub's CDN), which serves the bytes. Set ``redirect_base_url`` to put a proxy in between.
        token: when set, every request to the Hub origin needs ``Authorization: Bearer <token>``;
            none gives 401 RepoNotFound (like a private repo), a wrong one 401 "Invalid credentials".
        tree_page_size: entries per tree page; further pages are linked by ``Link: <..>; rel="next"``.

    Start and stop with ``with FakeHub(root) as hub: hub.url`` or ``start()`` / ``stop()``.
    """

    def __init__(self, root: str | Path, *, redirect_resolve: bool = False, token: str | None = None,
                 revisions: Mapping[str, str] | None = None, tree_page_size: int = 1000) -> None:
        revisions = dict(revisions or {})
        for name, sha in revisions.items():
            if not isinstance(sha, str) or not _SHA_RE.fullmatch(sha):
                raise ValueError(f"Invalid sha ({sha!r}) for revision {name!r}: expected 40 lowercase hex "
                                 "characters.")
        if tree_page_size < 1:
            raise ValueError(f"Invalid tree_page_size ({tree_page_size}): expected a positive integer.")
        self.root = Path(root)
        self.redirect_resolve = redirect_resolve
        self.token = token
        self.revisions = revisions
        self.tree_page_size = tree_page_size
        self.redirect_base_url: str | None = None
        self._stats = _Stats()
        self._main_shas: dict[Path, str] = {}
        self._sha_lock = threading.Lock()
        self._servers: list[_Server] = []
        self._threads: list[threading.Thread] = []

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> FakeHub:
        if self._servers:
            raise RuntimeError("FakeHub is already running.")
        roles = ("hub", "cdn") if self.redirect_resolve else ("hub",)
        self._servers = [_Server(self, role) for role in roles]
        for server in self._servers:
            thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                      name=f"FakeHub-{server.role}-{server.server_port}", daemon=True)
            thread.start()
            self._threads.append(thread)
        if self.redirect_resolve and self.redirect_base_url is None:
            self.redirect_base_url = self.cdn_url
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            with server.live_lock:
                live = dict(server.live)
            # Idle keep-alive connections block their handler thread in recv(): wake them up.
            for sock in live.values():
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            for thread in live:
                thread.join(timeout=5)
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._servers, self._threads = [], []

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The Hub origin, e.g. ``http://127.0.0.1:54321`` (pass it as ``endpoint=``)."""
        return self._server_url("hub")

    @property
    def cdn_url(self) -> str | None:
        """The origin that serves file bytes after a redirect; None without ``redirect_resolve``."""
        return self._server_url("cdn") if self.redirect_resolve else None

    def _server_url(self, role: str) -> str:
        for server in self._servers:
            if server.role == role:
                return f"http://127.0.0.1:{server.server_port}"
        raise RuntimeError("FakeHub is not running: use `with FakeHub(...) as hub` or call start().")

    # -- counters ----------------------------------------------------------------------------------
    def stats(self) -> HubStats:
        return self._stats.snapshot()

    def reset_stats(self) -> None:
        self._stats.reset()

    # -- repos and revisions -------------------------------------------------------------------------
    def main_sha(self, repo_id: str) -> str:
        """The sha that ``main`` resolves to for ``owner/name``."""
        return self._main_sha(self._repo_dir(repo_id))

    def _repo_dir(self, repo_id: str) -> Path:
        parts = repo_id.split("/")
        if len(parts) != 2 or any(p in ("", ".", "..") for p in parts):
            raise _HubError(404, f"Repository {repo_id!r} not found", error_code="RepoNotFound")
        repo_dir = self.root / "datasets" / parts[0] / parts[1]
        if not repo_dir.is_dir():
            raise _HubError(404, f"Repository {repo_id!r} not found", error_code="RepoNotFound")
        return repo_dir

    def _main_sha(self, repo_dir: Path) -> str:
        with self._sha_lock:
            if repo_dir not in self._main_shas:
                files = sorted((p.relative_to(repo_dir).as_posix(), p.stat().st_size)
                               for p in repo_dir.rglob("*") if p.is_file())
                self._main_shas[repo_dir] = _oid(*files)
            return self._main_shas[repo_dir]

    def _resolve_revision(self, repo_dir: Path, revision: str) -> str:
        main_sha = self._main_sha(repo_dir)
        if revision in ("main", main_sha):
            return main_sha
        if revision in self.revisions:
            return self.revisions[revision]
        if revision in self.revisions.values():
            return revision
        raise _HubError(404, f"Invalid rev id: {revision}", error_code="RevisionNotFound")

    def _check_token(self, authorization: str | None) -> None:
        if self.token is None:
            return
        if authorization is None:
            raise _HubError(401, "Repository not found", error_code="RepoNotFound")
        if authorization != f"Bearer {self.token}":
            # The exact message the Hub sends, which huggingface_hub tells apart from a missing repo.
            raise _HubError(401, "Invalid credentials in Authorization header")

    @staticmethod
    def _entry_path(repo_dir: Path, path_in_repo: str) -> Path:
        parts = [p for p in path_in_repo.split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise _HubError(404, f"Entry {path_in_repo!r} not found", error_code="EntryNotFound")
        return repo_dir.joinpath(*parts)

    @staticmethod
    def _entry(repo_dir: Path, path: Path) -> dict[str, object]:
        relpath = path.relative_to(repo_dir).as_posix()
        if path.is_dir():
            return {"type": "directory", "oid": _oid(relpath), "path": relpath}
        stat = path.stat()
        return {"type": "file", "oid": _oid(relpath, stat.st_size, stat.st_mtime_ns),
                "size": stat.st_size, "path": relpath}

    # -- routes ------------------------------------------------------------------------------------
    def _route(self, handler: _Handler, split: urllib.parse.SplitResult, body: bytes) -> None:
        # Split before unquoting: revisions and tree paths arrive percent-encoded with safe="".
        segments = split.path.strip("/").split("/")
        method = handler.command
        if segments[:2] == ["api", "datasets"] and len(segments) >= 4 and method in ("GET", "POST"):
            repo_id = "/".join(urllib.parse.unquote(s) for s in segments[2:4])
            repo_dir, rest = self._repo_dir(repo_id), segments[4:]
            if not rest and method == "GET":
                return self._repo_info(handler, repo_dir, repo_id, "main")
            if len(rest) == 2 and rest[0] == "revision" and method == "GET":
                return self._repo_info(handler, repo_dir, repo_id, urllib.parse.unquote(rest[1]))
            if len(rest) >= 2 and rest[0] == "tree" and method == "GET":
                path_in_repo = "/".join(urllib.parse.unquote(s) for s in rest[2:])
                return self._tree(handler, split, repo_dir, urllib.parse.unquote(rest[1]), path_in_repo)
            if len(rest) == 2 and rest[0] == "paths-info" and method == "POST":
                return self._paths_info(handler, repo_dir, urllib.parse.unquote(rest[1]), body)
        if (segments[:1] == ["datasets"] and len(segments) >= 6 and segments[3] == "resolve"
                and method in ("GET", "HEAD")):
            repo_id = "/".join(urllib.parse.unquote(s) for s in segments[1:3])
            repo_dir = self._repo_dir(repo_id)
            sha = self._resolve_revision(repo_dir, urllib.parse.unquote(segments[4]))
            path_in_repo = "/".join(urllib.parse.unquote(s) for s in segments[5:])
            return self._resolve(handler, repo_dir, repo_id, sha, path_in_repo)
        raise _HubError(404, f"No route for {method} {split.path}")

    def _route_cdn(self, handler: _Handler, split: urllib.parse.SplitResult) -> None:
        # The CDN serves what the Hub redirected to: /datasets/<owner>/<name>/resolve/<sha>/<path>.
        segments = split.path.strip("/").split("/")
        if (segments[:1] != ["datasets"] or len(segments) < 6 or segments[3] != "resolve"
                or handler.command not in ("GET", "HEAD")):
            raise _HubError(404, f"No route for {handler.command} {split.path}")
        repo_id = "/".join(urllib.parse.unquote(s) for s in segments[1:3])
        repo_dir = self._repo_dir(repo_id)
        path_in_repo = "/".join(urllib.parse.unquote(s) for s in segments[5:])
        self._send_file(handler, repo_dir, repo_id, urllib.parse.unquote(segments[4]), path_in_repo)

    def _repo_info(self, handler: _Handler, repo_dir: Path, repo_id: str, revision: str) -> None:
        sha = self._resolve_revision(repo_dir, revision)
        siblings = sorted(p.relative_to(repo_dir).as_posix() for p in repo_dir.rglob("*") if p.is_file())
        handler.send_json({"id": repo_id, "author": repo_id.split("/")[0], "sha": sha, "private": False,
                           "gated": False, "disabled": False,
                           "siblings": [{"rfilename": name} for name in siblings]})

    def _tree(self, handler: _Handler, split: urllib.parse.SplitResult, repo_dir: Path, revision: str,
              path_in_repo: str) -> None:
        self._resolve_revision(repo_dir, revision)
        base = self._entry_path(repo_dir, path_in_repo)
        if not base.is_dir():
            raise _HubError(404, f"Entry {path_in_repo!r} not found", error_code="EntryNotFound")
        query = urllib.parse.parse_qs(split.query)
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        paths = base.rglob("*") if recursive else base.iterdir()
        entries = [self._entry(repo_dir, p) for p in sorted(paths)]
        cursor = int(query.get("cursor", ["0"])[0] or 0)
        page = entries[cursor:cursor + self.tree_page_size]
        headers = {}
        if cursor + self.tree_page_size < len(entries):
            query["cursor"] = [str(cursor + self.tree_page_size)]
            next_url = f"{handler.base_url()}{split.path}?{urllib.parse.urlencode(query, doseq=True)}"
            headers["Link"] = f'<{next_url}>; rel="next"'
        handler.send_json(page, headers=headers)

    def _paths_info(self, handler: _Handler, repo_dir: Path, revision: str, body: bytes) -> None:
        self._resolve_revision(repo_dir, revision)
        form = urllib.parse.parse_qs(body.decode(), keep_blank_values=True)
        entries = []
        for path_in_repo in form.get("paths", []):
            path = self._entry_path(repo_dir, path_in_repo)
            if path.exists() and path != repo_dir:
                entries.append(self._entry(repo_dir, path))  # missing paths are left out, as on the Hub
        handler.send_json(entries)

    def _resolve(self, handler: _Handler, repo_dir: Path, repo_id: str, sha: str, path_in_repo: str) -> None:
        if self.redirect_base_url is None:
            return self._send_file(handler, repo_dir, repo_id, sha, path_in_repo)
        path = self._entry_path(repo_dir, path_in_repo)
        if not path.is_file():
            raise _HubError(404, f"Entry {path_in_repo!r} not found", error_code="EntryNotFound")
        entry = self._entry(repo_dir, path)
        quoted = urllib.parse.quote(f"datasets/{repo_id}/resolve/{sha}/{path_in_repo}")
        handler.send_response(302)
        # The file's metadata travels on the redirect itself: clients do not follow it for HEAD.
        for key, value in (("Location", f"{self.redirect_base_url}/{quoted}"), ("X-Repo-Commit", sha),
                           ("X-Linked-Etag", f'"{entry["oid"]}"'), ("X-Linked-Size", str(entry["size"])),
                           ("ETag", f'"{entry["oid"]}"'), ("Content-Length", "0")):
            handler.send_header(key, value)
        handler.end_headers()

    def _send_file(self, handler: _Handler, repo_dir: Path, repo_id: str, sha: str, path_in_repo: str) -> None:
        path = self._entry_path(repo_dir, path_in_repo)
        if not path.is_file():
            raise _HubError(404, f"Entry {path_in_repo!r} not found", error_code="EntryNotFound")
        entry = self._entry(repo_dir, path)
        size = int(entry["size"])  # type: ignore[call-overload]
        start, length, status = 0, size, 200
        match = _RANGE_RE.fullmatch(handler.headers.get("Range", "").replace(" ", ""))
        if match and (match[1] or match[2]):
            if match[1]:
                start = int(match[1])
                end = min(int(match[2]), size - 1) if match[2] else size - 1
            else:  # a suffix range: the last N bytes
                start, end = max(size - int(match[2]), 0), size - 1
            if start >= size or end < start:
                raise _HubError(416, f"Range {handler.headers['Range']} not satisfiable for {size} bytes",
                                headers={"Content-Range": f"bytes */{size}"})
            length, status = end - start + 1, 206
        handler.send_response(status)
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(length),
                   "Accept-Ranges": "bytes", "ETag": f'"{entry["oid"]}"', "X-Repo-Commit": sha}
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{start + length - 1}/{size}"
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.end_headers()
        if handler.command == "GET":
            handler.send_file_bytes(path, file_key=f"{repo_id}/{entry['path']}", start=start, length=length)
