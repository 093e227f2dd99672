"""The consumer schedule, tabular-free: skipping arithmetically equals walking, in hundreds of layouts.

Resume reaches a consumer's position with ``ConsumerSchedule.skip`` and, for elastic resume, what
it consumed with ``ConsumerSchedule.consumed``, without walking the consumed frames. Here both are
checked against walking every step, at save points that the DataLoader's round robin produces for
many world sizes, worker counts, pool sizes, batch sizes and drop_last.
"""

from __future__ import annotations

import itertools
import pickle
from collections import Counter

import numpy as np
import pytest

from episodestream._plan.resume import _walk_skip, loader_consumption, remaining_segments
from episodestream._plan.sampling import ADMIT, EMIT, EVICT, WIDE_RAMP_SHARE, EpochPlan, LeftFrames, Segment, consumer_rng, consumer_schedule
from episodestream._base.world import World

from .stream_model import chunks, sweep


def _segments(rng: np.random.Generator) -> list[Segment]:
    """Whole episodes, or (as after an elastic resume) sorted subsets of their frames."""
    out = []
    for episode in range(int(rng.integers(1, 25))):
        length = int(rng.integers(1, 30))
        if rng.random() < 0.3:
            frames = np.flatnonzero(rng.random(length) < 0.6)
            out.append(Segment(episode, frames if len(frames) else range(length)))
        else:
            out.append(Segment(episode, range(length)))
    return out


def _emits(steps) -> list[tuple[int, int]]:
    return [(episode, frame) for kind, episode, frame in steps if kind == EMIT]


def _check_pool(steps, pool_size: int) -> None:
    """Every EMIT's episode is admitted; the pool (before fill-ins) never holds more than pool_size."""
    held: Counter = Counter()
    for kind, episode, _ in steps:
        if kind == ADMIT:
            held[episode] += 1
            assert sum(held.values()) <= pool_size + 1  # + 1: a fill-in's own admission
        elif kind == EVICT:
            held[episode] -= 1
            assert held[episode] >= 0
            if not held[episode]:
                del held[episode]
        else:
            assert held[episode] > 0, f"episode {episode} emitted while not admitted"
    assert not held, f"left admitted: {dict(held)}"


# 150 configurations: the first 143 reach every branch (arc) of episodestream/ that 300 did
# (coverage.py, a context per configuration; benchmarks/LOG.md, "The suite's time: index-only
# batches and sweeps").
CONFIGS = 150


def _skipping_equals_walking(config):
    rng = np.random.default_rng(config)
    segments = _segments(rng)
    world_size, workers = int(rng.integers(1, 5)), int(rng.integers(1, 4))
    pool_size, shuffle = int(rng.integers(1, 7)), bool(rng.random() < 0.85)
    batch_size, drop_last = int(rng.integers(1, 9)), bool(rng.random() < 0.3)
    plan = EpochPlan(segments, seed=config, epoch=int(rng.integers(3)), shuffle=shuffle, world_size=world_size)
    for rank in range(world_size):
        shares = [plan.share(World(rank, world_size, w, workers)) for w in range(workers)]
        counts = [share.num_samples for share in shares]
        # Save points the DataLoader's round robin produces, plus a few arbitrary ones.
        batches_per_epoch = sum(-(-c // batch_size) for c in counts)
        save_points = {tuple(loader_consumption(counts, batch_size=batch_size, batches=b, drop_last=drop_last)[0])
                       for b in range(batches_per_epoch + 2)}
        for worker, share in enumerate(shares):
            def schedule(share=share, world=World(rank, world_size, worker, workers)):
                return consumer_schedule(share, pool_size=pool_size, shuffle=shuffle,
                                         rng=consumer_rng(plan.seed, plan.epoch, world))
            walked = list(schedule())
            _check_pool(walked, pool_size)
            emits = _emits(walked)
            assert len(emits) == share.num_samples
            loader_points = sorted({p[worker] for p in save_points})
            picked = rng.choice(loader_points, size=min(4, len(loader_points)), replace=False).tolist()
            points = set(picked) | {0, 1, len(emits) - 1, len(emits)}
            for count in sorted(c for c in points if 0 <= c <= len(emits)):
                skipped = list(schedule().skip(count))
                assert _emits(skipped) == emits[count:], (config, rank, worker, count)
                assert _emits(skipped) == _emits(_walk_skip(iter(walked), count))
                _check_pool(skipped, pool_size)
                pieces, fills = schedule().consumed(count)
                got = Counter((e, int(f)) for e, frames in pieces + fills for f in np.asarray(frames))
                assert got == Counter(emits[:count]), (config, rank, worker, count)


@pytest.mark.parametrize("configs", chunks(CONFIGS, 30))
def test_skipping_equals_walking(configs):
    sweep(_skipping_equals_walking, configs)


def _every_frame_once_and_remaining_segments(config):
    """Across all consumers each frame comes once (fill-ins aside); what is left after removing
    each consumer's consumed pieces is exactly the frames not yet emitted."""
    rng = np.random.default_rng(1000 + config)
    segments = _segments(rng)
    world_size, workers, pool_size = int(rng.integers(1, 5)), int(rng.integers(1, 4)), int(rng.integers(1, 7))
    plan = EpochPlan(segments, seed=config, epoch=0, shuffle=True, world_size=world_size)
    everything = Counter((s.episode_index, int(f)) for s in segments for f in s.frames)
    pieces, fills, emitted = [], [], Counter()
    for rank in range(world_size):
        for worker in range(workers):
            world = World(rank, world_size, worker, workers)
            share = plan.share(world)
            schedule = consumer_schedule(share, pool_size=pool_size, shuffle=True,
                                         rng=consumer_rng(plan.seed, 0, world))
            emits = _emits(schedule)
            assert Counter(emits[:len(emits) - share.fill_ins]) == Counter(
                (s.episode_index, int(f)) for s in share.segments for f in s.frames)
            count = int(rng.integers(len(emits) + 1))
            emitted.update(emits[:count])
            more, more_fills = consumer_schedule(share, pool_size=pool_size, shuffle=True,
                                                 rng=consumer_rng(plan.seed, 0, world)).consumed(count)
            pieces += more
            fills += more_fills
    left = Counter((s.episode_index, int(f)) for s in remaining_segments(segments, pieces, fills) for f in s.frames)
    assert left == Counter({k: 1 for k in everything if k not in emitted})


@pytest.mark.parametrize("configs", chunks(60, 10))
def test_every_frame_once_and_remaining_segments(configs):
    sweep(_every_frame_once_and_remaining_segments, configs)


def test_pool_of_one_and_no_shuffle_keep_episodes_whole():
    segments = [Segment(e, range(n)) for e, n in enumerate([5, 3, 7])]
    plan = EpochPlan(segments, seed=0, epoch=0, shuffle=False, world_size=1)
    share = plan.share(World(0, 1, 0, 1))
    ordered = _emits(consumer_schedule(share, pool_size=4, shuffle=False, rng=consumer_rng(0, 0, World(0, 1, 0, 1))))
    assert ordered == [(e, f) for e, n in enumerate([5, 3, 7]) for f in range(n)]
    plan = EpochPlan(segments, seed=0, epoch=0, shuffle=True, world_size=1)
    emits = _emits(consumer_schedule(plan.share(World(0, 1, 0, 1)), pool_size=1, shuffle=True,
                                     rng=consumer_rng(0, 0, World(0, 1, 0, 1))))
    runs = [e for i, (e, _) in enumerate(emits) if i == 0 or emits[i - 1][0] != e]
    assert len(runs) == 3 and sorted(runs) == [0, 1, 2]


def _walked_consumption(counts, *, batch_size, batches, drop_last):
    """The DataLoader's in-order round robin, one batch at a time (the reference)."""
    left = [c // batch_size if drop_last else -(-c // batch_size) for c in counts]
    taken, turn = [0] * len(counts), 0
    for _ in range(batches):
        if not any(left):
            break
        while not left[turn]:
            turn = (turn + 1) % len(counts)
        taken[turn] += 1
        left[turn] -= 1
        turn = (turn + 1) % len(counts)
    return [min(c, t * batch_size) for c, t in zip(counts, taken)], turn


def _loader_consumption_by_rounds_equals_walking(config):
    rng = np.random.default_rng(5000 + config)
    counts = rng.integers(0, 80, size=int(rng.integers(1, 7))).tolist()
    batch_size, drop_last = int(rng.integers(1, 9)), bool(rng.random() < 0.4)
    for batches in range(sum(-(-c // batch_size) for c in counts) + 3):
        assert loader_consumption(counts, batch_size=batch_size, batches=batches, drop_last=drop_last) == \
            _walked_consumption(counts, batch_size=batch_size, batches=batches, drop_last=drop_last)


@pytest.mark.parametrize("configs", chunks(200, 25))
def test_loader_consumption_by_rounds_equals_walking(configs):
    sweep(_loader_consumption_by_rounds_equals_walking, configs)


def test_skip_emits_walks_a_schedule_already_started():
    from episodestream._plan.resume import skip_emits

    segments = [Segment(e, range(n)) for e, n in enumerate([6, 4, 9, 3])]
    plan = EpochPlan(segments, seed=1, epoch=0, shuffle=True, world_size=1)
    world = World(0, 1, 0, 1)

    def schedule():
        return consumer_schedule(plan.share(world), pool_size=2, shuffle=True, rng=consumer_rng(1, 0, world))
    emits = _emits(schedule())
    started = schedule()
    first = next(started)
    assert first[0] == ADMIT
    # The first step is gone: skipping 5 more emits continues from where the iterator is.
    assert _emits(skip_emits(started, 5)) == emits[5:]
    assert _emits(skip_emits(schedule(), 5)) == emits[5:]


def test_the_pool_ramps_up_one_two_four_episodes_then_holds_a_full_window():
    """A consumer draws its first frames from one admitted episode and grows the pool over the first
    slots (1, 2, 4, ... segments), so a remote first batch waits for one episode's video; the ramp
    depends only on (seed, epoch, rank, worker), and from slot log2(pool) on the pool is full."""
    segments = [Segment(e, range(60)) for e in range(40)]
    world = World(0, 1, 0, 1)
    pool_size = 16
    plan = EpochPlan(segments, seed=4, epoch=0, shuffle=True, world_size=1)

    def schedule():
        return consumer_schedule(plan.share(world), pool_size=pool_size, shuffle=True, rng=consumer_rng(4, 0, world))

    steps = list(schedule())
    assert steps == list(schedule())  # nothing but (seed, epoch, rank, worker) decides it
    first_emit = next(i for i, (kind, _, _) in enumerate(steps) if kind == EMIT)
    assert [kind for kind, _, _ in steps[:first_emit]] == [ADMIT]
    held, most, admitted_before_emit = set(), 0, []
    for kind, episode, _ in steps:
        if kind == ADMIT:
            held.add(episode)
        elif kind == EVICT:
            held.discard(episode)
        else:
            admitted_before_emit.append(len(held))
            most = max(most, len(held))
    # The pool as emits see it: one episode, then two, then four, ... never above the window.
    assert admitted_before_emit[0] == 1 and most == pool_size
    growth = list(dict.fromkeys(admitted_before_emit))  # pool sizes in the order emits first see them
    assert growth[:6] == [1, 2, 4, 8, pool_size - 1, pool_size]
    _check_pool(steps, pool_size)
    assert Counter(_emits(steps)) == Counter((s.episode_index, f) for s in plan.share(world).segments for f in s.frames)


def test_keys_are_systematic_over_each_window():
    """Each of a segment's n frames gets one key in its own n-th of the segment's window, all at the
    same point of their n-ths (so one episode's frames come at an even pace over the slots it is
    pooled for), every frame once, keys sorted."""
    rng = np.random.default_rng(7)
    for config in range(40):
        segments = _segments(rng)
        plan = EpochPlan(segments, seed=config, epoch=0, shuffle=True, world_size=1)
        world = World(0, 1, 0, 1)
        schedule = consumer_schedule(plan.share(world), pool_size=int(rng.integers(1, 20)), shuffle=True,
                                     rng=consumer_rng(config, 0, world))
        for i, segment in enumerate(schedule.share.segments):
            frames, keys = schedule._keys(i)
            a, b, n = int(schedule._a[i]), int(schedule._b[i]), len(segment)
            assert sorted(frames.tolist()) == sorted(np.asarray(segment.frames).tolist())
            assert np.all((keys >= a) & (keys < b)) and np.all(np.diff(keys) > 0)
            strata = (keys - a) * n / (b - a)
            np.testing.assert_array_equal(np.floor(strata), np.arange(n))
            np.testing.assert_allclose(strata - np.arange(n), strata[0], atol=1e-6)


def test_an_episodes_frames_come_in_gop_pairs_in_random_order():
    """Shuffled, each episode emits its frames 2q and 2q+1 one after the other (of its own emits),
    the pairs in random order and each pair's two in random order: the frames a decoder asked for
    one of can keep the other for its turn (``_sample.video.gop_pairs``)."""
    first_of_pair, pair_orders = Counter(), set()
    for seed in range(12):
        lengths = [30, 1, 17, 8, 25, 2, 40, 13]
        plan = EpochPlan([Segment(e, range(n)) for e, n in enumerate(lengths)], seed=seed, epoch=0,
                         shuffle=True, world_size=1)
        world = World(0, 1, 0, 1)
        pool_size = 3 if seed % 2 else 1000
        schedule = consumer_schedule(plan.share(world), pool_size=pool_size, shuffle=True,
                                     rng=consumer_rng(seed, 0, world))
        by_episode: dict[int, list[int]] = {}
        for episode, frame in _emits(schedule):
            by_episode.setdefault(episode, []).append(frame)
        assert sorted(by_episode) == list(range(len(lengths)))
        for episode, frames in by_episode.items():
            n = lengths[episode]
            assert sorted(frames) == list(range(n))
            pairs = frames[:n - n % 2] if n % 2 == 0 else [f for f in frames if f != n - 1]
            assert all(a // 2 == b // 2 for a, b in zip(pairs[::2], pairs[1::2])), (episode, frames)
            first_of_pair.update(f % 2 for f in pairs[::2])
            if n >= 8:
                pair_orders.add(tuple(f // 2 for f in pairs[::2]))
    assert min(first_of_pair[0], first_of_pair[1]) > 0.4 * sum(first_of_pair.values())  # either frame first
    assert len(pair_orders) > 40  # the pairs' order differs by episode and seed (not sorted, not fixed)


def test_keys_counted_per_segment_equal_the_drawn_keys_below_every_slot():
    """A position and what a consumer left count each segment's keys below a slot from the keys'
    expression (``_keys_below``) and place single keys (``_key_at``) rather than draw them all: the
    same counts and bits as the drawn keys, for sliding pools (ramp, last windows), pools of the
    whole share and unshuffled schedules, whole and curated segments, at every slot."""
    rng = np.random.default_rng(11)
    for config in range(60):
        segments = _segments(rng)
        shuffle = bool(rng.random() < 0.8)
        plan = EpochPlan(segments, seed=config, epoch=0, shuffle=shuffle, world_size=1)
        world = World(0, 1, 0, 1)
        pool = int(rng.choice([1, 2, 5, len(segments), len(segments) + 1]))
        schedule = consumer_schedule(plan.share(world), pool_size=pool, shuffle=shuffle,
                                     rng=consumer_rng(config, 0, world))
        n = len(schedule.share.segments)
        every = np.arange(n, dtype=np.int64)
        drawn = [schedule._window_keys(i, i + 1) for i in range(n)]
        for slot in range(int(schedule._b.max()) + 2):
            assert schedule._keys_below(every, slot).tolist() == [int((keys < slot).sum()) for keys in drawn]
        for i, keys in enumerate(drawn):
            placed = schedule._key_at(np.full(len(keys), i, dtype=np.int64), np.arange(len(keys)))
            assert placed.tobytes() == keys.tobytes()
        # Phases that put a key on a slot boundary, where the count's estimate may round the other
        # way than the key's expression (settled by evaluating the keys beside it).
        a, b, lengths = schedule._a, schedule._b, schedule._lengths
        boundary = rng.integers(a, b) if len(a) else a
        schedule._phase = np.mod((boundary - a) * lengths / np.maximum(b - a, 1), 1.0)
        drawn = [schedule._window_keys(i, i + 1) for i in range(n)]
        for slot in range(int(schedule._b.max()) + 2):
            assert schedule._keys_below(every, slot).tolist() == [int((keys < slot).sum()) for keys in drawn]


@pytest.mark.parametrize("lengths", [(30, 60), (150, 400)])
def test_a_wide_pools_first_batches_wait_for_as_few_episodes_as_pool_16s(lengths):
    """The ramp's first windows are pool 16's, so the first batch of 32 of a pool of 64 or 512, or
    of the whole share, needs the videos of no more episodes than pool 16's did (a remote first
    batch waits for them)."""
    frame_counts = np.random.default_rng(0).integers(lengths[0], lengths[1] + 1, 1000)
    plan = EpochPlan([Segment(i, range(int(n))) for i, n in enumerate(frame_counts)], seed=0, epoch=0,
                     shuffle=True, world_size=1)
    world = World(0, 1, 0, 1)

    def first_batch_episodes(pool: int) -> int:
        steps = consumer_schedule(plan.share(world), pool_size=pool, shuffle=True, rng=consumer_rng(0, 0, world))
        emits = (episode for kind, episode, _ in steps if kind == EMIT)
        return len(set(itertools.islice(emits, 32)))

    narrow = first_batch_episodes(16)
    assert narrow <= 8
    assert first_batch_episodes(64) <= narrow and first_batch_episodes(512) <= narrow
    assert first_batch_episodes(len(frame_counts)) <= narrow


@pytest.mark.parametrize("workers", [1, 3])
def test_a_pool_of_the_whole_share_spreads_every_episode_over_the_whole_stream(workers):
    """A pool at least as wide as a consumer's share (what ``"auto"`` gives where a local layout
    allows): segments are admitted in share order on the ramp (all by slot log2 of the share) and
    all but the ramp's first groups keep emitting to the end, so each episode emits at an even pace
    (its first frame within about the ramp's slots and its first stratum, its last within about its
    last stratum, but for a few first segments: at most 4 and 2/WIDE_RAMP_SHARE of the share),
    skipping and what was consumed equal walking at many points (with enough open segments that the
    position is bracketed first), and windows of runs of samples draw from about as many episodes as
    a uniform permutation's."""
    from episodestream._plan.shuffle_quality import shuffle_quality

    lengths = np.random.default_rng(3).integers(5, 40, 240)
    plan = EpochPlan([Segment(i, range(int(n))) if i % 5 else Segment(i, np.arange(0, int(n), 2))
                      for i, n in enumerate(lengths)], seed=3, epoch=1, shuffle=True, world_size=1)
    for worker in range(workers):
        world = World(0, 1, worker, workers)
        share = plan.share(world)

        def schedule(share=share, world=world):
            return consumer_schedule(share, pool_size=len(share.segments), shuffle=True,
                                     rng=consumer_rng(3, 1, world))

        assert schedule().share_wide and not consumer_schedule(
            share, pool_size=len(share.segments) - 1, shuffle=True, rng=consumer_rng(3, 1, world)).share_wide
        walked = list(schedule())
        n = len(share.segments)
        admitted = [episode for kind, episode, _ in walked if kind == ADMIT]
        assert admitted == [segment.episode_index for segment in share.segments]
        emits = _emits(walked)
        total = len(emits)
        ramp_emits = total * (n.bit_length() + 1) / n  # about the emits of the ramp's slots
        ended_early = []
        for i, segment in enumerate(share.segments):
            at = [k for k, (episode, _) in enumerate(emits) if episode == segment.episode_index]
            # Within about one stratum of each end (slots hold the frames unevenly by a few samples).
            assert at[0] < ramp_emits + 1.2 * total / len(segment) + 16, (i, at[0])
            if at[-1] <= total - 1.2 * total / len(segment) - 16:
                ended_early.append(i)
        assert ended_early == list(range(len(ended_early))) and len(ended_early) <= 4 + 2 * n / WIDE_RAMP_SHARE
        for count in sorted({0, 1, 2, total // 3, total // 2, total - 7, total - 1, total}
                            | set(np.random.default_rng(worker).integers(total, size=6).tolist())):
            assert _emits(schedule().skip(count)) == emits[count:], count
            pieces, fills = schedule().consumed(count)
            got = Counter((e, int(f)) for e, frames in pieces + fills for f in np.asarray(frames))
            assert got == Counter(emits[:count]), count
        ids = np.array([episode for episode, _ in emits])
        quality = shuffle_quality(ids, 16, windows=(100, 400))
        # The ramp's first slots draw from fewer episodes: a few hundredths of a window's ratio here.
        assert all(w.ratio >= 0.95 for w in quality.windows), quality.windows


def test_a_resumed_pool_of_the_whole_share_admits_each_episode_at_its_first_emit():
    """Resumed, a pool of the whole share has every segment open; it admits each one as its first
    emit after the position comes due, not all before the first sample (which held ~10^4 episodes
    before a DROID-sized share's first sample), and still emits only from episodes it holds."""
    lengths = np.random.default_rng(5).integers(5, 40, 300)
    plan = EpochPlan([Segment(i, range(int(n))) for i, n in enumerate(lengths)], seed=5, epoch=0,
                     shuffle=True, world_size=1)
    world = World(0, 1, 0, 1)
    share = plan.share(world)

    def schedule():
        return consumer_schedule(share, pool_size=len(share.segments), shuffle=True, rng=consumer_rng(5, 0, world))

    emits = _emits(list(schedule()))
    for count in (len(emits) // 2, len(emits) * 9 // 10):
        steps = list(schedule().skip(count))
        assert _emits(steps) == emits[count:]
        held: set[int] = set()
        for kind, episode, _ in steps:
            if kind == ADMIT:
                assert episode not in held
                held.add(episode)
            elif kind == EMIT:
                assert episode in held
            else:
                held.remove(episode)
        assert not held
        left = {episode for episode, _ in emits[count:]}
        first_emit = next(k for k, (kind, _, _) in enumerate(steps) if kind == EMIT)
        assert sum(1 for kind, episode, _ in steps if kind == ADMIT) == len(left)
        assert first_emit < len(left) / 4, (first_emit, len(left))


@pytest.mark.parametrize("seed", range(40))
def test_what_consumers_left_equals_comparing_what_they_took(seed):
    """An elastic re-plan takes each consumer's left frames (``ConsumerSchedule.left``) instead of
    comparing what it took with every segment: the same segments, frames in the same order, over
    random layouts (whole episodes and curated frame arrays, sliding pools and pools of the whole
    share, shuffled or not, consumers stopped anywhere before their fill-ins)."""
    from episodestream._plan.resume import Leg, _left_segments
    from episodestream._plan.sampling import consumer_rng

    rng = np.random.default_rng(seed)
    episodes = int(rng.integers(1, 40))
    segments = []
    for e in range(episodes):
        n = int(rng.integers(1, 30))
        if rng.random() < 0.3:  # curated: some frames kept, as an array
            frames = np.sort(rng.choice(n + 10, size=n, replace=False)).astype(np.int64)
            segments.append(Segment(e, frames))
        else:
            start = int(rng.integers(0, 5))
            segments.append(Segment(e, range(start, start + n)))
    world_size, workers = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    pool = int(rng.choice([1, 2, 5, episodes + 1]))
    shuffle = bool(rng.random() < 0.8)
    plan = EpochPlan(segments, seed=seed, epoch=1, shuffle=shuffle, world_size=world_size)
    leg = Leg(world_size, workers, (pool,), 1, 0)
    per_rank, consumed, repeated = {}, [], []
    for rank in range(world_size):
        taken = []
        for worker in range(workers):
            world = World(rank, world_size, worker, workers)
            share = plan.share(world)
            frames = sum(s.length for s in share.segments)
            count = int(rng.integers(0, frames + 1))
            taken.append(count)
            if count:
                schedule = consumer_schedule(share, pool_size=pool, shuffle=shuffle,
                                             rng=consumer_rng(plan.seed, plan.epoch, world, leg=0))
                pieces, fills = schedule.consumed(count)
                consumed += pieces
                repeated += fills
        per_rank[rank] = (taken, 0)
    expected = remaining_segments(tuple(segments), consumed, repeated)
    left = _left_segments(tuple(segments), plan, leg, 0, per_rank)
    assert left is not None
    assert list(left) == expected
    # Pickled (a resumed dataset sent to DataLoader workers) as the frames, not the schedules behind them.
    pickled = pickle.dumps(left)
    assert list(pickle.loads(pickled)) == expected and b"ConsumerSchedule" not in pickled
    # Untouched ones kept as they were; a partly consumed one's frames drawn at first use, an array then.
    assert [np.ndarray if type(s.frames) is LeftFrames else type(s.frames) for s in left] == [
        type(s.frames) for s in expected]
