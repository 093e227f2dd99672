"""Which frames each consumer emits, and in what order: the epoch split and the episode pool.

Everything here is pure and tabular-free (it sees episode indices and frame counts only), so the
same code drives streaming, counts ``len()``, and replays a stream for resume without touching
rows or video.

The split: the epoch's episodes are permuted from (seed, epoch) and their frames laid end to end;
that sequence is cut into ``world_size`` equal contiguous parts (sizes differ by at most one), and
each rank's part into ``num_workers`` equal parts. Equal cuts may fall inside an episode: the two
consumers then each own a disjoint range of its frames (each loads the episode's rows, so windows
still see the whole episode). Every rank emits ``ceil(frames / world_size)`` samples; a rank one
short repeats one of its own frames (a "fill-in"), so distributed training never hangs on an
uneven split.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ._world import World

ADMIT, EMIT, EVICT = 0, 1, 2
_PERMUTE, _CONSUMER, _FILL = 0, 1, 2  # rng purposes: fixed-length spawn keys never collide


_PURPOSES = 3


def make_rng(seed: int, epoch: int, purpose: int, rank: int = 0, worker: int = 0, *,
             leg: int = 0) -> np.random.Generator:
    """A generator for one purpose; ``leg`` > 0 marks the later legs of an elastically resumed epoch."""
    key = (epoch, purpose + _PURPOSES * leg, rank, worker)
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


def consumer_rng(seed: int, epoch: int, world: World, *, leg: int = 0) -> np.random.Generator:
    """Each consumer's RNG derives from (seed, epoch, rank, worker)."""
    return make_rng(seed, epoch, _CONSUMER, world.rank, world.worker, leg=leg)


@dataclass(frozen=True)
class Segment:
    """Frames of one episode owned by one consumer: offsets within the episode (a range, or an array)."""

    episode_index: int
    frames: range | np.ndarray

    def __len__(self) -> int:
        return len(self.frames)


@dataclass(frozen=True)
class ConsumerShare:
    segments: tuple[Segment, ...]
    fill_ins: int  # extra samples repeated at the end so every rank emits the same count
    fill_pool: tuple[Segment, ...]  # where fill-ins are drawn from

    @property
    def num_samples(self) -> int:
        return sum(len(s) for s in self.segments) + self.fill_ins


def _cut(segments: Sequence[Segment], parts: int) -> list[list[Segment]]:
    """Cut the concatenated frames of ``segments`` into ``parts`` contiguous, equal-sized parts."""
    total = sum(len(s) for s in segments)
    bounds = [p * total // parts for p in range(parts + 1)]
    starts = np.cumsum([0] + [len(s) for s in segments])
    out: list[list[Segment]] = [[] for _ in range(parts)]
    for p in range(parts):
        lo, hi = bounds[p], bounds[p + 1]
        i = bisect.bisect_right(starts, lo) - 1
        while lo < hi:
            seg, seg_start = segments[i], int(starts[i])
            take_hi = min(hi, seg_start + len(seg))
            out[p].append(Segment(seg.episode_index, seg.frames[lo - seg_start:take_hi - seg_start]))
            lo = take_hi
            i += 1
    return out


class EpochPlan:
    """The split of one epoch's frames across ranks and workers.

    ``segments`` lists what the epoch must cover, in selection order: normally one whole-episode
    segment per selected episode; after an elastic resume, the frames not yet consumed.
    """

    def __init__(self, segments: Sequence[Segment], *, seed: int, epoch: int, shuffle: bool,
                 world_size: int, leg: int = 0) -> None:
        segments = [s for s in segments if len(s)]
        if shuffle:
            order = make_rng(seed, epoch, _PERMUTE, leg=leg).permutation(len(segments))
            segments = [segments[i] for i in order]
        self.segments = tuple(segments)
        self.seed, self.epoch, self.shuffle, self.world_size, self.leg = seed, epoch, shuffle, world_size, leg
        self.total_frames = sum(len(s) for s in segments)
        self.rank_parts = _cut(self.segments, world_size)

    @property
    def samples_per_rank(self) -> int:
        return -(-self.total_frames // self.world_size)

    def share(self, world: World) -> ConsumerShare:
        rank_part = self.rank_parts[world.rank]
        rank_frames = sum(len(s) for s in rank_part)
        parts = _cut(rank_part, world.num_workers)
        counts = [sum(len(s) for s in part) for part in parts]
        # The shortfall (0 or 1 by construction) goes to the last of the least-loaded workers.
        filler = max(range(world.num_workers), key=lambda w: (-counts[w], w))
        fill_ins = self.samples_per_rank - rank_frames if world.worker == filler else 0
        # A rank with no frames at all (fewer frames than ranks) repeats frames of the whole epoch.
        fill_pool = tuple(rank_part) if rank_frames else self.segments
        return ConsumerShare(tuple(parts[world.worker]), fill_ins, fill_pool)

    def uneven_warning(self, num_workers: int) -> str | None:
        """A one-line explanation when some consumer gets nothing to emit, else None."""
        consumers = self.world_size * num_workers
        if self.total_frames < consumers:
            return (f"The epoch has {self.total_frames} frames for {consumers} consumers "
                    f"({self.world_size} rank(s) x {num_workers} worker(s)): some consumers emit only "
                    f"fill-ins or nothing. Use fewer workers or select more episodes.")
        return None


def consumer_schedule(share: ConsumerShare, *, pool_size: int, shuffle: bool,
                      rng: np.random.Generator) -> Iterator[tuple[int, int, int]]:
    """Yield ``(ADMIT|EMIT|EVICT, episode_index, frame_offset)`` steps for one consumer.

    With ``shuffle`` the pool holds up to ``pool_size`` segments and each EMIT is a frame drawn
    uniformly, without replacement, from all frames left in the pool; a spent segment is evicted
    and the next admitted. Without ``shuffle`` segments and frames come in order.
    """
    pending = deque(share.segments)
    pool: list[list] = []  # [episode_index, frames still to emit (a shuffled array), count left]
    capacity = pool_size if shuffle else 1
    while pending or pool:
        while pending and len(pool) < capacity:
            seg = pending.popleft()
            yield ADMIT, seg.episode_index, -1
            frames = np.asarray(seg.frames)
            pool.append([seg.episode_index, rng.permutation(frames)[::-1] if shuffle else frames[::-1],
                         len(frames)])
        if shuffle and len(pool) > 1:
            u = int(rng.integers(sum(slot[2] for slot in pool)))
            slot_index = 0
            while u >= pool[slot_index][2]:
                u -= pool[slot_index][2]
                slot_index += 1
        else:
            slot_index = 0
        slot = pool[slot_index]
        slot[2] -= 1
        yield EMIT, slot[0], int(slot[1][slot[2]])
        if slot[2] == 0:
            pool.pop(slot_index)
            yield EVICT, slot[0], -1
    if share.fill_ins:
        fill_rng = make_rng(int(rng.integers(2**32)), 0, _FILL)
        starts = np.cumsum([0] + [len(s) for s in share.fill_pool])
        picks = fill_rng.choice(int(starts[-1]), size=share.fill_ins, replace=starts[-1] < share.fill_ins)
        for i in picks:
            k = bisect.bisect_right(starts, i) - 1
            seg = share.fill_pool[k]
            yield ADMIT, seg.episode_index, -1
            yield EMIT, seg.episode_index, int(seg.frames[i - starts[k]])
            yield EVICT, seg.episode_index, -1
