"""``Turn``: a consumer's place in the order its DataLoader needs the consumers' first batches.

A DataLoader takes batch 0 from worker 0, batch 1 from worker 1, and so on. Remote consumers that
all start downloading at once share the link, so worker 0's first episodes arrive only when
everyone's do, and the trainer's first batch with them. With a turn, a consumer starts its first
downloads once the consumer before it passed its turn on (its head start is local, it ended, or it
failed), and passes its own on likewise: worker 0's episodes cross the link alone, then worker 1's,
and each first batch comes as soon as the link allows. What a turn changes is the order of
downloads, never which samples come out; the wait is bounded (``wait_s``), so a predecessor that
died or never started costs that long once, then the consumer downloads as it would without one.

The waiting is polling, not a notification: the consumer before may be another process (the
shared slots of ``_runtime.turns``), whose writes cannot wake this one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

TURN_WAIT_S = 10.0  # a dead predecessor's cost, once; a live one's head start takes far less
_POLL_S = 0.005


class Turn:
    """One consumer's turn (see the module). ``wait`` and ``pass_on`` may be called from any
    thread, any number of times: the first ``wait`` starts the bounded wait, every later one
    returns once it ended; ``pass_on`` acts once.

    Keywords:
        ready: whether the consumer before passed its turn on (polled); None: this consumer is
            first, it never waits.
        pass_on: tells the consumer after that this one passed its turn on; None: nobody is after.
        wait_s: the longest ``wait`` lasts, in seconds, counted from the first call.
    """

    def __init__(self, *, ready: Callable[[], bool] | None = None, pass_on: Callable[[], None] | None = None,
                 wait_s: float = TURN_WAIT_S) -> None:
        self._ready, self._pass_on = ready, pass_on
        self._wait_s = wait_s
        self._lock = threading.Lock()
        self._deadline_s: float | None = None
        self._open = ready is None
        self._passed = False

    def wait(self) -> None:
        """Until the consumer before passed its turn on, or ``wait_s`` since the first call."""
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

    def pass_on(self) -> None:
        """Let the consumer after start its downloads (once; later calls do nothing)."""
        with self._lock:
            if self._passed:
                return
            self._passed = True
        if self._pass_on is not None:
            self._pass_on()

    @property
    def passed(self) -> bool:
        return self._passed
