"""The DatasetFiles / EpisodeVideos seam, checked the same way against every implementation.

Everything above the seam (metadata, rows, sampling, decoding) reads a dataset only through it, so
an implementation that answers these questions as the local folder does serves every layer. The
sources: the local folder (``LocalFiles``), and ``RemoteFiles`` over ``file://`` (fsspec's local
filesystem), the Hub (``FakeHub``), S3 (``S3Server``, moto) and plain HTTP (``HttpServer``). The
expected answers come from the folder on disk, never from the implementation under test.
"""

from __future__ import annotations

import functools
import os
import shutil
from contextlib import ExitStack
from pathlib import Path

# huggingface_hub reads these when it is imported.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")

import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402

from episodestream import SourceStats  # noqa: E402
from episodestream.testing.source_files import DatasetFiles, EpisodeVideos, LocalFiles, RemoteFiles  # noqa: E402
from episodestream.tools.cli import dataset_info  # noqa: E402
from episodestream.testing.source_files import open_remote_files
from episodestream.testing import FakeHub, HttpServer, S3Server  # noqa: E402
from episodestream.testing.source_files import read_metadata  # noqa: E402
from episodestream.testing.video_readers import open_video_reader  # noqa: E402

REPO = "lerobot/main"
SOURCES = ["local", "file", "hub", "s3", "http"]
INFO = "meta/info.json"


def _on_disk(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


@pytest.fixture(scope="module", params=SOURCES)
def opener(request, dataset_root, tmp_path_factory):
    """A function opening the session dataset as one implementation of ``DatasetFiles``; servers
    run for the whole module (one per kind), and so do the files opened on them."""
    kind = request.param
    cache_dir = tmp_path_factory.mktemp(f"seam-cache-{kind}")
    with ExitStack() as stack:
        if kind == "local":
            yield lambda: LocalFiles(dataset_root)
        elif kind == "file":
            yield lambda: open_remote_files(dataset_root.as_uri(), cache_dir=cache_dir)
        elif kind == "hub":
            root = tmp_path_factory.mktemp("seam-hub")
            shutil.copytree(dataset_root, root / "datasets" / REPO)
            hub = stack.enter_context(FakeHub(root))
            yield lambda: open_remote_files(REPO, cache_dir=cache_dir, hub_endpoint=hub.url, token=False)
        elif kind == "s3":
            pytest.importorskip("s3fs")
            s3 = stack.enter_context(S3Server())
            s3.upload_folder(dataset_root, "robot-data", REPO)
            yield lambda: open_remote_files(f"s3://robot-data/{REPO}", cache_dir=cache_dir,
                                             storage_options=s3.storage_options())
        else:
            served = tmp_path_factory.mktemp("seam-http")
            shutil.copytree(dataset_root, served / "main")
            server = stack.enter_context(HttpServer(served))
            yield lambda: open_remote_files(server.url_for("main"), cache_dir=cache_dir)


@pytest.fixture(scope="module")
def files(opener):
    opened = opener()
    try:
        yield opened
    finally:
        opened.close()


def test_implements_the_seam(files):
    assert isinstance(files, DatasetFiles)
    assert isinstance(files, (LocalFiles, RemoteFiles))
    videos = files.episode_videos()
    try:
        assert isinstance(videos, EpisodeVideos)
        assert videos.prefetches is isinstance(files, RemoteFiles)  # local videos need no prefetch
    finally:
        videos.close()
    assert isinstance(files.description, str) and files.description


def test_files_sizes_and_bytes_match_the_folder(files, dataset_root):
    everything = _on_disk(dataset_root)
    assert files.list_files("data", suffix=".parquet") == [p for p in everything if p.startswith("data/")
                                                         and p.endswith(".parquet")]
    assert files.list_files("videos", suffix=".mp4") == [p for p in everything if p.startswith("videos/")]
    assert files.list_files("no-such-folder", suffix=".parquet") == []
    for relpath in everything:
        assert files.exists(relpath), relpath
        assert files.size_bytes(relpath) == (dataset_root / relpath).stat().st_size, relpath
    assert not files.exists("meta/no-such-file.json")
    assert files.read_bytes(INFO) == (dataset_root / INFO).read_bytes()
    assert Path(files.local_path(INFO)).read_bytes() == (dataset_root / INFO).read_bytes()


def test_paths_outside_the_root_are_refused(files):
    for relpath in ("../outside.json", "/etc/passwd", "meta/../../outside.json"):
        with pytest.raises(ValueError, match="escapes the dataset root"):
            files.exists(relpath)


def test_data_parquet_reads_as_on_disk(files, dataset_root):
    for relpath in files.list_files("data", suffix=".parquet"):
        got = pq.ParquetFile(files.open_input(relpath)).read()
        assert got.equals(pq.read_table(dataset_root / relpath)), relpath


def test_metadata_and_cache_budget_through_the_seam(files, dataset_root):
    meta = read_metadata(files)
    expected = read_metadata(LocalFiles(dataset_root))
    assert meta.episodes.keys() == expected.episodes.keys()
    assert meta.total_frames == expected.total_frames and meta.features.keys() == expected.features.keys()
    files.check_cache_budget(meta, episodes_in_flight=4)  # no cache_limit: nothing to refuse


def test_episode_videos_decode_as_the_local_files(files, dataset_root):
    meta = read_metadata(files)
    open_video = functools.partial(open_video_reader, backend="pyav")
    videos = files.episode_videos()
    try:
        episodes = [meta.episodes[i] for i in sorted(meta.episodes)[:3]]
        for episode in episodes:
            videos.admit(episode)
        for episode in episodes:
            for key, span in episode.videos.items():
                # First and last frame of the episode: both ends of a remote span must be there.
                seconds = [span.from_timestamp_s, span.from_timestamp_s + (episode.length - 1) / meta.fps]
                reader, expected_reader = open_video(videos.path(episode, key)), open_video(
                    str(dataset_root / span.relpath))
                try:
                    got, _ = reader.frames_played_at(seconds)
                    expected, _ = expected_reader.frames_played_at(seconds)
                finally:
                    reader.close()
                    expected_reader.close()
                assert np.array_equal(got.numpy(), expected.numpy()), (episode.episode_index, key)
            videos.evict(episode)
    finally:
        videos.close()


def test_stats_count_reads_and_cache_entries_of_this_process(files, dataset_root):
    """``stats()``: all zeros for a folder read in place. A source with a node cache counts the
    requests and bytes it read, and its cache entries: what one consumer acquires for an episode
    (downloads, on a fresh cache), a second consumer finds on disk, as many hits and no request."""
    meta = read_metadata(files)
    episode = meta.episodes[sorted(meta.episodes)[-1]]
    before = files.stats()
    first, second = files.episode_videos(), files.episode_videos()
    try:
        for key in episode.videos:
            first.path(episode, key)
        middle = files.stats()
        for key in episode.videos:
            second.path(episode, key)
        after = files.stats()
    finally:
        first.close()
        second.close()
    assert all(isinstance(stats, SourceStats) for stats in (before, middle, after))
    if files.node_cache_dir is None:
        assert isinstance(files, LocalFiles)
        assert before == middle == after == SourceStats(0, 0, 0, 0, 0)
        return
    assert Path(files.local_path(INFO)).is_relative_to(files.node_cache_dir)  # where the cache is
    acquired = (middle.cache_hits + middle.cache_misses) - (before.cache_hits + before.cache_misses)
    downloaded = middle.cache_misses - before.cache_misses
    assert acquired >= len(episode.videos) and downloaded > 0  # at least one entry per camera
    assert middle.requests > before.requests and middle.bytes_fetched > before.bytes_fetched
    # What the entries hold, at most their files (a span each, or a whole file) and a header each.
    video_bytes = sum((dataset_root / span.relpath).stat().st_size for span in episode.videos.values())
    assert 0 < middle.cache_miss_bytes - before.cache_miss_bytes <= 2 * video_bytes
    assert (after.cache_hits - middle.cache_hits, after.cache_misses, after.cache_miss_bytes) == (
        acquired, middle.cache_misses, middle.cache_miss_bytes)
    assert (after.requests, after.bytes_fetched) == (middle.requests, middle.bytes_fetched)


def test_info_reports_the_same_dataset_local_and_over_http(dataset_root, tmp_path):
    """`episodestream info` on a remote source (it called a method RemoteFiles did not have)."""
    expected = dataset_info(str(dataset_root))
    shutil.copytree(dataset_root, tmp_path / "served" / "main")
    with HttpServer(tmp_path / "served") as server:
        got, url = dataset_info(server.url_for("main")), server.url
    assert got["source"] == f"{url}/main" and expected["source"] == str(dataset_root)
    assert {k: v for k, v in got.items() if k != "source"} == {k: v for k, v in expected.items() if k != "source"}
    assert got["data_size_bytes"] == sum(p.stat().st_size for p in (dataset_root / "data").rglob("*.parquet"))
