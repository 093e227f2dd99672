"""The adaptive download controller: how many downloads a node may have in flight, and retries.

``ControllerConfig`` holds the knobs. ``LinkEstimator`` turns finished transfers into bandwidth
and round-trip estimates. ``DownloadController`` sets the node-wide budget of ``NodePermits`` from
those estimates and from throttling (AIMD), and hands out permits. ``RetryPolicy`` retries one
request with jittered exponential backoff and reports every failure to the controller.

The budget model (docs/download-controller.md has the derivation)::

    q      = 1 + bandwidth * lowest_rtt / mean_request_bytes   # requests one busy stream needs
    target = clamp(round(streams * q), floor, cap)           # floor becomes 1 after throttling

``streams`` is the AIMD state. A throttle or timeout cuts the budget by ``decrease_factor`` (once
per ``cooldown_s``) and re-bases ``streams``. A healthy window of ``increase_interval_s`` (no
throttle, requests succeeded, someone waited for a permit, and the link is not slower than its
best since the last cut) adds ``increase_step`` and re-bases ``streams``. Before the first
throttle, timeout or slowed window (slow start, as in TCP) a healthy window multiplies the budget
by ``slow_start_factor`` instead: a link that needs 50 streams gets them in seconds, not minutes. Between those, the
budget follows the target down (a slower stream, bigger requests) but never up: only a healthy
window raises it, so slowness can never raise concurrency. The estimates and AIMD state live in
the permits directory so every process on the node agrees on them.
"""

from __future__ import annotations

import dataclasses
import email.utils
import http.client
import logging
import math
import os
import random
import re
import statistics
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, TypeVar

from .._options import parse_size_bytes
from ._permits import MAX_PERMITS, NodePermits, default_permits_dir

T = TypeVar("T")
LOGGER_NAME = "episodestream.download"
ENV_PREFIX = "EPISODESTREAM_DOWNLOAD_"
# The budget never reaches 0: with no permit at all nothing could ever succeed and raise it again.
MIN_BUDGET = 1
THROTTLE_STATUSES = frozenset({429, 503})      # the server says "too many": cut and maybe pause
TIMEOUT_STATUSES = frozenset({408, 504})       # a timeout reported as a status: cut like a timeout
_HISTORY_LENGTH = 1000
_STATE_VERSION = 1
# Evidence (finished transfers, permit waits) is buffered in each process and merged into the
# node's shared state at most this often, or once this many transfers are waiting: the merge is
# a locked read-modify-write of a JSON file (~0.5 ms), which per request cost a third of a core
# on a fast link. A window is 2 s by default, so 50 ms of delay changes no decision; throttles
# and timeouts are written at once (they merge what is buffered first).
STATE_FLUSH_INTERVAL_S = 0.05
STATE_FLUSH_TRANSFERS = 32
# An increase is kept only if the node's goodput grew by at least this share of what the added
# permits would carry at the old per-permit rate; less means the link (or the server, or our CPU)
# was already full. A third: a doubling that nears the link's cap still gains well over it, and
# the few percent a 2 s window's goodput jitters by rarely pass it for a full link.
PROBE_MIN_GAIN = 1 / 3
# After a probe that bought nothing, no increase for 1, 2, 4, ... windows (at most this many).
MAX_HOLD_WINDOWS = 16

SampleClass = Literal["bandwidth", "latency"]
FailureKind = Literal["throttle", "timeout", "transient", "fatal"]


# ---------------------------------------------------------------------------------------------
# Configuration


def _knob(kind: str, default: Any, *, low: float | None = None, high: float | None = None,
          open_low: bool = False, open_high: bool = False) -> Any:
    return field(default=default, metadata={"kind": kind, "low": low, "high": high,
                                            "open_low": open_low, "open_high": open_high})


@dataclass(frozen=True)
class ControllerConfig:
    """The controller's knobs, validated once. Each has an ``EPISODESTREAM_DOWNLOAD_<NAME>``
    environment override read by ``from_env`` (never at import or construction).

    Budget (permits = downloads in flight on the whole node):
        ``floor_permits``, ``cap_permits``: the normal range; only throttling takes it below the
        floor (down to 1). ``initial_permits``: the budget before anything is measured.
    Reacting to the link:
        ``decrease_factor``, ``cooldown_s``: a throttle or timeout multiplies the budget by the
        factor, at most once per cooldown. ``increase_interval_s``, ``increase_step``: a healthy
        window of this length adds the step. ``slow_start_factor``: until the first throttle,
        timeout or slowdown, a healthy window multiplies the budget by this instead (at least
        +step), as TCP's slow start does; 1 means additive from the start. ``max_slowdown``: no increase while bandwidth is
        below, or round trip above, its best since the last cut by more than this factor; the
        model lowers the budget only when its target is below the budget by more than it.
    Measuring the link:
        ``bandwidth_min_bytes``: single-stream transfers at least this big are bandwidth samples.
        ``latency_max_bytes``: transfers at most this big are round-trip samples (sizes between
        the two are neither). ``min_samples``: per class, before defaults give way to estimates.
        ``window_samples``: recent samples kept per class. ``default_bandwidth_bytes_per_s``,
        ``default_rtt_s``, ``default_object_bytes``: the warm-up values. ``min_rtt_s``: the
        smallest round trip we believe (a transfer-free round trip can compute to ~0).
    Retrying one request:
        ``max_attempts``, ``base_backoff_s``, ``max_backoff_s``, ``max_retry_after_s`` (longest
        ``Retry-After`` honoured), ``request_timeout_s`` (given to the HTTP client per attempt).
    Sharing across processes:
        ``permits_dir``: where node-wide permits and state live (node-local; default
        ``<tmp>/episodestream-<uid>/permits``). ``idle_reset_s``: shared state untouched this
        long is stale (an earlier run) and starts afresh.
    """

    floor_permits: int = _knob("int", 4, low=1, high=MAX_PERMITS)
    cap_permits: int = _knob("int", 64, low=1, high=MAX_PERMITS)
    initial_permits: int = _knob("int", 8, low=1, high=MAX_PERMITS)
    decrease_factor: float = _knob("float", 0.5, low=0, high=1, open_low=True, open_high=True)
    cooldown_s: float = _knob("float", 2.0, low=0, open_low=True)
    increase_interval_s: float = _knob("float", 2.0, low=0, open_low=True)
    increase_step: int = _knob("int", 1, low=1, high=MAX_PERMITS)
    slow_start_factor: float = _knob("float", 2.0, low=1)
    max_slowdown: float = _knob("float", 1.25, low=1, open_low=True)
    bandwidth_min_bytes: int = _knob("size", 128 * 1024)
    latency_max_bytes: int = _knob("size", 16 * 1024)
    min_samples: int = _knob("int", 8, low=1, high=100_000)
    window_samples: int = _knob("int", 32, low=1, high=100_000)
    default_bandwidth_bytes_per_s: float = _knob("rate", 25e6, low=0, open_low=True)
    default_rtt_s: float = _knob("float", 0.05, low=0, open_low=True)
    default_object_bytes: int = _knob("size", 512 * 1024)
    min_rtt_s: float = _knob("float", 0.001, low=0, open_low=True)
    max_attempts: int = _knob("int", 5, low=1, high=1000)
    base_backoff_s: float = _knob("float", 0.5, low=0, open_low=True)
    max_backoff_s: float = _knob("float", 30.0, low=0, open_low=True)
    max_retry_after_s: float = _knob("float", 120.0, low=0, open_low=True)
    request_timeout_s: float = _knob("float", 30.0, low=0, open_low=True)
    idle_reset_s: float = _knob("float", 300.0, low=0, open_low=True)
    permits_dir: str | None = _knob("path", None)

    def __post_init__(self) -> None:
        for knob in fields(self):
            object.__setattr__(self, knob.name, _check_knob(knob, getattr(self, knob.name)))
        for low, high in _ORDERED_KNOBS:
            if getattr(self, low) > getattr(self, high):
                raise _CrossKnobError(
                    (low, high), f"{low} ({getattr(self, low)!r}) must be <= {high} "
                                 f"({getattr(self, high)!r}).")
        if self.latency_max_bytes >= self.bandwidth_min_bytes:
            raise _CrossKnobError(
                ("latency_max_bytes", "bandwidth_min_bytes"),
                f"latency_max_bytes ({self.latency_max_bytes}) must be < bandwidth_min_bytes "
                f"({self.bandwidth_min_bytes}): one transfer cannot be a sample of both classes.")

    @classmethod
    def from_env(cls, **overrides: Any) -> ControllerConfig:
        """Knobs from keyword arguments, else ``EPISODESTREAM_DOWNLOAD_<NAME>``, else defaults.

        Read when called, so a process can set variables first. A bad variable raises an error
        naming the variable, its value and the valid range.
        """
        knobs = {knob.name: knob for knob in fields(cls)}
        unknown = sorted(set(overrides) - set(knobs))
        if unknown:
            raise TypeError(f"Unknown ControllerConfig option(s) {unknown}. Valid: {sorted(knobs)}.")
        values, from_env = dict(overrides), {}
        for name, knob in knobs.items():
            variable = env_var(name)
            raw = os.environ.get(variable, "")
            if name in overrides or not raw.strip():
                continue
            try:
                values[name] = _check_knob(knob, _parse_env(knob, raw.strip()))
            except (TypeError, ValueError) as error:
                raise ValueError(f"Environment variable {variable}={raw!r} is invalid: {error}") from None
            from_env[name] = f"{variable}={raw!r}"
        try:
            return cls(**values)
        except _CrossKnobError as error:
            sources = [from_env[name] for name in error.names if name in from_env]
            if not sources:
                raise
            raise ValueError(f"{error} (set by environment: {', '.join(sources)})") from None


# Pairs that must satisfy low <= high; written once so every check reads the same way.
_ORDERED_KNOBS = (("floor_permits", "cap_permits"), ("floor_permits", "initial_permits"),
                  ("initial_permits", "cap_permits"), ("min_samples", "window_samples"),
                  ("base_backoff_s", "max_backoff_s"))


class _CrossKnobError(ValueError):
    def __init__(self, names: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.names = names


def env_var(knob: str) -> str:
    """The environment variable overriding ``knob``: ``EPISODESTREAM_DOWNLOAD_<KNOB>``."""
    return ENV_PREFIX + knob.upper()


def _parse_env(knob: dataclasses.Field, raw: str) -> Any:
    kind = knob.metadata["kind"]
    if kind == "int":
        return int(raw)
    if kind == "float":
        return float(raw)
    return raw  # sizes, rates and paths are parsed by _check_knob


def _check_knob(knob: dataclasses.Field, value: Any) -> Any:
    meta, name = knob.metadata, knob.name
    kind = meta["kind"]
    if kind == "path":
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"{name} must be a path or None, got {value!r}.")
        return None if value is None else os.fspath(value)
    if kind == "size":
        return parse_size_bytes(name, value)
    if kind == "rate" and isinstance(value, str):
        value = float(parse_size_bytes(name, value))  # "25MB" means 25 MB per second
    number_type = int if kind == "int" else (int, float)
    if isinstance(value, bool) or not isinstance(value, number_type) or not math.isfinite(value):
        what = "an int" if kind == "int" else "a finite number"
        raise TypeError(f"Invalid {name} ({value!r}): must be {what}.")
    low, high = meta["low"], meta["high"]
    too_low = low is not None and (value <= low if meta["open_low"] else value < low)
    too_high = high is not None and (value >= high if meta["open_high"] else value > high)
    if too_low or too_high:
        left = "(" if meta["open_low"] else "["
        right = ")" if meta["open_high"] else "]"
        valid = f"{left}{'-inf' if low is None else low}, {'inf' if high is None else high}{right}"
        raise ValueError(f"Invalid {name} ({value!r}). Valid range is {valid}.")
    return value if kind == "int" else float(value)


# ---------------------------------------------------------------------------------------------
# Measuring the link


@dataclass(frozen=True)
class LinkEstimate:
    """One reading of the estimator. ``*_measured`` is False while the value is the default."""

    bandwidth_bytes_per_s: float
    rtt_s: float
    lowest_rtt_s: float
    object_bytes: float
    bandwidth_samples: int
    latency_samples: int
    bandwidth_measured: bool
    latency_measured: bool

    def describe(self) -> str:
        def source(measured: bool, samples: int) -> str:
            return f"{samples} samples" + ("" if measured else ", default")
        return (f"bandwidth {self.bandwidth_bytes_per_s / 1e6:.2f} MB/s "
                f"({source(self.bandwidth_measured, self.bandwidth_samples)}), "
                f"rtt {self.rtt_s * 1e3:.1f} ms (lowest {self.lowest_rtt_s * 1e3:.1f} ms; "
                f"{source(self.latency_measured, self.latency_samples)}), "
                f"mean request {self.object_bytes / 1024:.0f} KiB")


def classify_transfer(config: ControllerConfig, *, size_bytes: int, duration_s: float,
                      parallel: bool = False, hedged: bool = False) -> SampleClass | None:
    """Which class of sample a finished transfer is (see ``LinkEstimator``); validates it."""
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes < 0:
        raise ValueError(f"size_bytes must be an int >= 0, got {size_bytes!r}.")
    if isinstance(duration_s, bool) or not isinstance(duration_s, (int, float)) \
            or not duration_s >= 0 or not math.isfinite(duration_s):
        raise ValueError(f"duration_s must be a finite number >= 0, got {duration_s!r}.")
    if parallel or hedged:
        return None  # siblings share its stream, or it timed a hedge wait: measures neither class
    if size_bytes >= config.bandwidth_min_bytes and duration_s > 0:
        return "bandwidth"
    if size_bytes <= config.latency_max_bytes:
        return "latency"
    return None


class LinkEstimator:
    """Single-stream bandwidth and transfer-free round trip, from finished transfers.

    A transfer is a *bandwidth sample* when it moved at least ``bandwidth_min_bytes`` over one
    stream (not a piece of a parallel gather, not a hedged request): ``size / duration``, nothing
    subtracted, so a sample can never be faster than the transfer really was. It is a *latency
    sample* when it moved at most ``latency_max_bytes`` (and was not parallel or hedged); its
    round trip is ``max(min_rtt_s, duration - size / bandwidth)``, using the bandwidth estimate
    current when the round trip is computed. Sizes in between are neither. Each class keeps its
    last ``window_samples`` and reports the median, or the default until ``min_samples`` of that
    class have been seen. The mean of recent request sizes (every transfer) is the model's
    object size. ``lowest_rtt_s`` is the smallest round-trip estimate seen: queueing can only
    raise the round trip, so this is the part of it the link's distance explains.
    """

    def __init__(self, *, config: ControllerConfig) -> None:
        self.config = config
        window = config.window_samples
        self._bandwidth: deque[float] = deque(maxlen=window)
        self._small: deque[tuple[int, float]] = deque(maxlen=window)
        self._sizes: deque[int] = deque(maxlen=window)
        self._bandwidth_count = 0
        self._latency_count = 0
        self._lowest_rtt_s: float | None = None

    def add_transfer(self, *, size_bytes: int, duration_s: float, parallel: bool = False,
                     hedged: bool = False) -> SampleClass | None:
        """Record one finished transfer; returns the class it was a sample of, if any."""
        kind = classify_transfer(self.config, size_bytes=size_bytes, duration_s=duration_s,
                                 parallel=parallel, hedged=hedged)
        self._sizes.append(size_bytes)
        if kind == "bandwidth":
            self._bandwidth.append(size_bytes / duration_s)
            self._bandwidth_count += 1
        elif kind == "latency":
            self._small.append((size_bytes, float(duration_s)))
            self._latency_count += 1
        if kind is not None and self.latency_measured:
            rtt_s = self.rtt_s()
            self._lowest_rtt_s = rtt_s if self._lowest_rtt_s is None else min(self._lowest_rtt_s, rtt_s)
        return kind

    @property
    def bandwidth_measured(self) -> bool:
        return self._bandwidth_count >= self.config.min_samples

    @property
    def latency_measured(self) -> bool:
        return self._latency_count >= self.config.min_samples

    def bandwidth_bytes_per_s(self) -> float:
        if not self.bandwidth_measured:
            return self.config.default_bandwidth_bytes_per_s
        return statistics.median(self._bandwidth)

    def rtt_s(self) -> float:
        if not self.latency_measured:
            return self.config.default_rtt_s
        bandwidth = self.bandwidth_bytes_per_s()
        return statistics.median(max(self.config.min_rtt_s, duration - size / bandwidth)
                                 for size, duration in self._small)

    def lowest_rtt_s(self) -> float:
        return self.config.default_rtt_s if self._lowest_rtt_s is None else self._lowest_rtt_s

    def object_bytes(self) -> float:
        if len(self._sizes) < self.config.min_samples:
            return float(self.config.default_object_bytes)
        return max(1.0, statistics.fmean(self._sizes))

    def estimate(self) -> LinkEstimate:
        return LinkEstimate(self.bandwidth_bytes_per_s(), self.rtt_s(), self.lowest_rtt_s(),
                            self.object_bytes(), self._bandwidth_count, self._latency_count,
                            self.bandwidth_measured, self.latency_measured)

    def state_dict(self) -> dict[str, Any]:
        return {"bandwidth": list(self._bandwidth), "small": [list(s) for s in self._small],
                "sizes": list(self._sizes), "bandwidth_count": self._bandwidth_count,
                "latency_count": self._latency_count, "lowest_rtt_s": self._lowest_rtt_s}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._bandwidth.clear()
        self._bandwidth.extend(state.get("bandwidth", ()))
        self._small.clear()
        self._small.extend((int(s), float(d)) for s, d in state.get("small", ()))
        self._sizes.clear()
        self._sizes.extend(state.get("sizes", ()))
        self._bandwidth_count = int(state.get("bandwidth_count", 0))
        self._latency_count = int(state.get("latency_count", 0))
        self._lowest_rtt_s = state.get("lowest_rtt_s")


# ---------------------------------------------------------------------------------------------
# The controller


@dataclass(frozen=True)
class BudgetChange:
    """One budget change made by this process (``DownloadController.history``)."""

    time_s: float
    old_budget: int
    new_budget: int
    reason: str
    estimate: LinkEstimate


@dataclass
class _NodeRecord:
    """The controller's node-wide state, kept as JSON next to the permits.

    ``streams`` is the AIMD variable (budget = streams x q). ``peak_bandwidth`` / ``best_rtt_s``
    are the best readings since the last cut, for the slowdown test. ``measured`` remembers
    whether both classes were measured, to re-base ``streams`` once when defaults give way;
    ``slow_start`` whether no throttle, timeout or slowed window has been seen yet;
    ``window_bytes`` what the node received in the current window (its goodput); ``probe`` the
    budget and goodput before the last increase, until a window judges it; ``hold_windows`` /
    ``hold_until_s`` how long increases wait after a probe that bought nothing;
    ``bandwidth_reference_measured`` / ``latency_reference_measured`` whether each reference
    was re-based when its own class was first measured. Timestamps are the controller clock
    (CLOCK_MONOTONIC by default: one clock for the machine).
    """

    version: int
    updated_s: float
    streams: float
    congested: bool
    window_start_s: float
    pause_until_s: float
    peak_bandwidth: float
    best_rtt_s: float
    measured: bool
    last_decrease_s: float | None = None
    last_success_s: float | None = None
    last_wait_s: float | None = None
    estimator: dict[str, Any] = field(default_factory=dict)
    bandwidth_reference_measured: bool = False
    latency_reference_measured: bool = False
    slow_start: bool = True
    window_bytes: int = 0
    probe: list[float] | None = None  # [budget before the last increase, goodput then]: not judged yet
    hold_windows: int = 0
    hold_until_s: float = 0.0


class DownloadController:
    """Sets and enforces how many downloads the node may have in flight.

    What to share: ``config`` (``ControllerConfig()`` when omitted; use
    ``ControllerConfig.from_env()`` to honour environment overrides); ``permits`` (a
    ``NodePermits``; by default ``<permits_dir or tmp>/.../<name>``, so every controller with the
    same ``name`` on a node shares one budget). Time: ``clock`` and ``sleep`` (injectable so tests
    are fast and deterministic; the clock must be shared by the node's processes, as
    ``time.monotonic`` is).

    Use::

        with controller.permit():                 # waits for a node-wide permit
            t0 = clock(); data = get_range(...)
        controller.record_transfer(size_bytes=len(data), duration_s=clock() - t0)
        # on failure: controller.record_throttle(status=429, retry_after_s=...) / record_timeout()
    """

    def __init__(self, *, config: ControllerConfig | None = None, permits: NodePermits | None = None,
                 name: str = "default", clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.config = config if config is not None else ControllerConfig()
        if permits is None:
            directory = default_permits_dir(name)
            if self.config.permits_dir is not None:
                directory = Path(self.config.permits_dir) / directory.name
            permits = NodePermits(directory=directory, default_budget=self.config.initial_permits)
        self.permits = permits
        self.clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._history: deque[BudgetChange] = deque(maxlen=_HISTORY_LENGTH)
        self._log = logging.getLogger(LOGGER_NAME)
        self._started = False
        self._reset_buffer()

    def _reset_buffer(self) -> None:
        # This process's evidence not yet merged into the node's state (see STATE_FLUSH_INTERVAL_S).
        self._pid = os.getpid()
        self._pending: list[tuple[int, float, bool, bool, float]] = []  # ..., finished at
        self._pending_wait_s: float | None = None
        self._last_flush_s = -math.inf
        self._window_end_s = -math.inf  # when the node's current window closes, as last merged

    def _check_process(self) -> None:
        # Called holding self._lock. A forked child must not merge its parent's evidence again.
        if self._pid != os.getpid():
            self._reset_buffer()

    # -- permits -------------------------------------------------------------------------------

    @contextmanager
    def permit(self, *, timeout_s: float | None = None) -> Iterator[int]:
        """Hold one node-wide download permit for the block (yields its slot number).

        Waits while a ``Retry-After`` pause is in force and while the node is at its budget.
        ``timeout_s=0`` never waits. Raises ``TimeoutError`` when no permit came in time.
        """
        if not self._started:
            with self._transaction():
                pass  # start (or reset stale) node state before the first permit is counted
            self._started = True
        deadline = None if timeout_s is None else self.clock() + timeout_s
        with ExitStack() as stack:
            while True:
                self._wait_out_pause(deadline)
                try:
                    slot = stack.enter_context(self.permits.acquire(timeout_s=0))
                except TimeoutError:
                    self._note_permit_wait()  # demand exceeds the budget: increases may help
                    remaining = None if deadline is None else max(0.0, deadline - self.clock())
                    if remaining == 0:
                        raise
                    slot = stack.enter_context(self.permits.acquire(timeout_s=remaining))
                if self.pause_remaining_s() <= 0:
                    break
                stack.close()  # a Retry-After arrived while we waited: give the slot back
            yield slot

    def budget(self) -> int:
        self._flush_if_pending()
        return self.permits.budget()

    def flush(self) -> None:
        """Merge this process's buffered evidence into the node's shared state now."""
        with self._transaction():
            pass  # _transaction merges what is buffered

    def _flush_if_pending(self) -> None:
        with self._lock:
            self._check_process()
            pending = bool(self._pending) or self._pending_wait_s is not None
        if pending:
            self.flush()

    def pause_remaining_s(self) -> float:
        """Seconds until new permits may start (a ``Retry-After`` pause), 0 if none."""
        state = self.permits.read_state()
        now = self.clock()
        if state.get("updated_s", now) > now:
            return 0.0  # written by another clock (an earlier boot): not ours to obey
        remaining = float(state.get("pause_until_s", 0.0)) - now
        return min(max(0.0, remaining), self.config.max_retry_after_s)

    # -- evidence ------------------------------------------------------------------------------

    def record_transfer(self, *, size_bytes: int, duration_s: float, parallel: bool = False,
                        hedged: bool = False) -> SampleClass | None:
        """A request finished: ``size_bytes`` arrived in ``duration_s`` (request sent to last
        byte). ``parallel``: it was one piece of a gather running alongside others; ``hedged``:
        it raced a duplicate. Returns the sample class it counted as, if any.

        Buffered: the node's state sees it within ``STATE_FLUSH_INTERVAL_S`` (or at ``flush``,
        ``budget``, ``estimate``, a throttle or a timeout)."""
        kind = classify_transfer(self.config, size_bytes=size_bytes, duration_s=duration_s,
                                 parallel=parallel, hedged=hedged)
        with self._lock:
            self._check_process()
            now = self.clock()
            self._pending.append((size_bytes, float(duration_s), parallel, hedged, now))
            # A transfer that may close a window is merged at once, so windows are judged on time.
            due = (len(self._pending) >= STATE_FLUSH_TRANSFERS or now >= self._window_end_s
                   or now - self._last_flush_s >= STATE_FLUSH_INTERVAL_S)
        if due:
            self.flush()
        return kind

    def record_throttle(self, *, status: int, retry_after_s: float | None = None) -> None:
        """The server throttled a request (also when a client library retried it internally).

        429 and 503 (and any response with ``Retry-After``) cut the budget; 408 and 504 count as
        timeouts. ``retry_after_s`` pauses new permits node-wide (up to ``max_retry_after_s``).
        Other statuses are not throttling and change nothing.
        """
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
            raise ValueError(f"status must be an HTTP status code (100..599), got {status!r}.")
        if retry_after_s is not None and not (isinstance(retry_after_s, (int, float))
                                              and retry_after_s >= 0):
            raise ValueError(f"retry_after_s must be None or a number >= 0, got {retry_after_s!r}.")
        if status not in THROTTLE_STATUSES | TIMEOUT_STATUSES and retry_after_s is None:
            return
        with self._transaction() as (now, record, estimator):
            reason = f"HTTP {status}" + ("" if retry_after_s is None else f", Retry-After {retry_after_s:g} s")
            self._cut(now, record, estimator, reason)
            if retry_after_s:  # "Retry-After: 0" is throttling, but asks for no pause
                until = now + min(retry_after_s, self.config.max_retry_after_s)
                if until > record.pause_until_s:
                    record.pause_until_s = until
                    self._log.info("download permits paused for %.1f s (%s)", until - now, reason)

    def record_timeout(self) -> None:
        """A request timed out (connect or read): cut the budget like a throttle."""
        with self._transaction() as (now, record, estimator):
            self._cut(now, record, estimator, "timeout")

    def record_failure(self, failure: Failure) -> None:
        """Report a classified failure (see ``RetryPolicy.classify``)."""
        if failure.kind == "throttle":
            self.record_throttle(status=failure.status or 429, retry_after_s=failure.retry_after_s)
        elif failure.kind == "timeout":
            self.record_timeout()

    # -- reading -------------------------------------------------------------------------------

    def estimate(self) -> LinkEstimate:
        self._flush_if_pending()
        estimator = LinkEstimator(config=self.config)
        estimator.load_state_dict(self.permits.read_state().get("estimator", {}))
        return estimator.estimate()

    def history(self) -> list[BudgetChange]:
        """Budget changes this process made, oldest first (the last 1000)."""
        self._flush_if_pending()
        with self._lock:
            return list(self._history)

    # -- internals -----------------------------------------------------------------------------

    @contextmanager
    def _transaction(self) -> Iterator[tuple[float, _NodeRecord, LinkEstimator]]:
        # One thread lock and one file lock around read-modify-write, so every counter is read
        # under the same locks that write it, in this process and across the node.
        with self._lock, self.permits.locked_state() as raw:
            self._check_process()
            now = self.clock()
            estimator = LinkEstimator(config=self.config)
            record = self._load(raw, now, estimator)
            self._merge_buffer(now, record, estimator)
            yield now, record, estimator
            self._window_end_s = record.window_start_s + self.config.increase_interval_s
            record.estimator = estimator.state_dict()
            record.updated_s = now
            raw.clear()  # shallow on purpose: asdict's deep copy of the sample windows is slow
            raw.update((knob.name, getattr(record, knob.name)) for knob in fields(record))

    def _merge_buffer(self, now: float, record: _NodeRecord, estimator: LinkEstimator) -> None:
        # Called inside _transaction: buffered evidence first, so a throttle or timeout that
        # follows is judged after the transfers that finished before it.
        pending, self._pending = self._pending, []
        wait_s, self._pending_wait_s = self._pending_wait_s, None
        self._last_flush_s = now
        if wait_s is not None and (record.last_wait_s is None or wait_s > record.last_wait_s):
            record.last_wait_s = wait_s
        if pending:
            for size_bytes, duration_s, parallel, hedged, _finished_s in pending:
                estimator.add_transfer(size_bytes=size_bytes, duration_s=duration_s,
                                       parallel=parallel, hedged=hedged)
                record.window_bytes += size_bytes
            # Judged as of the last transfer, not the merge: evidence merged late (a read, a
            # throttle) must not close a window early and without the waits that came after it.
            finished_s = max(now if finished > now else finished for *_, finished in pending)
            record.last_success_s = finished_s
            self._update(finished_s, record, estimator)

    def _load(self, raw: dict[str, Any], now: float, estimator: LinkEstimator) -> _NodeRecord:
        try:
            record = _NodeRecord(**raw)
            fresh = (record.version != _STATE_VERSION or record.updated_s > now
                     or now - record.updated_s > self.config.idle_reset_s)
        except TypeError:
            fresh = True
        if not fresh:
            estimator.load_state_dict(record.estimator)
            return record
        estimate = estimator.estimate()
        record = _NodeRecord(version=_STATE_VERSION, updated_s=now,
                             streams=self.config.initial_permits / self._requests_per_stream(estimate),
                             congested=False, window_start_s=now, pause_until_s=0.0,
                             peak_bandwidth=estimate.bandwidth_bytes_per_s, best_rtt_s=estimate.rtt_s,
                             measured=False)
        self._set_budget(now, self.config.initial_permits, "start" if not raw else "reset (stale state)",
                         estimate)
        return record

    def _requests_per_stream(self, estimate: LinkEstimate) -> float:
        # One stream stays busy only if, while a request waits out its round trip, others
        # transfer: (rtt + S/b) / (S/b) = 1 + b * rtt / S requests. The lowest rtt is used because
        # queueing delay is slowness, and slowness must never raise the budget.
        return 1.0 + estimate.bandwidth_bytes_per_s * estimate.lowest_rtt_s / estimate.object_bytes

    def _clamp(self, record: _NodeRecord, permits: float) -> int:
        lower = MIN_BUDGET if record.congested else self.config.floor_permits
        return int(min(self.config.cap_permits, max(lower, round(permits))))

    def _update(self, now: float, record: _NodeRecord, estimator: LinkEstimator) -> None:
        estimate = estimator.estimate()
        q = self._requests_per_stream(estimate)
        measured = estimate.bandwidth_measured and estimate.latency_measured
        if measured != record.measured:
            # Defaults gave way to measurements (both classes: with one still at its default, q
            # is a hybrid that says little). A link measured slower than the defaults lowers the
            # budget at the next window; one measured faster must not leave the target above the
            # budget, or later slowdowns would be absorbed by that reserve instead of lowering
            # the budget. Slowness is judged against the measured link from here on.
            record.measured = measured
            record.streams = min(record.streams, self.permits.budget() / q)
            self._reset_references(record, estimate)
        # Each slowdown reference is re-based when its own class is first measured: a default is
        # no reading of the link. Waiting for both classes left a workload without small
        # requests (video spans only: the round trip is never measured) judging every window
        # against the default bandwidth, so it never counted as healthy and the budget never rose.
        if estimate.bandwidth_measured and not record.bandwidth_reference_measured:
            record.bandwidth_reference_measured = True
            record.peak_bandwidth = estimate.bandwidth_bytes_per_s
        if estimate.latency_measured and not record.latency_reference_measured:
            record.latency_reference_measured = True
            record.best_rtt_s = estimate.rtt_s
        record.peak_bandwidth = max(record.peak_bandwidth, estimate.bandwidth_bytes_per_s)
        record.best_rtt_s = min(record.best_rtt_s, estimate.rtt_s)
        if now - record.window_start_s < self.config.increase_interval_s:
            return
        window_start, record.window_start_s = record.window_start_s, now
        goodput = record.window_bytes / (now - window_start)
        record.window_bytes = 0
        slowed = (estimate.bandwidth_bytes_per_s * self.config.max_slowdown < record.peak_bandwidth
                  or estimate.rtt_s > record.best_rtt_s * self.config.max_slowdown)
        busy = record.last_wait_s is not None and record.last_wait_s >= window_start
        succeeded = record.last_success_s is not None and record.last_success_s >= window_start
        # Goodput measures the budget only when every permit had work all window and no
        # Retry-After pause stopped them.
        measured_window = busy and succeeded and record.pause_until_s <= window_start
        old = self.permits.budget()
        if slowed and record.slow_start:
            record.slow_start = False  # streams added made each slower: the link is full, probe gently
        if measured_window and record.probe is not None:
            before, goodput_before = record.probe
            record.probe = None
            wanted = goodput_before * (1 + PROBE_MIN_GAIN * (old / before - 1))
            if old > before and goodput < wanted:
                # The added permits carried nothing more: the link (or server, or CPU) was full.
                # Give them back, stop doubling, and wait longer before each next probe.
                record.slow_start = False
                record.hold_windows = min(MAX_HOLD_WINDOWS, max(1, 2 * record.hold_windows))
                record.hold_until_s = now + record.hold_windows * self.config.increase_interval_s
                new = self._clamp(record, before)
                record.streams = new / q
                self._set_budget(now, new, f"probe bought no throughput ({goodput / 1e6:.1f} vs "
                                 f"{goodput_before / 1e6:.1f} MB/s at {int(before)}); hold "
                                 f"{record.hold_windows} window(s)", estimate)
                return
            record.hold_windows = 0
        if succeeded and busy and not slowed and (measured_window or record.slow_start) \
                and now >= record.hold_until_s:
            step = self.config.increase_step
            doubling = record.slow_start and self.config.slow_start_factor > 1
            if doubling:
                step = max(step, round(old * (self.config.slow_start_factor - 1)))
            new = self._clamp(record, old + step)
            record.streams = new / q
            if new > old and measured_window:
                record.probe = [old, goodput]
            reason = f"healthy window: +{new - old}" + (" (slow start)" if doubling else "")
        else:
            # Outside a healthy window the model may only lower the budget (a slower stream or
            # bigger requests need fewer permits); a rise must wait for a healthy window. Only a
            # clear drop counts: the mean request size of a mixed workload jitters from window
            # to window, and following every dip would ratchet the budget down.
            target = record.streams * q
            new = old if target * self.config.max_slowdown >= old else min(old, self._clamp(record, target))
            reason = "link estimate" + (", slower than its best" if slowed else "")
        if record.congested and new >= self.config.floor_permits:
            record.congested = False
        self._set_budget(now, new, reason, estimate)

    def _cut(self, now: float, record: _NodeRecord, estimator: LinkEstimator, reason: str) -> None:
        record.window_start_s = now  # a throttle starts the healthy window afresh
        record.window_bytes = 0
        if record.last_decrease_s is not None and now - record.last_decrease_s < self.config.cooldown_s:
            return  # the requests already in flight when we cut report the same congestion
        estimate = estimator.estimate()
        budget = self.permits.budget()
        if record.probe is not None:
            # Throttled while probing: the probe's extra permits are what the server refused,
            # so the cut starts from the budget before it.
            budget = min(budget, int(record.probe[0]))
            record.probe = None
        new = max(MIN_BUDGET, math.floor(budget * self.config.decrease_factor))
        record.last_decrease_s = now
        record.congested = True
        record.slow_start = False
        record.streams = new / self._requests_per_stream(estimate)
        self._reset_references(record, estimate)
        self._set_budget(now, new, f"{reason}: x{self.config.decrease_factor:g}", estimate)

    def _reset_references(self, record: _NodeRecord, estimate: LinkEstimate) -> None:
        record.peak_bandwidth = estimate.bandwidth_bytes_per_s
        record.best_rtt_s = estimate.rtt_s

    def _set_budget(self, now: float, new: int, reason: str, estimate: LinkEstimate) -> None:
        old = self.permits.budget()
        if new == old and reason != "start":
            return
        self.permits.set_budget(new)
        self._history.append(BudgetChange(now, old, new, reason, estimate))
        self._log.info("download budget %d -> %d (%s): %s", old, new, reason, estimate.describe(),
                       extra={"budget_old": old, "budget_new": new, "budget_reason": reason,
                              "bandwidth_bytes_per_s": estimate.bandwidth_bytes_per_s,
                              "rtt_s": estimate.rtt_s, "bandwidth_samples": estimate.bandwidth_samples,
                              "latency_samples": estimate.latency_samples})

    def _note_permit_wait(self) -> None:
        # Demand exceeded the budget. Buffered and merged with this process's next transfer
        # (a wait is only evidence for a window in which requests also succeeded), so the
        # window that transfer closes knows the node was busy.
        with self._lock:
            self._check_process()
            self._pending_wait_s = self.clock()

    def _wait_out_pause(self, deadline: float | None) -> None:
        while (remaining := self.pause_remaining_s()) > 0:
            if deadline is not None and self.clock() + remaining > deadline:
                raise TimeoutError(f"downloads are paused for {remaining:.1f} s (Retry-After)")
            self._sleep(remaining)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_lock", "_history", "_log", "_pending", "_pending_wait_s", "_last_flush_s", "_pid",
                     "_window_end_s"):
            del state[name]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._history = deque(maxlen=_HISTORY_LENGTH)
        self._log = logging.getLogger(LOGGER_NAME)
        self._reset_buffer()


# ---------------------------------------------------------------------------------------------
# Retrying one request


@dataclass(frozen=True)
class Failure:
    """What a failed attempt means: ``throttle`` and ``timeout`` retry and cut the budget,
    ``transient`` retries, ``fatal`` does not retry."""

    kind: FailureKind
    status: int | None = None
    retry_after_s: float | None = None


class DownloadError(RuntimeError):
    """A download failed for good. Names the URL (credentials removed), the last HTTP status
    (None when there was none, e.g. a timeout), how many attempts were made, and the last error."""

    def __init__(self, url: str, status: int | None, attempts: int, last_error: BaseException | str | None) -> None:
        self.url = redact_url(url)
        self.status = status
        self.attempts = attempts
        self.last_error = last_error
        if isinstance(last_error, BaseException):
            detail = f"{type(last_error).__name__}: {last_error}"
        else:
            detail = "" if last_error is None else str(last_error)
        self.detail = redact_text(detail)
        super().__init__(f"GET {self.url} failed after {attempts} attempt{'s' * (attempts != 1)} "
                         f"(last HTTP status: {status if status is not None else 'none'}): {self.detail}")

    def __reduce__(self) -> tuple[Any, ...]:
        # The original error may not pickle (DataLoader workers send errors across processes).
        return (type(self), (self.url, self.status, self.attempts, self.detail))


class RetryPolicy:
    """Retries one request: which failures retry, jittered exponential backoff, ``Retry-After``.

    Knobs come from ``config`` (``max_attempts``, ``base_backoff_s``, ``max_backoff_s``,
    ``max_retry_after_s``, ``request_timeout_s``). Determinism: ``seed`` fixes the jitter;
    without it each process draws its own (re-seeded after fork, so DataLoader workers do not
    retry in lockstep). ``sleep`` is injectable for tests.
    """

    def __init__(self, *, config: ControllerConfig | None = None, seed: int | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.config = config if config is not None else ControllerConfig()
        self._seed = seed
        self._sleep = sleep
        self._rng = random.Random(seed)
        self._pid = os.getpid()

    def delay_s(self, attempt: int, *, retry_after_s: float | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based).

        Exponential ``base * 2**(attempt - 1)`` capped at ``max_backoff_s``, jittered into
        [half, all] of it (never near zero, so the backoff really grows). A ``Retry-After`` is a
        lower bound (up to ``max_retry_after_s``), plus up to ``base_backoff_s`` of jitter so
        the workers it stopped do not all come back at the same instant.
        """
        if os.getpid() != self._pid and self._seed is None:
            self._rng, self._pid = random.Random(), os.getpid()
        ceiling = min(self.config.max_backoff_s, self.config.base_backoff_s * 2.0 ** min(attempt - 1, 60))
        delay = self._rng.uniform(ceiling / 2, ceiling)
        if retry_after_s is not None:
            honoured = min(retry_after_s, self.config.max_retry_after_s)
            delay = max(delay, honoured + self._rng.uniform(0, self.config.base_backoff_s))
        return delay

    def classify(self, error: BaseException) -> Failure:
        """Throttle (429, 503, any Retry-After), timeout (TimeoutError, 408, 504), transient
        (other 5xx, connection resets, truncated bodies) or fatal (everything else).

        Status and ``Retry-After`` are found on the error (``status``, ``status_code``,
        ``retry_after_s``, ``headers``) or its ``response``, as requests, aiohttp, httpx and
        huggingface_hub errors carry them.
        """
        status = _status_of(error)
        retry_after_s = _retry_after_of(error)
        if status is not None:
            if status in THROTTLE_STATUSES or retry_after_s is not None:
                return Failure("throttle", status, retry_after_s)
            if status in TIMEOUT_STATUSES:
                return Failure("timeout", status)
            return Failure("transient" if status >= 500 else "fatal", status)
        names = {cls.__name__ for cls in type(error).__mro__}
        if isinstance(error, TimeoutError) or any("Timeout" in name for name in names):
            return Failure("timeout")
        if isinstance(error, (ConnectionError, http.client.HTTPException)) or any(
                marker in name for name in names for marker in _TRANSIENT_NAME_MARKERS):
            return Failure("transient")
        return Failure("fatal")

    def call(self, fn: Callable[[float], T], *, url: str, controller: DownloadController | None = None,
             parallel: bool = False) -> T:
        """Run ``fn(timeout_s)`` (one complete request) until it succeeds or attempts run out.

        With a ``controller`` each attempt holds a permit, a success is recorded as a transfer
        (its size is ``len(result)`` when the result has one) and every failure is reported. A
        result is returned exactly once, from the attempt that succeeded: ``fn`` must return the
        whole response or raise, so a fault mid-body is retried, never half-delivered.
        """
        for attempt in range(1, self.config.max_attempts + 1):
            try:
                return self._attempt(fn, controller, parallel)
            except Exception as error:  # noqa: BLE001 - classified below; fatal ones re-raise
                failure = self.classify(error)
                if controller is not None:
                    controller.record_failure(failure)
                if failure.kind == "fatal" or attempt == self.config.max_attempts:
                    raise DownloadError(url, failure.status, attempt, error) from error
                self._sleep(self.delay_s(attempt, retry_after_s=failure.retry_after_s))
        raise AssertionError("unreachable: the loop returns or raises")

    def _attempt(self, fn: Callable[[float], T], controller: DownloadController | None,
                 parallel: bool) -> T:
        if controller is None:
            return fn(self.config.request_timeout_s)
        with controller.permit():
            start_s = controller.clock()
            result = fn(self.config.request_timeout_s)
            duration_s = controller.clock() - start_s
        try:
            size_bytes = len(result)  # type: ignore[arg-type]
        except TypeError:
            return result
        controller.record_transfer(size_bytes=size_bytes, duration_s=max(0.0, duration_s),
                                   parallel=parallel)
        return result


# Exception class names (any library) that mean "the connection broke, try again".
_TRANSIENT_NAME_MARKERS = ("Connection", "Disconnected", "IncompleteRead", "ChunkedEncoding",
                           "ProtocolError", "PayloadError")


def _status_of(error: BaseException) -> int | None:
    for holder in (error, getattr(error, "response", None)):
        for attribute in ("status", "status_code"):
            value = getattr(holder, attribute, None)
            if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
                return value
    return None


def _retry_after_of(error: BaseException) -> float | None:
    value = getattr(error, "retry_after_s", None)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    for holder in (error, getattr(error, "response", None)):
        headers = getattr(holder, "headers", None)
        if headers is not None and hasattr(headers, "get"):
            parsed = parse_retry_after(headers.get("Retry-After"))
            if parsed is not None:
                return parsed
    return None


def parse_retry_after(value: str | None, *, now_s: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP date.

    ``now_s`` is the wall clock (``time.time()``) for dates. None when absent or unparseable.
    """
    if value is None:
        return None
    value = str(value).strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now_s is None else now_s))


_CREDENTIAL_RES = (
    re.compile(r"\b(hf_|api_org_)[A-Za-z0-9]{6,}"),
    re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+"),
    re.compile(r"(?i)\b(authorization|token|access_token|api_key|apikey|password|signature|sig|"
               r"x-amz-security-token|x-amz-signature|x-amz-credential)(['\"]?\s*[:=]\s*)['\"]?[^\s'\",&]+"),
)
_URL_RE = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")


def redact_url(url: str) -> str:
    """``url`` without user info, query string or fragment (where signed URLs and tokens live)."""
    try:
        parts = urllib.parse.urlsplit(str(url))
    except ValueError:
        return "<unparseable url>"
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    query = "?<redacted>" if parts.query else ""
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", "")) + query


def redact_text(text: str) -> str:
    """``text`` with URLs' query strings and anything that looks like a token removed."""
    text = _URL_RE.sub(lambda m: redact_url(m.group(0)), text)
    text = _CREDENTIAL_RES[0].sub(lambda m: m.group(1) + "<redacted>", text)
    text = _CREDENTIAL_RES[1].sub(lambda m: m.group(1) + " <redacted>", text)
    return _CREDENTIAL_RES[2].sub(lambda m: m.group(1) + m.group(2) + "<redacted>", text)
