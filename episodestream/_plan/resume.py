"""Deterministic fast-forward resume: what a trainer consumed, and where each consumer restarts.

A stream is fully determined by (seed, epoch, shuffle, pool size, world size, num_workers) and the
episode selection, and ``_plan.sampling`` replays it without rows or video. From the trainer's
``batches_consumed`` and ``batch_size`` we replay how the DataLoader handed batches out:
with ``num_workers`` w > 0, each worker batches its own stream and the loader takes one batch from
each worker in turn (worker 0 first), skipping workers that are exhausted (in-order delivery, the
DataLoader default). That gives, per worker, how many of its samples were consumed.

Exact resume (same world size, workers and pool size): each worker skips its consumed samples,
tabular-free, and the workers are rotated so the loader's first batch comes from the worker whose
turn was next. The resumed stream is the uninterrupted one, sample for sample.

Elastic resume (anything else changed): the consumed samples are removed from the epoch and the
remaining frames are split afresh across the new ranks and workers, as a new "leg" of the same
epoch. Every unconsumed frame is emitted exactly once, nothing consumed is repeated (fill-ins
aside), and every rank still yields the same count. ``batches_consumed`` keeps counting from the
start of the epoch across legs, so a state saved during a resumed epoch resumes again.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Any, TypeVar

import numpy as np

from episodestream._base.cores import usable_cores
from episodestream._base.gc_pause import gc_paused
from episodestream._base.options import check_bool, check_int
from episodestream._plan.sampling import (
    ADMIT,
    as_array,
    EMIT,
    NO_FRAME,
    ConsumerSchedule,
    Step,
    EpochPlan,
    Frames,
    LeftFrames,
    Segment,
    consumer_rng,
    consumer_schedule,
)
from episodestream._base.world import World

# /2: the pool schedule became a sliding window of keyed frames (``_plan.sampling.ConsumerSchedule``), so
# a resume point is found arithmetically. /3: the window's first segments open on a ramp. /4: a
# segment's keys are stratified over its window. /5: all at one point of their strata (systematic). /6: a
# pool of the whole share, keys from counter-based bits. /7: that pool's first segments open on a ramp.
# /8: a segment's frames are emitted in GOP pairs (``ConsumerSchedule._order_bits``).
# Each time the same (seed, epoch, rank, worker) emits another order, so an older state cannot be resumed
# exactly.
STATE_FORMAT = "episodestream.stream_state/8"
# Threads replaying old consumers' schedules at once on an elastic re-plan: where frames are compared
# (``ConsumerSchedule.consumed``) each holds a share's keys (tens of MB at DROID size), so not one per
# core on a large node.
_REPLAY_THREADS = 8
_T = TypeVar("_T")


def refuse_other_format(state: object, expected: str, what: str) -> None:
    """A clear error for anything but a state of format ``expected`` (``what``: "stream", "mixture")."""
    found = state.get("format") if isinstance(state, Mapping) else None
    if found == expected:
        return
    family = expected.rsplit("/", 1)[0]
    if isinstance(found, str) and found.startswith(family + "/"):
        raise ValueError(f"The state was saved by another episodestream version (format {found!r}; this one reads "
                         f"{expected!r}), whose schedule emits another order for the same seed: it cannot be "
                         f"resumed exactly. Start the epoch afresh (set_epoch) or resume with that version.")
    raise ValueError(f"Not an episodestream {what} state (expected format {expected!r}): {state!r:.200}")


# Upper bounds of a saved layout. Resuming replays every consumer (rank x worker) of every leg before
# the first batch, so a corrupt count (world_size = 2**40) ran for minutes and took gigabytes instead
# of being refused. Each bound is far above what a real trainer has:
MAX_WORLD_SIZE = 2**20  # ~10x the largest training runs (~10^5 GPUs, one rank each)
MAX_NUM_WORKERS = 2**10  # DataLoader workers are processes on one rank's node: a few dozen in practice
MAX_CONSUMERS = 2**22  # ranks x workers: a replay costs ~50 us per consumer, minutes at this many
MAX_BATCH_SIZE = 2**24  # samples per batch per rank: 16M, beyond any accelerator's memory
MAX_BATCHES = 2**40  # batches of one epoch per rank: 10^12 samples at one each, months of streaming


@dataclass(frozen=True)
class Leg:
    """One stretch of an epoch streamed under one layout, and the batches consumed in it: the one
    leg type of datasets and mixtures (``pools``: each component's episode pool size; a dataset's
    one). Saved as ``to_state(pools_key)``: a dataset's legs say ``pool_size`` (an int), a
    mixture's ``pool_sizes`` (a list), as states always did."""

    world_size: int
    num_workers: int  # as passed to the DataLoader (0: the main process iterates)
    pools: tuple[int, ...]
    batch_size: int
    batches: int
    drop_last: bool = False

    @property
    def workers(self) -> int:
        return max(1, self.num_workers)

    @property
    def pool_size(self) -> int:
        """A dataset's episode pool size (its one component's)."""
        return self.pools[0]

    @property
    def pool_sizes(self) -> tuple[int, ...]:
        return self.pools

    def same_stream(self, other: Leg) -> bool:
        return (self.world_size, self.workers, self.pools) == (other.world_size, other.workers, other.pools)

    def to_state(self, pools_key: str) -> dict[str, Any]:
        pools: Any = self.pools[0] if pools_key == "pool_size" else list(self.pools)
        return {"world_size": self.world_size, "num_workers": self.num_workers, pools_key: pools,
                "batch_size": self.batch_size, "batches": self.batches, "drop_last": self.drop_last}

    @classmethod
    def from_state(cls, value: Any, where: str, pools_key: str = "pool_size") -> Leg:
        """A leg saved by ``state_dict`` (``where`` names it in errors), every field checked."""
        fields = {"world_size", "num_workers", pools_key, "batch_size", "batches", "drop_last"}
        # drop_last is optional: states saved before it existed lack it.
        if not isinstance(value, Mapping) or not fields - {"drop_last"} <= set(value) <= fields:
            raise ValueError(f"{where} must be a dict with keys {sorted(fields)}, got {value!r:.200}.")
        minimum = {"world_size": 1, "batch_size": 1}
        maximum = {"world_size": MAX_WORLD_SIZE, "num_workers": MAX_NUM_WORKERS, "batch_size": MAX_BATCH_SIZE,
                   "batches": MAX_BATCHES}
        ints = {k: check_int(f"{where}[{k!r}]", value[k], minimum=minimum.get(k, 0), maximum=maximum[k])
                for k in ("world_size", "num_workers", "batch_size", "batches")}
        check_consumers(where, ints["world_size"], ints["num_workers"])
        return cls(**ints, pools=read_pools(value[pools_key], f"{where}[{pools_key!r}]", pools_key),
                   drop_last=check_bool(f"{where}['drop_last']", value.get("drop_last", False)))


def read_pools(value: Any, where: str, pools_key: str) -> tuple[int, ...]:
    """A saved pool size (``pools_key`` "pool_size": an int) or pool sizes ("pool_sizes": a list)."""
    if pools_key == "pool_size":
        return (check_int(where, value, minimum=1),)
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{where} must be a list of ints, got {value!r:.200}.")
    return tuple(check_int(f"{where}[{i}]", p, minimum=1) for i, p in enumerate(value))


def check_consumers(where: str, world_size: int, num_workers: int) -> None:
    """Refuse a layout of more than ``MAX_CONSUMERS`` consumers (``where`` names the dict holding
    its ``world_size`` and ``num_workers``): each field within its own bound, the product may not be."""
    consumers = world_size * max(1, num_workers)
    if consumers > MAX_CONSUMERS:
        raise ValueError(f"{where}['world_size']={world_size} x {where}['num_workers']={num_workers} is {consumers} "
                         f"consumers, more than {MAX_CONSUMERS}: the state is not one a trainer saved.")


class BeyondEpochError(ValueError):
    """A leg says more batches were consumed than its epoch had."""

    def __init__(self, leg_index: int, batches: int, available: int) -> None:
        super().__init__(f"leg {leg_index}: {batches} batches consumed, but the epoch had {available}")
        self.leg_index, self.batches, self.available = leg_index, batches, available


def fingerprint_digest(values: Sequence[int]) -> str:
    return hashlib.sha1(json.dumps(list(values)).encode()).hexdigest()[:16]


def consumer_schedule_of(plan: EpochPlan, world: World, *, pool_size: int, leg: int) -> ConsumerSchedule:
    """A consumer's schedule; no rows, no video."""
    return consumer_schedule(plan.share(world), pool_size=pool_size, shuffle=plan.shuffle,
                             rng=consumer_rng(plan.seed, plan.epoch, world, leg=leg))


def consumer_emits(plan: EpochPlan, world: World, *, pool_size: int, leg: int) -> list[tuple[int, int]]:
    """The (episode_index, frame) pairs a consumer emits, in order (walks every step: for tests)."""
    steps = consumer_schedule_of(plan, world, pool_size=pool_size, leg=leg)
    return [(episode, frame) for kind, episode, frame in steps if kind == EMIT]


def loader_consumption(counts: Sequence[int], *, batch_size: int, batches: int,
                       drop_last: bool = False) -> tuple[list[int], int]:
    """Given each worker's sample count, how many samples of each the first ``batches`` batches took,
    and which worker's turn comes next (the DataLoader's in-order round robin)."""
    # Batches each worker produces: with drop_last every worker drops its own partial batch.
    left = [c // batch_size if drop_last else -(-c // batch_size) for c in counts]
    taken = [0] * len(counts)
    turn = 0
    # Whole rounds (one batch from every worker not yet exhausted) arithmetically, all but the last
    # one or two rounds, which are walked below: an epoch has ~10^5 batches, a round only a few.
    rounds = _full_rounds(left, batches)
    if rounds > 1:
        skipped = rounds - 1
        taken = [min(n, skipped) for n in left]
        batches -= sum(taken)
        # After a whole round, the turn passes the last worker that still had a batch in it.
        turn = (max(w for w, n in enumerate(left) if n >= skipped) + 1) % len(counts)
        left = [n - t for n, t in zip(left, taken)]
    for _ in range(batches):
        if not any(left):
            break
        while not left[turn]:
            turn = (turn + 1) % len(counts)
        taken[turn] += 1
        left[turn] -= 1
        turn = (turn + 1) % len(counts)
    consumed = [min(c, t * batch_size) for c, t in zip(counts, taken)]
    return consumed, turn


def _full_rounds(batches_per_worker: Sequence[int], batches: int) -> int:
    """The most whole rounds of the round robin that fit in ``batches`` (batches in r rounds:
    ``sum(min(n, r))``), by bisection."""
    lo, hi = 0, max(batches_per_worker, default=0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(min(n, mid) for n in batches_per_worker) <= batches:
            lo = mid
        else:
            hi = mid - 1
    return lo


def skip_emits(steps: Iterator[Step], count: int) -> Iterator[Step]:
    """Drop the first ``count`` EMITs, then re-admit whatever the pool holds at that point.

    A fresh ``ConsumerSchedule`` is skipped arithmetically (``ConsumerSchedule.skip``); any other
    step iterator is walked. Either way no episode rows are read and nothing is decoded.
    """
    if isinstance(steps, ConsumerSchedule) and not steps.started:
        return steps.skip(count)
    return _walk_skip(steps, count)


def _walk_skip(steps: Iterator[Step], count: int) -> Iterator[Step]:
    admitted: dict[int, int] = {}
    skipped = 0
    for step in steps:
        if skipped == count:
            for episode, times in admitted.items():
                for _ in range(times):
                    yield Step(ADMIT, episode, NO_FRAME)
            yield step
            yield from steps
            return
        kind, episode, _ = step
        if kind == EMIT:
            skipped += 1
        elif kind == ADMIT:
            admitted[episode] = admitted.get(episode, 0) + 1
        else:
            admitted[episode] -= 1
            if not admitted[episode]:
                del admitted[episode]


def remaining_segments(segments: Sequence[Segment], consumed: Sequence[tuple[int, Frames]],
                       repeated: Sequence[tuple[int, np.ndarray]] = ()) -> list[Segment]:
    """``segments`` without the consumed frames, in the same order.

    ``consumed`` pieces never hold a frame twice (each frame belongs to one consumer, which emits it
    once), so an episode whose pieces add up to its frame count is dropped without comparing
    frames: at 90% of a 92,000-episode epoch that is nearly every episode. The rest (what the
    pools held, and episodes with ``repeated`` frames, the fill-ins) are compared frame by frame.
    The counting is done on arrays: a Python pass per segment cost more than all the comparing.
    """
    if not consumed and not repeated:
        return list(segments)
    # map() with an attrgetter/itemgetter walks these ~10^5 items at about twice a generator's speed.
    seg_episodes = np.fromiter(map(attrgetter("episode_index"), segments), np.int64, len(segments))
    seg_lengths = np.fromiter(map(attrgetter("length"), segments), np.int64, len(segments))
    taken_pieces = [*consumed, *repeated]
    piece_episodes = np.fromiter(map(itemgetter(0), taken_pieces), np.int64, len(taken_pieces))
    piece_lengths = np.fromiter(map(len, map(itemgetter(1), taken_pieces)), np.int64, len(taken_pieces))
    size = int(max(seg_episodes.max(initial=-1), piece_episodes.max(initial=-1))) + 1
    taken = np.bincount(piece_episodes, weights=piece_lengths, minlength=size)
    # An episode weighted up has several segments (distinct anchors, ``Segment.period``): the
    # shortcut compares what was taken with all of them.
    anchors = np.bincount(seg_episodes, weights=seg_lengths, minlength=size)
    compare = np.zeros(size, bool)
    compare[[e for e, _ in repeated]] = True
    whole = (taken[seg_episodes] == anchors[seg_episodes]) & ~compare[seg_episodes]
    touched = taken[seg_episodes] > 0
    partial_episodes = np.unique(seg_episodes[touched & ~whole])
    pieces: dict[int, list] = {int(e): [] for e in partial_episodes}
    for k in np.flatnonzero(np.isin(piece_episodes, partial_episodes) & (piece_lengths > 0)).tolist():
        episode, frames = taken_pieces[k]
        pieces[episode].append(frames)
    kept: dict[int, np.ndarray] = {}
    compared = np.flatnonzero(touched & ~whole).tolist()
    # A pool of the whole share leaves every episode partial: compared in blocks, each one lookup
    # table over its episodes (a Python pass per segment cost seconds at 92,000 episodes; one table
    # for all of them, hundreds of MB).
    for block in range(0, len(compared), _COMPARE_BLOCK):
        kept.update(_kept_frames([(i, segments[i]) for i in compared[block:block + _COMPARE_BLOCK]], pieces))
    out = []
    for i in np.flatnonzero(~whole).tolist():
        seg = segments[i]
        if not touched[i]:
            out.append(seg)
        elif len(frames := kept[i]):
            out.append(Segment(seg.episode_index, frames, seg.period))
    return out


_COMPARE_BLOCK = 4096  # segments whose frames ``remaining_segments`` compares at once


def _kept_frames(segments: list[tuple[int, Segment]], pieces: dict[int, list]) -> dict[int, np.ndarray]:
    """Each of ``segments``' frames not among its episode's taken ``pieces``, by segment number.

    Frames and anchors are small non-negative ints: each episode gets a stretch of one boolean
    table (~5x np.isin's speed)."""
    episodes = sorted({seg.episode_index for _, seg in segments})
    seg_frames = [as_array(seg.frames) for _, seg in segments]
    taken = [as_array(t) for e in episodes for t in pieces[e]]
    taken_episodes = np.repeat(np.searchsorted(episodes, [seg.episode_index for _, seg in segments]),
                               [len(f) for f in seg_frames])
    all_frames = np.concatenate(seg_frames)
    taken_frames = np.concatenate(taken) if taken else np.zeros(0, np.int64)
    taken_at = np.repeat(np.arange(len(episodes)), [sum(len(t) for t in pieces[e]) for e in episodes])
    width = np.zeros(len(episodes), np.int64)
    np.maximum.at(width, taken_episodes, all_frames + 1)
    np.maximum.at(width, taken_at, taken_frames + 1)
    base = np.concatenate([[0], np.cumsum(width)[:-1]])
    table = np.zeros(int(width.sum()), bool)
    table[base[taken_at] + taken_frames] = True
    keep = ~table[base[taken_episodes] + all_frames]
    bounds = np.cumsum([len(f) for f in seg_frames])[:-1]
    return {i: frames[mask] for (i, _), frames, mask in zip(segments, seg_frames, np.split(keep, bounds))}


@dataclass(frozen=True)
class ResumePoint:
    """Where iteration restarts within ``epoch``: the current leg's frames and, in exact mode, the
    per-rank skips (consumed samples per worker role, and the role whose turn comes first)."""

    epoch: int
    leg_index: int
    segments: tuple[Segment, ...]
    skips: dict[int, tuple[list[int], int]] | None
    seed: int = 0
    shuffle: bool = True

    def plan(self, world_size: int) -> EpochPlan:
        """The plan of the leg that resumes here."""
        return EpochPlan(self.segments, seed=self.seed, epoch=self.epoch, shuffle=self.shuffle,
                         world_size=world_size, leg=self.leg_index)

    def samples_left(self, world_size: int, rank: int) -> int:
        """Samples ``rank`` yields from here to the end of the epoch."""
        total = self.plan(world_size).samples_per_rank
        return total if self.skips is None else total - sum(self.skips[rank][0])

    def share_for(self, plan: EpochPlan, world: World) -> tuple[World, int]:
        """The worker role this consumer plays and how many of its samples to skip."""
        if self.skips is None:
            return world, 0
        consumed, first_role = self.skips[world.rank]
        role = (first_role + world.worker) % world.num_workers
        return World(world.rank, world.world_size, role, world.num_workers), consumed[role]


def _worker_counts(plan: EpochPlan, rank: int, workers: int) -> list[int]:
    return [plan.share(World(rank, plan.world_size, k, workers)).num_samples for k in range(workers)]


def plan_resume(segments: Sequence[Segment], *, seed: int, epoch: int, shuffle: bool, legs: Sequence[Leg],
                world_size: int, num_workers: int, pool_size: int) -> ResumePoint | None:
    """Where to restart ``epoch`` after ``legs`` (the last one holding the batches consumed so far),
    for a run with ``world_size`` ranks, ``num_workers`` workers and ``pool_size``. None when the
    legs consumed the whole epoch."""
    # An elastic replay makes a piece per consumed segment (~10^5 at 90% of a DROID-sized epoch),
    # none of them cyclic: with the collector on, their allocations set off collections that walk a
    # trainer's whole heap, which cost more than the replay (benchmarks/LOG.md).
    with gc_paused():
        return _plan_resume(tuple(segments), seed=seed, epoch=epoch, shuffle=shuffle, legs=legs,
                            world_size=world_size, num_workers=num_workers, pool_size=pool_size)


def _plan_resume(segments: tuple[Segment, ...], *, seed: int, epoch: int, shuffle: bool, legs: Sequence[Leg],
                 world_size: int, num_workers: int, pool_size: int) -> ResumePoint | None:
    new = Leg(world_size, num_workers, (pool_size,), 1, 0)
    for index, leg in enumerate(legs):
        plan = EpochPlan(segments, seed=seed, epoch=epoch, shuffle=shuffle, world_size=leg.world_size, leg=index)
        counts = {r: _worker_counts(plan, r, leg.workers) for r in range(leg.world_size)}
        available = max(sum(c // leg.batch_size if leg.drop_last else -(-c // leg.batch_size) for c in rank_counts)
                        for rank_counts in counts.values())
        if leg.batches > available:
            raise BeyondEpochError(index, leg.batches, available)
        per_rank = {r: loader_consumption(counts[r], batch_size=leg.batch_size, batches=leg.batches,
                                          drop_last=leg.drop_last)
                    for r in range(leg.world_size)}
        if index == len(legs) - 1 and leg.same_stream(new):
            produced = {r: loader_consumption(counts[r], batch_size=leg.batch_size, batches=10**12,
                                              drop_last=leg.drop_last)[0] for r in per_rank}
            if all(per_rank[r][0] == produced[r] for r in per_rank):
                return None
            return ResumePoint(epoch, index, segments, per_rank, seed, shuffle)
        left = _left_segments(segments, plan, leg, index, per_rank)
        if left is not None:
            segments = left
            continue
        consumed: list[tuple[int, Frames]] = []
        repeated: list[tuple[int, np.ndarray]] = []
        takers = [(World(rank, leg.world_size, worker, leg.workers), count)
                  for rank, (taken, _) in per_rank.items() for worker, count in enumerate(taken) if count]
        consumed_by = functools.partial(_consumed_by, plan, pool_size=leg.pool_size, leg=index)
        for pieces, fills in _each_consumer(consumed_by, takers):
            consumed += pieces
            repeated += fills
        segments = tuple(remaining_segments(segments, consumed, repeated))
    if not segments:
        return None
    return ResumePoint(epoch, len(legs), segments, None, seed, shuffle)


def _left_segments(segments: tuple[Segment, ...], plan: EpochPlan, leg: Leg, index: int,
                   per_rank: Mapping[int, tuple[list[int], int]]) -> tuple[Segment, ...] | None:
    """``remaining_segments`` of what the leg's consumers took, from what each one left
    (``ConsumerSchedule.left``) rather than by comparing what they took with every segment's frames.
    None where that does not apply, and the comparison decides: an episode with several segments
    (weighted up), or fill-ins emitted (a repeat may take a frame of another worker's share).

    Each segment's frames are cut into consecutive consumers' parts in order, so its consumers' left
    frames, taken in consumer order, are in the segment's own order: the same segments as the
    comparison gives."""
    episodes = np.fromiter(map(attrgetter("episode_index"), segments), np.int64, len(segments))
    if len(np.unique(episodes)) != len(episodes):
        return None
    def left_of(world: World, count: int) -> list[tuple[int, Frames]] | None:
        if not count:
            return [(seg.episode_index, seg.frames) for seg in plan.share(world).segments]
        schedule = consumer_schedule_of(plan, world, pool_size=leg.pool_size, leg=index)
        pieces = schedule.left(count)
        share = schedule.share.segments
        return None if pieces is None else [(share[i].episode_index, frames) for i, frames in pieces]

    consumers = [(World(rank, leg.world_size, worker, leg.workers), per_rank[rank][0][worker])
                 for rank in range(leg.world_size) for worker in range(leg.workers)]
    left: dict[int, list[Frames]] = {}
    for pieces in _each_consumer(left_of, consumers):  # in consumer order, as the segments cut them
        if pieces is None:
            return None
        for episode, frames in pieces:
            left.setdefault(episode, []).append(frames)
    out = []
    for seg in segments:
        parts = left.get(seg.episode_index)
        if not parts:
            continue
        if len(parts) == 1:  # the usual case: the segment in one consumer's share
            part = parts[0]
            if len(part) == seg.length:
                out.append(seg)
            else:  # an array, as comparing gives it (a slice of the other consumer's part may be a range)
                out.append(Segment(seg.episode_index, part if type(part) in (np.ndarray, LeftFrames) else as_array(part),
                                   seg.period))
        elif sum(len(part) for part in parts) == seg.length:
            out.append(seg)
        else:
            out.append(Segment(seg.episode_index, np.concatenate([as_array(part) for part in parts]), seg.period))
    return tuple(out)


def _consumed_by(plan: EpochPlan, world: World, count: int, *, pool_size: int,
                 leg: int) -> tuple[list[tuple[int, Frames]], list[tuple[int, np.ndarray]]]:
    return consumer_schedule_of(plan, world, pool_size=pool_size, leg=leg).consumed(count)


def _each_consumer(work: Callable[[World, int], _T], consumers: Sequence[tuple[World, int]]) -> list[_T]:
    """``work(world, count)`` of every old consumer, in their order, on threads: each replays a
    share's keys in large numpy arrays (which release the GIL), and an elastic re-plan of a
    DROID-sized epoch replays every old consumer's (docs/resume.md, "Cost")."""
    threads = min(usable_cores(), len(consumers), _REPLAY_THREADS)
    if threads <= 1:
        return [work(world, count) for world, count in consumers]
    with ThreadPoolExecutor(threads, thread_name_prefix="episodestream-replan") as pool:
        return list(pool.map(lambda consumer: work(*consumer), consumers))


def consumer_steps(plan: EpochPlan, world: World, *, pool_size: int, point: ResumePoint | None = None,
                   then_skip: int = 0) -> tuple[Iterator[Step], int, ConsumerSchedule]:
    """The one place a consumer's schedule is made: its steps for ``plan`` (from ``point`` when the
    epoch is resumed: the worker role it takes over and the samples it skips, tabular-free), how
    many samples they emit, and the schedule they come from (its share and fill-ins: what a
    remote source narrows each episode's video bytes to). ``then_skip``: samples of those steps to skip as well (what a
    per-consumer state says this consumer yielded, ``_runtime.resume.position``)."""
    role, skip = point.share_for(plan, world) if point is not None else (world, 0)
    skip += then_skip
    share = plan.share(role)
    steps = consumer_schedule(share, pool_size=pool_size, shuffle=plan.shuffle,
                              rng=consumer_rng(plan.seed, plan.epoch, role, leg=plan.leg))
    return (skip_emits(steps, skip) if skip else steps), share.num_samples - skip, steps
