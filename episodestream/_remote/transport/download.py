"""Every remote read through the download controller: node-wide permits, retries, measurements.

``DownloadFetch`` is the ``fetch(fs, path, start, end)`` that ``RemoteFiles`` reads through (its
``fetch=`` hook), and ``DownloadFetch.send`` runs any other request (a listing, a look-up, a Hub
commit) the same way. Both go through ``_remote.transport.request.request`` under a permit of the
node-wide ``DownloadController`` for the server (one per ``link_name``): one classification, one
retry policy, ``DownloadError`` (URL without credentials, last status, attempts) when attempts run
out. A read returns the whole range from the one attempt that succeeded, or raises.

Client libraries retry by themselves, which would hide throttling from the controller: a 429 that
huggingface_hub retried inside ``http_backoff`` (up to 5 times, sleeping up to 8 s) reaches us only
as a slow success. We switch their retries off rather than hooking their retry callbacks:
huggingface_hub offers no callback (only log lines), botocore's retry handler is not per-request,
and one retry loop is easier to reason about than two nested ones. So:

- Hub: one request on huggingface_hub's own HTTP session (``hub_http.hub_send``), without
  ``http_backoff``; the timeout is ours, per attempt.
- S3 (s3fs): botocore ``retries={"total_max_attempts": 1}`` and s3fs's own retry loop set to one
  attempt, on every client a request is sent with (configured before its first request);
  ``connect_timeout`` / ``read_timeout`` default to ``request_timeout_s``.
- Other fsspec filesystems (gcsfs, http, ...): as they are; their internal retries remain (a known
  gap, docs/download-controller.md).
- Local filesystems (``file://``) bypass the controller: there is no link to measure or protect.

Process model: a ``DownloadFetch`` pickles as its configuration only. Each process (a DataLoader
worker, a forked child) makes its own ``RetryPolicy``, controllers and counters on first use; the
controllers of one node share their budget through the permits directory.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

import fsspec

from episodestream._remote.transport.config import ControllerConfig
from episodestream._remote.transport.controller import DownloadController
from episodestream._base.redact import redact_url
from episodestream._remote.transport.hub_http import hub_headers, hub_send, hub_url
from episodestream._remote.transport.process import process_state
from episodestream._remote.transport.reader import exact_range, fetch_range
from episodestream._remote.transport.request import RetryPolicy, request

logger = logging.getLogger("episodestream.download")

# Filesystems without a network link: nothing to measure, throttle or retry.
LOCAL_PROTOCOLS = frozenset({"file", "local", "memory"})
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")

ControllerFactory = Callable[..., Any]
T = TypeVar("T")


@dataclass(frozen=True)
class FetchStats:
    """What this process's reads cost. ``reads``: ranges asked for; ``attempts``: requests made;
    ``throttles`` (429, 503, any ``Retry-After``), ``timeouts``, ``transient`` (resets, short
    bodies, other 5xx) and ``fatal``: failed attempts by kind; ``failed``: reads that raised;
    ``bytes_fetched``: bytes delivered to callers."""

    reads: int = 0
    attempts: int = 0
    throttles: int = 0
    timeouts: int = 0
    transient: int = 0
    fatal: int = 0
    failed: int = 0
    bytes_fetched: int = 0


class _ProcessState:
    """One process's policy, controllers (one per server) and counters."""

    def __init__(self, fetch: DownloadFetch) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.policy = RetryPolicy(config=fetch.config)
        self.controllers: dict[str, Any] = {}
        self.counts = {knob.name: 0 for knob in fields(FetchStats)}
        self.hub_headers: dict[str, dict[str, str]] = {}

    def count(self, name: str, amount: int = 1) -> None:
        with self.lock:
            self.counts[name] += amount


class DownloadFetch:
    """``fetch(fs, path, start, end) -> bytes`` through retries and the node-wide download budget.

    Settings: ``config`` (a ``ControllerConfig``; ``ControllerConfig()`` when omitted; build it
    with ``ControllerConfig.from_env()`` to honour ``EPISODESTREAM_DOWNLOAD_*``). Which budget:
    ``name`` (default: one per server, e.g. ``hf-huggingface.co``, ``s3-<endpoint host>``; every
    process of a node using the same name shares one budget). ``controller_factory``: makes a
    process's controller, called as ``factory(config=..., name=...)`` (default
    ``DownloadController``); must be picklable. Benchmarks use it to run fixed budgets through
    the same path.

    Reads of local filesystems bypass the controller. ``stats()`` and ``controllers()`` describe
    this process only.
    """

    def __init__(self, *, config: ControllerConfig | None = None, name: str | None = None,
                 controller_factory: ControllerFactory | None = None) -> None:
        if config is not None and not isinstance(config, ControllerConfig):
            raise TypeError(f"config must be a ControllerConfig or None, got {type(config).__name__}.")
        if name is not None:
            _check_name(name)
        self.config = config if config is not None else ControllerConfig()
        self.name = name
        self.controller_factory = controller_factory
        self._process: _ProcessState | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_process"] = None  # controllers, locks and sessions never cross a process boundary
        return state

    def __repr__(self) -> str:
        return f"DownloadFetch(name={self.name!r}, config={self.config!r})"

    # -- per process -----------------------------------------------------------------------------

    def _state(self) -> _ProcessState:
        return process_state(self, _ProcessState)

    def controller(self, fs: fsspec.AbstractFileSystem | str) -> Any:
        """This process's controller for ``fs``'s server, or of a budget name (made on first use)."""
        name = self.name or link_name(fs)
        state = self._state()
        with state.lock:
            controller = state.controllers.get(name)
            if controller is None:
                factory = self.controller_factory or DownloadController
                controller = state.controllers[name] = factory(config=self.config, name=name)
            return controller

    def controllers(self) -> dict[str, Any]:
        """This process's controllers by name (their ``history()`` shows the budget changes)."""
        state = self._state()
        with state.lock:
            return dict(state.controllers)

    def stats(self) -> FetchStats:
        state = self._state()
        with state.lock:
            return FetchStats(**state.counts)

    # -- fetching --------------------------------------------------------------------------------

    def __call__(self, fs: fsspec.AbstractFileSystem, path: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        if _protocol(fs) in LOCAL_PROTOCOLS:
            return fetch_range(fs, path, start, end)
        state = self._state()
        get, url = self._getter(state, fs, path)
        state.count("reads")
        try:
            data = request(lambda timeout_s: get(start, end, timeout_s), url=url, policy=state.policy,
                           controller=self.controller(fs), count=state.count)
        except Exception:
            state.count("failed")
            raise
        state.count("bytes_fetched", len(data))
        return data

    def send(self, link: fsspec.AbstractFileSystem | str, attempt: Callable[[float], T], *, url: str,
             method: str = "GET") -> T:
        """Any other request (a listing, a look-up, a Hub commit) as reads go: ``attempt(timeout_s)``
        through ``request`` under a permit of ``link``'s controller (a filesystem, or a budget name
        from ``link_name``). Not counted in ``stats()``, which counts reads; a local filesystem's
        attempt runs once, directly. An s3 filesystem has its client's own retries switched off."""
        if not isinstance(link, str):
            if _protocol(link) in LOCAL_PROTOCOLS:
                return attempt(self.config.request_timeout_s)
            if _protocol(link) == "s3":
                with self._state().lock:
                    _quiet_s3(link, self.config)
        controller = self.controller(link)
        return request(attempt, url=url, policy=self._state().policy, controller=controller, method=method)

    def hub_headers(self, token: Any) -> dict[str, str]:
        """This process's Hub request headers for ``token`` (``hub_http.hub_headers``, made once)."""
        state = self._state()
        key = repr(token)
        with state.lock:
            headers = state.hub_headers.get(key)
        if headers is None:
            headers = hub_headers(token)
            with state.lock:
                state.hub_headers[key] = headers
        return headers

    def _getter(self, state: _ProcessState, fs: fsspec.AbstractFileSystem,
                path: str) -> tuple[Callable[[int, int, float], bytes], str]:
        """How to make one attempt at a range of ``path``, and the URL to name in errors."""
        if _is_hub(fs):
            url = hub_url(fs.endpoint, path)
            headers = self.hub_headers(fs.token)

            def hub_range(start: int, end: int, timeout_s: float) -> bytes:
                body, _ = hub_send("GET", url, {**headers, "Range": f"bytes={start}-{end - 1}"}, timeout_s)
                return exact_range(body, start, end)

            return hub_range, url
        if _protocol(fs) == "s3":
            with state.lock:
                _quiet_s3(fs, self.config)
        # http(s) paths are whole URLs, possibly with user:password@, which no error may show.
        url = redact_url(path) if "://" in path else f"{_protocol(fs)}://{path.lstrip('/')}"
        return (lambda start, end, timeout_s: fetch_range(fs, path, start, end)), url


def default_fetch(config: ControllerConfig | Mapping[str, Any] | None = None) -> DownloadFetch:
    """The fetch remote sources read through.

    ``config``: a ``ControllerConfig`` (used as it is), a mapping of knobs (the others from
    ``EPISODESTREAM_DOWNLOAD_*``, else defaults) or None (all from the environment, else
    defaults). The environment is read here, when the dataset is built, never at import.
    """
    if isinstance(config, ControllerConfig):
        return DownloadFetch(config=config)
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise TypeError(f"download_config must be a ControllerConfig, a dict of its knobs or None, "
                        f"got {type(config).__name__}.")
    return DownloadFetch(config=ControllerConfig.from_env(**config))


def link_name(fs: fsspec.AbstractFileSystem | str) -> str:
    """The budget's name for ``fs``'s server: ``<protocol>-<host>``, e.g. ``hf-huggingface.co``.

    The host, not the port: the budget protects the link to a machine, and servers on random
    ports (tests) would otherwise leave a permits directory each behind.
    """
    if isinstance(fs, str):
        return fs
    protocol = _protocol(fs)
    if _is_hub(fs):
        endpoint = fs.endpoint
    elif protocol == "s3":
        endpoint = (getattr(fs, "client_kwargs", None) or {}).get("endpoint_url") or getattr(fs, "endpoint_url", None)
    else:
        endpoint = None
    return link_name_of(protocol, endpoint)


def link_name_of(protocol: str, endpoint: str | None) -> str:
    """``link_name`` of a server named by protocol and endpoint URL (None: the default server)."""
    host = (urllib.parse.urlsplit(endpoint).hostname or "default") if endpoint else "default"
    return _NAME_UNSAFE.sub("_", f"{protocol}-{host}")[:100]


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9._-]{1,100}", name):
        raise ValueError(f"Invalid name ({name!r}). Use 1-100 of A-Z a-z 0-9 . _ -.")


def _protocol(fs: fsspec.AbstractFileSystem) -> str:
    protocol = fs.protocol
    return protocol if isinstance(protocol, str) else protocol[0]


def _is_hub(fs: fsspec.AbstractFileSystem) -> bool:
    return _protocol(fs) == "hf" and hasattr(fs, "endpoint")


def _quiet_s3(fs: fsspec.AbstractFileSystem, config: ControllerConfig) -> None:
    """Switch s3fs's and botocore's own retries off on ``fs`` (once; the caller holds a lock)."""
    if getattr(fs, "_episodestream_quiet", False):
        return
    fs.retries = 1  # s3fs's own loop around each call (SlowDown, timeouts, short bodies)
    if getattr(fs, "_s3", None) is None:
        # Read when s3fs makes its botocore client, at the first request: we come before it.
        options = dict(getattr(fs, "config_kwargs", None) or {})
        options["retries"] = {"total_max_attempts": 1, "mode": "standard"}
        options.setdefault("connect_timeout", config.request_timeout_s)
        options.setdefault("read_timeout", config.request_timeout_s)
        fs.config_kwargs = options
    else:
        logger.warning("The s3fs client was used before the download controller saw it: botocore's own "
                       "retries stay on for it, and the throttling they absorb stays hidden.")
    fs._episodestream_quiet = True
