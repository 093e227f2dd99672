"""Per-process state for picklable objects: built lazily once in each process that uses it.

Objects such as ``RemoteFiles`` and ``DownloadFetch`` travel to DataLoader workers by pickling or
fork; their clients, thread pools and controllers must not. Each keeps its per-process state in an
attribute ``_process`` (an object with a ``pid``), dropped when pickled and rebuilt here when the
pid changes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

# Guards building a process's state once when several threads ask at the same time (not a cache).
# A fork child gets a fresh lock: the parent's may have been held by another thread at fork time.
_STATE_LOCK = threading.Lock()
os.register_at_fork(after_in_child=lambda: globals().__setitem__("_STATE_LOCK", threading.Lock()))


def process_state(owner: Any, make: Callable[[Any], T]) -> T:
    """``owner._process`` if it was built in this process, else ``make(owner)``, stored there."""
    state = owner._process
    if state is None or state.pid != os.getpid():
        with _STATE_LOCK:
            state = owner._process
            if state is None or state.pid != os.getpid():
                state = owner._process = make(owner)
    return state
