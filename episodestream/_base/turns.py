"""``Turn``: a consumer's place in the order its DataLoader needs the consumers' first batches.

A DataLoader takes batch 0 from worker 0, batch 1 from worker 1, and so on. Remote consumers that
all start downloading at once share the link, so worker 0's first episodes arrive only when
everyone's do, and the trainer's first batch with them. With turns, the consumers' head starts
(the episodes their first batches draw from) cross the link one consumer after another, in the
DataLoader's order, and everything else after the last head start: a consumer starts its head
start once the consumer before it passed its turn on (its head start is local, it ended, or it
failed), and the rest of its downloads once the last consumer passed its own on. The bytes are the
same, so the later downloads finish when they would have; each first batch comes as soon as the
link allows. What a turn changes is the order of downloads, never which samples come out; each
wait is bounded (``wait_s``), so a consumer that died or never started costs that long once, then
the others download as they would without turns.

The waiting is polling, not a notification: the other consumers may be other processes (the
shared slots of ``_runtime.lookahead.worker_turns``), whose writes cannot wake this one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

TURN_WAIT_S = 10.0  # a dead consumer's cost, once; a live one's head start takes far less
_POLL_S = 0.005


class _Gate:
    """Open once ``ready()`` is true or ``wait_s`` passed since the first ``wait`` (any thread)."""

    def __init__(self, ready: Callable[[], bool] | None, wait_s: float) -> None:
        self._ready, self._wait_s = ready, wait_s
        self._lock = threading.Lock()
        self._deadline_s: float | None = None
        self._open = ready is None

    def wait(self) -> None:
        if self._open:
            return
        with self._lock:
            if self._deadline_s is None:
                self._deadline_s = time.monotonic() + self._wait_s
            deadline_s = self._deadline_s
        ready = self._ready
        assert ready is not None  # _open otherwise
        while not self._open:
            if ready() or time.monotonic() >= deadline_s:
                self._open = True
                break
            time.sleep(_POLL_S)


class Turn:
    """One consumer's turn (see the module). ``wait``, ``wait_for_all`` and ``pass_on`` may be
    called from any thread, any number of times: each wait is bounded from its first call and
    returns at once after it ended; ``pass_on`` acts once.

    Keywords:
        ready: whether the consumer before passed its turn on (polled); None: this consumer is
            first, its head start never waits.
        all_ready: whether the last consumer passed its turn on (polled; for the last consumer,
            itself); None: never wait.
        pass_on: tells the others that this consumer passed its turn on.
        wait_s: the longest each wait lasts, in seconds, counted from its first call.
    """

    def __init__(self, *, ready: Callable[[], bool] | None = None, all_ready: Callable[[], bool] | None = None,
                 pass_on: Callable[[], None] | None = None, wait_s: float = TURN_WAIT_S) -> None:
        self._mine, self._all = _Gate(ready, wait_s), _Gate(all_ready, wait_s)
        self._pass_on = pass_on
        self._lock = threading.Lock()
        self._passed = False

    def wait(self) -> None:
        """Before the head start: until the consumer before passed its turn on (bounded)."""
        self._mine.wait()

    def wait_for_all(self) -> None:
        """Before any other download: until the last consumer passed its turn on (bounded)."""
        self._all.wait()

    def pass_on(self) -> None:
        """This consumer's head start is local (or it ended): the next may start (once)."""
        with self._lock:
            if self._passed:
                return
            self._passed = True
        if self._pass_on is not None:
            self._pass_on()

    @property
    def passed(self) -> bool:
        return self._passed
