"""A span's own sample tables: an mp4's ``moov`` cut to the samples of one episode's byte span.

Why: a remote episode's sparse copy (``_remote.source.videos``) holds its mp4's header and the
episode's bytes, and FFmpeg indexes every sample its tables list (docs/remote.md has the memory
measured), so each decoder of a span of a v3.0 file shared by a thousand episodes paid for the whole
file's frames to read a few dozen. Cut to the span's samples, the tables give the decoder the same
frames at the same times:

- the kept samples keep their byte offsets (one chunk per sample: ``stco``/``co64`` list them where
  they lie in the file, so the span's bytes stay where they are);
- decode times restart at 0 with the first kept sample, so an empty edit as long as the cut time puts
  every kept frame back at its presentation time; the movie's timescale is set to the media's, which
  makes that shift exact (an empty edit is counted in movie time units, often milliseconds);
- the rest of the header is left as it was (the sample description, ``mdhd``'s duration).

``sdtp`` (a byte of dependency flags per sample, which FFmpeg 8's muxer writes for AV1) is cut with
them. Only the layouts LeRobot's writers produce are cut: one track, the sample-table boxes in ``_KEPT``,
composition offsets that are not negative, an edit list of empty edits then at most one media edit.
``SpanTables.of`` returns None for anything else, and the copy keeps the whole tables (correct, larger).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace

import numpy as np

from episodestream._format.mp4 import Mp4Header, Mp4LayoutError, _box_header, _children, _table

_CONTAINERS = frozenset({b"moov", b"trak", b"edts", b"mdia", b"minf", b"stbl"})
# Sample-table boxes this module rewrites or keeps unchanged (``stsd``, ``cslg``); any other one
# (sample groups, ``stz2``, ...) lists samples in a way it does not cut.
_KEPT = frozenset({b"stsd", b"stts", b"ctts", b"cslg", b"stss", b"stsz", b"stsc", b"stco", b"co64", b"sdtp"})
_STBL = (b"mdia", b"minf", b"stbl")
_UNIT_RATE = 0x00010000  # an edit's media rate 1.0 (16.16 fixed point)


@dataclass(frozen=True)
class _Box:
    kind: bytes
    body: bytes = b""  # a leaf's body (after its header)
    children: tuple[_Box, ...] | None = None  # a container's boxes

    def to_bytes(self) -> bytes:
        body = self.body if self.children is None else b"".join(child.to_bytes() for child in self.children)
        return struct.pack(">I4s", 8 + len(body), self.kind) + body

    def child(self, *path: bytes) -> _Box | None:
        box: _Box | None = self
        for kind in path:
            box = next((c for c in (box.children or ()) if c.kind == kind), None) if box else None
        return box

    def with_child(self, path: tuple[bytes, ...], new: _Box | None, *, after: bytes | None = None) -> _Box:
        """This box with the box at ``path`` replaced by ``new`` (removed where None; added after
        the child of kind ``after``, or last, where missing)."""
        children = list(self.children or ())
        at = next((i for i, c in enumerate(children) if c.kind == path[0]), None)
        if len(path) > 1:
            if at is None:
                raise Mp4LayoutError(f"no {path[0]!r} box to cut in")
            children[at] = children[at].with_child(path[1:], new, after=after)
        elif at is not None:
            children[at:at + 1] = [] if new is None else [new]
        elif new is not None:
            place = next((i + 1 for i, c in enumerate(children) if c.kind == after), len(children))
            children.insert(place, new)
        return replace(self, children=tuple(children))


def _parse(data: bytes, start: int, end: int) -> tuple[_Box, ...]:
    return tuple(_Box(kind, children=_parse(data, body, box_end)) if kind in _CONTAINERS
                 else _Box(kind, data[body:box_end]) for kind, body, box_end in _children(data, start, end))


def _full(body: bytes, fmt: str, values: np.ndarray | list, *, extra: bytes = b"") -> bytes:
    """A full box's body: the version and flags of ``body`` (the box it replaces; zeros for a new
    one), ``extra``, the entry count, then the entries."""
    rows = np.asarray(values)
    table = rows.astype(">" + fmt).tobytes() if rows.size else b""
    return (body[:4] if body else bytes(4)) + extra + struct.pack(">I", len(rows)) + table


def _runs(values: np.ndarray) -> np.ndarray:
    """(count, value) rows of ``values``' runs, as ``stts`` and ``ctts`` store them."""
    starts = np.flatnonzero(np.diff(values, prepend=values[:1] - 1))
    counts = np.diff(np.append(starts, len(values)))
    return np.stack([counts, values[starts]], axis=1)


def _scaled(value: int, to_scale: int, from_scale: int) -> int:
    return -(-value * to_scale // from_scale)


def _duration_at(body: bytes, version_offsets: tuple[int, int]) -> tuple[int, int]:
    """(byte offset, width) of the duration field in ``mvhd``'s or ``tkhd``'s body."""
    return (version_offsets[1], 8) if body[0] == 1 else (version_offsets[0], 4)


def _with_duration(body: bytes, at: tuple[int, int], value: int, *, timescale_at: int | None = None,
                   timescale: int = 0) -> bytes:
    offset, width = at
    if value >= 1 << (8 * width):
        raise Mp4LayoutError("a duration in the new timescale does not fit its field")
    out = bytearray(body)
    out[offset:offset + width] = value.to_bytes(width, "big")
    if timescale_at is not None:
        out[timescale_at:timescale_at + 4] = timescale.to_bytes(4, "big")
    return bytes(out)


@dataclass(frozen=True)
class SpanTables:
    """One mp4's ``moov``, parsed once, cut to any run of its samples by ``moov_for``."""

    root: _Box  # the moov box
    sizes: np.ndarray
    offsets: np.ndarray
    deltas: np.ndarray  # decode-time step of each sample (media units)
    composition: np.ndarray | None  # ctts offsets (None: no ctts)
    sync: np.ndarray | None  # bool per sample (None: no stss, every sample is a keyframe)
    uniform_size: int  # stsz's one size for every sample (0: a table)
    description: int  # the sample description every chunk uses
    media_timescale: int
    movie_timescale: int
    empty_media_units: int  # leading empty edits, in media units
    media_edit: tuple[int, int] | None  # the media edit's (media time, rate), None: no edit list

    @classmethod
    def of(cls, moov: bytes, *, offsets: np.ndarray, sizes: np.ndarray) -> SpanTables | None:
        """``moov``'s tables ready to cut (``offsets`` and ``sizes``: each sample's, from
        ``VideoTrack``), or None where the layout is one this module does not cut."""
        try:
            return cls._of(moov, offsets, sizes)
        except (Mp4LayoutError, struct.error, ValueError, IndexError):
            return None

    @classmethod
    def _of(cls, moov: bytes, offsets: np.ndarray, sizes: np.ndarray) -> SpanTables | None:
        kind, header, size = _box_header(moov, 0, len(moov), where="of moov")
        if kind != b"moov":
            return None
        root = _Box(b"moov", children=_parse(moov, header, size))
        traks = [c for c in root.children or () if c.kind == b"trak"]
        if len(traks) != 1 or root.child(b"mvex") is not None:
            return None
        trak = traks[0]
        stbl = trak.child(*_STBL)
        mdhd, mvhd, tkhd = trak.child(b"mdia", b"mdhd"), root.child(b"mvhd"), trak.child(b"tkhd")
        if stbl is None or mdhd is None or mvhd is None or tkhd is None:
            return None
        boxes = {c.kind: c.body for c in stbl.children or ()}
        if not set(boxes) <= _KEPT or not {b"stsd", b"stts", b"stsz", b"stsc"} <= set(boxes):
            return None
        n = len(sizes)

        def table(kind: bytes, fmt: str, header_bytes: int = 8) -> np.ndarray:
            return _table(boxes[kind], 0, len(boxes[kind]), fmt, header=header_bytes)

        stts = table(b"stts", "II")
        deltas = np.repeat(stts["f1"].astype(np.int64), stts["f0"].astype(np.int64))[:n]
        composition = None
        if b"ctts" in boxes:
            ctts = table(b"ctts", "Ii")
            composition = np.repeat(ctts["f1"].astype(np.int64), ctts["f0"].astype(np.int64))[:n]
            if len(composition) < n or composition.min() < 0:
                return None
        sync = None
        if b"stss" in boxes:
            sync = np.zeros(n, bool)
            numbers = table(b"stss", "I")["f0"].astype(np.int64) - 1
            sync[numbers[(numbers >= 0) & (numbers < n)]] = True
        descriptions = table(b"stsc", "III")["f2"]
        uniform = struct.unpack_from(">I", boxes[b"stsz"], 4)[0]
        if len(deltas) < n or len(set(descriptions.tolist())) != 1:
            return None
        if b"sdtp" in boxes and len(boxes[b"sdtp"]) - 4 < n:
            return None
        media_timescale = struct.unpack_from(">I", mdhd.body, 20 if mdhd.body[0] == 1 else 12)[0]
        movie_timescale = struct.unpack_from(">I", mvhd.body, 20 if mvhd.body[0] == 1 else 12)[0]
        empty, media_edit = 0, None
        elst = trak.child(b"edts", b"elst")
        if elst is not None:
            for duration, media_time, rate in _table(elst.body, 0, len(elst.body),
                                                     "QqI" if elst.body[0] == 1 else "IiI").tolist():
                if media_time == -1 and media_edit is None:
                    empty += duration
                elif media_time != -1 and media_edit is None:
                    media_edit = (media_time, rate)
                else:
                    return None  # an edit after the media edit
            if media_edit is None or (empty * media_timescale) % movie_timescale:
                return None
        if not media_timescale or not movie_timescale:
            return None
        return cls(root, sizes, offsets, deltas, composition, sync, uniform, int(descriptions[0]), media_timescale,
                   movie_timescale, empty * media_timescale // movie_timescale, media_edit)

    def moov_for(self, first: int, last: int) -> bytes:
        """The moov of samples ``first..last`` (decode order, both kept), every one at its byte offset
        and presentation time. Raises ``Mp4LayoutError`` where the cut cannot keep the times."""
        kept = slice(first, last + 1)
        deltas = self.deltas[kept]
        start = int(self.deltas[:first].sum())
        composition = self.composition[kept] if self.composition is not None else np.zeros(len(deltas), np.int64)
        stbl: list[_Box] = []
        root = self.root
        for box in root.child(b"trak", *_STBL).children or ():
            body = box.body
            if box.kind == b"stts":
                body = _full(body, "u4", _runs(deltas))
            elif box.kind == b"ctts":
                body = _full(body, "i4" if body[0] == 1 else "u4", _runs(composition))
            elif box.kind == b"stss":
                body = _full(body, "u4", np.flatnonzero(self.sync[kept]) + 1)
            elif box.kind == b"stsz":
                table = [] if self.uniform_size else self.sizes[kept]
                body = _full(body, "u4", table, extra=struct.pack(">I", self.uniform_size))
                if self.uniform_size:
                    body = body[:8] + struct.pack(">I", len(deltas))
            elif box.kind == b"sdtp":  # version and flags, then a byte per sample
                body = body[:4] + body[4 + first:4 + last + 1]
            elif box.kind == b"stsc":
                body = _full(body, "u4", [[1, 1, self.description]])
            elif box.kind in (b"stco", b"co64"):
                offsets = self.offsets[kept]
                wide = int(offsets.max()) >= 1 << 32
                box = _Box(b"co64" if wide else b"stco")
                body = _full(b"", "u8" if wide else "u4", offsets)
            stbl.append(_Box(box.kind, body))
        root = root.with_child((b"trak", *_STBL), _Box(b"stbl", children=tuple(stbl)))
        if start == 0:
            return root.to_bytes()  # the times are unchanged: the edit list stays as it was
        return self._shifted(root, start, composition, deltas).to_bytes()

    def _shifted(self, root: _Box, start: int, composition: np.ndarray, deltas: np.ndarray) -> _Box:
        """``root`` with an edit list that shows the kept samples, whose decode times now start at 0
        rather than ``start``, at their times in the whole file, and the movie timescale the media's."""
        cts = np.cumsum(deltas) - deltas + composition  # the kept samples' composition times, cut
        media_time = int(cts.min())
        before_time, rate = self.media_edit if self.media_edit is not None else (0, _UNIT_RATE)
        empty = self.empty_media_units - before_time + start + media_time
        if empty < 0:
            raise Mp4LayoutError("the cut samples are shown before the track starts")
        length = int((cts + deltas).max()) - media_time
        entries = ([[empty, -1, _UNIT_RATE]] if empty else []) + [[length, media_time, rate]]
        wide = max(empty, length, media_time) >= 1 << 31
        rows = np.array(entries, dtype=np.int64)
        table = b"".join(struct.pack(">QqI" if wide else ">IiI", *row) for row in rows.tolist())
        elst = _Box(b"elst", struct.pack(">B3sI", 1 if wide else 0, b"\0\0\0", len(rows)) + table)
        root = root.with_child((b"trak", b"edts"), _Box(b"edts", children=(elst,)), after=b"tkhd")
        if self.movie_timescale != self.media_timescale:
            to, frm = self.media_timescale, self.movie_timescale
            mvhd = root.child(b"mvhd")
            tkhd = root.child(b"trak", b"tkhd")
            assert mvhd is not None and tkhd is not None
            mvhd_at, tkhd_at = _duration_at(mvhd.body, (16, 24)), _duration_at(tkhd.body, (20, 28))
            movie = int.from_bytes(mvhd.body[mvhd_at[0]:sum(mvhd_at)], "big")
            track = int.from_bytes(tkhd.body[tkhd_at[0]:sum(tkhd_at)], "big")
            root = root.with_child((b"mvhd",), _Box(b"mvhd", _with_duration(
                mvhd.body, mvhd_at, _scaled(movie, to, frm), timescale_at=mvhd_at[0] - 4, timescale=to)))
            root = root.with_child((b"trak", b"tkhd"), _Box(b"tkhd", _with_duration(
                tkhd.body, tkhd_at, _scaled(track, to, frm))))
        return root


def with_moov(header: Mp4Header, moov: bytes) -> Mp4Header | None:
    """``header`` with its ``moov`` replaced by the shorter ``moov`` and a ``free`` box over the rest
    of the old one's bytes, whose body is left out of the regions (a sparse copy leaves it a hole).
    None where the new moov leaves no room for the ``free`` box's header."""
    for index, (offset, data) in enumerate(header.regions):
        if offset <= header.moov_offset < offset + len(data):
            at = header.moov_offset - offset
            old = _box_header(data, at, len(data) - at, where="of moov")[2]
            rest = old - len(moov)
            if rest < 8 or rest >= 1 << 32:
                return None
            head = (offset, data[:at] + moov + struct.pack(">I4s", rest, b"free"))
            tail = [(header.moov_offset + old, data[at + old:])] if at + old < len(data) else []
            regions = header.regions[:index] + (head, *tail) + header.regions[index + 1:]
            return Mp4Header(header.file_size, regions, header.moov_offset)
    return None
