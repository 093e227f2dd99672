"""Every remote ranged read through the download controller: node-wide permits, retries, measurements.

``DownloadFetch`` is the ``fetch(fs, path, start, end)`` that ``RemoteFiles`` reads through (its
``fetch=`` hook). Each read runs in ``RetryPolicy.call`` under a permit of the node-wide
``DownloadController`` for the file's server: the policy times every attempt (one stream, its
size), reports throttles (429/503, ``Retry-After``), timeouts and resets to the controller, retries
with jittered exponential backoff, and raises ``DownloadError`` (URL without credentials, last
status, attempts) when attempts run out. A read returns the whole range from the one attempt that
succeeded, or raises: a fault part-way through a body is retried, never half-delivered, so no sample
is lost or duplicated.

Client libraries retry by themselves, which would hide throttling from the controller: a 429 that
huggingface_hub retried inside ``http_backoff`` (up to 5 times, sleeping up to 8 s) reaches us only
as a slow success. We switch their retries off for our reads rather than hooking their retry
callbacks: huggingface_hub offers no callback (only log lines), botocore's retry handler is not
per-request, and one retry loop is easier to reason about than two nested ones (5 x 5 attempts,
two backoffs, a timeout per inner attempt). So:

- Hub (``HfFileSystem``): one ranged GET of the ``/resolve/`` URL through huggingface_hub's own
  HTTP session (``get_session()``: its headers, proxies, redirects to the CDN) and
  ``hf_raise_for_status``, without ``http_backoff``; the timeout is ours, per attempt.
- S3 (s3fs): botocore ``retries={"total_max_attempts": 1}`` and s3fs's own retry loop set to one
  attempt, on the client this process reads with (configured before its first request);
  ``connect_timeout`` / ``read_timeout`` default to ``request_timeout_s``.
- Other fsspec filesystems (gcsfs, http, ...): ``fetch_range`` as it is; their internal retries
  remain (a known gap, docs/download-controller.md).
- Local filesystems (``file://``) bypass the controller: there is no link to measure or protect.

Errors are normalised before the policy sees them (``_remote.transport.failures.normalise``, which also owns their
classification): a transport error of any client (httpx's ``ReadError``, aiohttp's
``ClientPayloadError``, botocore's ``ReadTimeoutError``) becomes a ``TransferInterrupted`` (a
``ConnectionError``) or a ``TransferTimeout`` (a ``TimeoutError``), and a botocore status hidden in
s3fs's translated ``OSError`` becomes an ``HTTPStatusError`` carrying the status and ``Retry-After``.
Errors that say the request itself is wrong (404, 403) are raised as the client raised them, after one attempt, so callers still see ``FileNotFoundError`` and
``PermissionError``.

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
from typing import Any

import fsspec

from episodestream._remote.transport.config import ControllerConfig
from episodestream._remote.transport.controller import DownloadController
from episodestream._remote.transport.failures import TransferInterrupted, classify, normalise
from episodestream._remote.transport.process import process_state
from episodestream._remote.transport.reader import fetch_range
from episodestream._remote.transport.retry import DownloadError, RetryPolicy, redact_url

logger = logging.getLogger("episodestream.download")

# Filesystems without a network link: nothing to measure, throttle or retry.
LOCAL_PROTOCOLS = frozenset({"file", "local", "memory"})
_COUNTER_OF_KIND = {"throttle": "throttles", "timeout": "timeouts", "transient": "transient", "fatal": "fatal"}
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_HUB_PATH = re.compile(r"^(datasets|spaces|models)/([^/@]+/[^/@]+)(?:@([^/]+))?/(.+)$")

ControllerFactory = Callable[..., Any]


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
        self.hub_headers: dict[tuple[str, Any], dict[str, str]] = {}

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

    def controller(self, fs: fsspec.AbstractFileSystem) -> Any:
        """This process's controller for ``fs``'s server (made on first use)."""
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
        controller = self.controller(fs)
        get, url = self._getter(state, fs, path)
        state.count("reads")

        def attempt(timeout_s: float) -> bytes:
            state.count("attempts")
            try:
                return get(start, end, timeout_s)
            except Exception as error:
                normalised = normalise(error)
                state.count(_COUNTER_OF_KIND[classify(normalised).kind])
                if normalised is error:
                    raise
                raise normalised from error

        fatal: BaseException | None = None
        try:
            data = state.policy.call(attempt, url=url, controller=controller)
        except DownloadError as error:
            state.count("failed")
            cause = error.__cause__
            if not (error.attempts == 1 and cause is not None
                    and classify(cause).kind == "fatal"):
                raise
            fatal = cause
        if fatal is not None:
            # Not a link problem (a missing file, refused credentials): the client's own error,
            # raised outside the handler so it carries no DownloadError context.
            raise fatal
        state.count("bytes_fetched", len(data))
        return data

    def _getter(self, state: _ProcessState, fs: fsspec.AbstractFileSystem,
                path: str) -> tuple[Callable[[int, int, float], bytes], str]:
        """How to make one attempt at a range of ``path``, and the URL to name in errors."""
        if _is_hub(fs):
            url = _hub_url(fs, path)
            key = (fs.endpoint, fs.token)
            with state.lock:
                headers = state.hub_headers.get(key)
            if headers is None:
                from huggingface_hub.utils import build_hf_headers

                headers = build_hf_headers(token=fs.token, library_name="episodestream")
                with state.lock:
                    state.hub_headers[key] = headers
            return (lambda start, end, timeout_s: _hub_get(url, headers, start, end, timeout_s)), url
        if _protocol(fs) == "s3":
            with state.lock:
                _quiet_s3(fs, self.config)
        # http(s) paths are whole URLs, possibly with user:password@, which no error may show.
        url = redact_url(path) if "://" in path else f"{_protocol(fs)}://{path.lstrip('/')}"
        return (lambda start, end, timeout_s: _checked(fetch_range(fs, path, start, end), start, end)), url


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


def link_name(fs: fsspec.AbstractFileSystem) -> str:
    """The budget's name for ``fs``'s server: ``<protocol>-<host>``, e.g. ``hf-huggingface.co``.

    The host, not the port: the budget protects the link to a machine, and servers on random
    ports (tests) would otherwise leave a permits directory each behind.
    """
    protocol = _protocol(fs)
    if _is_hub(fs):
        endpoint = fs.endpoint
    elif protocol == "s3":
        endpoint = (getattr(fs, "client_kwargs", None) or {}).get("endpoint_url") or getattr(fs, "endpoint_url", None)
    else:
        endpoint = None
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


# ---------------------------------------------------------------------------------------------
# One attempt


def _checked(data: bytes, start: int, end: int) -> bytes:
    if len(data) != end - start:
        # A body that ended early on a connection that closed cleanly: retry like a reset.
        raise TransferInterrupted(f"asked for bytes {start}..{end} ({end - start}), got {len(data)}")
    return data


def _hub_url(fs: fsspec.AbstractFileSystem, path: str) -> str:
    from huggingface_hub import hf_hub_url

    match = _HUB_PATH.match(path.removeprefix("hf://"))
    if match is not None:
        kind, repo_id, revision, path_in_repo = match.groups()
        repo_type = {"datasets": "dataset", "spaces": "space", "models": "model"}[kind]
        revision = urllib.parse.unquote(revision) if revision else None
    else:
        resolved = fs.resolve_path(path)  # may ask the Hub once per repo (the client caches it)
        repo_type, repo_id = resolved.repo_type, resolved.repo_id
        revision, path_in_repo = resolved.revision, resolved.path_in_repo
    return hf_hub_url(repo_id, path_in_repo, repo_type=repo_type, revision=revision, endpoint=fs.endpoint)


def _hub_get(url: str, headers: Mapping[str, str], start: int, end: int, timeout_s: float) -> bytes:
    # huggingface_hub's session (its user agent, proxies, redirects to the CDN), not http_backoff:
    # our policy must see every 429 (see the module docstring).
    from huggingface_hub import get_session
    from huggingface_hub.utils import hf_raise_for_status

    response = get_session().get(url, headers={**headers, "Range": f"bytes={start}-{end - 1}"},
                                 timeout=timeout_s)
    hf_raise_for_status(response)
    data = response.content
    if response.status_code == 200 and len(data) >= end:
        data = data[start:end]  # a server that ignores Range sends the whole file
    return _checked(data, start, end)


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
