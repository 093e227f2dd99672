"""The adaptive download controller: how many downloads a node may have in flight.

``ControllerConfig`` (``_remote.transport.config``) holds the knobs. ``LinkEstimator`` (``_remote.transport.estimator``) turns
finished transfers into bandwidth and round-trip estimates. ``DownloadController`` (here) sets the
node-wide budget of ``NodePermits`` from those estimates and from throttling (AIMD), and hands out
permits. ``request`` (``_remote.transport.request``) retries one request with jittered exponential backoff and
reports every failure to the controller.

The budget model (docs/download-controller.md has the derivation)::

    q      = 1 + bandwidth * lowest_rtt / mean_request_bytes   # requests one busy stream needs
    target = clamp(round(streams * q), floor, cap)           # floor becomes 1 after throttling

``streams`` is the AIMD state. A throttle or timeout cuts the budget by ``decrease_factor`` (once
per ``cooldown_s``) and re-bases ``streams``. A healthy window of ``increase_interval_s`` (no
throttle, requests succeeded, someone waited for a permit, no ``Retry-After`` pause, the link not
slower than its best since the last cut, and no hold after a probe that bought nothing) adds
``increase_step`` and re-bases ``streams``. Before the first
throttle, timeout or slowed window (slow start, as in TCP) a healthy window multiplies the budget
by ``slow_start_factor`` instead: a link that needs 50 streams gets them in seconds, not minutes.
Every increase is a probe: the next busy window keeps it only if the node's goodput grew
(``probe_min_gain``). Between those, the budget follows the target down (a slower stream, bigger
requests) but never up: only a healthy window raises it, so slowness can never raise
concurrency. The estimates and AIMD state live in the permits directory so every process on the
node agrees on them.
"""

from __future__ import annotations

import logging
import math
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from episodestream._remote.transport.config import ControllerConfig
from episodestream._remote.transport.estimator import LinkEstimate, LinkEstimator, SampleClass, classify_transfer
from episodestream._remote.transport.permits import NodePermits, default_permits_dir
from episodestream._remote.transport.failures import THROTTLE_STATUSES, TIMEOUT_STATUSES, Failure

LOGGER_NAME = "episodestream.download"
# The budget never reaches 0: with no permit at all nothing could ever succeed and raise it again.
MIN_BUDGET = 1
_HISTORY_LENGTH = 1000
_STATE_VERSION = 1
# Evidence (finished transfers, permit waits) is buffered in each process and merged into the
# node's shared state at most this often, or once this many transfers are waiting: the merge is
# a locked read-modify-write of a JSON file, which per request cost a large share of a core on a
# fast link. A window (2 s by default) is 40 flush intervals, so the delay changes no decision; throttles
# and timeouts are written at once (they merge what is buffered first).
STATE_FLUSH_INTERVAL_S = 0.05
STATE_FLUSH_TRANSFERS = 32


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
        self._pending: list[tuple[int, float, float]] = []  # (size_bytes, duration_s, finished at)
        self._pending_wait_s: float | None = None
        self._last_flush_s = -math.inf
        self._window_end_s = -math.inf  # when the node's current window closes, as last merged

    def _check_process(self) -> None:
        # Called before taking self._lock. A forked child must not merge its parent's evidence
        # again, and must not wait on a lock that a parent thread held at the fork (the child has
        # only the forking thread, so nothing else can be using either here).
        if self._pid != os.getpid():
            self._lock = threading.Lock()
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
        # A process that waits or finishes little still merges within about an interval.
        self._flush_buffered(older_than_s=STATE_FLUSH_INTERVAL_S)
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
        self._flush_buffered()
        return self.permits.budget()

    def flush(self) -> None:
        """Merge this process's buffered evidence into the node's shared state now."""
        with self._transaction():
            pass  # _transaction merges what is buffered

    def _flush_buffered(self, *, older_than_s: float = 0.0) -> None:
        # Merge what is buffered, if anything, and if the last merge is at least this old.
        self._check_process()
        with self._lock:
            due = ((bool(self._pending) or self._pending_wait_s is not None)
                   and self.clock() - self._last_flush_s >= older_than_s)
        if due:
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

    def record_transfer(self, *, size_bytes: int, duration_s: float) -> SampleClass | None:
        """A request finished: ``size_bytes`` arrived in ``duration_s`` (request sent to last
        byte), on one stream of its own. Returns the sample class it counted as, if any.

        Buffered: the node's state sees it at this process's first transfer or permit after
        ``STATE_FLUSH_INTERVAL_S``, once ``STATE_FLUSH_TRANSFERS`` are buffered, at once when it
        may close a window, or at ``flush``, ``budget``, ``estimate``, ``history``, a throttle or
        a timeout. A process that exits between merges
        takes its last samples with it (never a throttle: those are written at once)."""
        kind = classify_transfer(self.config, size_bytes=size_bytes, duration_s=duration_s)
        self._check_process()
        with self._lock:
            now = self.clock()
            self._pending.append((size_bytes, float(duration_s), now))
            # A transfer that may close a window is merged at once, so windows are judged on time.
            due = (len(self._pending) >= STATE_FLUSH_TRANSFERS or now >= self._window_end_s
                   or now - self._last_flush_s >= STATE_FLUSH_INTERVAL_S)
        if due:
            self.flush()
        return kind

    def record_throttle(self, *, status: int, retry_after_s: float | None = None) -> None:
        """The server throttled a request (also when a client library retried it internally).

        429 and 503 (and any response with ``Retry-After``) cut the budget; 408 and 504 count as
        timeouts. ``retry_after_s`` pauses new permits node-wide (up to ``max_retry_after_s``, plus
        up to ``base_backoff_s`` of jitter).
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
                # Jittered by up to base_backoff_s: nodes throttled in the same second (a launch)
                # would otherwise all come back at the same instant and be throttled together again.
                jitter_s = random.uniform(0.0, self.config.base_backoff_s)
                until = now + min(retry_after_s, self.config.max_retry_after_s) + jitter_s
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
        self._flush_buffered()
        estimator = LinkEstimator(config=self.config)
        estimator.load_state_dict(self.permits.read_state().get("estimator", {}))
        return estimator.estimate()

    def history(self) -> list[BudgetChange]:
        """Budget changes this process made, oldest first (the last 1000)."""
        self._flush_buffered()
        with self._lock:
            return list(self._history)

    # -- internals -----------------------------------------------------------------------------

    @contextmanager
    def _transaction(self) -> Iterator[tuple[float, _NodeRecord, LinkEstimator]]:
        # One thread lock and one file lock around read-modify-write, so every counter is read
        # under the same locks that write it, in this process and across the node.
        self._check_process()
        with self._lock, self.permits.locked_state() as raw:
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
            for size_bytes, duration_s, finished in pending:
                estimator.add_transfer(size_bytes=size_bytes, duration_s=duration_s)
                if finished >= record.window_start_s:
                    # Goodput counts a transfer in the window it finished in; one merged late (a
                    # process that went quiet) belongs to a window already judged.
                    record.window_bytes += size_bytes
            # Judged as of the last transfer, not the merge: evidence merged late (a read, a
            # throttle) must not close a window early and without the waits that came after it.
            finished_s = min(now, max(finished for *_, finished in pending))
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
            wanted = goodput_before * (1 + self.config.probe_min_gain * (old / before - 1))
            if old > before and goodput < wanted:
                # The added permits carried nothing more: the link (or server, or CPU) was full.
                # Give them back, stop doubling, and wait longer before each next probe.
                record.slow_start = False
                record.hold_windows = min(self.config.max_hold_windows, max(1, 2 * record.hold_windows))
                record.hold_until_s = now + record.hold_windows * self.config.increase_interval_s
                new = self._clamp(record, before)
                record.streams = new / q
                self._set_budget(now, new, f"probe bought no throughput ({goodput / 1e6:.1f} vs "
                                 f"{goodput_before / 1e6:.1f} MB/s at {int(before)}); hold "
                                 f"{record.hold_windows} window(s)", estimate)
                return
            record.hold_windows = 0
        if measured_window and not slowed and now >= record.hold_until_s:  # a healthy window
            step = self.config.increase_step
            doubling = record.slow_start and self.config.slow_start_factor > 1
            if doubling:
                step = max(step, round(old * (self.config.slow_start_factor - 1)))
            new = self._clamp(record, old + step)
            record.streams = new / q
            if new > old:
                record.probe = [old, goodput]  # judged by the next measured window
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
        self._check_process()
        with self._lock:
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
