"""Mixture planning, tabular-free (``_plan.mixing``): counts, passes, interleaving and resume, in many layouts.

Each check replays whole epochs from episode lengths alone, so hundreds of layouts run in seconds.
"""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from episodestream._plan.mixing import (
    MAX_PASSES_PER_EPOCH,
    EpochTooLargeError,
    LegPlan,
    MixLeg,
    ComponentEpoch as Source,
    initial_passes,
    largest_remainder,
    plan_mixture_resume,
    rank_counts,
)
from episodestream._plan.resume import loader_consumption
from episodestream._plan.sampling import ADMIT, EVICT, Segment
from episodestream._base.world import World


def _source(rng: np.random.Generator, seed: int, episodes: int | None = None) -> Source:
    lengths = rng.integers(1, 30, size=episodes or int(rng.integers(1, 15)))
    return Source(tuple(Segment(e, range(int(n))) for e, n in enumerate(lengths)), seed, bool(rng.random() < 0.9))


def _layout(rng: np.random.Generator):
    sources = [_source(rng, seed) for seed in range(int(rng.integers(1, 4)))]
    stop = ["all", "first", int(rng.integers(1, 400))][int(rng.integers(3))]
    weights = None if rng.random() < 0.25 else [float(w) for w in rng.uniform(0.05, 1, len(sources))]
    return sources, weights, stop


def _fresh_leg(sources, weights, stop, *, world_size, workers, pools, seed=7, epoch=2) -> LegPlan:
    counts = rank_counts([s.frames for s in sources], world_size=world_size, weights=weights, stop=stop)
    return LegPlan(sources, initial_passes(sources, counts, world_size), seed=seed, epoch=epoch, leg=0,
                   world_size=world_size, num_workers=workers, pool_sizes=pools)


def _consumer_samples(leg: LegPlan, world: World, skip: int = 0) -> list[tuple[int, int, int, int]]:
    """(component, pass number, episode, frame) of each sample the consumer yields after ``skip``,
    in order; checks each component's steps keep the pool consistent and cut at its demand."""
    consumer = leg.consumer(world)
    skips = consumer.counts_before(skip)
    per_component = []
    for i in range(len(leg.components)):
        emits, held = [], Counter()
        for kind, episode, frame in consumer.steps(i, skips[i]):
            if kind == ADMIT:
                held[episode] += 1
            elif kind == EVICT:
                held[episode] -= 1
                assert held[episode] >= 0
            else:
                assert held[episode] > 0, "emitted an episode the pool does not hold"
                emits.append((episode, frame))
        assert not +held, f"left admitted: {+held}"
        # Which pass each emit belongs to: passes run one after another, each cut at its demand.
        numbers = [p.number for p, demand in zip(leg.passes[i], consumer.demand[i]) for _ in range(demand)]
        assert len(emits) == consumer.counts[i] - skips[i]
        per_component.append(iter([(i, n, e, f) for n, (e, f) in zip(numbers[skips[i]:], emits)]))
    return [next(per_component[i]) for i in consumer.order()[skip:].tolist()]


def _round_robin(streams: list[list], batch_size: int, drop_last: bool) -> list[list]:
    """The DataLoader's in-order delivery: one batch from each worker in turn, skipping exhausted ones."""
    batches = [[s[i:i + batch_size] for i in range(0, len(s), batch_size)] for s in streams]
    batches = [[b for b in bs if len(b) == batch_size or not drop_last] for bs in batches]
    out = []
    for round_ in range(max((len(b) for b in batches), default=0)):
        out += [bs[round_] for bs in batches if round_ < len(bs)]
    return out


def _rank_batches(leg: LegPlan, rank: int, batch_size: int, drop_last: bool) -> list[list]:
    streams = [_consumer_samples(leg, World(rank, leg.world_size, w, leg.workers)) for w in range(leg.workers)]
    return _round_robin(streams, batch_size, drop_last)


# -- counts ------------------------------------------------------------------------------------


def test_largest_remainder_is_exact_and_proportional():
    rng = np.random.default_rng(0)
    for _ in range(300):
        weights = [Fraction(int(w)) for w in rng.integers(0, 20, int(rng.integers(1, 6)))]
        if not any(weights):
            continue
        total = int(rng.integers(0, 500))
        parts = largest_remainder(total, weights)
        assert sum(parts) == total
        for part, weight in zip(parts, weights):
            quota = Fraction(total) * weight / sum(weights)
            assert math.floor(quota) <= part <= math.ceil(quota)


@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
def test_rank_counts_follow_stop(world_size):
    rng = np.random.default_rng(world_size)
    for _ in range(200):
        frames = [int(f) for f in rng.integers(1, 3000, int(rng.integers(1, 5)))]
        lengths = [-(-f // world_size) for f in frames]
        weights = [float(w) for w in rng.uniform(0.01, 1, len(frames))]
        assert rank_counts(frames, world_size=world_size, weights=None, stop="all") == lengths
        counts = rank_counts(frames, world_size=world_size, weights=weights, stop="all")
        assert all(c >= n for c, n in zip(counts, lengths))
        shares = [Fraction(w) / sum(Fraction(x) for x in weights) for w in weights]
        smaller = sum(counts) - 1  # the epoch is the shortest that runs every component to its end
        assert not all(c >= n for c, n in zip(largest_remainder(smaller, shares), lengths))
        first = rank_counts(frames, world_size=world_size, weights=weights, stop="first")
        assert all(c <= n for c, n in zip(first, lengths)) and any(c == n for c, n in zip(first, lengths))
        total = int(rng.integers(1, 10_000))
        assert sum(rank_counts(frames, world_size=world_size, weights=weights, stop=total)) == -(-total // world_size)


def _smallest_by_scan(frames, weights, world_size):
    """The reference: the first epoch size, counting up, whose split runs every component to its end."""
    lengths = [-(-f // world_size) for f in frames]
    shares = [Fraction(w) / sum(Fraction(x) for x in weights) for w in weights]
    m = 0
    while not all(c >= n for c, n in zip(largest_remainder(m, shares), lengths)):
        m += 1
    return largest_remainder(m, shares)


def test_two_components_with_a_small_weight_get_the_smallest_epoch_without_a_long_search():
    # The search used to try sizes one by one over a range of ~1/weight; with two components it
    # bisects. These ranges are short enough for the reference to count up through.
    rng = np.random.default_rng(5)
    for _ in range(25):
        frames = [int(f) for f in rng.integers(1, 30, 2)]
        weights = [float(rng.uniform(0.5, 1)), float(rng.uniform(3e-3, 3e-2))]
        world_size = int(rng.choice([1, 2, 3]))
        assert rank_counts(frames, world_size=world_size, weights=weights, stop="all") == \
            _smallest_by_scan(frames, weights, world_size), (frames, weights, world_size)


@pytest.mark.parametrize("weights, stop", [([1 - 1e-9, 1e-9], "all"), ([1.0, 1e-9, 0.5], "all"),
                                           ([0.5, 0.5], 10**15), (None, 10**15)])
def test_an_epoch_too_large_to_plan_is_refused_at_once_naming_weights_and_stop(weights, stop):
    # weights near 1e-9 made rank_counts try ~1e9 epoch sizes (hours); a huge stop built one pass
    # object per pass until memory ran out.
    with pytest.raises(EpochTooLargeError) as caught:
        rank_counts([100] * (len(weights) if weights else 2), world_size=1, weights=weights, stop=stop)
    message = str(caught.value)
    assert f"stop={stop!r}" in message and "weights=" in message and "samples per rank" in message
    assert f"at most {MAX_PASSES_PER_EPOCH} passes" in message


# -- one epoch: coverage, equal counts, proportions -----------------------------------------------


def test_every_pass_covers_its_component_once_in_many_layouts():
    """Per component: whole passes emit every frame once (plus at most one fill-in per rank), a
    partial pass emits its count of distinct frames; every rank yields the same count; each
    consumer's counts sum to its order."""
    rng = np.random.default_rng(1)
    for _ in range(60):
        sources, weights, stop = _layout(rng)
        world_size, workers = int(rng.integers(1, 5)), int(rng.integers(1, 4))
        pools = tuple(int(p) for p in rng.integers(1, 5, len(sources)))
        leg = _fresh_leg(sources, weights, stop, world_size=world_size, workers=workers, pools=pools)
        counts = rank_counts([s.frames for s in sources], world_size=world_size, weights=weights, stop=stop)
        by_pass: dict[tuple[int, int], Counter] = {}
        for rank in range(world_size):
            samples = [s for w in range(workers) for s in _consumer_samples(leg, World(rank, world_size, w, workers))]
            assert len(samples) == leg.samples_per_rank == sum(counts)
            assert Counter(s[0] for s in samples) == Counter({i: c for i, c in enumerate(counts) if c})
            for component, number, episode, frame in samples:
                by_pass.setdefault((component, number), Counter())[(episode, frame)] += 1
        for i, source in enumerate(sources):
            frames = {(s.episode_index, f) for s in source.segments for f in s.frames}
            per_rank = -(-source.frames // world_size)
            whole, rest = divmod(counts[i], per_rank)
            for number in range(whole + bool(rest)):
                seen = by_pass[(i, number)]
                assert set(seen) <= frames
                extra = sum(seen.values()) - len(seen)
                assert extra <= world_size, (i, number, extra)  # fill-ins: at most one per rank
                if number < whole:
                    assert set(seen) == frames and sum(seen.values()) == per_rank * world_size
                else:
                    assert sum(seen.values()) == rest * world_size
            assert (i, whole + bool(rest)) not in by_pass


def test_passes_are_permuted_afresh():
    rng = np.random.default_rng(2)
    sources = [_source(rng, 0, episodes=12), _source(rng, 1, episodes=12)]
    leg = _fresh_leg(sources, [0.8, 0.2], "all", world_size=1, workers=1, pools=(2, 2))
    orders = [tuple(s.episode_index for s in plan.segments) for plan in leg.plans[0]]
    assert len(orders) >= 3 and len(set(orders)) == len(orders)  # 12! orders: equal only by a bug
    other_epoch = _fresh_leg(sources, [0.8, 0.2], "all", world_size=1, workers=1, pools=(2, 2), epoch=3)
    assert tuple(s.episode_index for s in other_epoch.plans[0][0].segments) != orders[0]


def _hypergeometric_interval(population: int, successes: int, draws: int, tail: float) -> tuple[int, int]:
    """The smallest and largest counts whose tails each hold more than ``tail`` of the mass."""
    total = math.comb(population, draws)
    pmf = [math.comb(successes, k) * math.comb(population - successes, draws - k) / total for k in range(draws + 1)]
    cdf = np.cumsum(pmf)
    low = int(np.searchsorted(cdf, tail))
    high = draws - int(np.searchsorted(np.cumsum(pmf[::-1]), tail))
    return low, high


def test_batches_hold_the_mix_within_hypergeometric_bounds():
    """Each consumer draws a uniformly random order of its exact counts, so the count of component
    i in any fixed window of b samples is hypergeometric(n, c_i, b). Every batch of 16 must lie in
    the interval that leaves at most 1e-6 of the mass in each tail: over the <= 2,000 batch-component
    checks here, a correct implementation fails with probability below 2000 * 2e-6 = 0.4% for a
    random seed (and this seed is fixed, so the test is deterministic)."""
    rng = np.random.default_rng(3)
    sources = [_source(rng, s, episodes=20) for s in range(3)]
    weights = [0.6, 0.3, 0.1]
    checks = 0
    for world_size, workers in ((1, 1), (2, 3), (4, 2)):
        leg = _fresh_leg(sources, weights, "all", world_size=world_size, workers=workers, pools=(3, 3, 3))
        for rank in range(world_size):
            for worker in range(workers):
                consumer = leg.consumer(World(rank, world_size, worker, workers))
                order, n = consumer.order(), consumer.num_samples
                assert np.bincount(order, minlength=3).tolist() == consumer.counts
                # The consumer's proportions are the rank's, whatever the layout (within the
                # rounding of each pass's split: one sample per pass).
                for i, count in enumerate(consumer.counts):
                    expected = n * leg.component_counts()[i] / leg.samples_per_rank
                    assert abs(count - expected) <= len(leg.passes[i]) + 1
                for start in range(0, n - 15, 16):
                    for i in range(3):
                        low, high = _hypergeometric_interval(n, consumer.counts[i], 16, 1e-6)
                        assert low <= int((order[start:start + 16] == i).sum()) <= high
                        checks += 1
    assert 100 < checks <= 2000


def test_planning_is_deterministic_and_seeded():
    rng = np.random.default_rng(4)
    sources = [_source(rng, s, episodes=10) for s in range(2)]
    world = World(1, 2, 1, 2)

    def samples(seed):
        leg = _fresh_leg(sources, [0.4, 0.6], 500, world_size=2, workers=2, pools=(2, 3), seed=seed)
        return _consumer_samples(leg, world)

    assert samples(5) == samples(5)
    assert samples(5) != samples(6)


# -- resume -------------------------------------------------------------------------------------


def _batches_available(leg: LegPlan, batch_size: int, drop_last: bool) -> int:
    return max(sum(c // batch_size if drop_last else -(-c // batch_size) for c in leg.worker_counts(r))
               for r in range(leg.world_size))


def test_exact_resume_continues_sample_for_sample():
    rng = np.random.default_rng(5)
    for _ in range(40):
        sources, weights, stop = _layout(rng)
        world_size, workers = int(rng.integers(1, 4)), int(rng.integers(0, 4))
        pools = tuple(int(p) for p in rng.integers(1, 4, len(sources)))
        batch_size, drop_last = int(rng.integers(1, 7)), bool(rng.random() < 0.3)
        leg = _fresh_leg(sources, weights, stop, world_size=world_size, workers=max(1, workers), pools=pools)
        available = _batches_available(leg, batch_size, drop_last)
        batches = int(rng.integers(0, available + 1))
        spec = MixLeg(world_size, workers, pools, batch_size, batches, drop_last)
        point = plan_mixture_resume(sources, seed=7, epoch=2, weights=weights, stop=stop, legs=[spec],
                                    world_size=world_size, num_workers=workers, pool_sizes=pools)
        for rank in range(world_size):
            expected = _rank_batches(leg, rank, batch_size, drop_last)[batches:]
            if point is None:
                assert not expected
                continue
            assert point.skips is not None
            streams = []
            for worker in range(max(1, workers)):
                role, skip = point.role_for(World(rank, world_size, worker, max(1, workers)))
                streams.append(_consumer_samples(leg, role, skip))
            assert _round_robin(streams, batch_size, drop_last) == expected


def _leg_samples(leg: LegPlan, taken=None) -> list[tuple[int, int, int, int]]:
    """Every sample of the leg (all ranks), or only the first ``taken[rank][worker]`` of each consumer."""
    out = []
    for rank in range(leg.world_size):
        for worker in range(leg.workers):
            samples = _consumer_samples(leg, World(rank, leg.world_size, worker, leg.workers))
            out += samples if taken is None else samples[:taken[rank][worker]]
    return out


def _check_epoch_covered(sources, weights, stop, first_world_size, samples, last_world_size) -> None:
    """Across legs: a whole pass took every frame exactly once (fill-ins aside: at most one per rank
    per leg), a partial pass its owed count (rounded up per rank in the last leg) of distinct frames."""
    counts = rank_counts([s.frames for s in sources], world_size=first_world_size, weights=weights, stop=stop)
    for i, source in enumerate(sources):
        frames = {(s.episode_index, f) for s in source.segments for f in s.frames}
        per_rank = -(-source.frames // first_world_size)
        whole, rest = divmod(counts[i], per_rank)
        for number in range(whole + bool(rest)):
            seen = Counter((e, f) for c, n, e, f in samples if (c, n) == (i, number))
            repeats = sum(seen.values()) - len(seen)
            assert set(seen) <= frames
            assert repeats <= 3 * max(first_world_size, last_world_size), (i, number, repeats)
            if number < whole:
                assert set(seen) == frames, (i, number, len(frames - set(seen)))
            else:
                owed = rest * first_world_size
                assert owed <= sum(seen.values()) <= owed + last_world_size - 1 + repeats, (i, number)


def test_elastic_resume_covers_each_pass_once_in_many_layouts():
    rng = np.random.default_rng(6)
    for _ in range(40):
        sources, weights, stop = _layout(rng)
        layouts: list[tuple[int, int, tuple[int, ...]]] = []
        while len(layouts) < 3:  # each leg's layout differs from the one before: an elastic resume
            layout = (int(rng.integers(1, 4)), int(rng.integers(0, 3)),
                      tuple(int(p) for p in rng.integers(1, 4, len(sources))))
            if not layouts or MixLeg(*layouts[-1], 1, 0).same_stream(MixLeg(*layout, 1, 0)) is False:
                layouts.append(layout)
        batch_size = int(rng.integers(1, 6))
        legs: list[MixLeg] = []
        samples = []
        for index, (world_size, workers, pools) in enumerate(layouts):
            point = (None if index == 0 else
                     plan_mixture_resume(sources, seed=7, epoch=2, weights=weights, stop=stop, legs=legs,
                                         world_size=world_size, num_workers=workers, pool_sizes=pools))
            if index and point is None:
                break
            if index == 0:
                leg = _fresh_leg(sources, weights, stop, world_size=world_size, workers=max(1, workers), pools=pools)
            else:
                assert point.skips is None and point.leg_index == index
                leg = LegPlan(sources, point.passes, seed=7, epoch=2, leg=index, world_size=world_size,
                              num_workers=workers, pool_sizes=pools)
                # Every rank of the new leg yields the same count.
                assert len({sum(leg.worker_counts(r)) for r in range(world_size)}) == 1
            available = _batches_available(leg, batch_size, False)
            batches = available if index == len(layouts) - 1 else int(rng.integers(0, available + 1))
            taken = {r: loader_consumption(leg.worker_counts(r), batch_size=batch_size, batches=batches)[0]
                     for r in range(world_size)}
            samples += _leg_samples(leg, taken)
            legs = legs + [MixLeg(world_size, workers, pools, batch_size, batches)]
        _check_epoch_covered(sources, weights, stop, layouts[0][0], samples,
                             max(layout[0] for layout in layouts))


def test_resume_after_the_whole_epoch_is_none_and_beyond_is_refused():
    rng = np.random.default_rng(8)
    sources = [_source(rng, s, episodes=6) for s in range(2)]
    leg = _fresh_leg(sources, [0.5, 0.5], "all", world_size=2, workers=2, pools=(2, 2))
    available = _batches_available(leg, 4, False)
    kwargs = dict(seed=7, epoch=2, weights=[0.5, 0.5], stop="all", world_size=2, num_workers=2, pool_sizes=(2, 2))
    assert plan_mixture_resume(sources, legs=[MixLeg(2, 2, (2, 2), 4, available)], **kwargs) is None
    assert plan_mixture_resume(sources, legs=[MixLeg(2, 2, (2, 2), 4, available)],
                               **{**kwargs, "world_size": 3}) is None
    from episodestream._plan.resume import BeyondEpochError

    with pytest.raises(BeyondEpochError):
        plan_mixture_resume(sources, legs=[MixLeg(2, 2, (2, 2), 4, available + 1)], **kwargs)
