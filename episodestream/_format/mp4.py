"""A minimal ISO-BMFF (mp4) index reader: where an episode's frames lie in a remote mp4.

Why a small parser and not a library: PyAV and torchcodec open a file to decode it, and neither
exposes the byte offset of a sample, which is what a ranged download needs. The sample tables in
``moov`` (stts, ctts, stss, stsc, stsz, stco/co64, the media timescale and the edit list) are a few
fixed layouts, so reading them here costs ~250 lines and no dependency, and works from ranged reads
before a single byte of ``mdat`` is fetched.

Two steps, both pure (``read`` is any ``(start, end) -> bytes``):

1. ``read_header(read, file_size)`` walks the top-level boxes (one small read per box header,
   skipping ``mdat`` by its size) and returns ``Mp4Header``: the byte regions a decoder needs before
   any sample (every top-level box header, ``ftyp``, ``moov``) with their bytes.
2. ``VideoTrack.parse(moov)`` builds per-sample offset, size, presentation time and sync flag of
   the first video track; ``VideoTrack.span(from_s, to_s)`` is the contiguous byte range holding
   the frames shown in ``[from_s, to_s)``, starting at the keyframe at or before the first of them.

Anything it does not understand (fragmented mp4, several non-empty edits, ``stz2`` with 4-bit
fields, no video track) raises ``Mp4LayoutError``; callers then fetch the whole file instead.
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

_BOX_HEADER_READ = 16  # size + type + 64-bit largesize
_CONTAINERS = {b"moov", b"trak", b"mdia", b"minf", b"stbl", b"edts"}
# Frames shown within this many seconds of a span boundary count as outside it: LeRobot's
# from/to timestamps are float64 copies of k / fps and may differ from the exact pts in the last bit.
_BOUNDARY_EPS_S = 1e-6
# A decoder may need packets past the last frame it returns before it hands that frame out, and
# PyAV's reader decodes one frame ahead; a packet outside the span is zeros and fails to decode. So
# a span runs this many samples past its last frame, plus twice the track's reordering depth (a
# decoder with B-frames holds up to that many frames back). Measured: AV1 GOP 2 needs 0 with
# torchcodec and 1 with PyAV; H.264 with 3 B-frames (reordering 3) needed 4 with PyAV.
TRAILING_SAMPLES = 2


class Mp4LayoutError(ValueError):
    """The mp4 uses a layout this reader does not map to byte spans (the caller fetches it whole)."""


@dataclass(frozen=True)
class Box:
    kind: bytes
    offset: int
    header_size: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(frozen=True)
class Mp4Header:
    """The bytes of an mp4 a decoder reads before any sample: ``regions`` hold them at their offsets."""

    file_size: int
    regions: tuple[tuple[int, bytes], ...]  # (offset, bytes), ascending, not overlapping
    moov_offset: int

    @property
    def size_bytes(self) -> int:
        return sum(len(data) for _, data in self.regions)

    @property
    def moov(self) -> bytes:
        for offset, data in self.regions:
            if offset <= self.moov_offset < offset + len(data):
                start = self.moov_offset - offset
                size = _box_header(data, start, len(data) - start, where="of moov")[2]
                return data[start:start + size]
        raise Mp4LayoutError("the header regions do not hold the moov box")

    def to_bytes(self) -> bytes:
        """A self-describing blob (for the cache): a JSON index, then the regions' bytes."""
        index = json.dumps({"file_size": self.file_size, "moov_offset": self.moov_offset,
                            "regions": [[offset, len(data)] for offset, data in self.regions]}).encode()
        return struct.pack(">Q", len(index)) + index + b"".join(data for _, data in self.regions)

    @classmethod
    def from_bytes(cls, blob: bytes) -> Mp4Header:
        (n,) = struct.unpack_from(">Q", blob, 0)
        index = json.loads(blob[8:8 + n])
        regions, position = [], 8 + n
        for offset, length in index["regions"]:
            regions.append((offset, blob[position:position + length]))
            position += length
        return cls(index["file_size"], tuple(regions), index["moov_offset"])


def _box_header(data: bytes, at: int, available: int, *, where: str) -> tuple[bytes, int, int]:
    """(type, header size, box size) of the box starting at ``data[at]``: a 32-bit size, or 1 and a
    64-bit size after the type, or 0 for "to the end of the parent" (``available`` bytes from ``at``).
    The caller checks the size against its parent (its own message says which)."""
    size, kind = struct.unpack_from(">I4s", data, at)
    header_size = 8
    if size == 1:
        if len(data) < at + 16:
            raise Mp4LayoutError(f"truncated 64-bit box header {where}")
        size, = struct.unpack_from(">Q", data, at + 8)
        header_size = 16
    elif size == 0:
        size = available
    return kind, header_size, size


def top_level_boxes(read: Callable[[int, int], bytes], file_size: int) -> list[Box]:
    boxes, offset = [], 0
    while offset + 8 <= file_size:
        head = read(offset, min(offset + _BOX_HEADER_READ, file_size))
        kind, header_size, size = _box_header(head, 0, file_size - offset, where=f"at byte {offset}")
        if size < header_size or offset + size > file_size:
            raise Mp4LayoutError(f"box {kind!r} at byte {offset} has size {size}, past the file's "
                                 f"{file_size} bytes")
        boxes.append(Box(kind, offset, header_size, size))
        offset += size
    return boxes


def read_header(read: Callable[[int, int], bytes], file_size: int) -> Mp4Header:
    """Locate ``moov`` by walking top-level box headers; return the header regions and their bytes."""
    boxes = top_level_boxes(read, file_size)
    kinds = [b.kind for b in boxes]
    if b"moof" in kinds:
        raise Mp4LayoutError("fragmented mp4 (moof boxes): samples are not indexed in moov")
    if b"moov" not in kinds:
        raise Mp4LayoutError(f"no moov box among the top-level boxes {[k.decode('latin-1') for k in kinds]}")
    # mdat is the only box whose body the decoder reads per sample; of every other top-level box
    # (ftyp, moov, free, ...) it may read everything when it opens the file.
    wanted = [(b.offset, b.offset + (b.header_size if b.kind == b"mdat" else b.size)) for b in boxes]
    regions: list[list[int]] = []
    for start, end in wanted:
        if regions and start <= regions[-1][1]:
            regions[-1][1] = max(regions[-1][1], end)
        else:
            regions.append([start, end])
    moov = next(b for b in boxes if b.kind == b"moov")
    return Mp4Header(file_size, tuple((s, read(s, e)) for s, e in regions), moov.offset)


def _children(data: bytes, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """(type, body start, box end) of the boxes in ``data[start:end]``."""
    offset = start
    while offset + 8 <= end:
        kind, header, size = _box_header(data, offset, end - offset, where="inside moov")
        if size < header or offset + size > end:
            raise Mp4LayoutError(f"box {kind!r} inside moov overruns its parent")
        yield kind, offset + header, offset + size
        offset += size


def _find(data: bytes, start: int, end: int, path: tuple[bytes, ...]) -> list[tuple[int, int]]:
    """Body ranges of every box at ``path`` below ``data[start:end]``."""
    found = []
    for kind, body, box_end in _children(data, start, end):
        if kind == path[0]:
            found.extend([(body, box_end)] if len(path) == 1 else _find(data, body, box_end, path[1:]))
    return found


def _table(data: bytes, body: int, end: int, fmt: str, *, header: int = 8) -> np.ndarray:
    """A full box's entry table: ``count`` at ``body + header - 4``, then ``count`` rows of ``fmt``."""
    count, = struct.unpack_from(">I", data, body + header - 4)
    dtype = np.dtype([(f"f{i}", ">" + c) for i, c in enumerate(fmt)])
    if body + header + count * dtype.itemsize > end:
        raise Mp4LayoutError(f"sample table claims {count} entries, more than its box holds")
    return np.frombuffer(data, dtype=dtype, count=count, offset=body + header)


@dataclass(frozen=True)
class Span:
    """The bytes ``[start, end)`` of the file holding an episode's frames."""

    start: int
    end: int

    @property
    def size_bytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class VideoTrack:
    """Per-sample tables of one video track, in decode order."""

    offsets: np.ndarray  # int64 byte offsets
    sizes: np.ndarray  # int64 bytes
    pts_s: np.ndarray  # float64 presentation time in seconds, after the edit list
    duration_s: np.ndarray  # float64 display duration of each sample
    is_sync: np.ndarray  # bool
    reorder_depth: int = 0  # most places a sample moves between decode and presentation order
    timescale: int = 1  # media time units a second (FFmpeg's stream time base is its inverse)
    dts: np.ndarray | None = None  # int64 decode times in ``timescale`` units (the demuxer's index times)

    @classmethod
    def parse(cls, moov: bytes) -> VideoTrack:
        start = _box_header(moov, 0, len(moov), where="of moov")[1] if moov[4:8] == b"moov" else 0
        movie_timescale = None
        for body, _ in _find(moov, start, len(moov), (b"mvhd",)):
            movie_timescale, = struct.unpack_from(">I", moov, body + (20 if moov[body] == 1 else 12))
        for body, end in _find(moov, start, len(moov), (b"trak",)):
            handlers = _find(moov, body, end, (b"mdia", b"hdlr"))
            if handlers and moov[handlers[0][0] + 8:handlers[0][0] + 12] == b"vide":
                return cls._from_trak(moov, body, end, movie_timescale)
        raise Mp4LayoutError("no video track (hdlr 'vide') in moov")

    @classmethod
    def _from_trak(cls, d: bytes, body: int, end: int, movie_timescale: int | None) -> VideoTrack:
        def one(path: tuple[bytes, ...], required: bool = True) -> tuple[int, int] | None:
            found = _find(d, body, end, path)
            if not found and required:
                raise Mp4LayoutError(f"video track lacks {b'/'.join(path).decode()}")
            return found[0] if found else None

        mdhd = one((b"mdia", b"mdhd"))
        timescale, = struct.unpack_from(">I", d, mdhd[0] + (20 if d[mdhd[0]] == 1 else 12))
        if not timescale:
            raise Mp4LayoutError("media timescale is 0")
        stbl = (b"mdia", b"minf", b"stbl")
        stsz = one(stbl + (b"stsz",), required=False)
        if stsz is not None:
            uniform, count = struct.unpack_from(">II", d, stsz[0] + 4)
            sizes = (np.full(count, uniform, np.int64) if uniform else
                     _table(d, stsz[0], stsz[1], "I", header=12)["f0"].astype(np.int64))
        else:
            stz2 = one(stbl + (b"stz2",))
            field_bits = d[stz2[0] + 7]
            if field_bits not in (8, 16):
                raise Mp4LayoutError(f"stz2 with {field_bits}-bit sizes is not supported")
            sizes = _table(d, stz2[0], stz2[1], "B" if field_bits == 8 else "H")["f0"].astype(np.int64)
        n = len(sizes)
        stco = one(stbl + (b"stco",), required=False)
        chunk_offsets = (_table(d, *stco, "I") if stco else _table(d, *one(stbl + (b"co64",)), "Q"))["f0"]
        chunk_offsets = chunk_offsets.astype(np.int64)
        stsc = _table(d, *one(stbl + (b"stsc",)), "III")
        first_chunk = stsc["f0"].astype(np.int64) - 1
        if len(first_chunk) == 0 or first_chunk[0] != 0 or np.any(np.diff(first_chunk) <= 0):
            raise Mp4LayoutError("stsc entries are empty or out of order")
        runs = np.diff(np.append(first_chunk, len(chunk_offsets)))
        per_chunk = np.repeat(stsc["f1"].astype(np.int64), np.maximum(runs, 0))
        if per_chunk.sum() < n:
            raise Mp4LayoutError(f"stsc/stco place {per_chunk.sum()} samples, stsz lists {n}")
        chunk_of = np.repeat(np.arange(len(per_chunk)), per_chunk)[:n]
        before = np.concatenate(([0], np.cumsum(sizes)))
        first_of_chunk = np.cumsum(per_chunk) - per_chunk
        offsets = chunk_offsets[chunk_of] + before[:n] - before[first_of_chunk[chunk_of]]

        stts = _table(d, *one(stbl + (b"stts",)), "II")
        deltas = np.repeat(stts["f1"].astype(np.int64), stts["f0"].astype(np.int64))
        if len(deltas) < n:
            raise Mp4LayoutError(f"stts gives times for {len(deltas)} samples, stsz lists {n}")
        deltas = deltas[:n]
        dts = np.concatenate(([0], np.cumsum(deltas)[:-1]))
        ctts = one(stbl + (b"ctts",), required=False)
        cts = dts.copy()
        if ctts is not None:
            # Version 0 declares the offsets unsigned, but writers put negative ones there too;
            # FFmpeg reads them signed, and so do we.
            table = _table(d, *ctts, "Ii")
            shift = np.repeat(table["f1"].astype(np.int64), table["f0"].astype(np.int64))
            cts[:min(n, len(shift))] += shift[:n]
        stss = one(stbl + (b"stss",), required=False)
        is_sync = np.ones(n, bool)
        if stss is not None:
            is_sync[:] = False
            numbers = _table(d, *stss, "I")["f0"].astype(np.int64) - 1
            is_sync[numbers[(numbers >= 0) & (numbers < n)]] = True
        shift_s = cls._edit_shift_s(d, one((b"edts", b"elst"), required=False), timescale, movie_timescale)
        pts_s = cts / timescale + shift_s
        # A sample is shown until the next one in presentation order starts (the last: its delta).
        order = np.argsort(cts, kind="stable")
        duration_s = np.empty(n)
        if n:
            duration_s[order[:-1]] = np.diff(cts[order]) / timescale
            duration_s[order[-1]] = deltas[order[-1]] / timescale
        rank = np.empty(n, np.int64)
        rank[order] = np.arange(n)
        reorder = int(np.abs(rank - np.arange(n)).max()) if n else 0
        return cls(offsets, sizes, pts_s, duration_s, is_sync, reorder, timescale, dts)

    @staticmethod
    def _edit_shift_s(d: bytes, elst: tuple[int, int] | None, timescale: int,
                      movie_timescale: int | None) -> float:
        """Seconds added to ``cts / timescale`` by the edit list, as FFmpeg's mov demuxer applies it."""
        if elst is None:
            return 0.0
        body, end = elst
        version = d[body]
        table = _table(d, body, end, "QqI" if version == 1 else "IiI")
        empty_s, media = 0.0, []
        for duration, media_time, _rate in table:
            if media_time == -1:
                if media:
                    raise Mp4LayoutError("an empty edit after a media edit is not supported")
                empty_s += duration / (movie_timescale or timescale)
            else:
                media.append(int(media_time))
        if len(media) > 1:
            raise Mp4LayoutError(f"{len(media)} media edits in the edit list are not supported")
        return empty_s - (media[0] / timescale if media else 0.0)

    def span(self, from_s: float, to_s: float) -> Span:
        """The bytes holding every frame shown in ``[from_s, to_s)``: those of ``samples(from_s, to_s)``.
        (``RemoteVideos`` pads the span it fetches.)"""
        return self.byte_span(*self.samples(from_s, to_s))

    def byte_span(self, first: int, last: int) -> Span:
        """The bytes of samples ``first..last`` (decode order)."""
        ends = self.offsets[first:last + 1] + self.sizes[first:last + 1]
        return Span(int(self.offsets[first:last + 1].min()), int(ends.max()))

    def samples(self, from_s: float, to_s: float) -> tuple[int, int]:
        """The first and last sample (decode order) a decoder reads for every frame shown in
        ``[from_s, to_s)``: from the last keyframe at or before the first of them and shown no later
        than any of them, through ``TRAILING_SAMPLES + 2 * reorder_depth`` samples past the last."""
        if self.reorder_depth == 0 and self._in_order:
            return self._samples_in_order(from_s, to_s)
        shown = (self.pts_s < to_s - _BOUNDARY_EPS_S) & (self.pts_s + self.duration_s > from_s + _BOUNDARY_EPS_S)
        wanted = np.flatnonzero(shown)
        if not len(wanted):
            raise Mp4LayoutError(f"no frame is shown in [{from_s}, {to_s}) s; the video holds "
                                 f"{self.pts_s.min() if len(self.pts_s) else 0:.3f}..{self.pts_s.max() if len(self.pts_s) else 0:.3f} s")
        first, last = int(wanted[0]), int(wanted[-1])
        # An open GOP's leading frames (B-frames after a keyframe in decode order, before it in
        # presentation) reference the GOP before; a decoder starting at that keyframe drops them.
        # So the span starts at a keyframe shown no later than the first wanted frame.
        first_pts_s = self.pts_s[wanted].min() + _BOUNDARY_EPS_S
        syncs = np.flatnonzero(self.is_sync[:first + 1] & (self.pts_s[:first + 1] <= first_pts_s))
        first = int(syncs[-1]) if len(syncs) else 0
        return first, min(last + TRAILING_SAMPLES + 2 * self.reorder_depth, len(self.sizes) - 1)

    @functools.cached_property
    def _in_order(self) -> bool:
        """Samples shown in decode order, each until the next (AV1, and video without B-frames):
        ``samples`` then bisects rather than scanning every sample (a v3.0 mp4 holds tens of
        thousands, and a wide pool asks for a thousand spans of it at once)."""
        ends = self._ends_s
        return bool(len(self.pts_s)) and bool(np.all(np.diff(self.pts_s) > 0) and np.all(np.diff(ends) > 0))

    @functools.cached_property
    def _ends_s(self) -> np.ndarray:
        return self.pts_s + self.duration_s

    @functools.cached_property
    def _sync_samples(self) -> np.ndarray:
        return np.flatnonzero(self.is_sync)

    def _samples_in_order(self, from_s: float, to_s: float) -> tuple[int, int]:
        """``samples`` where presentation order is decode order: the same answer by bisection."""
        first = int(np.searchsorted(self._ends_s, from_s + _BOUNDARY_EPS_S, side="right"))
        last = int(np.searchsorted(self.pts_s, to_s - _BOUNDARY_EPS_S, side="left")) - 1
        if last < first:
            raise Mp4LayoutError(f"no frame is shown in [{from_s}, {to_s}) s; the video holds "
                                 f"{self.pts_s.min():.3f}..{self.pts_s.max():.3f} s")
        syncs = self._sync_samples
        at = int(np.searchsorted(syncs, first, side="right")) - 1
        first = int(syncs[at]) if at >= 0 else 0
        return first, min(last + TRAILING_SAMPLES, len(self.sizes) - 1)


def read_local_track(path: str) -> VideoTrack:
    """The video track of a local mp4, from its ``moov`` alone (no sample is read)."""
    with open(path, "rb") as file:
        def read(start: int, end: int) -> bytes:
            file.seek(start)
            return file.read(end - start)

        size = file.seek(0, 2)
        return VideoTrack.parse(read_header(read, size).moov)
