"""How a mixture of streams is planned: per-rank counts, passes, per-consumer interleaving, resume.

Pure and tabular-free, like ``_plan.sampling`` (which it drives): it sees each component's segments
(episode indices and frame counts), seed, shuffle and pool size, never rows or video.

An epoch of the mixture (``docs/mixtures.md``):
- component ``i`` has ``F_i`` selected frames; with ``W`` ranks one *pass* over it is a standard epoch
  stream of it (``EpochPlan`` + ``consumer_schedule``), ``N_i = ceil(F_i / W)`` samples per rank;
- every rank yields ``M`` samples, ``c_i`` of them from component ``i`` (``rank_counts``: a largest
  remainder split of ``M`` by the weights; ``M`` from ``stop``);
- component ``i`` runs ``c_i // N_i`` whole passes and then ``c_i % N_i`` samples per rank of one
  more pass (the *partial* pass), each pass under a fresh permutation keyed by (mixture seed,
  epoch, component, its seed, pass number);
- each consumer takes its whole share of every whole pass and a largest-remainder share of the
  partial pass's count, and interleaves its counts in a random order drawn from (mixture seed,
  epoch, leg, rank, worker).

Resume mirrors ``_plan.resume``: from the batches consumed, each consumer's mixture count; the prefix of
its interleave order gives each component's count, and each pass's schedule what that took. Exact
resume skips those counts; elastic resume removes what was consumed from each pass and splits what
is left afresh (a new leg): a whole pass owes every remaining frame once, the partial pass its
remaining count.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from episodestream._plan.resume import BeyondEpochError, Leg, loader_consumption, remaining_segments, skip_emits
from episodestream._plan.sampling import (
    ADMIT,
    EMIT,
    EVICT,
    NO_FRAME,
    ConsumerSchedule,
    EpochPlan,
    Segment,
    Step,
    consumer_rng,
    consumer_schedule,
)
from episodestream._base.world import World

# Spawn keys here have six entries and start with this tag, so they never meet ``make_rng``'s
# four-entry keys; the second entry says what the generator is for.
_MIX_TAG = 0x6D6978  # "mix"
_PASS_SEED, _INTERLEAVE = 0, 1


@dataclass(frozen=True)
class ComponentEpoch:
    """What the planner needs of one component: its selected episodes and how it streams."""

    segments: tuple[Segment, ...]
    seed: int
    shuffle: bool

    @property
    def frames(self) -> int:
        return sum(s.length for s in self.segments)


@dataclass(frozen=True)
class Pass:
    """One pass over a component within the current leg: the frames it still draws from and, for
    the partial pass, how many samples it still owes across all ranks (None: every frame once)."""

    number: int
    segments: tuple[Segment, ...]
    owed: int | None


# -- per-rank counts ----------------------------------------------------------------------------

def largest_remainder(total: int, weights: Sequence[Fraction | int]) -> list[int]:
    """``total`` split in proportion to ``weights`` (non-negative, not all zero): each part the floor
    of its quota, the rest one each to the largest fractional remainders (ties: lowest index)."""
    weight_sum = sum(weights)
    quotas = [Fraction(total) * w / weight_sum for w in weights]
    parts = [math.floor(q) for q in quotas]
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - parts[i]), i))
    for i in order[:total - sum(parts)]:
        parts[i] += 1
    return parts


# Each pass of a component is planned (a permutation of its episodes, then every consumer's share)
# before an epoch streams: an epoch that runs one component more often than this is refused up
# front, naming weights and stop, rather than planned for hours or until memory runs out.
MAX_PASSES_PER_EPOCH = 100_000
# stop="all" with three or more components tries epoch sizes one by one (the largest remainder
# split is not monotone then); past this many, the largest size of the range is taken instead.
_MAX_SIZES_TRIED = 100_000


class EpochTooLargeError(ValueError):
    """weights and stop make an epoch that runs some component more than ``MAX_PASSES_PER_EPOCH`` times."""


def rank_counts(frames: Sequence[int], *, world_size: int, weights: Sequence[float] | None,
                stop: str | int) -> list[int]:
    """Samples per rank from each component in one epoch (see the module docstring); raises
    ``EpochTooLargeError`` for an epoch beyond ``MAX_PASSES_PER_EPOCH`` passes of a component."""
    lengths = [-(-f // world_size) for f in frames]  # N_i: one pass per rank
    if weights is None and stop != "first" and not isinstance(stop, int):
        return lengths  # a plain shuffled concatenation: every component once
    # Fractions of the floats: exact arithmetic, so every rank and every run gets the same counts.
    shares = [Fraction(n) for n in lengths] if weights is None else [Fraction(w) for w in weights]
    if isinstance(stop, int):
        size = -(-stop // world_size)
        _check_passes([math.floor(size * s / sum(shares)) for s in shares], lengths, weights, stop, size)
        return largest_remainder(size, shares)
    total = sum(shares)
    shares = [s / total for s in shares]
    if stop == "all":
        # c_i >= floor(M w_i) >= N_i at M = max ceil(N_i / w_i); the smallest M that works is near.
        upper = max(math.ceil(n / s) for n, s in zip(lengths, shares))
        lower = max(0, max(math.floor((n - 1) / s) for n, s in zip(lengths, shares)))
        # The epoch has at least ``lower`` samples, so at least these counts: refuse before searching.
        _check_passes([math.floor(lower * s) for s in shares], lengths, weights, stop, lower)
        return largest_remainder(_smallest_covering(lower, upper, shares, lengths), shares)
    # "first": the component that runs out first (smallest N_i / w_i) runs exactly one pass.
    m = min(math.floor(n / s) for n, s in zip(lengths, shares))
    counts = [min(c, n) for c, n in zip(largest_remainder(m, shares), lengths)]
    first = min(range(len(lengths)), key=lambda i: (lengths[i] / shares[i], i))
    counts[first] = lengths[first]
    return counts


def _smallest_covering(lower: int, upper: int, shares: Sequence[Fraction], lengths: Sequence[int]) -> int:
    """The smallest epoch size in [lower, upper] whose split gives every component its length
    (``upper`` always does). A weight of 1e-9 makes the range ~1e9 sizes long."""
    def covers(m: int) -> bool:
        return all(c >= n for c, n in zip(largest_remainder(m, shares), lengths))

    if len(shares) <= 2:
        # Two components: the split is c_0 = floor(M w_0 + 1/2), c_1 = M - c_0, both non-decreasing
        # in M, so whether M covers is monotone and bisection finds the smallest exactly.
        while lower < upper:
            middle = (lower + upper) // 2
            lower, upper = (lower, middle) if covers(middle) else (middle + 1, upper)
        return upper
    if upper - lower > _MAX_SIZES_TRIED:
        return upper
    return next((m for m in range(lower, upper) if covers(m)), upper)


def _check_passes(counts: Sequence[int], lengths: Sequence[int], weights: Sequence[float] | None,
                  stop: str | int, size: int) -> None:
    for i, (count, length) in enumerate(zip(counts, lengths)):
        passes = count // length if length else 0
        if passes > MAX_PASSES_PER_EPOCH:
            raise EpochTooLargeError(
                f"weights={None if weights is None else list(weights)} and stop={stop!r} make an epoch of at least "
                f"{size} samples per rank, in which dataset {i} ({length} samples per rank per pass) would run "
                f"{passes} passes; a mixture epoch plans each pass and allows at most {MAX_PASSES_PER_EPOCH} "
                f"passes of one dataset. Raise the smallest weights, or give stop= a smaller number of samples.")


def initial_passes(components: Sequence[ComponentEpoch], counts: Sequence[int], world_size: int) -> tuple[tuple[Pass, ...], ...]:
    """Each component's passes in an epoch's first leg, from its per-rank count."""
    out = []
    for component, count in zip(components, counts):
        per_rank = -(-component.frames // world_size)
        whole, rest = divmod(count, per_rank) if per_rank else (0, 0)
        passes = [Pass(p, component.segments, None) for p in range(whole)]
        if rest:
            passes.append(Pass(whole, component.segments, rest * world_size))
        out.append(tuple(passes))
    return tuple(out)


def pass_seed(seed: int, epoch: int, component: int, component_seed: int, number: int) -> int:
    """The permutation seed of one pass: distinct for every (epoch, component, pass)."""
    sequence = np.random.SeedSequence(seed, spawn_key=(_MIX_TAG, _PASS_SEED, epoch, component, component_seed, number))
    high, low = (int(v) for v in sequence.generate_state(2, np.uint64))
    return (high << 64) | low


def _interleave_rng(seed: int, epoch: int, leg: int, world: World) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(
        seed, spawn_key=(_MIX_TAG, _INTERLEAVE, epoch, leg, world.rank, world.worker)))


# -- one leg ------------------------------------------------------------------------------------

class LegPlan:
    """One leg of a mixture epoch under one layout (ranks, workers, pool sizes)."""

    def __init__(self, components: Sequence[ComponentEpoch], passes: Sequence[Sequence[Pass]], *, seed: int, epoch: int,
                 leg: int, world_size: int, num_workers: int, pool_sizes: Sequence[int]) -> None:
        self.components, self.passes = tuple(components), tuple(tuple(p) for p in passes)
        self.seed, self.epoch, self.leg = seed, epoch, leg
        self.world_size, self.workers, self.pool_sizes = world_size, max(1, num_workers), tuple(pool_sizes)
        self.plans = [[EpochPlan(p.segments, seed=pass_seed(seed, epoch, i, component.seed, p.number), epoch=0,
                                 shuffle=component.shuffle, world_size=world_size, leg=leg) for p in its_passes]
                      for i, (component, its_passes) in enumerate(zip(self.components, self.passes))]
        # Per rank from each pass: a whole pass its length, the partial pass its owed count split
        # over the ranks (rounded up: at most world_size - 1 extra draws, never a truncated whole pass).
        self.rank_demand = [[plan.samples_per_rank if p.owed is None else min(-(-p.owed // world_size),
                                                                                  plan.samples_per_rank)
                             for p, plan in zip(component, plans)]
                            for component, plans in zip(self.passes, self.plans)]
        self._consumers: dict[tuple[int, int], ConsumerMix] = {}

    @property
    def samples_per_rank(self) -> int:
        return sum(sum(d) for d in self.rank_demand)

    def component_counts(self) -> list[int]:
        return [sum(d) for d in self.rank_demand]

    def consumer(self, world: World) -> ConsumerMix:
        """The consumer ``world`` (its ``num_workers`` must be this leg's)."""
        key = (world.rank, world.worker)
        if key not in self._consumers:
            self._consumers[key] = ConsumerMix(self, world)
        return self._consumers[key]

    def worker_counts(self, rank: int) -> list[int]:
        return [self.consumer(World(rank, self.world_size, w, self.workers)).num_samples for w in range(self.workers)]


class ConsumerMix:
    """One consumer's part of a leg: its demand from every pass of every component, the order it
    interleaves them in, and the step streams of each component."""

    def __init__(self, leg: LegPlan, world: World) -> None:
        self.leg, self.world = leg, World(world.rank, leg.world_size, world.worker, leg.workers)
        self.demand: list[list[int]] = []
        for plans, rank_demand in zip(leg.plans, leg.rank_demand):
            component = []
            for plan, per_rank in zip(plans, rank_demand):
                shares = [plan.share(World(world.rank, leg.world_size, w, leg.workers)).num_samples
                          for w in range(leg.workers)]
                if per_rank >= sum(shares):
                    component.append(shares[world.worker])
                else:
                    component.append(largest_remainder(per_rank, shares)[world.worker] if any(shares) else 0)
            self.demand.append(component)
        self.counts = [sum(d) for d in self.demand]
        self.num_samples = sum(self.counts)
        self._order: np.ndarray | None = None

    def order(self) -> np.ndarray:
        """Which component each of this consumer's samples comes from (int64 array)."""
        if self._order is None:
            labels = np.repeat(np.arange(len(self.counts), dtype=np.int64), self.counts)
            self._order = _interleave_rng(self.leg.seed, self.leg.epoch, self.leg.leg, self.world).permutation(labels)
        return self._order

    def counts_before(self, samples: int) -> list[int]:
        """Samples taken from each component by the first ``samples`` of this consumer's order."""
        return np.bincount(self.order()[:samples], minlength=len(self.counts)).tolist()

    def schedule(self, component: int, index: int) -> ConsumerSchedule:
        plan = self.leg.plans[component][index]
        return consumer_schedule(plan.share(self.world), pool_size=self.leg.pool_sizes[component],
                                 shuffle=plan.shuffle, rng=consumer_rng(plan.seed, 0, self.world, leg=plan.leg))

    def steps(self, component: int, skip: int = 0) -> Iterator[Step]:
        """Component ``component``'s steps: its passes one after the other, each cut at this
        consumer's demand, after the first ``skip`` EMITs (skipped without reading anything)."""
        for index, demand in enumerate(self.demand[component]):
            if skip >= demand:
                skip -= demand
                continue
            schedule = self.schedule(component, index)
            yield from _first_emits(skip_emits(schedule, skip) if skip else schedule, demand - skip)
            skip = 0

    def consumed(self, samples: int) -> list[list[tuple[int, list, list]]]:
        """What the first ``samples`` of this consumer took, per component and pass: (count,
        pieces, fill-in repeats) as ``ConsumerSchedule.consumed`` gives them."""
        out = []
        for component, taken in enumerate(self.counts_before(samples)):
            passes = []
            for index, demand in enumerate(self.demand[component]):
                count = min(taken, demand)
                taken -= count
                pieces, fills = self.schedule(component, index).consumed(count) if count else ([], [])
                passes.append((count, pieces, fills))
            out.append(passes)
        return out


def _first_emits(steps: Iterator[Step], count: int) -> Iterator[Step]:
    """``steps`` up to their ``count``-th EMIT, then an EVICT for everything still admitted."""
    if count <= 0:
        return
    live: dict[int, int] = {}
    emitted = 0
    for step in steps:
        kind, episode = step[0], step[1]
        if kind == ADMIT:
            live[episode] = live.get(episode, 0) + 1
        elif kind == EVICT:
            live[episode] -= 1
            if not live[episode]:
                del live[episode]
        yield step
        if kind == EMIT:
            emitted += 1
            if emitted == count:
                break
    for episode, times in live.items():
        for _ in range(times):
            yield Step(EVICT, episode, NO_FRAME)


def next_passes(leg: LegPlan, taken: Mapping[int, Sequence[int]]) -> tuple[tuple[Pass, ...], ...]:
    """What every component still owes after the consumers of ``leg`` took ``taken[rank][worker]``
    mixture samples each: each pass without its consumed frames; a partial pass owes less."""
    pieces: dict[tuple[int, int], list] = {}
    fills: dict[tuple[int, int], list] = {}
    counts: dict[tuple[int, int], int] = {}
    for rank, per_worker in taken.items():
        for worker, samples in enumerate(per_worker):
            if not samples:
                continue
            consumer = leg.consumer(World(rank, leg.world_size, worker, leg.workers))
            for component, passes in enumerate(consumer.consumed(samples)):
                for index, (count, got, repeats) in enumerate(passes):
                    key = (component, index)
                    pieces.setdefault(key, []).extend(got)
                    fills.setdefault(key, []).extend(repeats)
                    counts[key] = counts.get(key, 0) + count
    out = []
    for component, owed_passes in enumerate(leg.passes):
        left = []
        for index, p in enumerate(owed_passes):
            key = (component, index)
            segments = tuple(remaining_segments(p.segments, pieces.get(key, []), fills.get(key, [])))
            owed = None if p.owed is None else p.owed - counts.get(key, 0)
            if segments and (owed is None or owed > 0):
                left.append(Pass(p.number, segments, owed))
        out.append(tuple(left))
    return tuple(out)


# -- resume -------------------------------------------------------------------------------------

MixLeg = Leg  # a mixture's legs are the one leg type (``_plan.resume.Leg``), with a pool size per component


@dataclass(frozen=True)
class MixResume:
    """Where a mixture epoch restarts: the leg to stream (its passes) and, in exact mode, the
    per-rank skips (mixture samples consumed per worker role, and the role whose turn is next)."""

    leg_index: int
    passes: tuple[tuple[Pass, ...], ...]
    skips: dict[int, tuple[list[int], int]] | None

    def role_for(self, world: World) -> tuple[World, int]:
        """The worker role this consumer plays and how many of its mixture samples to skip."""
        if self.skips is None:
            return world, 0
        consumed, first_role = self.skips[world.rank]
        role = (first_role + world.worker) % world.num_workers
        return World(world.rank, world.world_size, role, world.num_workers), consumed[role]


def _available_batches(leg: LegPlan, spec: MixLeg) -> int:
    return max(sum(c // spec.batch_size if spec.drop_last else -(-c // spec.batch_size)
                   for c in leg.worker_counts(rank)) for rank in range(leg.world_size))


def plan_mixture_resume(components: Sequence[ComponentEpoch], *, seed: int, epoch: int, weights: Sequence[float] | None,
                        stop: str | int, legs: Sequence[MixLeg], world_size: int, num_workers: int,
                        pool_sizes: Sequence[int]) -> MixResume | None:
    """Where to restart ``epoch`` after ``legs`` (the last one holding the batches consumed so far)
    for a run with ``world_size`` ranks, ``num_workers`` workers and ``pool_sizes``. None when the
    legs consumed the whole epoch. Raises ``BeyondEpochError`` when a leg claims more batches than
    it had."""
    new = MixLeg(world_size, num_workers, tuple(pool_sizes), 1, 0)
    first = legs[0].world_size
    passes = initial_passes(components, rank_counts([s.frames for s in components], world_size=first, weights=weights,
                                                 stop=stop), first)
    for index, spec in enumerate(legs):
        leg = LegPlan(components, passes, seed=seed, epoch=epoch, leg=index, world_size=spec.world_size,
                      num_workers=spec.num_workers, pool_sizes=spec.pool_sizes)
        available = _available_batches(leg, spec)
        if spec.batches > available:
            raise BeyondEpochError(index, spec.batches, available)
        per_rank = {r: loader_consumption(leg.worker_counts(r), batch_size=spec.batch_size, batches=spec.batches,
                                          drop_last=spec.drop_last) for r in range(spec.world_size)}
        if index == len(legs) - 1 and spec.same_stream(new):
            produced = {r: loader_consumption(leg.worker_counts(r), batch_size=spec.batch_size, batches=10**12,
                                              drop_last=spec.drop_last)[0] for r in per_rank}
            if all(per_rank[r][0] == produced[r] for r in per_rank):
                return None
            return MixResume(index, passes, per_rank)
        passes = next_passes(leg, {r: taken for r, (taken, _) in per_rank.items()})
    if not any(passes):
        return None
    return MixResume(len(legs), passes, None)
