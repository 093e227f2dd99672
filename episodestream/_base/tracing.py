"""Chrome trace events for the streaming pipeline, readable by Perfetto and chrome://tracing.

Call sites stay in the code permanently::

    with trace_span("decode", cat="video", file=name, frames=n):
        ...
    trace_instant("admit", cat="pool", episode=e)

and cost one attribute check (plus the Python call) while tracing is off, which is the default.

Process-wide state. A tracer is only useful if every process of a run writes to the same file
without being handed an object, so this module keeps exactly one piece of process-wide state, the
``_Tracer`` instance ``_TRACER``. It holds the file path, the level and this process's file
descriptor. ``enable_tracer`` also exports ``EPISODESTREAM_TRACE`` (the path) and
``EPISODESTREAM_TRACE_LEVEL`` so that processes started with *spawn* (DataLoader workers,
``accelerate``) enable themselves at their first trace call; processes started with *fork* inherit
the enabled state and reopen the file when they notice their pid changed. The environment is read
once per process, at the first trace call, never at import; a path there that cannot be opened
(its folder missing) turns tracing off in that process with one line on stderr. Call ``enable_tracer`` and
``disable_tracer`` before starting and after stopping the loaders, not while they run. An I/O error
while writing (disk full) stops tracing in that process with a message; it never raises.

File format: the JSON array format. The file appears already holding ``[`` (written to a private
file, then ``link()``-ed into place, which like ``O_EXCL`` lets exactly one creator win); every
event is one line ending in ``,\\n`` written by a single ``os.write`` on an ``O_APPEND``
descriptor, which local filesystems apply atomically, so several processes can write at once
without interleaving. The closing ``]`` is optional in this format and never written (no process
knows it is the last one); ``load_trace`` tolerates its absence and the trailing comma.

Timestamps are microseconds since the Unix epoch (``time.time_ns``) so events from different
processes on one machine line up.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, Literal

from episodestream._base.options import check_choice

TRACE_ENV = "EPISODESTREAM_TRACE"
TRACE_LEVEL_ENV = "EPISODESTREAM_TRACE_LEVEL"

TraceLevel = Literal["basic", "detailed"]
# "basic": admit/evict/download/decode/batch; "detailed" adds per-sample and per-read spans.
_LEVELS = {"basic": 0, "detailed": 1}
# default=str: a Path or numpy scalar in the args must not make tracing crash the run.
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)

__all__ = [
    "TRACE_ENV",
    "TRACE_LEVEL_ENV",
    "disable_tracer",
    "enable_tracer",
    "load_trace",
    "set_process_name",
    "trace_counter",
    "trace_instant",
    "trace_span",
    "tracer_enabled",
]


class _NullSpan:
    """What ``trace_span`` returns while tracing is off: a context manager that does nothing."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> None:
        return None


_NULL_SPAN = _NullSpan()


class _Span:
    __slots__ = ("_tracer", "_name", "_cat", "_args", "_start_ns")

    def __init__(self, tracer: _Tracer, name: str, cat: str, args: dict[str, Any]) -> None:
        self._tracer, self._name, self._cat, self._args = tracer, name, cat, args
        self._start_ns = 0

    def __enter__(self) -> None:
        self._start_ns = time.time_ns()

    def __exit__(self, exc_type, exc, tb) -> None:
        end_ns = time.time_ns()
        if exc_type is not None:
            # A span cut short by an exception is the one you want to find in the timeline.
            self._args["error"] = exc_type.__name__
        self._tracer.write({"name": self._name, "cat": self._cat, "ph": "X",
                            "ts": self._start_ns / 1000, "dur": (end_ns - self._start_ns) / 1000,
                            "args": self._args})


class _Tracer:
    """This process's view of the trace file.

    ``known_off`` is the one attribute the hot path reads. It starts False, meaning "not yet
    decided in this process": the first trace call then takes the slow path, reads the
    environment and either enables tracing or sets ``known_off`` so later calls return at once.
    ``fd_pid`` records which process opened ``fd``: a forked child sees another pid and reopens.
    """

    def __init__(self) -> None:
        self.known_off = False
        self.decided = False
        self.path: str | None = None
        self.level_rank = 0
        self.fd: int | None = None
        self.fd_pid = 0
        self.process_name: tuple[int, str] | None = None  # (pid that chose it, name)
        # Reentrant: deciding from the environment enables, which opens, under the same lock.
        self.lock = threading.RLock()

    def after_fork_in_child(self) -> None:
        # The parent's lock may have been held by a thread that does not exist in the child.
        self.lock = threading.RLock()

    # -- switching on and off ------------------------------------------------------------------

    def enable(self, path: str, level: str) -> None:
        self.close()
        self.path, self.level_rank = path, _LEVELS[level]
        self.decided, self.known_off = True, False
        self._fd_for_this_process()  # create the file now, before any worker is started

    # Why the environment, and not state on an object: processes started with *spawn*
    # (DataLoader workers with a spawn context, ranks of `accelerate launch` / torchrun started
    # after this call) receive no object from this process; what they inherit is the environment.
    # So the tracer, which owns the setting, also owns its export: it writes the two variables
    # when enabled from code and removes them when disabled, and nothing else writes them.
    @staticmethod
    def export_to_children(path: str, level: str) -> None:
        os.environ[TRACE_ENV] = path
        os.environ[TRACE_LEVEL_ENV] = level

    @staticmethod
    def withdraw_from_children() -> None:
        os.environ.pop(TRACE_ENV, None)
        os.environ.pop(TRACE_LEVEL_ENV, None)

    def disable(self) -> None:
        self.close()
        self.path, self.decided, self.known_off = None, True, True

    def close(self) -> None:
        if self.fd is not None:
            # Also right for a descriptor inherited through fork: the child's copy is its own.
            os.close(self.fd)
        self.fd, self.fd_pid = None, 0

    def active(self, level: str) -> bool:
        """Slow path: decide from the environment if needed, then whether ``level`` is recorded."""
        if not self.decided:
            with self.lock:  # two threads of a fresh worker must not both open the file
                if not self.decided:
                    self._decide_from_environment()
        if self.known_off:
            return False
        rank = _LEVELS.get(level)
        if rank is None:
            check_choice("level", level, _LEVELS)
        return rank <= self.level_rank

    def _decide_from_environment(self) -> None:
        path = os.environ.get(TRACE_ENV, "")
        if not path:
            self.decided, self.known_off = True, True
            return
        level = os.environ.get(TRACE_LEVEL_ENV, "") or "basic"
        if level not in _LEVELS:
            valid = ", ".join(repr(name) for name in _LEVELS)
            raise ValueError(f"Environment variable {TRACE_LEVEL_ENV}={level!r} is invalid. "
                             f"Supported values are {valid}.")
        try:
            self.enable(path, level)
        except OSError as error:
            # A variable set by hand (or inherited by a job on another machine) may name a folder
            # that does not exist here; a trace is never worth ending a training run for.
            self.disable()
            print(f"episodestream: tracing is off in process {os.getpid()}: {TRACE_ENV}={path!r} cannot be "
                  f"opened ({type(error).__name__}: {error.strerror or error}); create its folder or unset "
                  f"{TRACE_ENV}", file=sys.stderr)

    # -- writing -------------------------------------------------------------------------------

    def write(self, event: dict[str, Any]) -> None:
        try:
            fd = self._fd_for_this_process()
            event["pid"] = self.fd_pid
            event["tid"] = threading.get_native_id()
            os.write(fd, (_ENCODER.encode(event) + ",\n").encode())
        except OSError as error:
            # A full disk or a vanished trace folder must not end a training run: stop tracing
            # in this process and say so once.
            self.known_off = True
            print(f"episodestream: tracing stopped in process {os.getpid()}: {error}", file=sys.stderr)

    def _fd_for_this_process(self) -> int:
        pid = os.getpid()
        if self.fd is not None and self.fd_pid == pid:
            return self.fd
        with self.lock:
            if self.fd is None or self.fd_pid != pid:
                self.close()
                self.fd, self.fd_pid = _open_trace_file(self.path), pid
                self._write_process_name()
        return self.fd

    def set_process_name(self, name: str) -> None:
        self.process_name = (os.getpid(), name)
        if self.fd is not None and self.fd_pid == os.getpid():
            self._write_process_name()  # the viewer keeps the last name given for a pid

    def _write_process_name(self) -> None:
        chosen = self.process_name
        # A name chosen in the parent does not describe a forked child.
        name = chosen[1] if chosen is not None and chosen[0] == self.fd_pid else _default_process_name()
        event = {"name": "process_name", "ph": "M", "pid": self.fd_pid,
                 "tid": threading.get_native_id(), "args": {"name": name}}
        os.write(self.fd, (_ENCODER.encode(event) + ",\n").encode())


def _open_trace_file(path: str) -> int:
    """Open ``path`` for appending, creating it holding ``[`` if no process has yet."""
    flags = os.O_WRONLY | os.O_APPEND
    try:
        return os.open(path, flags)
    except FileNotFoundError:
        pass
    # Create-then-write would let another rank append an event before our "[", so the "[" is
    # written to a private file first and published with link(), which like O_EXCL fails when
    # the name exists: exactly one creator wins and the file never appears without its "[".
    private = f"{path}.{os.getpid()}.{threading.get_native_id()}.tmp"
    fd = os.open(private, flags | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, b"[\n")
        try:
            os.link(private, path)
        except FileExistsError:
            os.close(fd)
            return os.open(path, flags)
        except OSError:
            # Filesystems without hard links: plain O_EXCL, with the small window described above.
            os.close(fd)
            return _open_exclusive(path, flags)
        return fd
    finally:
        os.unlink(private)


def _open_exclusive(path: str, flags: int) -> int:
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return os.open(path, flags)
    os.write(fd, b"[\n")
    return fd


def _default_process_name() -> str:
    # Only ask torch when it is already loaded: tracing must not import it.
    data = sys.modules.get("torch.utils.data")
    info = data.get_worker_info() if data is not None else None
    if info is not None:
        return f"episodestream worker {info.id} pid {os.getpid()}"
    return f"episodestream pid {os.getpid()}"


_TRACER = _Tracer()
# Registering a hook is not work at import: nothing is read or opened until the first trace call.
os.register_at_fork(after_in_child=_TRACER.after_fork_in_child)


# -- public API --------------------------------------------------------------------------------

def enable_tracer(path: str | os.PathLike[str], level: TraceLevel = "basic") -> None:
    """Record trace events to ``path`` (created if missing, appended to otherwise).

    ``level="basic"`` records admit/evict/download/decode/batch spans; ``"detailed"`` also the
    per-sample and per-read spans. Also sets ``EPISODESTREAM_TRACE`` and
    ``EPISODESTREAM_TRACE_LEVEL`` so worker processes started later trace to the same file.
    """
    check_choice("level", level, _LEVELS)
    path = os.path.abspath(os.fspath(path))  # children may run in another working directory
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _TRACER.enable(path, level)
    _TRACER.export_to_children(path, level)


def disable_tracer() -> None:
    """Stop recording in this process and unset the variables so new workers do not trace."""
    _TRACER.disable()
    _TRACER.withdraw_from_children()


def tracer_enabled(level: TraceLevel = "basic") -> bool:
    """Whether events of ``level`` are recorded: guard for arguments that are costly to compute."""
    if _TRACER.known_off:
        return False
    return _TRACER.active(level)


def set_process_name(name: str) -> None:
    """Name this process in the timeline, e.g. "episodestream worker 1 rank 0".

    Applies to the current process only; without it a process is named by pid (and DataLoader
    worker id when torch is loaded).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}.")
    _TRACER.set_process_name(name)


def trace_span(name: str, *, cat: str = "episodestream", level: TraceLevel = "basic", **args: Any):
    """A context manager recording a complete ("X") event from enter to exit, with ``args``.

    A span left by an exception records the exception's type name as ``args["error"]``.
    """
    if _TRACER.known_off:
        return _NULL_SPAN
    if not _TRACER.active(level):
        return _NULL_SPAN
    return _Span(_TRACER, name, cat, args)


def trace_instant(name: str, *, cat: str = "episodestream", level: TraceLevel = "basic",
                  **args: Any) -> None:
    """Record a thread-scoped instant ("i") event, e.g. an episode admitted to the pool."""
    if _TRACER.known_off:
        return
    if _TRACER.active(level):
        _TRACER.write({"name": name, "cat": cat, "ph": "i", "s": "t", "ts": time.time_ns() / 1000,
                       "args": args})


def trace_counter(name: str, *, cat: str = "episodestream", level: TraceLevel = "basic",
                  **values: float) -> None:
    """Record a counter ("C") event: each keyword is one series, e.g. ``episodes=12, bytes=3e8``."""
    if _TRACER.known_off:
        return
    if _TRACER.active(level):
        _TRACER.write({"name": name, "cat": cat, "ph": "C", "ts": time.time_ns() / 1000,
                       "args": values})


def load_trace(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Parse a trace file written by this module: one event per line, ``]`` and last comma optional.

    Raises ``ValueError`` naming the line when a line is not a JSON object (a torn write).
    """
    events = []
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            text = line.strip().rstrip(",")
            if text in ("", "[", "]"):
                continue
            try:
                event = json.loads(text)
            except json.JSONDecodeError as error:
                raise ValueError(f"{os.fspath(path)} line {number} is not a trace event: {error}") from None
            if not isinstance(event, dict):
                raise ValueError(f"{os.fspath(path)} line {number} is not a trace event: {text[:80]!r}")
            events.append(event)
    return events
