"""Curated anchors (``_plan.curation``) through the schedule, tabular-free, in hundreds of layouts.

Keep-ranges make an episode's segment a subset of its frames; weights make several segments of
one episode whose anchors are distinct (copy ``c`` of frame ``f`` is anchor ``c * length + f``)
and emit ``anchor % length``. Checked here on anchors themselves: every anchor of an epoch is
owned by exactly one consumer and emitted once (fill-ins aside), skipping equals walking, what a
consumer consumed (``consumed``) is what it emitted, and what is left after removing it
(``remaining_segments``, elastic resume) is exactly the anchors not yet emitted.
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from episodestream._base.world import World
from episodestream._plan.curation import Anchors, KeepRanges, anchor_counts, check_keep_frames, check_weights
from episodestream._plan.resume import _walk_skip, loader_consumption, remaining_segments
from episodestream._plan.sampling import EpochPlan, consumer_rng, consumer_schedule

from .stream_model import chunks, sweep
from .test_schedule import _check_pool, _emits


def random_keep(rng: np.random.Generator, lengths: np.ndarray) -> dict:
    """A random keep-range layout: per episode none, one or several disjoint ranges (some
    touching), a few episodes left out or named with no range."""
    keep: dict = {}
    for episode, length in enumerate(lengths.tolist()):
        roll = rng.random()
        if roll < 0.1:
            continue  # not named: no kept frame
        if roll < 0.15:
            keep[str(episode)] = []  # named with no range (a str key, as JSON has)
            continue
        cuts = np.sort(rng.choice(length + 1, size=min(length + 1, 2 * int(rng.integers(1, 4))), replace=False))
        ranges = [(int(a), int(b)) for a, b in zip(cuts[::2], cuts[1::2]) if a < b]
        rng.shuffle(ranges)  # any order is accepted
        keep[episode] = ranges
    return keep


def random_anchors(rng: np.random.Generator) -> tuple[Anchors, np.ndarray]:
    """Anchors of a random dataset: random keep-ranges, and random (integer, fractional, zero) weights."""
    lengths = rng.integers(1, 30, size=int(rng.integers(1, 20))).astype(np.int64)
    episodes = np.arange(len(lengths), dtype=np.int64)
    ranges = check_keep_frames(random_keep(rng, lengths), episode_index=episodes, lengths=lengths)
    kept = ranges.kept_frames(episodes)
    weights = None
    if rng.random() < 0.7:
        weights = check_weights({e: float(rng.choice([0, 0.25, 0.5, 1, 1.5, 2, 3])) for e in episodes.tolist()
                                 if rng.random() < 0.6}, episode_index=episodes)
    counts = anchor_counts(ranges.kept_counts(episodes), weights)
    used = np.flatnonzero(counts)
    if not len(used):
        return random_anchors(rng)
    # Kept frames as a list (ranges and FrameRanges) or, as datasets pass them, the KeepRanges.
    listed = [kept[k] for k in used.tolist()] if rng.random() < 0.5 else ranges
    anchors = Anchors(episodes[used], lengths[used], listed, counts[used])
    return anchors, lengths


def _frames_of(anchors, lengths) -> Counter:
    return Counter((e, int(a) % int(lengths[e])) for e, a in anchors)


def _anchor_pairs(segments) -> list[tuple[int, int]]:
    return [(s.episode_index, int(a)) for s in segments for a in np.asarray(s.frames)]


# 125 configurations: the first 106 reach every arc of episodestream/ that 200 did (coverage.py, a
# context per configuration; benchmarks/LOG.md, "The suite's time: index-only batches and sweeps").
CONFIGS = 125


def _anchors_once_and_resume_arithmetic(config):
    rng = np.random.default_rng(20_000 + config)
    anchors, lengths = random_anchors(rng)
    epoch = int(rng.integers(3))
    segments = anchors.segments(config, epoch)
    everything = _anchor_pairs(segments)
    assert len(everything) == len(set(everything)) == anchors.total, "anchors are distinct, as many as counted"
    # Per episode, the count asked for; copies of kept frames only.
    assert Counter(e for e, _ in everything) == dict(zip(anchors.episode_index.tolist(), anchors.counts.tolist()))
    kept = {int(e): set(np.asarray(anchors.kept(k)).tolist()) for k, e in enumerate(anchors.episode_index)}
    assert all(f in kept[e] for e, f in _frames_of(everything, lengths))
    world_size, workers = int(rng.integers(1, 5)), int(rng.integers(1, 4))
    pool_size, shuffle = int(rng.integers(1, 7)), bool(rng.random() < 0.85)
    batch_size = int(rng.integers(1, 9))
    plan = EpochPlan(segments, seed=config, epoch=epoch, shuffle=shuffle, world_size=world_size)
    owned, emitted_frames, pieces, fills, taken_anchors = Counter(), Counter(), [], [], Counter()
    for rank in range(world_size):
        shares = [plan.share(World(rank, world_size, w, workers)) for w in range(workers)]
        counts = [share.num_samples for share in shares]
        assert sum(counts) == plan.samples_per_rank
        batches = int(rng.integers(0, sum(-(-c // batch_size) for c in counts) + 1))
        consumed_counts, _ = loader_consumption(counts, batch_size=batch_size, batches=batches)
        for worker, share in enumerate(shares):
            world = World(rank, world_size, worker, workers)

            def schedule(share=share, world=world):
                return consumer_schedule(share, pool_size=pool_size, shuffle=shuffle,
                                         rng=consumer_rng(plan.seed, plan.epoch, world))
            walked = list(schedule())
            _check_pool(walked, pool_size)
            emits = _emits(walked)
            owned.update(_anchor_pairs(share.segments))
            emitted_frames.update(emits[:len(emits) - share.fill_ins])
            for count in {0, 1, consumed_counts[worker], len(emits) - 1, len(emits)}:
                if not 0 <= count <= len(emits):
                    continue
                assert _emits(schedule().skip(count)) == emits[count:] == _emits(_walk_skip(iter(walked), count))
                got_pieces, got_fills = schedule().consumed(count)
                got = [(e, int(a)) for e, frames in got_pieces + got_fills for a in np.asarray(frames)]
                assert _frames_of(got, lengths) == Counter(emits[:count]), (rank, worker, count)
            got_pieces, got_fills = schedule().consumed(consumed_counts[worker])
            pieces += got_pieces
            fills += got_fills
            taken_anchors.update((e, int(a)) for e, frames in got_pieces for a in np.asarray(frames))
    # Exactly once: every anchor owned by one consumer, and emitted (as its frame) once.
    assert owned == Counter(everything)
    assert emitted_frames == _frames_of(everything, lengths)
    assert max(taken_anchors.values(), default=1) == 1, "no anchor consumed twice"
    fill_anchors = {(e, int(a)) for e, frames in fills for a in np.asarray(frames)}
    left = _anchor_pairs(remaining_segments(segments, pieces, fills))
    assert sorted(left) == sorted(set(everything) - set(taken_anchors) - fill_anchors)


@pytest.mark.parametrize("configs", chunks(CONFIGS, 25))
def test_anchors_once_and_resume_arithmetic(configs):
    sweep(_anchors_once_and_resume_arithmetic, configs)


def test_integer_weights_are_whole_copies_in_fresh_places():
    anchors = Anchors(np.array([0, 1]), np.array([4, 3]), None, np.array([8, 3]))
    segments = anchors.segments(0, 0)
    assert [(s.episode_index, list(s.frames), s.period) for s in segments] == [
        (0, [0, 1, 2, 3], 4), (0, [4, 5, 6, 7], 4), (1, [0, 1, 2], 0)]
    assert anchors.segments(0, 1) is segments  # no partial copy: the same every epoch


def test_fractional_weights_largest_remainder_in_exact_fractions():
    # 1/3 of 10 frames three times: quotas 10/3 each, 10 in all; the remainders tie, lowest first.
    assert anchor_counts(np.array([10, 10, 10]), np.array([Fraction(1, 3)] * 3, dtype=object)).tolist() == [4, 3, 3]
    assert anchor_counts(np.array([4, 6]), np.array([2.5, 0.5])).tolist() == [10, 3]
    assert anchor_counts(np.array([4, 6]), np.array([2.0, 0.0])).tolist() == [8, 0]
    # 0.1 is not 1/10 in binary: quotas are exact, so 3 x 0.1 x 10 adds up to 3 anchors, not 2 or 4.
    assert anchor_counts(np.array([10, 10, 10]), np.array([0.1, 0.1, 0.1])).tolist() == [1, 1, 1]


def test_partial_copies_are_drawn_afresh_each_epoch():
    """Weight 1.3 of 100 frames: a whole copy, then 30 frames, one from each of 30 equal strides
    of the episode, at an offset drawn per epoch (every frame equally likely: 0.3)."""
    anchors = Anchors(np.array([0]), np.array([100]), None, np.array([130]))
    draws = [sorted(np.asarray(anchors.segments(7, epoch)[1].frames).tolist()) for epoch in range(200)]
    assert all(len(d) == 30 and len(set(d)) == 30 for d in draws)
    assert all(100 <= a < 200 for d in draws for a in d)  # copy 1's anchors
    assert len({tuple(d) for d in draws}) > 1
    picked = Counter(a - 100 for d in draws for a in d)
    assert set(picked) == set(range(100)) and max(picked.values()) < 100  # every frame, none always
    assert anchors.segments(7, 2)[1] == anchors.segments(7, 2)[1]  # the same (seed, epoch), the same draw


@pytest.mark.parametrize("keep, message", [
    ({9: [(0, 1)]}, r"names episode\(s\) \[9\] that the dataset does not have"),
    ({0: [(3, 1)]}, r"keep_frames\[0\]: range \(3, 1\) is empty or reversed"),
    ({1: [(2, 2)]}, r"keep_frames\[1\]: range \(2, 2\) is empty or reversed"),
    ({0: [(0, 6)]}, r"keep_frames\[0\]: range \(0, 6\) is out of the episode; episode 0 has 5 frames"),
    ({0: [(-1, 2)]}, r"keep_frames\[0\]: range \(-1, 2\) is out of the episode"),
    ({1: [(0, 3), (2, 5)]}, r"keep_frames\[1\]: ranges \(0, 3\) and \(2, 5\) overlap"),
    ({1: [(4, 6), (0, 5)]}, r"keep_frames\[1\]: ranges \(0, 5\) and \(4, 6\) overlap"),
    ({0: [(0, 1)], "0": [(2, 3)]}, r"names episode 0 twice"),
])
def test_keep_frames_errors_name_the_episode_and_value(keep, message):
    with pytest.raises(ValueError, match=message):
        check_keep_frames(keep, episode_index=np.array([0, 1]), lengths=np.array([5, 8]))


@pytest.mark.parametrize("keep, message", [
    ({0: [(0, 1.5)]}, r"keep_frames\[0\]: range \(0, 1.5\) is not a \(start, end\) pair of ints"),
    ({0: [(0, 1, 2)]}, r"keep_frames\[0\]: range \(0, 1, 2\) is not a \(start, end\) pair"),
    ({1: (0, 1)}, r"keep_frames\[1\]: range 0 is not a \(start, end\) pair"),
    ({1: "0-1"}, r"keep_frames\[1\] must be a list of \(start, end\) frame ranges"),
    ({"one": [(0, 1)]}, r"episode key 'one' is not an episode index"),
    ({True: [(0, 1)]}, r"episode key True is a bool"),
    ([(0, 1)], r"keep_frames must be a dict"),
])
def test_keep_frames_type_errors(keep, message):
    with pytest.raises(TypeError, match=message):
        check_keep_frames(keep, episode_index=np.array([0, 1]), lengths=np.array([5, 8]))


def test_keep_frames_accepts_touching_unsorted_ranges_and_str_keys():
    ranges = check_keep_frames({"1": [[5, 8], [0, 2], [2, 3]], 0: []}, episode_index=np.array([0, 1]),
                               lengths=np.array([5, 8]))
    assert isinstance(ranges, KeepRanges)
    assert ranges.kept_counts(np.array([0, 1])).tolist() == [0, 6]
    assert np.asarray(ranges.kept_frames(np.array([1]))[0]).tolist() == [0, 1, 2, 5, 6, 7]


@pytest.mark.parametrize("weights, error, message", [
    ({0: -1}, ValueError, r"episode 0 has weight -1.0; weights must be finite and >= 0"),
    ({1: float("nan")}, ValueError, r"episode 1 has weight nan"),
    ({1: float("inf")}, ValueError, r"episode 1 has weight inf"),
    ({0: Fraction(-1, 2)}, ValueError, r"episode 0 has weight Fraction\(-1, 2\)"),
    ({5: 1}, ValueError, r"names episode\(s\) \[5\] that the dataset does not have"),
    ({0: "2"}, TypeError, r"episode_weights\[0\] = '2' is not a number"),
    ({0: True}, TypeError, r"episode_weights\[0\] = True is not a number"),
    ([1, 2], TypeError, r"episode_weights must be a dict"),
])
def test_weight_errors_name_the_episode_and_value(weights, error, message):
    with pytest.raises(error, match=message):
        check_weights(weights, episode_index=np.array([0, 1]))


def test_frame_ranges_behave_as_their_frames():
    from episodestream._plan.curation import FrameRanges

    ranges = FrameRanges(np.array([2, 10, 20]), np.array([5, 12, 26]))
    frames = [2, 3, 4, 10, 11, 20, 21, 22, 23, 24, 25]
    assert len(ranges) == len(frames) and list(ranges) == frames
    assert np.asarray(ranges, dtype=np.int64).tolist() == frames
    for lo in range(-2, len(frames) + 2):
        for hi in range(-2, len(frames) + 2):
            assert np.asarray(ranges[lo:hi]).tolist() == frames[lo:hi], (lo, hi)
    assert [ranges[i] for i in range(-len(frames), len(frames))] == frames[-len(frames):] + frames
    with pytest.raises(IndexError):
        ranges[len(frames)]
    assert list(ranges + 100) == [f + 100 for f in frames]
    assert ranges[::2].tolist() == frames[::2]
    assert ranges == np.array(frames) and repr(ranges) == "FrameRanges([2, 5), [10, 12), [20, 26))"
