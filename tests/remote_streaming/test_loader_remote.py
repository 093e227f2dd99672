"""EpisodeLoader over a remote source: its decode threads share one consumer's prefetching video
cache and the download controller; batches equal the local ones, each byte range is fetched once,
and every cache reference is released, also when a pass is dropped midway."""

from __future__ import annotations

import itertools
from collections import Counter

import torch.utils.data

from episodestream import EpisodeLoader, EpisodeStreamingDataset
from episodestream.testing import faults

from ..stream_model import unbatch
from .conftest import SPANS_REPO, assert_same_samples, cache_files, remote_dataset
from .test_bytes import RangeLoggingHub

OPTIONS = dict(episode_pool_size=3, prefetch_episodes=2, seed=3, decode_group_size=2, return_uint8=True)


def _unbatch(batches):
    return [sample for batch in batches for sample in unbatch(batch)]


def test_threads_share_the_remote_cache_and_fetch_each_range_once(hub_root, spans_root, tmp_path):
    local = list(torch.utils.data.DataLoader(EpisodeStreamingDataset(spans_root, **OPTIONS), batch_size=5))
    with RangeLoggingHub(hub_root) as hub, \
            remote_dataset(EpisodeStreamingDataset, SPANS_REPO, cache_dir=tmp_path / "cache", hub_endpoint=hub.url,
                           token=False, **OPTIONS) as dataset:
        hub.reset_stats()
        got = list(EpisodeLoader(dataset, 5, num_threads=4))
        gets = list(hub.gets)
    assert_same_samples(_unbatch(got), _unbatch(local))
    videos = Counter(g for g in gets if g[0].endswith(".mp4"))
    assert videos and max(videos.values()) == 1, [g for g, n in videos.items() if n > 1]
    assert cache_files(tmp_path / "cache") == [], "every reference released at the end of the pass"


def test_a_remote_passs_decoders_close_with_it(hub_root, tmp_path):
    """The node cache may delete a file, or fetch another span under its name, between passes: a
    decoder kept open would read the old bytes, so none outlives its pass (unlike a local one's)."""
    with RangeLoggingHub(hub_root) as hub, \
            remote_dataset(EpisodeStreamingDataset, SPANS_REPO, cache_dir=tmp_path / "cache", hub_endpoint=hub.url,
                           token=False, **OPTIONS) as dataset:
        readers = faults.count_video_readers(dataset)
        loader = EpisodeLoader(dataset, 5, num_threads=3)
        first = list(loader)
        assert readers.opened and readers.open_now() == [], "every decoder closed at the pass's end"
        opened_first = len(readers.opened)
        assert len(list(loader)) == len(first)
        assert len(readers.opened) > opened_first and readers.open_now() == [], "the next pass opened its own"
        loader.close()


def test_a_pass_dropped_midway_releases_its_cache_references(hub_root, tmp_path):
    with RangeLoggingHub(hub_root) as hub, \
            remote_dataset(EpisodeStreamingDataset, SPANS_REPO, cache_dir=tmp_path / "cache", hub_endpoint=hub.url,
                           token=False, **OPTIONS) as dataset:
        loader = EpisodeLoader(dataset, 5, num_threads=3)
        iterator = iter(loader)
        list(itertools.islice(iterator, 3))
        assert any(name.endswith(".mp4") for name in cache_files(tmp_path / "cache")), "spans are cached"
        del iterator
    assert cache_files(tmp_path / "cache") == []


class _AllLocalFirst:
    """An ``EpisodeVideos`` whose first ``path`` waits until every episode admitted so far is local."""

    def __init__(self, videos) -> None:
        self._videos, self._admitted, self._waited = videos, [], False

    def admit_many(self, episodes) -> None:
        self._admitted.extend(episodes)
        self._videos.admit_many(episodes)

    def path(self, episode, key):
        if not self._waited:
            self._waited = True
            for admitted in self._admitted:
                for camera in admitted.videos:
                    self._videos.local_file(admitted, camera)
        return self._videos.path(episode, key)

    def __getattr__(self, name):
        return getattr(self._videos, name)


def test_a_remote_mp4s_pooled_episodes_share_a_decoder_closed_when_they_leave_the_pool(hub_root, tmp_path):
    """A remote mp4's pooled episodes are read through one view of it (``FileView``): one decoder
    per mp4, not per episode, a second only where a span arrived over bytes a decoder had read as a
    hole (its buffer may hold them); and once none of its episodes is pooled, its decoders are
    closed then, not kept until the cache needs room (where they would be the most recently used,
    and a pooled file's decoder closed in their place)."""
    files = 2  # 9 episodes, 5 per mp4
    with RangeLoggingHub(hub_root) as hub, \
            remote_dataset(EpisodeStreamingDataset, SPANS_REPO, cache_dir=tmp_path / "wide", hub_endpoint=hub.url,
                           token=False, **{**OPTIONS, "episode_pool_size": 10}) as dataset:
        readers = faults.count_video_readers(dataset)
        faults.resize_decoder_cache(dataset, 20)
        # Every span local before the first decoder opens (no decoder then reads a hole a span
        # arrives over later, which would open a second): one decoder per mp4, the one decode thread's.
        faults.wrap_episode_videos(dataset, _AllLocalFirst)
        assert sum(1 for _ in dataset) == dataset.num_frames
        assert len(readers.opened) == files, readers.opened
    with RangeLoggingHub(hub_root) as hub, \
            remote_dataset(EpisodeStreamingDataset, SPANS_REPO, cache_dir=tmp_path / "narrow", hub_endpoint=hub.url,
                           token=False, **{**OPTIONS, "episode_pool_size": 2}) as dataset:
        readers = faults.count_video_readers(dataset)
        faults.resize_decoder_cache(dataset, 20)  # room for every decoder: none closed to make room
        closed_while_streaming = 0
        for _ in dataset:  # one decode thread: the last sample comes before the pass closes its decoders
            closed_while_streaming = len(readers.closed)
        # A pool of 2 over 2 mp4s leaves an mp4 now and then: its view's decoders close as it does.
        assert len(readers.opened) > 2 * files
        assert closed_while_streaming >= len(readers.opened) - 2 * files
