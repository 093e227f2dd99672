"""``FileView``: one remote mp4 as one consumer's decoders see it, its pooled episodes' spans together.

Why: each pooled episode's bytes are a span file of their own in the node cache (shared by the node's
consumers, counted against ``cache_limit``), and a decoder opened on each span file costs a decoder's
memory per pooled episode and camera (docs/benchmarks.md: the decoders, not the rows or the disk,
bounded the remote pool). A view serves reads of the whole mp4 from its header and whichever span
file holds the bytes asked for, so one decoder per source file reads every pooled episode of it, as
on a local disk. What it serves is always the file's own bytes or zeros (a hole: bytes no pooled
episode needs).

A decoder buffers what it read (FFmpeg reads ahead of the packet it needs), so zeros it read where a
span arrives later would stay in its buffer. Two rules keep that from reaching a frame: a read never
crosses from one region (the header, a span, a hole) into the next, so a buffer of span bytes holds
nothing else; and a span that arrives over bytes a decoder read as a hole starts a new generation of
the view's name, so the decode layer opens a new decoder (``served``: the name carries it). Decoders
read holes only at their open (FFmpeg probes the first samples), so this is rare.
"""

from __future__ import annotations

import bisect
import io
import os
import threading

from episodestream._format.mp4 import Mp4Header, VideoTrack
from episodestream._format.served_video import ServedVideo

# A read in a hole returns at most this many zeros: a decoder's buffer then holds zeros only where it
# read (FFmpeg probes a few samples at open), and only a span arriving over those bytes starts a new
# generation, not every span after a hole read that ran to the next region.
_HOLE_READ_BYTES = 512


class FileView:
    """One source mp4 (``file_size`` bytes, ``header``) and the spans of it a consumer holds."""

    def __init__(self, name: str, header: Mp4Header, track: VideoTrack) -> None:
        self._name = name
        self._header = header
        self._track = track
        self._header_starts = [offset for offset, _ in header.regions]
        self._lock = threading.Lock()
        self._spans: list[tuple[int, int, str]] = []  # (start, end, span file), sorted
        self._held: dict[tuple[int, int, str], int] = {}  # how many admissions hold each
        self._longest = 0
        self._generation = 0
        self._holes_read: list[tuple[int, int]] = []  # since the generation began
        self._names: list[str] = []  # served in this generation (one name)
        self._superseded: list[str] = []  # served in earlier ones, whose decoders are not closed yet
        self._served: ServedVideo | None = None  # this generation's (asked for at every sample)

    def add(self, start: int, end: int, path: str) -> None:
        """Serve bytes ``[start, end)`` from ``path`` (a sparse copy holding them at their offsets)."""
        span = (start, end, path)
        with self._lock:
            count = self._held.get(span, 0)
            self._held[span] = count + 1
            if count:
                return
            bisect.insort(self._spans, span)
            self._longest = max(self._longest, end - start)
            if any(a < end and start < b for a, b in self._holes_read):
                self._generation += 1
                self._holes_read = []
                self._superseded.extend(self._names)
                self._names = []
                self._served = None

    def remove(self, start: int, end: int, path: str) -> None:
        """One holder of the span let it go: once none holds it, its bytes are a hole again."""
        span = (start, end, path)
        with self._lock:
            count = self._held.get(span, 0) - 1
            if count > 0:
                self._held[span] = count
                return
            self._held.pop(span, None)
            at = bisect.bisect_left(self._spans, span)
            if at < len(self._spans) and self._spans[at] == span:
                del self._spans[at]

    @property
    def empty(self) -> bool:
        with self._lock:
            return not self._spans

    def served(self) -> ServedVideo:
        """The name a decoder of the view is opened by (and kept under) in this generation."""
        with self._lock:
            if self._served is None:
                name = f"{self._name}.{self._generation}"
                self._names.append(name)
                self._served = ServedVideo(name, open_bytes=lambda: _ViewReader(self), track=self._track)
            return self._served

    def names(self) -> list[str]:
        """Every name ``served`` gave whose decoders were not closed (``superseded``)."""
        with self._lock:
            names, self._names, self._superseded = self._superseded + self._names, [], []
            return names

    def superseded(self) -> list[str]:
        """The names of earlier generations not given out before: no sample asks for them again."""
        with self._lock:
            names, self._superseded = self._superseded, []
            return names

    @property
    def file_size(self) -> int:
        return self._header.file_size

    def read_at(self, position: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``position``, never past the end of the region it lies in."""
        size = min(size, self._header.file_size - position)
        if size <= 0:
            return b""
        at = bisect.bisect_right(self._header_starts, position) - 1
        if at >= 0:
            offset, data = self._header.regions[at]
            if position < offset + len(data):
                return data[position - offset:position - offset + size]
        if at + 1 < len(self._header_starts):
            # Not past the next header region: a span file holds its own (cut) moov there.
            size = min(size, self._header_starts[at + 1] - position)
        with self._lock:
            found = self._covering(position)
            if found is None:
                after = self._next_start(position)
                size = min(size, after - position, _HOLE_READ_BYTES)
                self._holes_read.append((position, position + size))
                return bytes(size)
        _, end, path = found
        try:
            with open(path, "rb") as file:
                return os.pread(file.fileno(), min(size, end - position), position)
        except FileNotFoundError:  # let go of meanwhile (its episode left the pool): a hole now
            with self._lock:
                self._holes_read.append((position, position + 1))
            return bytes(1)

    def _covering(self, position: int) -> tuple[int, int, str] | None:
        """The span holding ``position`` that reaches furthest (under the lock)."""
        best = None
        at = bisect.bisect_right(self._spans, (position, float("inf"), "")) - 1
        while at >= 0 and self._spans[at][0] > position - self._longest:
            span = self._spans[at]
            if span[1] > position and (best is None or span[1] > best[1]):
                best = span
            at -= 1
        return best

    def _next_start(self, position: int) -> int:
        """Where the next region (a header region or a span) after ``position`` starts (under the lock)."""
        starts = [self._header.file_size]
        at = bisect.bisect_right(self._header_starts, position)
        if at < len(self._header_starts):
            starts.append(self._header_starts[at])
        at = bisect.bisect_right(self._spans, (position, float("inf"), ""))
        if at < len(self._spans):
            starts.append(self._spans[at][0])
        return min(starts)


class _ViewReader(io.RawIOBase):
    """A decoder's file-like over a ``FileView``: its own position, the view's bytes."""

    def __init__(self, view: FileView) -> None:
        self._view = view
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = self._view.file_size - self._position
        data = self._view.read_at(self._position, size)
        self._position += len(data)
        return data

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def, override]
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._view.file_size}[whence]
        self._position = base + offset
        return self._position

    def tell(self) -> int:
        return self._position
