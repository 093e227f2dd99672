"""``DaemonPool``: the few background threads a ``RemoteVideos`` fetches on.

Why not ``concurrent.futures.ThreadPoolExecutor``: its workers are not daemon threads, and the
interpreter joins them at exit (``threading._register_atexit``). A fetch blocked on a stalled
connection (a request may wait ``request_timeout_s`` per attempt, times the retries) would then hold
the trainer's exit, or a DataLoader worker's, for minutes after the consumer is gone. Here the
threads are daemons, ``close(timeout_s)`` waits a bounded time for the running jobs and drops the
queued ones, and threads are made lazily (a consumer that never admits an episode starts none).
Nothing here needs futures: a job reports through its own ``_Task``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class DaemonPool:
    """A few daemon threads running callables in order; made lazily, stopped by ``close``."""

    def __init__(self, threads: int) -> None:
        self._size = threads
        self._queue: list[Callable[[], None]] = []
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def submit(self, job: Callable[[], None]) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("the fetch pool is closed")
            self._queue.append(job)
            if len(self._threads) < self._size:
                thread = threading.Thread(target=self._run, name=f"episodestream-fetch-{len(self._threads)}",
                                          daemon=True)
                self._threads.append(thread)
                thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                job = self._queue.pop(0)
            job()

    def close(self, timeout_s: float) -> None:
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout_s)
