"""``episode_pool_size="auto"``: wide where the layout makes it free, the spread pool (96, or what the
decoder cache holds) elsewhere, and why."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import pytest

from episodestream import EpisodeStreamingDataset
from episodestream._plan.sampling import EpochPlan, Segment, consumer_rng, consumer_schedule
from episodestream._plan.shuffle_quality import shuffle_quality
from episodestream._base.world import World
from episodestream._runtime.pool_size import (AUTO_DECODE_THREADS, NARROW_POOL, REMOTE_POOL_BYTES, REMOTE_SPREAD_POOL, ROWS_BUDGET_BYTES,
                                              SPREAD_POOL, choose_pool_size, row_bytes_per_frame,
                                              spread_pool, video_decoder_limit)
from episodestream._sample.video.decoder_cache import MAX_DECODERS


def test_auto_holds_every_episode_where_the_video_files_fit(many_episodes_root, caplog):
    """20 episodes in 3 video files of one camera (a pool of 96 may keep 96 open): the pool holds
    them all, one more than a consumer can own, and the choice is logged with its reason; never
    narrower than 16, and a number given is kept."""
    with caplog.at_level(logging.INFO, logger="episodestream.streaming"):
        dataset = EpisodeStreamingDataset(many_episodes_root)
    assert dataset.episode_pool_size == 21
    assert "episode_pool_size 'auto'" in caplog.text and "3 video file(s)" in caplog.text
    assert EpisodeStreamingDataset(many_episodes_root, episode_pool_size=3).episode_pool_size == 3
    assert EpisodeStreamingDataset(many_episodes_root, episodes=[0, 2]).episode_pool_size == NARROW_POOL


@pytest.mark.parametrize("value, error", [("wide", ValueError), (0, ValueError), (2.5, TypeError), (True, TypeError)])
def test_a_pool_size_is_an_int_or_auto(dataset_root, value, error):
    with pytest.raises(error, match="episode_pool_size"):
        EpisodeStreamingDataset(dataset_root, episode_pool_size=value)


class _Selection:
    """An ``EpisodeSelection`` as ``choose_pool_size`` reads it: a count, lengths and video files."""

    def __init__(self, episodes: int, files: int, length: int = 100) -> None:
        self.lengths, self._files = np.full(episodes, length), files

    def __len__(self) -> int:
        return len(self.lengths)

    def video_files(self) -> int:
        return self._files


def test_auto_spreads_where_a_wide_pool_costs_decoders_or_the_node_cache(many_episodes_root):
    meta = EpisodeStreamingDataset(many_episodes_root, episode_pool_size=1).typed_meta  # 1 camera
    assert spread_pool(meta) == SPREAD_POOL
    # What the decoders of its frames' size may take in memory, less one lent to the other of two
    # decode threads at once (the threads share one cache).
    limit = video_decoder_limit(meta) - (AUTO_DECODE_THREADS - 1)
    assert MAX_DECODERS < limit
    assert choose_pool_size(meta, _Selection(500, limit), remote=False).size == 501
    more_files = choose_pool_size(meta, _Selection(500, limit + 1), remote=False)  # v2.x: a file per episode
    assert more_files.size == SPREAD_POOL and f"{limit + 1} video files" in more_files.reason
    # The log line says what a run of 100 steps draws from: the pool and the 32 episodes it moves on by.
    assert "over 3,200 consecutive samples a consumer draws from ~128 episodes" in more_files.reason
    assert "shuffles its whole share" in choose_pool_size(meta, _Selection(500, 4), remote=False).reason
    assert choose_pool_size(meta, _Selection(500, 4), remote=True).size == REMOTE_SPREAD_POOL == 64
    assert choose_pool_size(meta, _Selection(5000, 4), remote=False).size == 5001  # every episode, however many
    assert choose_pool_size(meta, _Selection(3, 4), remote=False).size == NARROW_POOL  # never below 16
    assert choose_pool_size(meta, _Selection(40, 100), remote=False).size == 41  # no wider than its episodes + 1
    long_episodes = _Selection(5000, 4, length=ROWS_BUDGET_BYTES // row_bytes_per_frame(meta) // 100)
    assert choose_pool_size(meta, long_episodes, remote=False).size == 100  # the rows budget
    longer = _Selection(5000, 5000, length=ROWS_BUDGET_BYTES // row_bytes_per_frame(meta) // 20)
    assert choose_pool_size(meta, longer, remote=False).size == 20  # the spread pool within the rows budget
    huge = _Selection(5000, 5000, length=ROWS_BUDGET_BYTES // row_bytes_per_frame(meta))
    assert choose_pool_size(meta, huge, remote=False).size == NARROW_POOL  # never below 16


def test_a_remote_auto_pool_is_what_the_cache_limit_holds(many_episodes_root):
    meta = EpisodeStreamingDataset(many_episodes_root, episode_pool_size=1).typed_meta
    asked: list[int] = []

    def holds(limit: int):
        def check(pool: int) -> bool:
            asked.append(pool)
            return pool <= limit
        return check

    assert choose_pool_size(meta, _Selection(500, 4), remote=True, cache_holds=holds(64)).size == 64
    choice = choose_pool_size(meta, _Selection(500, 4), remote=True, cache_holds=holds(40))
    assert choice.size == 32 and "cache_limit holds a pool of 32" in choice.reason
    # Nothing wider fits: the floor, which the dataset's own cache check refuses if it does not fit.
    assert choose_pool_size(meta, _Selection(500, 4), remote=True, cache_holds=holds(3)).size == NARROW_POOL
    assert asked == [64, 64, 48, 32, 64, 48, 32, 16]  # the widest first, until one fits


def _pool_bytes(episode_bytes: int, metadata_bytes: int = 10**6, extra: int = 5):
    """A remote source's ``pool_cache_bytes`` where every episode's video takes ``episode_bytes``."""
    return lambda: (lambda pool: metadata_bytes + (pool + extra) * episode_bytes)


def test_a_remote_pool_is_as_wide_as_its_node_cache_budget_and_decoders_allow(many_episodes_root):
    """A remote v3.0 source: bounded by disk, its files read through a view each (a decoder per
    mp4, as on a local disk). Small episodes: every one, each consumer's whole share. Large ones: as
    many as REMOTE_POOL_BYTES of node cache hold (pool + prefetched episodes), and a cache_limit
    narrows it further. A source that cannot size its episodes without asking about every file
    (v2.x), or whose spread pool passes the budget, keeps the spread pool of 64."""
    meta = EpisodeStreamingDataset(many_episodes_root, episode_pool_size=1).typed_meta
    whole = choose_pool_size(meta, _Selection(300, 4), remote=True, pool_bytes=_pool_bytes(10**5))
    assert whole.size == 301 and "whole share" in whole.reason
    big = 10 * 2**20
    budget = choose_pool_size(meta, _Selection(5000, 4), remote=True, pool_bytes=_pool_bytes(big))
    assert budget.size == (REMOTE_POOL_BYTES - 10**6) // big - 5  # the widest whose bytes fit
    assert "GiB of node cache per consumer" in budget.reason and "3,200 consecutive samples" in budget.reason
    narrowed = choose_pool_size(meta, _Selection(5000, 4), remote=True, pool_bytes=_pool_bytes(big),
                                cache_holds=lambda pool: pool <= 300)
    assert narrowed.size == budget.size // 2  # the budget's, then three quarters, then half of it
    quarter = choose_pool_size(meta, _Selection(5000, 4), remote=True, pool_bytes=_pool_bytes(big),
                               cache_holds=lambda pool: pool <= 110)
    assert quarter.size == budget.size // 4  # then halving on, while it stays above the spread pool
    # A decoder per mp4, not per pooled episode: small episodes of few files pool the whole share;
    # more files than the decoders hold, the spread pool (their decoders would thrash).
    small = choose_pool_size(meta, _Selection(5000, 4), remote=True, pool_bytes=_pool_bytes(10**5))
    assert small.size == 5001 and "whole share" in small.reason
    many_files = video_decoder_limit(meta) - AUTO_DECODE_THREADS + 2
    assert choose_pool_size(meta, _Selection(5000, many_files), remote=True,
                            pool_bytes=_pool_bytes(10**5)).size == REMOTE_SPREAD_POOL
    assert choose_pool_size(meta, _Selection(5000, 4), remote=True, pool_bytes=lambda: None).size == REMOTE_SPREAD_POOL
    huge = choose_pool_size(meta, _Selection(5000, 4), remote=True, pool_bytes=_pool_bytes(REMOTE_POOL_BYTES // 32))
    assert huge.size == REMOTE_SPREAD_POOL  # not even the spread pool fits the budget: the old rule


def test_the_decoder_limit_is_a_memory_budget_within_open_files():
    """Small frames: more decoders than large ones; never fewer than MAX_DECODERS, never more than
    the ceiling or half the process's open-file limit."""
    import resource

    from episodestream._sample.video.decoder_cache import DECODERS_CEILING, decoder_limit

    small, large = decoder_limit([64 * 96] * 2), decoder_limit([480 * 640] * 2)
    assert MAX_DECODERS < large < small <= DECODERS_CEILING
    assert decoder_limit([4096 * 4096]) == MAX_DECODERS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (600, hard))
        assert decoder_limit([64 * 96]) == 300
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_decoder_counts_its_files_index(many_episodes_root):
    """Each open decoder holds its file's index (tens of bytes a frame, several MB for a v3.0 file of
    ~10^5 frames): long files leave room for fewer decoders, down to MAX_DECODERS; a source's limit
    counts its own files' frames (20 episodes in 3 files of one camera here)."""
    from episodestream._runtime.pool_size import frames_per_video_file
    from episodestream._sample.video.decoder_cache import decoder_limit

    pixels = [64 * 96] * 2
    assert decoder_limit(pixels, frames_per_file=20_000) < decoder_limit(pixels) / 1.5
    assert decoder_limit(pixels, frames_per_file=150_000) == MAX_DECODERS
    meta = EpisodeStreamingDataset(many_episodes_root).typed_meta
    spans = [span for episode in meta.episodes.values() for span in episode.videos.values()]
    per_file = meta.total_frames / len({span.relpath for span in spans})
    assert len({span.relpath for span in spans}) == 3
    assert frames_per_video_file(meta) == per_file
    pixels = [int(np.prod(sorted(meta.features[key].shape)[-2:])) for key in meta.video_keys]
    assert video_decoder_limit(meta) == decoder_limit(pixels, frames_per_file=per_file)


def test_a_rank_counts_its_own_episodes_files_where_each_episode_has_its_own(many_episodes_root):
    """v2.x (a file per episode and camera): a rank's share is its episodes' files, so ranks widen
    the pool to their whole share where one consumer of every file could not; shared files (v3.0)
    are in every rank's share."""
    meta = EpisodeStreamingDataset(many_episodes_root, episode_pool_size=1).typed_meta
    cap = video_decoder_limit(meta) - (AUTO_DECODE_THREADS - 1)
    own_files = dataclasses.replace(meta, episodes_share_video_files=False)
    selection = _Selection(1000, 2 * cap)
    assert choose_pool_size(own_files, selection, remote=False).size == SPREAD_POOL
    assert choose_pool_size(own_files, selection, remote=False, world_size=2).size == SPREAD_POOL  # the cut one
    assert choose_pool_size(own_files, selection, remote=False, world_size=3).size == 1001
    assert choose_pool_size(meta, selection, remote=False, world_size=3).size == SPREAD_POOL
    reason = choose_pool_size(own_files, selection, remote=False, world_size=2).reason
    assert f"a rank's share of the selection (2 ranks) is in {cap + 1} video files" in reason


@pytest.mark.parametrize("threads", [1, 2, 8])
def test_a_consumers_decode_threads_share_its_decoder_budget(many_episodes_root, threads):
    """However many threads decode, a consumer's decoders are one cache within its budget, each file
    open once but for the few that several threads read at once."""
    dataset = EpisodeStreamingDataset(many_episodes_root, episode_pool_size=5000, decode_threads=threads)
    assert sum(1 for _ in dataset) == dataset.num_frames
    stats = dataset.decoder_stats()
    assert stats["capacity"] == video_decoder_limit(dataset.typed_meta)  # one cache, not one a thread
    files = len(list(Path(many_episodes_root, "videos").rglob("*.mp4")))
    # Every file opened once, and again only where threads read it at once: never closed for room.
    assert files <= stats["misses"] <= files * threads and stats["evictions"] == 0


def test_the_spread_pool_keeps_every_cameras_files_in_the_decoder_cache():
    class _Meta:
        def __init__(self, cameras: int) -> None:
            self.video_keys = [f"observation.images.{i}" for i in range(cameras)]

    assert [spread_pool(_Meta(c)) for c in (0, 1, 2, 3, 4, 16)] == [96, 96, 64, 42, 32, 16]
    assert all(spread_pool(_Meta(c)) * c <= MAX_DECODERS for c in (1, 2, 3, 4, 8))


def test_the_auto_pool_shuffles_like_a_global_shuffle():
    """What the choice buys, planned: 1,100 episodes of 20-40 frames, one consumer, batch 32: the
    spread pool and a pool of every episode >= 0.95 of a global shuffle's distinct episodes; the old
    default of 16 under 0.55, and under 0.85 with 64 iid keys (each frame's key drawn on its own, as
    before /4: spreading the keys is what the spread pool needs)."""
    assert _least_ratio(1100, NARROW_POOL) < 0.55
    assert _least_ratio(1100, 64, keys="iid") < 0.85
    assert _least_ratio(1100, SPREAD_POOL) >= 0.95
    assert _least_ratio(1100, 1101) >= 0.95


@pytest.mark.parametrize("cameras", [1, 2, 3])
def test_every_cameras_spread_pool_shuffles_small_shares_like_a_global_shuffle(cameras):
    """DataLoader workers split an epoch into small shares, whose ramp and end weigh more: 1,000
    episodes of 20-40 frames over 4 workers (250 each), batch 32: the least diverse worker at the
    spread pool of 1, 2 or 3 cameras (96, 64, 42; a remote source's, at most 64, is one of them unless
    its cache_limit narrows it) >= 0.95 of a global shuffle's distinct episodes."""
    class _Meta:
        video_keys = [f"observation.images.{i}" for i in range(cameras)]

    assert _least_ratio(1000, spread_pool(_Meta()), workers=4) >= 0.95  # type: ignore[arg-type]


def test_systematic_keys_are_what_a_pool_of_64_needs_on_small_shares():
    """The same small shares at pool 64: a random point per stratum (the /4 schedule) fell short of
    0.95; one point for all of a segment's strata reaches it."""
    assert _least_ratio(1000, 64, workers=4, keys="stratified") < 0.95 <= _least_ratio(1000, 64, workers=4)


def _least_ratio(episodes: int, pool: int, *, workers: int = 1, keys: str = "systematic") -> float:
    """Planned distinct episodes per batch of 32 against a global shuffle of the epoch, for the least
    diverse of ``workers`` consumers of ``episodes`` episodes of 20-40 frames (``keys``: the schedule's
    own, "systematic"; "iid", each frame's key drawn on its own; "stratified", a random point per stratum)."""
    lengths = np.random.default_rng(0).integers(20, 41, episodes)
    plan = EpochPlan([Segment(i, range(int(n))) for i, n in enumerate(lengths)], seed=0, epoch=0,
                     shuffle=True, world_size=1)
    ratios = []
    for world in (World(0, 1, worker, workers) for worker in range(workers)):
        steps = consumer_schedule(plan.share(world), pool_size=pool, shuffle=True, rng=consumer_rng(0, 0, world))
        if keys != "systematic":
            steps._window_keys = lambda lo, hi, steps=steps: np.concatenate(  # type: ignore[method-assign]
                [np.zeros(0)] + [_older_keys(steps, i, keys) for i in range(lo, hi)])
        ratios.append(shuffle_quality(steps, 32, frame_counts=lengths).ratio)
    return min(ratios)


def _older_keys(schedule, i: int, kind: str) -> np.ndarray:
    """Segment ``i``'s keys, sorted, as older schedules drew them: "iid" (/3), each independently and
    uniformly in its window; "stratified" (/4), one per equal stratum of it, each at a random point of
    its own. Which frame each key emits is the schedule's own random permutation, as it was then."""
    a, b = int(schedule._a[i]), int(schedule._b[i])
    rng = np.random.default_rng(i)
    n = len(schedule._segments[i])
    spread = rng.random(n) if kind == "iid" else (np.arange(n) + rng.random(n)) / n
    return np.sort(a + (b - a) * spread)


@pytest.mark.parametrize("world_size, workers", [(1, 1), (2, 4)])
def test_the_auto_pool_shuffles_training_windows_like_a_global_shuffle(many_episodes_root, world_size, workers):
    """Over runs of steps, not only batches: where the files fit the decoders, "auto" pools a whole
    share, and every consumer's 3,200- and 32,000-sample windows (100 and 1,000 steps of 32) hold
    >= 0.9 of the distinct episodes a uniform permutation of its own frames holds (700 episodes of
    40-150 frames); the spread pool, which v2.x gets, holds under a third of them at 3,200."""
    meta = EpisodeStreamingDataset(many_episodes_root, episode_pool_size=1).typed_meta
    lengths = np.random.default_rng(5).integers(40, 151, 700)
    selection = _Selection(700, 4)
    selection.lengths = lengths
    auto = choose_pool_size(meta, selection, remote=False).size
    assert auto == 701
    plan = EpochPlan([Segment(i, range(int(n))) for i, n in enumerate(lengths)], seed=0, epoch=0,
                     shuffle=True, world_size=world_size)
    windows = (3_200, 32_000)
    for pool, least in ((auto, 0.9), (spread_pool(meta), None)):
        for world in (World(r, world_size, w, workers) for r in range(world_size) for w in range(workers)):
            steps = consumer_schedule(plan.share(world), pool_size=pool, shuffle=True, rng=consumer_rng(0, 0, world))
            quality = shuffle_quality(steps, 32, windows=windows)
            measured = [w for w in quality.windows if w.windows]
            assert measured and measured[0].window == 3_200
            if least is not None:
                assert quality.ratio >= 0.95 and all(w.ratio >= least for w in measured), (world, quality)
            elif world_size == 1:
                assert measured[0].ratio < 0.33, quality
