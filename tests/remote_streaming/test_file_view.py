"""``FileView``: one mp4's pooled spans served as the whole file to one decoder. Its bytes are the
file's where a span or the header holds them and zeros elsewhere; a read never crosses from one
region into the next (a decoder's buffer holds one region's bytes); and a span arriving over bytes a
decoder read as a hole gives the view a new name (the decoder that may hold those zeros is not asked
again), where a span elsewhere does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from episodestream._format.mp4 import VideoTrack, read_header
from episodestream._remote.source.file_view import FileView


@pytest.fixture
def mp4(spans_root) -> tuple[bytes, Path]:
    path = spans_root / "videos" / "observation.images.front" / "chunk-000" / "file-000.mp4"
    return path.read_bytes(), path


def _view(data: bytes) -> FileView:
    header = read_header(lambda start, end: data[start:end], len(data))
    return FileView("v", header, VideoTrack.parse(header.moov))


def _read_all(view: FileView, start: int, end: int) -> tuple[bytes, list[int]]:
    """Bytes ``[start, end)`` as a decoder reads them, and where each read ended."""
    out, ends, position = b"", [], start
    while position < end:
        piece = view.read_at(position, end - position)
        assert piece, position
        out += piece
        position += len(piece)
        ends.append(position)
    return out, ends


def test_a_view_serves_the_header_and_its_spans_and_zeros_elsewhere(mp4, tmp_path):
    data, path = mp4
    view = _view(data)
    header = read_header(lambda start, end: data[start:end], len(data))
    moov_at = header.moov_offset
    copy = tmp_path / "span.mp4"  # a span file: the span's bytes at their offsets, other bytes not the file's
    copy.write_bytes(bytes(len(data)))
    start, end = 1000, moov_at + 100  # reaching into the moov, where a span file holds its own cut moov
    with open(copy, "r+b") as out:
        out.seek(start)
        out.write(data[start:end])
        out.seek(moov_at)
        out.write(b"\xff" * 100)  # a span file's own (cut) moov: never served in place of the header
    view.add(start, end, str(copy))
    served, ends = _read_all(view, 0, len(data))
    assert served[:48] == data[:48] and served[moov_at:] == data[moov_at:]
    assert served[start:moov_at] == data[start:moov_at]
    assert served[48:start] == bytes(start - 48)
    assert {start, moov_at} <= set(ends)  # no read crossed into the span, nor out of it into the header
    view.remove(start, end, str(copy))
    assert view.empty and _read_all(view, start, moov_at)[0] == bytes(moov_at - start)


def test_a_span_over_bytes_read_as_a_hole_renames_the_view(mp4):
    data, path = mp4
    view = _view(data)
    first = view.served()
    assert view.read_at(2000, 100) == bytes(100)  # a decoder read a hole there (it probes at open)
    view.add(5000, 6000, str(path))  # elsewhere: the decoder holds no zeros of it
    assert view.served() == first
    view.add(1500, 2500, str(path))  # over what it read: its buffer may hold zeros of this span
    second = view.served()
    assert second != first and view.read_at(2000, 100) == data[2000:2100]
    assert view.superseded() == [first] and view.superseded() == []
    view.add(1500, 2500, str(path))  # held twice, let go of once: still served
    view.remove(1500, 2500, str(path))
    assert view.read_at(2000, 100) == data[2000:2100]
    assert sorted(view.names()) == [second]
