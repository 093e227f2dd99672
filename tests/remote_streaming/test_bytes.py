"""Counted bytes, on the server: each span and header is fetched once per node even when two
DataLoader workers want it at once; an episode costs at most 1.25x its own compressed video bytes
plus the file's header; an episode's rows cost its row group, not its data file."""

from __future__ import annotations

import struct
import threading
from collections import Counter
from pathlib import Path

import av
import torch.utils.data

from episodestream import EpisodeStreamingDataset
from episodestream.testing.source_files import open_files, open_remote_files, read_metadata, row_reader
from episodestream.testing import FakeHub

from .conftest import ROWS_REPO, SPANS_REPO, assert_same_samples, cache_files, remote_dataset

HEADER_READ_BLOCK = 4096  # the reader fetches box headers in blocks of this size (remote/_remote_videos.py)
FOOTER_READ_BYTES = 64 * 1024  # pyarrow reads a parquet file's footer as its last 64 KiB


class RangeLoggingHub(FakeHub):
    """FakeHub that also records the Range header of every file GET (FakeHub counts per file only)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gets: list[tuple[str, str | None]] = []
        self._log_lock = threading.Lock()

    def _send_file(self, handler, repo_dir, repo_id, sha, path_in_repo):
        if handler.command == "GET":
            with self._log_lock:
                self.gets.append((path_in_repo, handler.headers.get("Range")))
        return super()._send_file(handler, repo_dir, repo_id, sha, path_in_repo)


def episode_video_bytes(path: Path, spans: list[tuple[float, float]]) -> list[int]:
    """Compressed bytes of the frames shown in each [from, to) (PyAV's demuxer, not our parser)."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        packets = [(float(p.pts * stream.time_base), p.size) for p in container.demux(stream) if p.size]
    return [sum(size for pts, size in packets if start - 1e-6 <= pts < end - 1e-6) for start, end in spans]


def header_bytes(path: Path) -> int:
    """ftyp, moov and every top-level box header: what a decoder reads before any sample."""
    data, offset, total = path.read_bytes(), 0, 0
    while offset < len(data):
        size, kind = struct.unpack_from(">I4s", data, offset)
        total += 8 if kind == b"mdat" else size
        offset += size
    return total


def test_each_span_fetched_once_per_node_and_bytes_per_episode(hub_root, spans_root, tmp_path):
    # A pool as large as each worker's share admits every episode at the start, so the episode
    # cut between the two workers' shares is wanted by both at once.
    options = dict(episode_pool_size=9, prefetch_episodes=2, seed=3, shuffle=True)
    loader_options = dict(batch_size=4, num_workers=2)
    local = list(torch.utils.data.DataLoader(EpisodeStreamingDataset(spans_root, **options), **loader_options))
    with RangeLoggingHub(hub_root, redirect_resolve=True) as hub, \
            remote_dataset(EpisodeStreamingDataset, SPANS_REPO, cache_dir=tmp_path / "cache", hub_endpoint=hub.url,
                           token=False, **options) as dataset:
        hub.reset_stats()
        got = list(torch.utils.data.DataLoader(dataset, **loader_options))
        stats, gets = hub.stats(), list(hub.gets)
        meta = dataset.typed_meta
    assert_same_samples(got, local)
    assert cache_files(tmp_path / "cache") == []

    videos = Counter(g for g in gets if g[0].endswith(".mp4"))
    assert videos and all(rng is not None for _, rng in videos), "no mp4 is fetched whole"
    assert max(videos.values()) == 1, [g for g, n in videos.items() if n > 1]
    by_file: dict[str, list] = {}
    for episode in meta.episodes.values():
        for span in episode.videos.values():
            by_file.setdefault(span.relpath, []).append((span.from_timestamp_s, span.to_timestamp_s))
    for relpath, spans in by_file.items():
        own = episode_video_bytes(spans_root / relpath, spans)
        header = header_bytes(spans_root / relpath)
        fetched = stats.by_file[f"{SPANS_REPO}/{relpath}"].bytes_sent
        # The header's box headers come in small blocks: at most two blocks past the header itself.
        assert fetched <= 1.25 * sum(own) + header + 2 * HEADER_READ_BLOCK, (relpath, fetched, own, header)


def test_rows_fetch_the_row_group_and_the_footer_once(hub_root, rows_root, tmp_path):
    meta = read_metadata(open_files(rows_root))
    first_file = list(meta.episodes.values())
    assert len({ep.data_relpath for ep in first_file}) == 1
    with FakeHub(hub_root) as hub:
        files = open_remote_files(ROWS_REPO, cache_dir=tmp_path / "cache", hub_endpoint=hub.url, token=False)
        try:
            reader, local_reader = row_reader(files, meta), row_reader(open_files(rows_root), meta)
            key = f"{ROWS_REPO}/{first_file[0].data_relpath}"
            size = files.size_bytes(first_file[0].data_relpath)
            sent = []
            for episode in first_file:
                rows, expected = reader.read(episode), local_reader.read(episode)
                for name in expected.columns:
                    assert (rows.columns[name] == expected.columns[name]).all()
                sent.append(hub.stats().by_file[key].bytes_sent - sum(sent))
            requests = hub.stats().by_file[key].requests
        finally:
            files.close()
    # Each episode costs its row group, about a third of the file; the first also pays for the
    # footer, which pyarrow reads as the file's last 64 KiB, once.
    third = size / 3
    assert sent[0] <= third + FOOTER_READ_BYTES + 8192, (sent, size)
    assert sent[1] <= 1.05 * third and sent[2] <= 1.05 * third, (sent, size)
    assert requests <= 2 + 2 * len(sent), requests  # footer + one or two per row group
    assert cache_files(tmp_path / "cache") == []


def test_ranks_of_two_nodes_fetch_each_cut_episode_once(hub_root, spans_root, tmp_path):
    # 2 nodes x 2 ranks, one process: the epoch's frames are cut into 4 equal parts, so 3 episodes
    # are split between two ranks. Each rank fetches the video of the part it streams (plus a
    # keyframe and two frames), not the whole cut episode: fetched whole, the 3 cut episodes of 9
    # cost a third more video than the epoch's.
    options = dict(episode_pool_size=3, seed=3, shuffle=True, world_size=4)
    with RangeLoggingHub(hub_root) as hub:
        hub.reset_stats()
        for rank in range(4):
            node_cache = tmp_path / f"node-{rank // 2}"
            local = list(EpisodeStreamingDataset(spans_root, rank=rank, **options))
            with remote_dataset(EpisodeStreamingDataset, SPANS_REPO, cache_dir=node_cache, hub_endpoint=hub.url,
                                token=False, rank=rank, **options) as dataset:
                assert_same_samples(list(dataset), local)
                meta = dataset.typed_meta
            assert cache_files(node_cache) == []
        stats, gets = hub.stats(), list(hub.gets)
    by_file: dict[str, list] = {}
    for episode in meta.episodes.values():
        for span in episode.videos.values():
            by_file.setdefault(span.relpath, []).append((span.from_timestamp_s, span.to_timestamp_s))
    own = sum(sum(episode_video_bytes(spans_root / relpath, spans)) for relpath, spans in by_file.items())
    # Span reads: ranges inside mdat. The header's reads: the file's start, its tail (read with
    # it) and what lies from moov on. (A span starts past ftyp and mdat's header.)
    moov = {relpath: moov_offset(spans_root / relpath) for relpath in by_file}
    span_bytes = 0
    for relpath, header in gets:
        if relpath in moov and header is not None:
            start, end = (int(v) for v in header.removeprefix("bytes=").split("-"))
            size = (spans_root / relpath).stat().st_size
            if start > 0 and end != size - 1 and start < moov[relpath]:
                span_bytes += end + 1 - start
    assert sum(s.bytes_sent for key, s in stats.by_file.items() if key.endswith(".mp4")) > span_bytes > own
    assert span_bytes <= 1.2 * own, (span_bytes, own)


def moov_offset(path: Path) -> int:
    data, offset = path.read_bytes(), 0
    while offset < len(data):
        size, kind = struct.unpack_from(">I4s", data, offset)
        if kind == b"moov":
            return offset
        offset += size
    raise AssertionError(f"no moov in {path}")



def test_prewarm_reads_neighbouring_spans_of_an_mp4_together(hub_root, spans_root, tmp_path):
    """``prewarm`` admits its episodes a batch at a time: past the head start (the first four, one
    after another), the neighbouring spans of one mp4 come in one request; every span is pinned and
    holds the mp4's bytes."""
    from episodestream.testing.source_files import prewarm

    meta = read_metadata(open_files(spans_root))
    episodes = list(meta.episodes.values())
    key = next(iter(episodes[0].videos))
    mp4s = sorted({e.videos[key].relpath for e in episodes})
    assert len(episodes) == 9 and len(mp4s) == 2  # 5 episodes in the first mp4, 4 in the second
    with RangeLoggingHub(hub_root) as hub:
        files = open_remote_files(SPANS_REPO, cache_dir=tmp_path / "cache", hub_endpoint=hub.url, token=False)
        try:
            read_metadata(files)
            hub.reset_stats()
            report = prewarm(files, episodes)
            requests = {relpath: hub.stats().by_file[f"{SPANS_REPO}/{relpath}"].requests for relpath in mp4s}
            spans = [e for e in files.cache.list_entries() if "/spans/" in e.name and e.pinned]
        finally:
            files.close()
    assert report.episodes == 9 and len(spans) == 9
    # First mp4: its header (start and tail), the head start's 4 spans one by one, the fifth alone.
    # Second mp4: its header, then its 4 neighbouring spans in one request (4 apart).
    assert requests == {mp4s[0]: 2 + 4 + 1, mp4s[1]: 2 + 1}, requests
