"""Per-process state for picklable objects: built lazily once in each process that uses it.

Objects such as ``RemoteFiles`` and ``DownloadFetch`` travel to DataLoader workers by pickling or
fork; their clients, thread pools and controllers must not. Each keeps its per-process state in an
attribute ``_remote.transport.process`` (an object with a ``pid``), dropped when pickled and rebuilt here when the
pid changes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class _ForkSafeLock:
    """A lock that a fork child gets fresh: the parent's may have been held by another thread at
    fork time, and that thread does not exist in the child to release it. The object owns its
    lock and replaces it itself after fork (no module global is rebound)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Registering a hook is not work at import: nothing is read or opened.
        os.register_at_fork(after_in_child=self._renew)

    def _renew(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


# Guards building a process's state once when several threads ask at the same time (not a cache:
# the state lives on each owner). One lock for all owners: building is rare and short.
_STATE_LOCK = _ForkSafeLock()


def process_state(owner: Any, make: Callable[[Any], T]) -> T:
    """``owner._process`` if it was built in this process, else ``make(owner)``, stored there."""
    state = owner._process
    if state is None or state.pid != os.getpid():
        with _STATE_LOCK:
            state = owner._process
            if state is None or state.pid != os.getpid():
                state = owner._process = make(owner)
    return state
