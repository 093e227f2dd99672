"""``episode_pool_size="auto"``: wide where the layout makes it free, 16 elsewhere, and why."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from episodestream import EpisodeStreamingDataset
from episodestream._plan.sampling import EpochPlan, Segment, consumer_rng, consumer_schedule
from episodestream._plan.shuffle_quality import shuffle_quality
from episodestream._base.world import World
from episodestream._runtime.pool_size import (NARROW_POOL, ROWS_BUDGET_BYTES, WIDE_POOL_MAX, choose_pool_size,
                                              row_bytes_per_frame)


def test_auto_holds_every_episode_where_the_video_files_fit(many_episodes_root, caplog):
    """20 episodes in 3 video files of one camera (a pool of 16 may keep 16 open): the pool holds
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


def test_auto_stays_narrow_where_a_wide_pool_costs_decoders_or_the_node_cache(many_episodes_root):
    meta = EpisodeStreamingDataset(many_episodes_root, episode_pool_size=1).typed_meta  # 1 camera
    assert choose_pool_size(meta, _Selection(500, 16), remote=False).size == 501
    more_files = choose_pool_size(meta, _Selection(500, 17), remote=False)  # v2.x: a file per episode and camera
    assert more_files.size == NARROW_POOL and "17 video files" in more_files.reason
    assert choose_pool_size(meta, _Selection(500, 4), remote=True).size == NARROW_POOL
    assert choose_pool_size(meta, _Selection(5000, 4), remote=False).size == WIDE_POOL_MAX
    assert choose_pool_size(meta, _Selection(3, 4), remote=False).size == NARROW_POOL  # never below 16
    long_episodes = _Selection(5000, 4, length=ROWS_BUDGET_BYTES // row_bytes_per_frame(meta) // 100)
    assert choose_pool_size(meta, long_episodes, remote=False).size == 100  # the rows budget


def test_the_auto_pool_shuffles_like_a_global_shuffle():
    """What the choice buys, planned: 1,100 episodes of 20-40 frames (more than the widest auto pool
    holds), one consumer, batch 32: pool 16 draws under half a global shuffle's distinct episodes,
    the widest auto pool >= 0.95."""
    lengths = np.random.default_rng(0).integers(20, 41, 1100)
    plan = EpochPlan([Segment(i, range(int(n))) for i, n in enumerate(lengths)], seed=0, epoch=0,
                     shuffle=True, world_size=1)
    world = World(0, 1, 0, 1)

    def ratio(pool: int) -> float:
        steps = consumer_schedule(plan.share(world), pool_size=pool, shuffle=True, rng=consumer_rng(0, 0, world))
        return shuffle_quality(steps, 32, frame_counts=lengths).ratio

    assert ratio(NARROW_POOL) < 0.5
    assert ratio(WIDE_POOL_MAX) >= 0.95
