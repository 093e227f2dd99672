"""``GopPairs``: the other frame of a GOP pair, decoded with the one asked for and kept for its turn.

Why: a shuffled epoch asks for single frames at random, and on LeRobot's encoding (AV1, a keyframe
every other frame, each episode starting on one) a frame that is not a keyframe costs its
keyframe's decode too: two frames of a GOP asked for apart cost ~1.9x the two in one call
(docs/benchmarks.md, "On Ray Data"). The schedule emits an episode's frames 2q and 2q+1 at two
consecutive emits of that episode (``_plan.sampling``), so the frame asked for first brings its
mate into the same decoder call, where it costs little, and the mate is kept here until it is asked
for, then served without a decode. A kept frame is the decoder's own output for the same file and
time, so every sample is the same value either way.

Only what pays is kept: a mate in the same GOP (from the file's sample table; never with B-frames,
whose decode order differs), of the first frame of its pair (the second's mate was emitted
already), while the kept frames fit ``budget_bytes``. One per consumer, shared by its decode threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch

from episodestream._format.mp4 import Mp4LayoutError, VideoTrack
from episodestream._sample.video.backends import video_track

# A consumer's kept frames at most: a pair's two frames are one episode's consecutive emits, so a
# pool of P episodes keeps up to about P/2 frames per camera (docs/benchmarks.md, "GOP pairs").
KEPT_FRAMES_MAX_BYTES = 64 * 2**20
# Files whose GOP layout is remembered by default (a sample table each: 12 bytes a frame); a
# decoder cache remembers as many as it keeps decoders open, so that no pooled file's is read again.
_FILES_REMEMBERED = 256
# Second frames asked for and not kept, remembered so that their first's call, running late on
# another decode thread, does not keep them for nobody: at most this many, the oldest forgotten.
_ASKED_MAX = 1 << 12
# A kept frame not asked for after this many times the longest wait a served one had (and at least
# _STALE_MIN_QUERIES queries) is dropped when room is needed: its pair was cut (an epoch ended early,
# a remote file's view renamed), and it would hold the budget for good.
_STALE_FACTOR = 4
_STALE_MIN_QUERIES = 256
_Key = tuple[str, float]  # (the file as the decoder opens it, the frame's query time in it)


class GopPairs:
    """Frames kept for their turn, within ``budget_bytes``: ``mates`` says which to decode with the
    first frames of pairs, ``keep`` keeps them, ``taken`` (or ``take``) serves them to their second."""

    def __init__(self, *, budget_bytes: int, files_remembered: int = _FILES_REMEMBERED,
                 track_of: Callable[[str], VideoTrack] | None = None) -> None:
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes!r}.")
        self.budget_bytes = budget_bytes
        self._files_remembered = max(1, files_remembered)
        self._track_of = track_of or video_track  # the decoders' own reading of the file's index
        self._lock = threading.Lock()
        # Each kept frame's slot in its shape's slab, and the query number it was kept at.
        self._kept: OrderedDict[_Key, tuple[_Slot, int]] = OrderedDict()
        self._slabs: dict[tuple[tuple[int, ...], torch.dtype], _Slab] = {}
        self._bytes = 0
        self._asked: OrderedDict[_Key, None] = OrderedDict()  # seconds asked for and not kept (yet)
        self._gops: OrderedDict[str, _GopTable | None] = OrderedDict()  # path -> its table (None: no pairs in it)
        self._queries = 0
        self._longest_wait = 0
        self._served = self._kept_count = self._dropped = self._full = self._late = 0

    @contextmanager
    def taken(self, path: str, times_s: Sequence[float]) -> Iterator[dict[float, torch.Tensor]]:
        """The frames kept for ``times_s`` of ``path`` (the seconds of pairs asked for), no longer
        kept, readable in the block (their slots are reused after it: copy what must outlive it)."""
        slots = {t: slot for t in times_s if (slot := self._take(path, t)) is not None}
        try:
            yield {t: slab.frames[index] for t, (slab, index) in slots.items()}
        finally:
            if slots:
                with self._lock:
                    for slot in slots.values():
                        self._free(slot)

    def _take(self, path: str, time_s: float) -> _Slot | None:
        """The slot kept for ``time_s`` of ``path`` (lent until ``_free``), or None: the second of a
        pair asked for, whose first may have brought it. A frame asked for before its first's call
        kept it (decode threads run groups out of order) is not kept after."""
        with self._lock:
            self._queries += 1
            entry = self._kept.pop((path, time_s), None)
            if entry is None:
                self._asked[path, time_s] = None
                while len(self._asked) > _ASKED_MAX:
                    self._asked.popitem(last=False)
                return None
            slot, born = entry
            self._longest_wait = max(self._longest_wait, self._queries - born)
            self._served += 1
            return slot

    def mates(self, path: str, pairs: Sequence[tuple[float, float]]) -> list[float]:
        """Of ``(time, its mate's time)`` for the first frames of pairs of ``path`` decoded now, the
        mates to decode with them and ``keep``: those in the same GOP, while there is room."""
        if not self.budget_bytes or not pairs:
            return []
        with self._lock:
            read = path in self._gops
            if read:
                self._gops.move_to_end(path)
            table = self._gops.get(path)
        if not read:
            table = _gop_table(self._track_of, path)  # outside the lock: other threads decode meanwhile
            with self._lock:
                self._gops[path] = table
                while len(self._gops) > self._files_remembered:
                    self._gops.popitem(last=False)
        if table is None:
            return []
        with self._lock:
            return [mate_s for time_s, mate_s in pairs
                    if (path, mate_s) not in self._kept and self._room() and _same_gop(table, time_s, mate_s)]

    def keep(self, path: str, time_s: float, frame: torch.Tensor) -> None:
        """Keep ``frame`` (the decoder's frame for ``time_s``, a copy of its own) until it is asked for."""
        size = _nbytes(frame)
        with self._lock:
            if (path, time_s) in self._kept:
                return
            if (path, time_s) in self._asked:  # asked for already, while its first's call ran
                del self._asked[path, time_s]
                self._late += 1
                return
            while self._kept and self._bytes + size > self.budget_bytes and self._stale(next(iter(self._kept.values()))):
                _, (old, _) = self._kept.popitem(last=False)
                self._free(old)
                self._dropped += 1
            if self._bytes + size > self.budget_bytes:
                self._full += 1
                return
            key = (tuple(frame.shape), frame.dtype)
            slab = self._slabs.get(key)
            if slab is None:
                slab = self._slabs[key] = _Slab(frame, max(1, self.budget_bytes // size))
            slot = slab.put(frame)
            if slot is None:
                self._full += 1
                return
            self._kept[path, time_s] = ((slab, slot), self._queries)
            self._bytes += size
            self._kept_count += 1

    def forget(self, paths: Sequence[str]) -> None:
        """Drop what is kept of ``paths`` (files no later sample reads)."""
        gone = set(paths)
        with self._lock:
            for key in [key for key in self._kept if key[0] in gone]:
                self._free(self._kept.pop(key)[0])
            for path in gone:
                self._gops.pop(path, None)

    def stats(self) -> dict[str, int]:
        """Frames kept, served from here (a decode each, saved), dropped unasked, not kept for want of
        room, not kept because they were asked for first, and the bytes held."""
        with self._lock:
            return {"kept": self._kept_count, "served": self._served, "dropped": self._dropped,
                    "not_kept_full": self._full, "not_kept_late": self._late, "held_bytes": self._bytes}

    def _free(self, slot: _Slot) -> None:
        """Give ``slot`` back (under the lock): it may be filled again as soon as the lock is let go."""
        slab, index = slot
        slab.free.append(index)
        self._bytes -= slab.frame_bytes

    def _room(self) -> bool:
        return self._bytes < self.budget_bytes or bool(self._kept and self._stale(next(iter(self._kept.values()))))

    def _stale(self, entry: tuple[_Slot, int]) -> bool:
        return self._queries - entry[1] > max(_STALE_MIN_QUERIES, _STALE_FACTOR * self._longest_wait)


_GopTable = tuple[np.ndarray, np.ndarray]  # a file's frames' pts (s) and each one's GOP number


def _gop_table(track_of: Callable[[str], VideoTrack], path: str) -> _GopTable | None:
    """``path``'s GOP table, or None where pairs cannot be told from it (B-frames: a frame's decode
    does not follow from its neighbours' this simply; a layout the index reader refuses)."""
    try:
        track = track_of(path)
    except (Mp4LayoutError, OSError, ValueError):
        return None
    if track.reorder_depth or not len(track.pts_s) or not np.all(np.diff(track.pts_s) > 0):
        return None
    return track.pts_s, np.cumsum(track.is_sync, dtype=np.int32)


def _same_gop(table: _GopTable, a_s: float, b_s: float) -> bool:
    """Whether the frames shown at ``a_s`` and ``b_s`` decode from the same keyframe."""
    pts_s, gop = table
    # The frame shown at a query time (a frame's own pts, within the tolerance) is the last at or
    # before it, a hair on.
    at = np.searchsorted(pts_s, np.array([a_s, b_s]) + _HALF_FRAME_EPS_S, side="right") - 1
    return bool(at.min() >= 0 and gop[at[0]] == gop[at[1]])


# Query times are the frames' timestamps (float64 from the rows), a hair off the pts: this much on
# finds the frame itself, well within any frame's duration.
_HALF_FRAME_EPS_S = 1e-4


class _Slab:
    """Room for ``capacity`` frames like ``like``, allocated once: frames kept for thousands of
    queries, each allocated on its own, scattered the heap between the decoders' short-lived buffers
    and the process grew by tens of MB an epoch (measured; docs/benchmarks.md, "GOP pairs"). The
    slots are reused last freed first, so the pages in use are those of the most frames kept at once
    (a large allocation's untouched pages are never resident)."""

    def __init__(self, like: torch.Tensor, capacity: int) -> None:
        self.frames = torch.empty((capacity, *like.shape), dtype=like.dtype)
        self.frame_bytes = _nbytes(like)
        self.free = list(range(capacity - 1, -1, -1))  # popped from the end: slot 0 first

    def put(self, frame: torch.Tensor) -> int | None:
        if not self.free:
            return None
        index = self.free.pop()
        self.frames[index].copy_(frame)
        return index


_Slot = tuple[_Slab, int]


def _nbytes(frame: torch.Tensor) -> int:
    return frame.element_size() * frame.nelement()


