"""A node-wide counting semaphore for downloads, shared by unrelated processes on one machine.

DataLoader workers of one rank and separately launched ranks on the same node all open the same
directory. It holds:

- ``budget``: the number of permits, one integer, replaced atomically (readers never lock it);
- ``slot-0000.lock`` ...: one file per permit. Holding a permit means holding an exclusive
  ``flock`` on a slot whose number is below the budget. The kernel drops a dead process's locks,
  so a crashed worker never leaks a permit;
- ``state.json`` and ``state.lock``: a small JSON record that the download controller keeps here
  so every process on the node agrees on one budget, one set of link estimates and one
  throttle cooldown (read-modify-write under ``state.lock``).

Resizing never revokes a held permit. New acquirers only take slots below the current budget and
re-check the budget after locking one, so after ``set_budget(n)`` returns, every permit handed out
is on a slot below ``n``: permits already in flight count against the new budget and the total
falls to ``n`` as they finish, without ever exceeding the larger of the two.

The directory must be on a node-local file system (``/tmp``, ``/dev/shm``): ``flock`` on network
file systems is either not shared between nodes or not supported at all.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import re
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_SLOT_RE = re.compile(r"^slot-(\d+)\.lock$")
_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
# Waiting threads poll the slot files (releases in other processes cannot notify us). Start fast
# so a permit freed a moment later is taken quickly, back off so a long wait costs almost no CPU.
_FIRST_POLL_S = 0.001
_MAX_POLL_S = 0.02
_QUEUED_WAKE_S = 0.5
MAX_PERMITS = 4096


def default_permits_dir(name: str) -> Path:
    """``<base>/episodestream-<uid>/permits/<name>``: node-local and private to this user.

    ``<base>`` is ``/dev/shm`` where it is writable (tmpfs: every budget or state update is a
    rename, an order of magnitude cheaper there than on a journaling disk), else the temp dir.
    """
    if not _NAME_RE.match(name):
        raise ValueError(f"Invalid permits name ({name!r}). Use 1-100 of A-Z a-z 0-9 . _ -.")
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else Path(tempfile.gettempdir())
    return base / f"episodestream-{os.getuid()}" / "permits" / name


class NodePermits:
    """Permits for concurrent downloads, counted across every process that opens ``directory``.

    Where: ``directory`` (created on first use, node-local); ``default_budget`` is the budget
    while no one has set one.

    Within one process, waiting threads queue in FIFO order and sleep between polls; across
    processes there is no ordering. Safe to pickle or fork into DataLoader workers: each process
    keeps its own locks and re-opens the slot files.
    """

    # (stat key of state.json, its parsed state): read_state() re-reads only when the file changed.
    _state_cache: tuple[tuple[int, int, int, int], dict[str, Any]] | None

    def __init__(self, *, directory: str | os.PathLike[str], default_budget: int = 1) -> None:
        self.directory = Path(directory)
        self.default_budget = _check_budget("default_budget", default_budget)
        self._reset_process_state()

    # -- budget --------------------------------------------------------------------------------

    def budget(self) -> int:
        """The current node-wide budget (lock-free read of an atomically replaced file)."""
        try:
            text = (self.directory / "budget").read_text()
        except FileNotFoundError:
            return self.default_budget
        try:
            return _check_budget("budget", int(text))
        except ValueError:
            # Only our own atomic writes produce this file; anything else is not ours to trust.
            return self.default_budget

    def set_budget(self, permits: int) -> None:
        """Set the budget for every process. Held permits are never revoked (see module doc)."""
        _write_atomically(self._ensure_dir() / "budget", str(_check_budget("permits", permits)))

    # -- permits -------------------------------------------------------------------------------

    @contextmanager
    def acquire(self, timeout_s: float | None = None) -> Iterator[int]:
        """Hold one permit for the ``with`` block; yields its slot number.

        ``timeout_s=None`` waits forever, ``0`` tries once (failing also while other threads of
        this process are queued, to keep their turn). Raises ``TimeoutError`` when none came.
        """
        if timeout_s is not None and (isinstance(timeout_s, bool) or not timeout_s >= 0):
            raise ValueError(f"timeout_s must be None or >= 0, got {timeout_s!r}.")
        slot = self._acquire_slot(timeout_s)
        try:
            yield slot
        finally:
            self._release_slot(slot)

    def in_flight(self) -> int:
        """How many slots are held node-wide right now (probes each lock; for tests/benchmarks)."""
        self._check_process()
        return self._count_held(self._slot_numbers())

    # -- shared state --------------------------------------------------------------------------

    def read_state(self) -> dict[str, Any]:
        """The shared JSON record, without locking (it is replaced atomically); {} if none.

        The download controller reads it before every permit, so it is parsed again only when
        the file's inode, change or modification time or size differ from the last parse: the
        returned dict is shared with later calls and must not be modified. A disk file system
        may reuse inodes across the renames and stamp times at a clock tick, so two writes of
        one size within a tick can go unseen until the next write; on tmpfs (the default
        directory) each rename is a new inode.
        """
        path = self.directory / "state.json"
        try:
            info = os.stat(path)
        except FileNotFoundError:
            return {}
        key = (info.st_ino, info.st_mtime_ns, info.st_ctime_ns, info.st_size)
        cached = self._state_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        text = self._read_state_text()
        try:
            state = json.loads(text) if text else {}
        except ValueError:
            state = {}
        # A write between the stat and the read leaves the newer text under the older key: the
        # next call sees a new key and reads again, so the cache is never more than one call stale.
        self._state_cache = (key, state)
        return state

    @contextmanager
    def locked_state(self) -> Iterator[dict[str, Any]]:
        """Read-modify-write the shared record: yields it as a dict, writes it back if changed.

        Holds ``state.lock`` (exclusive, blocking) for the block, so updates from different
        processes never interleave. Callers in one process must also serialise their threads
        (flock does, but only between separately opened files; we open it afresh each time).
        """
        fd = os.open(self._ensure_dir() / "state.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            before = self._read_state_text()
            try:
                state = json.loads(before) if before else {}
            except ValueError:
                state = {}
            yield state
            after = json.dumps(state, sort_keys=True)
            if after != before:
                _write_atomically(self.directory / "state.json", after)
        finally:
            os.close(fd)  # closing the only descriptor of this open file drops the lock

    def _read_state_text(self) -> str:
        try:
            return (self.directory / "state.json").read_text()
        except FileNotFoundError:
            return ""

    # -- internals -----------------------------------------------------------------------------

    def _reset_process_state(self) -> None:
        self._pid = os.getpid()
        self._mutex = threading.Lock()
        self._queue: deque[threading.Condition] = deque()  # waiting threads, FIFO
        self._state_cache = None
        self._next_ticket = 0
        self._held: dict[int, int] = {}  # slot -> fd holding its lock
        self._rng = random.Random()
        self._dir_ready = False

    def _check_process(self) -> None:
        if self._pid != os.getpid():
            # A forked child inherits the parent's descriptors, locked ones included. Close them
            # (never LOCK_UN: that would release the parent's permit) so the parent's exit frees
            # them, and start with fresh in-process state (the parent's threads do not exist here).
            for fd in self._held.values():
                os.close(fd)
            self._reset_process_state()

    def _acquire_slot(self, timeout_s: float | None) -> int:
        self._check_process()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._mutex:
            if timeout_s == 0 and self._queue:
                raise TimeoutError("no download permit free (other threads are waiting)")
            # Each waiter sleeps on its own condition and only the head of the line is woken:
            # waking every waiter on each release (one shared condition) cost a context switch
            # per waiting thread per release, which dominated a CPU-bound link with many waiters.
            waiter = threading.Condition(self._mutex)
            self._queue.append(waiter)
            poll_s = _FIRST_POLL_S
            try:
                while True:
                    if self._queue[0] is waiter:
                        slot = self._try_take_slot()
                        if slot is not None:
                            return slot
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise TimeoutError(
                            f"no download permit free within {timeout_s} s (budget {self.budget()})")
                    if self._queue[0] is waiter:
                        # Jittered so processes that backed off together do not retry together.
                        wait_s = poll_s * self._rng.uniform(0.5, 1.5)
                        poll_s = min(poll_s * 2, _MAX_POLL_S)
                    else:
                        wait_s = _QUEUED_WAKE_S  # our turn comes with a notify; this is a safety net
                    waiter.wait(wait_s if remaining is None else min(wait_s, remaining))
            finally:
                self._queue.remove(waiter)
                self._wake_head()  # the next thread in line may try now

    def _wake_head(self) -> None:
        # Called holding self._mutex.
        if self._queue:
            self._queue[0].notify()

    def _try_take_slot(self) -> int | None:
        self._ensure_dir()
        budget = self.budget()
        for slot in range(budget):
            if slot in self._held:
                continue
            fd = os.open(self._slot_path(slot), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self._held[slot] = fd
            if self._within_budget(slot):
                return slot
            self._held.pop(slot)
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            return None
        return None

    def _within_budget(self, slot: int) -> bool:
        """Called holding a fresh slot: may we keep it?

        The budget may have shrunk since we read it, and permits taken under a larger budget
        (slots at or above the current one) are still in flight: they count against the new
        budget, so while any is held we count every holder, ourselves included. Two acquirers
        racing here both see each other and may both back off (and retry), never both stay.
        """
        budget = self.budget()
        if slot >= budget:
            return False
        high = [slot for slot in self._slot_numbers() if slot >= budget]
        held_high = self._count_held(high)
        if held_high == 0:
            return True
        return held_high + self._count_held(range(budget)) <= budget

    def _count_held(self, slots: Iterable[int]) -> int:
        count = 0
        for slot in slots:
            if slot in self._held:
                count += 1
                continue
            try:
                fd = os.open(self._slot_path(slot), os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                count += 1
            else:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
        return count

    def _release_slot(self, slot: int) -> None:
        self._check_process()
        with self._mutex:
            fd = self._held.pop(slot, None)
            if fd is not None:
                # Unlock explicitly: a child forked while we held it shares this open file, and
                # closing our descriptor alone would leave the lock held until the child exits.
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            self._wake_head()

    def _ensure_dir(self) -> Path:
        if not self._dir_ready:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._dir_ready = True
        return self.directory

    def _slot_path(self, slot: int) -> Path:
        return self.directory / f"slot-{slot:04d}.lock"

    def _slot_numbers(self) -> list[int]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for m in map(_SLOT_RE.match, names) if m)

    def __getstate__(self) -> dict[str, Any]:
        return {"directory": self.directory, "default_budget": self.default_budget}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.directory = state["directory"]
        self.default_budget = state["default_budget"]
        self._reset_process_state()

    def __repr__(self) -> str:
        return f"NodePermits(directory={str(self.directory)!r}, budget={self.budget()})"


def _check_budget(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PERMITS:
        raise ValueError(f"{name} must be an int in 1..{MAX_PERMITS}, got {value!r}.")
    return value


def _write_atomically(path: Path, text: str) -> None:
    # A unique temporary name per writer, then rename: readers see the old or the new content,
    # never a torn write, and concurrent writers never clobber each other's temporary file.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
