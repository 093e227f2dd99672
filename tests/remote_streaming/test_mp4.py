"""The mp4 index reader against PyAV's demuxer, and frames decoded from sparse span files equal
frames decoded from the whole file, for AV1 (GOP 2), H.264 without and with B-frames, with both
decoder backends; a span file's sample tables are cut to its own samples, at their offsets and
times; a layout it cannot map (fragmented mp4) is fetched whole and still decodes."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import torch

from episodestream.tools.synthetic import write_synthetic_dataset
from episodestream._format.metadata import EpisodeInfo, VideoSpan
from episodestream.remote import Mp4LayoutError
from episodestream.testing.source_files import open_remote_files
from episodestream._format.mp4 import Mp4Header, VideoTrack, read_header, read_local_track
from episodestream._format.mp4_trim import SpanTables, _Box, with_moov
from episodestream.testing.video_readers import open_video_reader

from .conftest import cache_files

FPS = 30
KEY = "observation.images.front"
SEGMENTS = [(0, 20), (20, 41), (41, 47), (47, 48), (48, 90)]  # frame ranges standing for episodes


def _write_h264(path: Path, *, b_frames: int, fragmented: bool = False) -> Path:
    """90 frames of a moving gradient (B-frames need motion to be chosen) with libx264."""
    path.parent.mkdir(parents=True, exist_ok=True)
    options = {"movflags": "frag_keyframe+empty_moov"} if fragmented else {}
    with av.open(str(path), "w", options=options) as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        stream.codec_context.time_base = Fraction(1, FPS)
        stream.options = {"g": "15", "bf": str(b_frames), "preset": "veryfast", "crf": "23"}
        yy, xx = np.mgrid[0:64, 0:96]
        for i in range(90):
            image = np.stack([(xx * 3 + i * 4) % 256, (yy * 4 + i * 2) % 256, (xx + yy + i * 8) % 256], -1)
            frame = av.VideoFrame.from_ndarray(image.astype(np.uint8), format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return path


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """One folder holding an mp4 per layout, as ``videos/<name>.mp4``."""
    root = tmp_path_factory.mktemp("mp4s")
    av1 = write_synthetic_dataset(root / "av1", num_episodes=1, episode_length=90, cameras=(KEY,), seed=2)
    h264 = write_synthetic_dataset(root / "h264", num_episodes=1, episode_length=90, cameras=(KEY,), codec="h264",
                                   gop=10, seed=2)
    folder = root / "remote"
    (folder / "videos").mkdir(parents=True)
    for name, dataset in (("av1", av1), ("h264", h264)):
        (folder / "videos" / f"{name}.mp4").write_bytes(
            (dataset / "videos" / KEY / "chunk-000" / "file-000.mp4").read_bytes())
    _write_h264(folder / "videos" / "h264-bframes.mp4", b_frames=3)
    _write_h264(folder / "videos" / "fragmented.mp4", b_frames=0, fragmented=True)
    return folder


def _demuxed(path: Path):
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        packets = [p for p in container.demux(stream) if p.size]
        return (np.array([float(p.pts * stream.time_base) for p in packets]), np.array([p.pos for p in packets]),
                np.array([p.size for p in packets]), np.array([p.is_keyframe for p in packets]))


@pytest.mark.parametrize("name", ["av1", "h264", "h264-bframes"])
def test_sample_tables_match_pyav(videos, name):
    path = videos / "videos" / f"{name}.mp4"
    data = path.read_bytes()
    header = read_header(lambda s, e: data[s:e], len(data))
    assert Mp4Header.from_bytes(header.to_bytes()) == header
    track = VideoTrack.parse(header.moov)
    pts, offsets, sizes, keys = _demuxed(path)
    np.testing.assert_allclose(track.pts_s, pts, atol=1e-9)
    assert (track.offsets == offsets).all() and (track.sizes == sizes).all() and (track.is_sync == keys).all()
    assert (track.reorder_depth > 0) == (name == "h264-bframes")


def test_fragmented_mp4_is_not_mapped(videos):
    data = (videos / "videos" / "fragmented.mp4").read_bytes()
    with pytest.raises(Mp4LayoutError, match="fragmented"):
        read_header(lambda s, e: data[s:e], len(data))


def _episode(index: int, name: str, first: int, end: int) -> EpisodeInfo:
    span = VideoSpan(f"videos/{name}.mp4", first / FPS, end / FPS)
    return EpisodeInfo(index, end - first, first, end, "data/none.parquet", (), {KEY: span})


@pytest.mark.parametrize("backend", ["torchcodec", "pyav"])
@pytest.mark.parametrize("name", ["av1", "h264", "h264-bframes", "fragmented"])
def test_sparse_spans_decode_like_the_whole_file(videos, tmp_path, name, backend):
    files = open_remote_files(f"file://{videos}", cache_dir=tmp_path / "cache")
    consumer = files.episode_videos()
    whole = open_video_reader(videos / "videos" / f"{name}.mp4", backend=backend)
    whole_track = None if name == "fragmented" else read_local_track(str(videos / "videos" / f"{name}.mp4"))
    cut = 0
    try:
        for index, (first, end) in enumerate(SEGMENTS):
            episode = _episode(index, name, first, end)
            consumer.admit(episode)
            local = consumer.local_file(episode, KEY)  # the span's sparse copy, or the whole file
            assert local != str(videos / "videos" / f"{name}.mp4") and Path(local).stat().st_size == \
                (videos / "videos" / f"{name}.mp4").stat().st_size
            if whole_track is not None:
                # The copy's decoder indexes the span's samples only (where the cut moov fits in the
                # old one's place), each at its byte offset and presentation time in the whole file.
                a, b = whole_track.samples(first / FPS, end / FPS)
                # The copy holds exactly those samples' bytes (its name: "<start>-<end>.<a>-<b>.mp4"):
                # FFmpeg reads a sample's bytes and no more, so no pad around them.
                span = whole_track.byte_span(a, b)
                assert Path(local).name.split(".")[0] == f"{span.start}-{span.end}", (Path(local).name, span)
                own = read_local_track(local)
                if len(own.sizes) == b - a + 1:
                    cut += 1
                    np.testing.assert_allclose(own.pts_s, whole_track.pts_s[a:b + 1], atol=1e-12)
                    assert (own.offsets == whole_track.offsets[a:b + 1]).all()
                    assert (own.is_sync == whole_track.is_sync[a:b + 1]).all()
                else:
                    assert len(own.sizes) == len(whole_track.sizes)
            # Every frame of the episode, in one call, as the decode path asks (half a frame late).
            seconds = [(f + 0.5) / FPS for f in range(first, end)]
            want = whole.frames_played_at(seconds)
            # What the decoders read (the mp4's view over its pooled spans, ``FileView``), and the
            # span's copy on its own (its own cut tables): both decode as the whole file does.
            for source in (consumer.path(episode, KEY), local):
                sparse = open_video_reader(source, backend=backend)
                got = sparse.frames_played_at(seconds)
                sparse.close()
                assert torch.equal(got[0], want[0]) and np.array_equal(got[1], want[1]), (name, first, end, source)
            consumer.evict(episode)
        stats = consumer.stats()
        assert (stats.whole_files, stats.spans) == ((len(SEGMENTS), 0) if name == "fragmented"
                                                   else (0, len(SEGMENTS)))
        # A 90-frame file's moov leaves no room for a cut one-frame span's in one case of five.
        assert cut >= (0 if name == "fragmented" else len(SEGMENTS) - 1), cut
    finally:
        whole.close()
        consumer.close()
        files.close()
    assert cache_files(tmp_path / "cache") == []


@pytest.mark.parametrize("name", ["av1", "h264", "h264-bframes"])
def test_cut_tables_keep_every_sample_where_it_lies_and_when_it_shows(videos, name):
    data = (videos / "videos" / f"{name}.mp4").read_bytes()
    header = read_header(lambda s, e: data[s:e], len(data))
    track = VideoTrack.parse(header.moov)
    tables = SpanTables.of(header.moov, offsets=track.offsets, sizes=track.sizes)
    assert tables is not None
    for first, last in [(0, 0), (0, 30), (10, 89), (47, 55), (89, 89)]:
        own = VideoTrack.parse(tables.moov_for(first, last))
        np.testing.assert_allclose(own.pts_s, track.pts_s[first:last + 1], atol=1e-12)
        assert (own.offsets == track.offsets[first:last + 1]).all() and (own.sizes == track.sizes[first:last + 1]).all()
        assert (own.is_sync == track.is_sync[first:last + 1]).all()
    small = with_moov(header, tables.moov_for(10, 20))
    assert small is not None and small.size_bytes < header.size_bytes
    assert VideoTrack.parse(small.moov).offsets.tolist() == track.offsets[10:21].tolist()


def test_a_layout_it_does_not_cut_keeps_the_whole_tables(videos):
    """A sample-table box it does not rewrite (here a sample-to-group table, runs of samples)
    would list the wrong samples after a cut: such a moov is not cut."""
    data = (videos / "videos" / "av1.mp4").read_bytes()
    header = read_header(lambda s, e: data[s:e], len(data))
    track = VideoTrack.parse(header.moov)
    tables = SpanTables.of(header.moov, offsets=track.offsets, sizes=track.sizes)
    assert tables is not None
    stbl = (b"trak", b"mdia", b"minf", b"stbl")
    extra = tables.root.with_child(stbl + (b"sbgp",), _Box(b"sbgp", bytes(16) + len(track.sizes).to_bytes(4, "big")))
    assert SpanTables.of(extra.to_bytes(), offsets=track.offsets, sizes=track.sizes) is None
    assert SpanTables.of(tables.root.to_bytes(), offsets=track.offsets, sizes=track.sizes) is not None


@pytest.mark.parametrize("name", ["av1", "h264"])
def test_samples_by_bisection_match_the_scan_of_every_sample(videos, name):
    """Frames shown in decode order (no B-frames): ``samples`` bisects, and answers as the scan of
    every sample (the path B-frame video takes) does, boundaries and lone frames included."""
    track = read_local_track(str(videos / "videos" / f"{name}.mp4"))
    scan = read_local_track(str(videos / "videos" / f"{name}.mp4"))
    scan.__dict__["_in_order"] = False  # the cached answer, overridden: the scan of every sample
    assert track._in_order
    bounds = [(a / FPS, b / FPS) for a in range(0, 90, 7) for b in range(a + 1, 91, 11)]
    bounds += [(1.0, 1.0 + 1e-3), (0.0, 100.0), (1.99, 2.01), (89.5 / FPS, 200.0)]
    for from_s, to_s in bounds:
        assert track.samples(from_s, to_s) == scan.samples(from_s, to_s), (from_s, to_s)
    for from_s, to_s in [(50.0, 60.0), (1.0, 1.0)]:
        with pytest.raises(Mp4LayoutError, match="no frame is shown"):
            track.samples(from_s, to_s)
        with pytest.raises(Mp4LayoutError, match="no frame is shown"):
            scan.samples(from_s, to_s)
