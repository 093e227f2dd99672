"""The node-cache budget a pool needs, estimated from above: each pooled episode's spans (each span
file with its own header, its sample tables cut to the span), and each mp4's header entry once, not
once per episode (a v3.0 file's episodes share it)."""

from __future__ import annotations

from episodestream._remote.source.budget import (episode_cache_bytes, header_cache_bytes, metadata_bytes,
                                                 pool_cache_bytes, video_cache_bytes)
from episodestream.testing.source_files import open_remote_files, read_metadata


def test_a_pool_counts_each_mp4s_header_once(spans_root, tmp_path):
    files = open_remote_files(f"file://{spans_root}", cache_dir=tmp_path / "cache")
    try:
        meta = read_metadata(files)
        episodes = list(meta.episodes.values())  # 9 episodes in 2 mp4s, one camera
        spans = sorted(episode_cache_bytes(files, meta).values(), reverse=True)
        headers = header_cache_bytes(files, meta)
        assert len(headers) == 2 and headers == sorted(headers, reverse=True)
        bytes_of = pool_cache_bytes(files, meta, 0)
        metadata = metadata_bytes(files)
        assert bytes_of(1) == metadata + spans[0] + headers[0]
        assert bytes_of(2) == metadata + sum(spans[:2]) + sum(headers)
        assert bytes_of(9) == bytes_of(20) == metadata + sum(spans) + sum(headers)
        assert video_cache_bytes(files, meta, episodes) == sum(spans) + sum(headers)
        # Two episodes of one mp4: its header once.
        same_file = [e for e in episodes if e.videos[next(iter(e.videos))].relpath == "videos/observation.images.front/chunk-000/file-000.mp4"][:2]
        assert len(same_file) == 2
        assert len(header_cache_bytes(files, meta, same_file)) == 1
    finally:
        files.close()
