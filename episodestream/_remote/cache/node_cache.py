"""A node-wide cache directory of downloaded entries, shared by every process on the node.

An entry is a file under the cache root (a whole small file, an mp4 header, or a sparse mp4 holding
one episode's span); its name is a relative path. Next to entry ``NAME`` live:

    NAME                 the complete bytes; exists only once complete (written as a temporary
                         file, then renamed into place: a reader never sees a partial file)
    NAME.tmp-<pid>-<r>   a download in progress (or left behind by a killed process)
    NAME.lock            flock(2) lock: held while an entry changes state, and for a whole download,
                         so one process per node downloads it while the others wait
    NAME.bytes           the bytes the entry takes on disk: reserved (rounded up to 4 KiB blocks)
                         before the download starts, then the complete file's allocated blocks;
                         the disk budget is the sum of these files
    NAME.refs/<marker>   one empty file per user: <host>-<pid>-<process start>-<holder>

Budget: a download that does not fit waits (at most ``wait_s``, logging while it waits) for other
users to release entries, except when pinned entries alone leave no room: pins stay until a user
removes them, so that fails at once with a ``CacheFullError`` naming what is pinned.

Counts: each ``NodeCache`` object counts, per process, the entries it acquired that were on disk
already (hits) and those it downloaded (misses, with the bytes their ``fetch`` reported):
``stats()``, what ``dataset.source_stats()`` reports.

Every change happens under ``NAME.lock``. flock locks die with their process, so a process killed
mid-download never leaves a lock held; what it leaves (a ``.tmp-`` file, a ``.bytes`` reservation,
its marker) is recognised as stale and removed by the next process that takes the lock. A marker
whose process is gone (or whose pid now belongs to a younger process) does not count as a user.
"""

from __future__ import annotations

import enum
import errno
import fcntl
import glob
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from episodestream._base.errors import CacheFullError  # defined outside remote/ so `episodestream` exports it cheaply
from episodestream._remote.transport.process import process_state

logger = logging.getLogger("episodestream.remote")

DEFAULT_WAIT_S = 300.0  # how long a download waits for cache space (EPISODESTREAM_CACHE_WAIT_S)
_WAIT_LOG_AFTER_S = 5.0  # a wait this long is logged (short ones are a tight budget working), ...
_WAIT_LOG_EVERY_S = 30.0  # ... and again this often
_PINS_SHOWN = 5  # sources named in a message, the largest first
_POLL_S = (0.005, 0.2)  # lock polling: first and longest sleep (doubling in between)
_BUDGET_LOCK = ".budget.lock"
# The bytes reserved on the node, as the last walk of the cache found them plus what reservations
# and deletions changed since ("<bytes> <time of the walk>"), written under the budget lock: a
# download checks it rather than walking every entry's ``NAME.bytes`` (a wide pool keeps thousands;
# a walk per download halved a remote stream's rate under a cache_limit). A ledger older than
# ``_LEDGER_FRESH_S`` is walked again, so what a killed process or an older version left uncounted
# is counted within that time; one absent or unreadable is walked at once.
_LEDGER = ".budget.used"
_LEDGER_FRESH_S = 5.0
_BLOCK_BYTES = 4096  # reservations round up to filesystem blocks
_SUFFIXES = (".lock", ".bytes", ".refs")


# The marker of a pin (``NodeCache.pin``): shaped like host-pid-start-holder, never a live process's.
PIN_MARKER = "pinned-0-0-pin"


class EntryState(enum.Enum):
    """Where an entry stands on this node.

    Transitions (all under the entry's lock)::

        REMOTE   -> FETCHING   a user acquires it and nobody has it: the space is reserved, the
                               download starts into a temporary file
        FETCHING -> LOCAL      the temporary file is complete and renamed into place
        FETCHING -> REMOTE     the download failed (temporary file and reservation removed), or
                               its process died (the next user to take the lock cleans up)
        LOCAL    -> REMOTE     the last user released it, a pin counting as a user until unpinned
                               (or, with no live user left, the budget
                               needed its space): file, reservation and markers are deleted
    """

    REMOTE = "remote"
    FETCHING = "fetching"
    LOCAL = "local"


@dataclass(frozen=True)
class CacheEntry:
    """One entry of a cache directory, as ``episodestream cache ls`` shows it."""

    name: str  # relative to the cache root: "<source key>/<kind>/<path>"
    state: EntryState
    size_bytes: int  # on disk (what the budget counts)
    users: int  # live processes holding it (the pin not counted)
    pinned: bool

    @property
    def source(self) -> str:
        return self.name.split("/", 1)[0]

    @property
    def file(self) -> str:
        return self.name.split("/", 1)[1] if "/" in self.name else ""


@dataclass(frozen=True)
class CacheStats:
    """One process's acquisitions through one ``NodeCache``: entries found on disk (``hits``),
    entries it downloaded (``misses``) and the bytes their downloads reported (``miss_bytes``)."""

    hits: int = 0
    misses: int = 0
    miss_bytes: int = 0


class _Counts:
    """``CacheStats`` being counted in one process (rebuilt after fork or unpickling: ``_remote.transport.process``)."""

    def __init__(self, cache: NodeCache) -> None:  # made by ``process_state(cache, _Counts)``
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.hits = self.misses = self.miss_bytes = 0


def _process_start(pid: int) -> str:
    """A token that tells a process from a later one with the same pid (Linux: start time)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            fields = file.read().rsplit(b")", 1)[1].split()
        return fields[19].decode()  # field 22, counted after the command name
    except (OSError, IndexError):
        return "0"


def _process_alive(pid: int, start: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            fields = file.read().rsplit(b")", 1)[1].split()
        if fields[0] == b"Z":  # killed but not reaped yet: it holds nothing any more
            return False
        return start == "0" or fields[19].decode() == start
    except (OSError, IndexError):
        return True


class NodeCache:
    """The cache under ``root`` with an optional disk budget (``limit_bytes``) for all of it.

    ``timeout_s`` bounds waits for an entry's lock (another process downloading it), ``wait_s``
    waits for disk space. Stateless apart from its settings and this process's counts (``stats``),
    which are left behind when it pickles into DataLoader workers or forks: each process counts
    its own.
    """

    def __init__(self, root: str | os.PathLike, *, limit_bytes: int | None = None,
                 timeout_s: float = 600.0, wait_s: float = DEFAULT_WAIT_S) -> None:
        self.root = Path(root)
        self.limit_bytes = limit_bytes
        self.timeout_s = timeout_s
        self.wait_s = wait_s
        self._host = socket.gethostname().replace("-", "_")
        self._me = (-1, "0")  # (pid, process start) of the process that made the last marker
        self._process: _Counts | None = None  # this process's counts, made on first use

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_process": None}

    # -- counts ----------------------------------------------------------------------------------

    def stats(self) -> CacheStats:
        """This process's hits, misses and miss bytes through this object (see the module docstring)."""
        counts = process_state(self, _Counts)
        with counts.lock:
            return CacheStats(counts.hits, counts.misses, counts.miss_bytes)

    def _count(self, *, hit: bool, miss_bytes: int = 0) -> None:
        """Count an acquisition: an entry found on disk (``hit``), or one downloaded (``miss_bytes``)."""
        counts = process_state(self, _Counts)
        with counts.lock:
            if hit:
                counts.hits += 1
            else:
                counts.misses += 1
                counts.miss_bytes += miss_bytes

    # -- users -----------------------------------------------------------------------------------

    def marker(self, holder: str) -> str:
        """The marker naming ``holder`` (any string without '-') in this process."""
        pid = os.getpid()
        if self._me[0] != pid:
            self._me = (pid, _process_start(pid))
        return f"{self._host}-{pid}-{self._me[1]}-{holder}"

    def _live(self, marker: str) -> bool:
        if marker == PIN_MARKER:
            return True  # a pin (``episodestream prewarm``) is a user that never dies
        host, pid, start, _ = marker.split("-", 3)
        if host != self._host:
            return True  # another machine's process: we cannot tell, so it counts
        return _process_alive(int(pid), start)

    def _users(self, name: str) -> list[str]:
        try:
            markers = os.listdir(self._path(name + ".refs"))
        except FileNotFoundError:
            return []
        return [m for m in markers if m.count("-") >= 3]

    def refcount(self, name: str) -> int:
        """Live users of an entry (markers of dead processes do not count)."""
        return sum(self._live(m) for m in self._users(name))

    def state(self, name: str) -> EntryState:
        if self._path(name).exists():
            return EntryState.LOCAL
        if self._path(name + ".bytes").exists():
            return EntryState.FETCHING
        return EntryState.REMOTE

    # -- paths and locks -------------------------------------------------------------------------

    def _path(self, name: str) -> Path:
        return self.root / name

    def path(self, name: str) -> Path:
        return self._path(name)

    def name_of(self, path: str | os.PathLike) -> str:
        """The entry name of a path ``path()`` gave (the inverse of ``path``)."""
        return Path(path).relative_to(self.root).as_posix()

    @contextmanager
    def _locked(self, lock_path: Path, deadline: float, what: str) -> Iterator[int]:
        """Hold an exclusive flock on ``lock_path``, polling until ``deadline``.

        Lock files are deleted with their entry, so after locking we check the path still names
        the file we locked; if it was deleted (or replaced) meanwhile, we start over.
        """
        sleep_s = _POLL_S[0]
        while True:
            try:
                lock_path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except (FileNotFoundError, FileExistsError):
                # Another entry's _delete pruned the folder (empty then) between mkdir and open, or
                # inside mkdir: os.mkdir found the folder there, and pathlib's exist_ok check then
                # found it gone and raised FileExistsError. Make it again; only a file standing
                # where the folder should be is an error.
                if lock_path.parent.exists() and not lock_path.parent.is_dir():
                    raise
                continue
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except OSError as error:
                        if error.errno not in (errno.EAGAIN, errno.EACCES):
                            raise
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"Waited {self.timeout_s:.0f} s for the lock on {what} "
                                           f"({lock_path}); another process holds it (a slow download?).")
                    time.sleep(sleep_s)
                    sleep_s = min(_POLL_S[1], sleep_s * 2)
                try:
                    same = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    yield fd
                    return
            finally:
                os.close(fd)  # also releases the flock

    # -- acquire / release -----------------------------------------------------------------------

    def acquire(self, name: str, holder: str, fetch: Callable[[Path], int | None], *, size_bytes: int,
                what: str | None = None, stop: Callable[[], bool] | None = None) -> Path:
        """Register ``holder`` as a user of ``name`` and return its local path, downloading it first
        (``fetch(temporary_path)`` writes the complete file and returns the bytes it downloaded for
        it, counted in ``stats().miss_bytes``; None counts as 0) when no process on the node has it.

        ``size_bytes`` is what the entry will occupy on disk (reserved against the budget before
        the download). Concurrent acquirers of one entry wait for the one download. ``stop()``
        true ends a wait for space early (the caller no longer wants the entry).
        """
        what = what or name
        deadline = time.monotonic() + self.timeout_s
        path = self._path(name)
        marker = self.marker(holder)
        with self._locked(self._path(name + ".lock"), deadline, what):
            refs = self._path(name + ".refs")
            refs.mkdir(parents=True, exist_ok=True)
            (refs / marker).touch()
            if path.exists():
                self._count(hit=True)
                return path
            try:
                self._remove_partial(name)  # FETCHING left by a dead process
                reserved = self._reserve(name, size_bytes, deadline, what, stop)
                tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
                try:
                    downloaded = fetch(tmp)
                    os.replace(tmp, path)
                    # From here on the budget counts what the file really takes on disk (a
                    # sparse file takes its written blocks only).
                    taken = os.stat(path).st_blocks * 512
                    if self._ledger_kept():
                        with self._locked(self.root / _BUDGET_LOCK, deadline, "the cache budget"):
                            self._path(name + ".bytes").write_text(str(taken))
                            self._ledger_change(taken - reserved)
                    else:
                        self._path(name + ".bytes").write_text(str(taken))
                finally:
                    if tmp.exists():
                        tmp.unlink()
            except BaseException:
                self._drop_marker(name, marker)
                if not self._path(name).exists():
                    self._delete(name)
                raise
            self._count(hit=False, miss_bytes=downloaded or 0)
            return path

    def release(self, name: str, holder: str) -> bool:
        """Remove ``holder``'s use of ``name``; the last live user deletes it. True when deleted."""
        deadline = time.monotonic() + self.timeout_s
        with self._locked(self._path(name + ".lock"), deadline, name):
            self._drop_marker(name, self.marker(holder))
            if any(self._live(m) for m in self._users(name)):
                return False
            self._delete(name)
            return True

    def _drop_marker(self, name: str, marker: str) -> None:
        try:
            (self._path(name + ".refs") / marker).unlink()
        except FileNotFoundError:
            pass

    def _remove_partial(self, name: str) -> None:
        path = self._path(name)
        reservation = self._path(name + ".bytes")
        # A ``.tmp-`` file is written only after its reservation and renamed before the reservation
        # is rewritten, and the lock (held) keeps downloads of one entry apart: a reservation
        # without the complete file is the only sign of one left by a dead process. Looked for only
        # then, since listing the folder (every span of one mp4, thousands in a wide pool) on
        # every acquire and delete cost more than the stream's own bookkeeping.
        if reservation.exists() and not path.exists() and path.parent.is_dir():
            for stale in path.parent.glob(f"{glob.escape(path.name)}.tmp-*"):
                stale.unlink(missing_ok=True)
        reservation.unlink(missing_ok=True)

    def _delete(self, name: str, *, ledger: bool = True) -> None:
        """Delete an entry and its bookkeeping (called under its lock); ``ledger``: take its bytes
        off the budget's ledger (False where the caller holds the budget lock and counts them, or
        leaves them to the next walk)."""
        path = self._path(name)
        reserved = self._reserved_bytes(name) if ledger and self._ledger_kept() else 0
        self._remove_partial(name)
        if reserved:
            with self._locked(self.root / _BUDGET_LOCK, time.monotonic() + self.timeout_s, "the cache budget"):
                self._ledger_change(-reserved)
        path.unlink(missing_ok=True)
        refs = self._path(name + ".refs")
        if refs.is_dir():
            for marker in os.listdir(refs):
                (refs / marker).unlink(missing_ok=True)
            refs.rmdir()
        self._path(name + ".lock").unlink(missing_ok=True)
        parent = path.parent
        while parent != self.root and self.root in parent.parents:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    # -- disk budget -----------------------------------------------------------------------------

    def _reservations(self) -> Iterator[tuple[str, int]]:
        """(entry name, bytes) of every LOCAL or FETCHING entry under the root."""
        for folder, _, files in os.walk(self.root):
            for file in files:
                if file.endswith(".bytes"):
                    full = os.path.join(folder, file)
                    try:
                        with open(full) as handle:
                            size = int(handle.read() or 0)
                    except (OSError, ValueError):
                        continue
                    yield os.path.relpath(full, self.root)[:-len(".bytes")], size

    def usage_bytes(self) -> int:
        return sum(size for _, size in self._reservations())

    def prune(self) -> list[str]:
        """Delete what no live process uses: entries whose users all died (killed or exited without
        releasing) and downloads their process did not finish. Returns the names deleted."""
        return [name for name, _ in list(self._reservations())
                if not any(self._live(m) for m in self._users(name)) and self._try_delete_unused(name)]

    # -- pins and listing ------------------------------------------------------------------------

    def is_pinned(self, name: str) -> bool:
        return (self._path(name + ".refs") / PIN_MARKER).exists()

    def pin(self, name: str) -> None:
        """Pin a LOCAL entry: a user that never dies (``PIN_MARKER``), so it survives releases,
        ``prune()`` and the disk budget until ``unpin``. The caller must hold it (acquired, not
        released), so no other process can delete it between the check and the marker; release it
        afterwards as usual."""
        if self.state(name) is not EntryState.LOCAL:
            raise FileNotFoundError(f"Cannot pin {name!r} in {self.root}: it is not in the cache.")
        (self._path(name + ".refs") / PIN_MARKER).touch()

    def unpin(self, name: str) -> bool:
        """Remove the pin; the entry stays while live users hold it. True when it was pinned."""
        try:
            (self._path(name + ".refs") / PIN_MARKER).unlink()
            return True
        except FileNotFoundError:
            return False

    def list_entries(self) -> list[CacheEntry]:
        """Every LOCAL or FETCHING entry under the root (each has its ``NAME.bytes``), sorted."""
        found = []
        for name, size_bytes in self._reservations():
            name = name.replace(os.sep, "/")
            pinned = self.is_pinned(name)
            found.append(CacheEntry(name, self.state(name), size_bytes, self.refcount(name) - pinned, pinned))
        return sorted(found, key=lambda e: e.name)

    def pinned(self) -> dict[str, tuple[int, int]]:
        """Pinned entries by source (the cache folder their names start with): (entries, bytes)."""
        found: dict[str, tuple[int, int]] = {}
        for name, size in self._reservations():
            if (self._path(name + ".refs") / PIN_MARKER).exists():
                source = name.replace(os.sep, "/").split("/", 1)[0]
                entries, total = found.get(source, (0, 0))
                found[source] = (entries + 1, total + size)
        return found

    def _reserve(self, name: str, size_bytes: int, deadline: float, what: str,
                 stop: Callable[[], bool] | None = None) -> int:
        """Reserve ``size_bytes`` (rounded up to blocks, returned) for ``name`` within the limit,
        waiting for room as the module docstring says."""
        reservation = self._path(name + ".bytes")
        size_bytes = -(-size_bytes // _BLOCK_BYTES) * _BLOCK_BYTES  # files take whole blocks
        limit = self.limit_bytes
        if limit is not None and size_bytes > limit:
            raise CacheFullError(f"{what} needs {size_bytes} bytes of cache, more than cache_limit="
                                 f"{limit} bytes allows in all.")
        start_s = time.monotonic()
        wait_until = start_s + self.wait_s
        log_at = start_s + min(_WAIT_LOG_AFTER_S, self.wait_s / 2)
        sleep_s = _POLL_S[0]
        while True:
            with self._locked(self.root / _BUDGET_LOCK, max(deadline, wait_until), "the cache budget"):
                if limit is None or self._fits(size_bytes):
                    self._ledger_change(size_bytes)  # first: a crash in between over-counts, never under
                    reservation.write_text(str(size_bytes))
                    return size_bytes
                used, pins = self.usage_bytes(), self.pinned()
            pinned_bytes = sum(total for _, total in pins.values())
            full = (f"cache_limit={limit} bytes ({limit / 1e6:.1f} MB) of the cache {self.root} is full "
                    f"({used} bytes in use, {pinned_bytes} of them pinned{describe_pins(pins, ': ')}) and {what} "
                    f"needs {size_bytes} more")
            if pinned_bytes + size_bytes > limit:
                # Pins never go by themselves: waiting for releases cannot make room.
                raise CacheFullError(f"{full}; pinned entries stay until unpinned, so waiting cannot help. "
                                     f"{unpin_hint(self.root)}, or raise cache_limit.")
            now = time.monotonic()
            if now > wait_until:
                raise CacheFullError(
                    f"{full}; waited {self.wait_s:g} s (EPISODESTREAM_CACHE_WAIT_S) for other users to release "
                    f"theirs. Raise cache_limit, or lower episode_pool_size, prefetch_episodes or the number of "
                    f"DataLoader workers on this node" + (f"; or unpin: {unpin_hint(self.root)}" if pins else "")
                    + ".")
            if stop is not None and stop():
                raise CacheFullError(f"{full}; stopped waiting: {what} is no longer wanted.")
            if now >= log_at:
                logger.warning("%s; waiting for other users to release theirs (%.0f s so far, at most %g s: "
                               "EPISODESTREAM_CACHE_WAIT_S).", full, now - start_s, self.wait_s)
                log_at = now + _WAIT_LOG_EVERY_S
            time.sleep(sleep_s)
            sleep_s = min(_POLL_S[1], sleep_s * 2)

    def _fits(self, size_bytes: int) -> bool:
        """Whether ``size_bytes`` fit now (under the budget lock), by the ledger where it is fresh
        and says so, else by a walk of every reservation, after deleting entries that no live
        process uses (left behind by killed processes), oldest first."""
        assert self.limit_bytes is not None
        used = self._ledger_used()
        if used is not None and used + size_bytes <= self.limit_bytes:
            return True
        walked_at = time.time()
        held = list(self._reservations())
        used = sum(size for _, size in held)
        if used + size_bytes <= self.limit_bytes:
            self._write_ledger(used, walked_at)
            return True
        unused = sorted((name for name, _ in held if not any(self._live(m) for m in self._users(name))),
                        key=lambda n: self._mtime(n))
        sizes = dict(held)
        fits = False
        for name in unused:
            if self._try_delete_unused(name):  # under the budget lock: counted here, not in the ledger
                used -= sizes[name]
                if used + size_bytes <= self.limit_bytes:
                    fits = True
                    break
        self._write_ledger(used, walked_at)
        return fits

    def _reserved_bytes(self, name: str) -> int:
        try:
            return int(self._path(name + ".bytes").read_text() or 0)
        except (OSError, ValueError):
            return 0

    def _ledger_kept(self) -> bool:
        """Whether a process with a limit keeps the ledger on this node: where none does, a
        completion or a release takes no budget lock for it. One that starts keeping it meanwhile
        misses that change until its next walk (at most ``_LEDGER_FRESH_S`` later)."""
        return (self.root / _LEDGER).exists()

    def _ledger_used(self) -> int | None:
        """The ledger's bytes, where its walk is fresh (under the budget lock); None: walk."""
        try:
            used, walked_at = (self.root / _LEDGER).read_text().split()
            if 0 <= time.time() - float(walked_at) <= _LEDGER_FRESH_S:
                return int(used)
        except (OSError, ValueError):
            pass
        return None

    def _write_ledger(self, used: int, walked_at: float) -> None:
        (self.root / _LEDGER).write_text(f"{max(0, used)} {walked_at!r}")

    def _ledger_change(self, delta: int) -> None:
        """Add ``delta`` bytes to the ledger (under the budget lock); none yet: the next walk counts them."""
        if not delta:
            return
        try:
            used, walked_at = (self.root / _LEDGER).read_text().split()
            self._write_ledger(int(used) + delta, float(walked_at))
        except (OSError, ValueError):
            pass

    def _mtime(self, name: str) -> float:
        try:
            return self._path(name + ".bytes").stat().st_mtime
        except FileNotFoundError:
            return 0.0

    def _try_delete_unused(self, name: str) -> bool:
        lock_path = self._path(name + ".lock")
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:
            return False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False  # someone is using or downloading it right now
            try:
                if os.stat(lock_path).st_ino != os.fstat(fd).st_ino:
                    return False  # deleted and made anew meanwhile: its new user holds the new lock
            except FileNotFoundError:
                return False
            if any(self._live(m) for m in self._users(name)):
                return False
            # Called under the budget lock by _fits, which counts it, and by prune, whose deletions
            # the ledger over-counts until its next walk: never less than is on disk.
            self._delete(name, ledger=False)
            return True
        finally:
            os.close(fd)


def describe_pins(pins: dict[str, tuple[int, int]], prefix: str = "") -> str:
    """'12 entries (1.2 MB) of <source key>, ...' for ``NodeCache.pinned()``; '' when nothing is pinned."""
    if not pins:
        return ""
    largest = sorted(pins.items(), key=lambda item: (-item[1][1], item[0]))
    shown = ", ".join(f"{entries} entries ({total / 1e6:.2f} MB) of {source}"
                      for source, (entries, total) in largest[:_PINS_SHOWN])
    more = len(largest) - _PINS_SHOWN
    return prefix + shown + (f" and {more} more sources" if more > 0 else "")


def unpin_hint(root: Path) -> str:
    return (f"Unpin with `episodestream cache unpin --cache-dir {root}` (--source KEY for one source; "
            f"`episodestream cache ls` lists them)")


def release_all(cache: NodeCache, holder: str, names: set[str] | dict[str, int]) -> None:
    """Release ``holder``'s use of every entry in ``names`` (a set or dict, emptied afterwards);
    a weakref finalizer's job, so errors are swallowed (a later ``prune`` cleans up)."""
    for name in sorted(names):
        try:
            cache.release(name, holder)
        except OSError:
            pass
    names.clear()
