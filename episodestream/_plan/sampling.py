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
import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from operator import attrgetter, itemgetter
from typing import Any, NamedTuple, Protocol

import numpy as np

from episodestream._base.world import World



class StepKind(IntEnum):
    """What a schedule step does to the consumer's pool."""

    ADMIT = 0  # read the episode's rows and admit its video (admissions are counted per episode)
    EMIT = 1  # emit one sample: ``frame`` of the episode
    EVICT = 2  # undo one admission; the last one drops the rows and, once decoded, the video


ADMIT, EMIT, EVICT = StepKind.ADMIT, StepKind.EMIT, StepKind.EVICT
NO_FRAME = -1  # the frame of an ADMIT or EVICT step


class Step(NamedTuple):
    """One step of a consumer's schedule (a tuple: ``kind, episode_index, frame = step``)."""

    kind: StepKind
    episode_index: int
    frame: int  # the frame offset an EMIT emits; NO_FRAME otherwise


# The ramp's first windows (``ConsumerSchedule``): as wide as a pool of 16's for the segments opening
# in its first 3 slots (4 segments: slot k opens segments 2**(k-1)..2**k - 1), so that any pool's
# first batches draw from as few episodes as pool 16's did (planned, docs/resume.md).
RAMP_FIRST_WIDTH = 16
RAMP_NARROW_SLOTS = 3
# A pool of the whole share closes a ramp group early only while it holds at most 1/WIDE_RAMP_SHARE of
# the share (``ConsumerSchedule._windows``).
WIDE_RAMP_SHARE = 64
_NARROW_FROM_SEGMENTS = 64  # ``ConsumerSchedule._narrow`` brackets a position only past this many open segments
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


_GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_ORDER_BITS = 40  # random bits per frame that order a segment's frames (``ConsumerSchedule._order_bits``)


def counter_bits(seed: int, counters: np.ndarray) -> np.ndarray:
    """Random uint64s, one per counter: SplitMix64 (Steele, Lea and Flood 2014; Java's
    ``SplittableRandom``) of ``seed`` at each counter. Counter-based, so any element is computed on its
    own and a whole share's in one numpy pass: a resume draws the keys of every pooled segment at
    once, where a generator per segment (numpy's Philox re-pointed, ``stream_state/5``) cost a Python
    call each, too slow for a pool of the whole share (docs/resume.md)."""
    # In place, one scratch array: a resume runs this over a share's frames (millions) per consumer.
    x = np.array(counters, dtype=np.uint64)
    scratch = np.empty_like(x)
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps, as SplitMix64 means it to
        x += np.uint64(1)
        x *= _GOLDEN_GAMMA
        x += np.uint64(seed)
        for shift, multiplier in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
            x ^= np.right_shift(x, np.uint64(shift), out=scratch)
            x *= np.uint64(multiplier)
        x ^= np.right_shift(x, np.uint64(31), out=scratch)
    return x


def counter_uniform(seed: int, counters: np.ndarray) -> np.ndarray:
    """Floats in [0, 1), one per counter (``counter_bits``' top 53 bits)."""
    return (counter_bits(seed, counters) >> np.uint64(11)).astype(np.float64) * 2.0**-53


class FrameSequence(Protocol):
    """Frames as a ``Segment`` may hold them besides a ``range`` or an array (``_plan.curation``'s
    ``FrameRanges``): a length, int and slice indexing, and ``np.asarray``."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: Any) -> Any: ...

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray: ...


Frames = range | np.ndarray | FrameSequence


class Segment:
    """Frames of one episode owned by one consumer: offsets within the episode (a range, or an array).

    A plain slotted class rather than a frozen dataclass: an epoch builds one per episode (92,000 for
    DROID) several times per plan, and a frozen dataclass's ``__init__`` costs several times as much.

    ``frames`` are *anchors*: with ``period`` 0 (the default) each is the frame it emits; with a
    ``period`` p > 0 (an episode weighted up, ``_plan.curation``), anchor ``c * p + f`` is copy ``c``
    of frame ``f``, so that every anchor of an epoch is distinct within its episode (resume removes
    consumed anchors by value) while the schedule emits ``anchor % p``.
    """

    __slots__ = ("episode_index", "frames", "length", "period")

    def __init__(self, episode_index: int, frames: Frames, period: int = 0) -> None:
        self.episode_index, self.frames, self.length, self.period = episode_index, frames, len(frames), period

    def __len__(self) -> int:
        return self.length

    def emitted(self, anchors: np.ndarray) -> np.ndarray:
        """The frames that ``anchors`` of this segment emit."""
        return anchors % self.period if self.period else anchors

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Segment) and self.episode_index == other.episode_index
                and self.period == other.period
                and np.array_equal(np.asarray(self.frames), np.asarray(other.frames)))

    def __repr__(self) -> str:
        period = f", period={self.period}" if self.period else ""
        return f"Segment({self.episode_index}, {self.frames!r}{period})"


def as_array(frames: Frames) -> np.ndarray:
    """``frames`` as an int64 array (a range without a Python int per frame: ``np.asarray`` of a
    range walks it, ~15x ``np.arange``'s cost, paid per pooled segment on every resume)."""
    if isinstance(frames, range):
        return np.arange(frames.start, frames.stop, frames.step, dtype=np.int64)
    return np.asarray(frames, dtype=np.int64)


def _concatenated_frames(segments: Sequence[Segment], lengths: np.ndarray) -> np.ndarray:
    """The segments' frames end to end (int64): arithmetically where every one is a unit-step range
    (whole episodes, their usual form), else one array per segment."""
    ranges = [s.frames for s in segments]
    if all(type(r) is range and r.step == 1 for r in ranges):
        starts = np.fromiter((r.start for r in ranges if isinstance(r, range)), np.int64, len(ranges))
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        return np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(starts - offsets, lengths)
    return np.concatenate([as_array(s.frames) for s in segments]) if len(segments) else np.zeros(0, np.int64)


def _frames_of(segments: Sequence[Segment]) -> np.ndarray:
    return np.fromiter((s.length for s in segments), np.int64, len(segments))


@dataclass(frozen=True)
class ConsumerShare:
    segments: tuple[Segment, ...]
    fill_ins: int  # extra samples repeated at the end so every rank emits the same count
    fill_pool: tuple[Segment, ...]  # where fill-ins are drawn from
    frames: int = -1  # frames of ``segments``, when the maker knows it
    lengths: np.ndarray | None = field(default=None, compare=False)  # each segment's frames, if known

    @property
    def num_samples(self) -> int:
        frames = self.frames if self.frames >= 0 else sum(s.length for s in self.segments)
        return frames + self.fill_ins


def part_bounds(total: int, parts: int) -> list[int]:
    """Where ``total`` frames laid end to end are cut into ``parts`` equal parts: part ``p`` is
    ``[bounds[p], bounds[p + 1])``, so parts differ by at most one frame (the shorter ones are the
    ranks that emit a fill-in). The one definition of the split; ``episodestream.ray`` reads a read
    task's own frames (its share without the fill-in) from it."""
    return [p * total // parts for p in range(parts + 1)]


def _cut(segments: Sequence[Segment], parts: int,
         lengths: np.ndarray) -> tuple[list[list[Segment]], list[np.ndarray], list[int]]:
    """Cut the concatenated frames of ``segments`` (of ``lengths`` frames) into ``parts``
    contiguous, equal-sized parts: each part's segments, their lengths and the part's frame count.
    Whole segments inside a part are shared, not copied; only the two ends are cut."""
    starts = np.concatenate([[0], np.cumsum(lengths)])
    bounds = part_bounds(int(starts[-1]), parts)
    out: list[list[Segment]] = []
    out_lengths: list[np.ndarray] = []
    for p in range(parts):
        lo, hi = bounds[p], bounds[p + 1]
        if lo == hi:
            out.append([])
            out_lengths.append(np.zeros(0, np.int64))
            continue
        first = int(np.searchsorted(starts, lo, side="right")) - 1  # segment holding frame lo
        last = int(np.searchsorted(starts, hi, side="left")) - 1  # segment holding frame hi - 1
        part = list(segments[first:last + 1])
        part_lengths = lengths[first:last + 1].copy()
        for k in ((0, last - first) if last > first else (0,)):
            seg, seg_start = part[k], int(starts[first + k])
            take_lo, take_hi = max(lo, seg_start) - seg_start, min(hi, seg_start + seg.length) - seg_start
            if (take_lo, take_hi) != (0, seg.length):
                part[k] = Segment(seg.episode_index, seg.frames[take_lo:take_hi], seg.period)
                part_lengths[k] = take_hi - take_lo
        out.append(part)
        out_lengths.append(part_lengths)
    return out, out_lengths, [bounds[p + 1] - bounds[p] for p in range(parts)]


class EpochPlan:
    """The split of one epoch's frames across ranks and workers.

    ``segments`` lists what the epoch must cover, in selection order: normally one whole-episode
    segment per selected episode; after an elastic resume, the frames not yet consumed.
    """

    def __init__(self, segments: Sequence[Segment], *, seed: int, epoch: int, shuffle: bool,
                 world_size: int, leg: int = 0) -> None:
        lengths = _frames_of(segments)
        if not lengths.all():
            segments = [s for s in segments if s.length]
            lengths = lengths[lengths > 0]
        if shuffle:
            order = make_rng(seed, epoch, _PERMUTE, leg=leg).permutation(len(segments))
            # itemgetter gathers in C: a list comprehension over a DROID-sized epoch's
            # segments cost a visible part of an elastic re-plan, which builds several plans.
            segments = list(itemgetter(*order.tolist())(segments)) if len(order) > 1 else [segments[i] for i in order]
            lengths = lengths[order]
        self.segments = tuple(segments)
        self.seed, self.epoch, self.shuffle, self.world_size, self.leg = seed, epoch, shuffle, world_size, leg
        self.rank_parts, self._rank_lengths, self._rank_frames = _cut(self.segments, world_size, lengths)
        self.total_frames = sum(self._rank_frames)
        # Each rank's cut into workers, by (rank, workers): resume asks for every worker of every rank.
        self._worker_parts: dict[tuple[int, int], tuple[list[list[Segment]], list[np.ndarray], list[int]]] = {}

    @property
    def samples_per_rank(self) -> int:
        return -(-self.total_frames // self.world_size)

    def share(self, world: World) -> ConsumerShare:
        rank_part = self.rank_parts[world.rank]
        rank_frames = self._rank_frames[world.rank]
        key = (world.rank, world.num_workers)
        if key not in self._worker_parts:
            self._worker_parts[key] = _cut(rank_part, world.num_workers, self._rank_lengths[world.rank])
        parts, part_lengths, counts = self._worker_parts[key]
        # The shortfall (0 or 1 by construction) goes to the last of the least-loaded workers.
        filler = max(range(world.num_workers), key=lambda w: (-counts[w], w))
        fill_ins = self.samples_per_rank - rank_frames if world.worker == filler else 0
        # A rank with no frames at all (fewer frames than ranks) repeats frames of the whole epoch.
        fill_pool = tuple(rank_part) if rank_frames else self.segments
        return ConsumerShare(tuple(parts[world.worker]), fill_ins, fill_pool, counts[world.worker],
                             part_lengths[world.worker])

    def uneven_warning(self, num_workers: int) -> str | None:
        """A one-line explanation when some consumer gets nothing to emit, else None."""
        consumers = self.world_size * num_workers
        if self.total_frames < consumers:
            return (f"The epoch has {self.total_frames} frames for {consumers} consumers "
                    f"({self.world_size} rank(s) x {num_workers} worker(s)): some consumers emit only "
                    f"fill-ins or nothing. Use fewer workers or select more episodes.")
        return None


class ConsumerSchedule:
    """The ``(ADMIT|EMIT|EVICT, episode_index, frame_offset)`` steps of one consumer; iterating
    yields them all, ``skip(count)`` yields what follows the first ``count`` EMITs.

    Shuffled, the schedule is a sliding window over the share's segments, in share order: segment
    ``i`` gets a window ``[a_i, b_i)`` of slots, normally ``[i, i + pool_size)`` (the first ones start
    on a ramp, segment ``i`` at slot ``i.bit_length()``, so that the first draws need one episode and
    the pool fills by slot log2(pool_size), and their windows widen on it, ``RAMP_FIRST_WIDTH``
    slots in its first ``RAMP_NARROW_SLOTS`` slots, then doubling per slot; the last ones end by slot
    n + pool_size // 4), and each of its frames a key in its window, one per equal stratum of it
    (``_window_keys``). Frames are emitted in key order, slot by
    slot; a segment is admitted when its window opens and evicted when it closes, so the pool never
    holds more than ``pool_size`` segments and every slot's frames are drawn from up to
    ``pool_size`` episodes. A pool of at least the share's segments (``share_wide``) holds them all
    to the last slot, every window from its ramp slot to the end of the schedule (but the few
    opening in the ramp's first ``RAMP_NARROW_SLOTS`` slots, which the first batch draws from): a
    global shuffle of the share, over runs of thousands of samples as well as batches. Without ``shuffle``, segments and frames
    come in order (windows of one slot, keys in frame order).

    Why keys rather than one draw per emit: a segment's keys are its window's strata at one random
    phase, and which frame each emits a permutation drawn from counter-based bits (``counter_bits``,
    counters = the segment's number and its frames' places in the share), so where a consumer stands
    after ``count`` emits is found arithmetically from the segments' lengths plus how many keys of
    each segment open around that point lie below a slot, counted from the keys' expression per
    segment (``_keys_below``): no frame is walked, no key drawn but a few (``docs/resume.md``).
    """

    def __init__(self, share: ConsumerShare, *, pool_size: int, shuffle: bool, rng: np.random.Generator) -> None:
        self.share, self.shuffle = share, shuffle
        self._segments = share.segments
        n = len(self._segments)
        self._lengths = share.lengths if share.lengths is not None else _frames_of(self._segments)
        self._before = np.concatenate([[0], np.cumsum(self._lengths)])  # frames of segments < i
        self.pool_frames = int(self._before[-1])
        # All drawn first, so that none depends on how far the consumer walks.
        self._order_seed, self._phase_seed, self._fill_seed = (int(v) for v in rng.integers(2**63, size=3))
        # Each segment's one point in its strata (``_window_keys``), for every segment at once.
        self._phase = (counter_uniform(self._phase_seed, np.arange(n)) if shuffle
                       else np.full(n, 0.5))
        self._steps: Iterator[Step] | None = None
        # A pool that holds the whole share: every window is the whole schedule (``_windows``).
        self.share_wide = shuffle and pool_size >= n
        self._a, self._b = self._windows(n, pool_size if shuffle else 1)
        self._slots = int(self._b.max(initial=0))

    def _windows(self, n: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        """Each segment's window ``[a_i, b_i)`` of slots (``a``, ``b`` non-decreasing)."""
        index = np.arange(n, dtype=np.int64)
        # The first segments open on a ramp: segment i < width - 1 at slot bit_length(i) (1 segment
        # at slot 0, 2 at slot 1, 4 at slot 2, ...), so the first draws need one episode's video,
        # not a whole pool's (a remote first batch waits for one download); from slot log2(width) on
        # the pool is as full as without it (a pool of the whole share: every segment opens on it).
        # frexp's exponent of i is i.bit_length(), in one pass.
        ramp = np.frexp(index[:n if self.share_wide else max(0, min(n, width - 1))])[1].astype(np.int64)
        # The ramp's windows widen with it too: RAMP_FIRST_WIDTH slots for the segments opening in
        # its first RAMP_NARROW_SLOTS slots, then doubling per slot, so its first segments emit as
        # densely as a pool of RAMP_FIRST_WIDTH's: a wide pool's first batch then waits for as few
        # episodes as a narrow one's (a window of the whole pool would spread a short episode's
        # frames thinly, and the first batch over many episodes).
        ramp_b = ramp + (RAMP_FIRST_WIDTH << np.maximum(0, ramp - RAMP_NARROW_SLOTS + 1))
        if self.share_wide:
            # Each episode emits at an even pace from its ramp slot to the last, so any run of
            # samples draws from as many episodes as a global shuffle of the share's frames (more,
            # for runs of thousands). Only the ramp's first groups (each at most 1/WIDE_RAMP_SHARE
            # of the share, and the first RAMP_NARROW_SLOTS) close early, as a sliding pool's do, so
            # the first batches draw from as few episodes as a sliding pool's (a remote first batch
            # waits for a few downloads, not for a batch of episodes over every mp4). Closing every
            # group early left up to half of the share out of the epoch's later windows; closing
            # none, the first hundreds of samples drew from the first four episodes on a large
            # share (docs/benchmarks.md, "A ramp for the whole share"). One slot per segment keeps a
            # slot's frames, and what a position brackets, as few as a sliding pool's.
            group = np.left_shift(1, np.maximum(ramp - 1, 0))  # the segments opening with it
            early = (ramp < RAMP_NARROW_SLOTS) | (group * WIDE_RAMP_SHARE <= n)
            return ramp, np.where(early, np.minimum(ramp_b, n), n)
        a = np.concatenate([ramp, index[len(ramp):]])
        b = np.concatenate([np.minimum(ramp_b, index[:len(ramp)] + width), index[len(ramp):] + width])
        # The last windows end up to a quarter of a pool past slot n: closing them all at n would
        # squeeze the last episodes' frames into the last few slots (the final slot would hold
        # all of the last episode's), and a batch there would draw from few episodes; never
        # closing early drains the pool one episode per slot instead. A quarter planned best of
        # the three on small shares (benchmarks/LOG.md).
        return a, np.minimum(b, n + width // 4)

    # -- keys ---------------------------------------------------------------------------------

    def _keys(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Segment ``i``'s frames sorted by key, and their keys."""
        return as_array(self._segments[i].frames)[self._frame_order(i)], self._window_keys(i, i + 1)

    def _frame_order(self, i: int) -> np.ndarray:
        """Which of segment ``i``'s frames each of its keys emits: a random permutation in GOP pairs
        (the identity unshuffled), from its frames' counters (their places in the share) alone."""
        n = int(self._lengths[i])
        if not self.shuffle:
            return np.arange(n)
        return np.argsort(self._order_bits(i, i + 1), kind="stable")

    def _order_bits(self, lo: int, hi: int) -> np.ndarray:
        """The sort keys of segments ``lo..hi-1``'s frames, laid end to end: 40 bits each, so that a
        whole block's permutations are one sort with the segment's number in the bits above
        (``consumed``), ~10x faster than ``np.lexsort`` of both.

        In GOP pairs: a segment's frames 2q and 2q+1 (its places, so an episode's frames 2q and 2q+1)
        share 39 random bits, the pair's place in the order, and the last bit puts them in a random
        order within it, so two consecutive keys of a segment emit a pair. LeRobot's encoder starts
        each episode on a keyframe with GOP 2: the pair is one GOP, and a decoder asked for one of its
        frames decodes the other for a fraction of the cost (``_sample.video.gop_pairs``). The episodes
        each window draws from are the keys', unchanged."""
        start, stop = int(self._before[lo]), int(self._before[hi])
        lengths = self._lengths[lo:hi]
        place = np.arange(start, stop, dtype=np.int64)
        second = (place - np.repeat(self._before[lo:hi], lengths)) & 1  # the pair's second frame
        bits = counter_bits(self._order_seed, place - second)  # the pair's first frame's counter: one draw per pair
        coin = (bits & np.uint64(1)) ^ second.astype(np.uint64)
        return (bits >> np.uint64(64 - _ORDER_BITS + 1)) << np.uint64(1) | coin

    def _first_keys(self, lo: int, hi: int) -> np.ndarray:
        """The first key of each of segments ``lo..hi-1`` (what admitting them needs): ``_place`` at
        each one's first stratum, so the same bits as ``_window_keys``."""
        return self._place(np.zeros(hi - lo), lo, hi, np.ones(hi - lo, dtype=np.int64))

    def _window_keys(self, lo: int, hi: int) -> np.ndarray:
        """The keys of segments ``lo..hi-1``, each segment's sorted, concatenated (no permutation:
        what a position needs). One expression for one segment and for a share, so both give the same
        bits.

        Systematic: a segment's window is cut into one equal stratum per frame, and every key sits at
        the same random point of its stratum (the segment's phase), so a segment emits at an even
        pace through its window. Every stretch of slots then takes its share of each pooled segment's
        frames, and two of a segment's frames land in one batch only where its pace is faster than a
        batch's: a batch spreads over the pool's episodes as a global shuffle's does. iid keys clump,
        and a random point per stratum (``stream_state/4``) still let two keys of a stratum pair meet
        (docs/resume.md, "Systematic keys"). Unshuffled, each key is mid-stratum of a one-slot window.
        """
        lengths = self._lengths[lo:hi]
        within = np.arange(int(lengths.sum()), dtype=np.float64)
        within -= np.repeat(self._before[lo:hi] - self._before[lo], lengths)
        return self._place(within, lo, hi, lengths)

    def _place(self, keys: np.ndarray, lo: int, hi: int, repeats: np.ndarray) -> np.ndarray:
        """``a + (b - a) * ((j + phase) / n)`` in place over ``keys`` (each j), segments ``lo..hi-1``'s
        values each repeated ``repeats`` times: the one expression of every key (+ and * commute
        exactly, so in place gives the expression's bits); the arrays are a share's frames long on a
        resume."""
        a, b = self._a[lo:hi], self._b[lo:hi]
        keys += np.repeat(self._phase[lo:hi], repeats)
        keys /= np.repeat(self._lengths[lo:hi], repeats)
        keys *= np.repeat(b - a, repeats)
        keys += np.repeat(a, repeats)
        # Rounding may carry the last key onto b, where the segment has left the pool.
        return np.minimum(keys, np.repeat(np.nextafter(b.astype(np.float64), a.astype(np.float64)), repeats), out=keys)

    def _key_at(self, segment: np.ndarray, j: np.ndarray) -> np.ndarray:
        """Key ``j`` of each of ``segment`` (segment numbers, keys' numbers, int64 arrays): ``_place``'s
        expression, the same operations in the same order, so the same bits."""
        a, b = self._a[segment], self._b[segment]
        keys = j.astype(np.float64)
        keys += self._phase[segment]
        keys /= self._lengths[segment]
        keys *= b - a
        keys += a
        return np.minimum(keys, np.nextafter(b.astype(np.float64), a.astype(np.float64)), out=keys)

    def _keys_below(self, segment: np.ndarray, slot: int) -> np.ndarray:
        """How many keys of each of ``segment`` lie below ``slot``, without drawing them: a segment's
        keys rise with their number, so the count is the first key number at or above ``slot``,
        estimated from the expression and settled by evaluating it (``_key_at``) beside the
        estimate. Per segment, not per frame: a position in a pool of the whole share counts ~10^4
        segments where drawing their keys was ~10^6 frames."""
        n = self._lengths[segment]
        a, b = self._a[segment], self._b[segment]  # b > a: a window holds a slot at least
        j = np.clip(np.ceil((slot - a) / (b - a) * n - self._phase[segment]), 0, n).astype(np.int64)
        while True:  # rounding puts the estimate a key or two off at most: a few passes
            # Keys rise with their number (each operation of the expression is monotone), so the
            # count is off upwards where key j is below the slot, downwards where key j - 1 is not.
            maybe_up = np.flatnonzero(j < n)
            up = maybe_up[self._key_at(segment[maybe_up], j[maybe_up]) < slot]
            maybe_down = np.flatnonzero(j > 0)
            down = maybe_down[self._key_at(segment[maybe_down], j[maybe_down] - 1) >= slot]
            if not (len(up) or len(down)):
                return j
            j[up] += 1
            j[down] -= 1

    # -- where a consumer stands after ``count`` emits -----------------------------------------

    def _position(self, count: int) -> tuple[int, int]:
        """(slot, emits into that slot) after ``count`` < pool_frames emits."""
        slots = np.arange(self._slots)
        # Frames before slot k: at least those of segments whose window closed by k, at most
        # those of segments whose window opened before k.
        lower = self._before[np.searchsorted(self._b, slots, side="right")]
        upper = self._before[np.searchsorted(self._a, slots, side="left")]
        k_hi = int(np.searchsorted(lower, count, side="right")) - 1
        k_lo = int(np.searchsorted(upper, count, side="right")) - 1
        k_lo, k_hi = self._narrow(count, k_lo, k_hi, lower)
        partial = range(int(np.searchsorted(self._b, k_lo, side="right")),
                        int(np.searchsorted(self._a, k_hi, side="left")))
        segment = np.arange(partial.start, partial.stop, dtype=np.int64)
        closing = self._b[partial.start:partial.stop]

        def frames_before(k: int) -> int:
            # lower[k] + the keys < k of the segments still open at k. A segment's keys lie in [a, b):
            # one opening at or after k adds none, and one closed by k (b <= k) is all in lower[k]
            # already, so its keys are taken back out (b is non-decreasing: a prefix of them). The
            # keys are counted per segment (``_keys_below``), not drawn: a pool of the whole share
            # holds every segment open, a share's frames of keys.
            if not len(segment):
                return int(lower[k])
            closed = int(np.searchsorted(closing, k, side="right"))
            return (int(lower[k]) + int(self._keys_below(segment, k).sum())
                    - int(self._before[partial.start + closed] - self._before[partial.start]))

        # The last slot in [k_lo, k_hi] with at most ``count`` frames before it: frames before a slot
        # rise with it, so a bisection (the bracket is ~10^2 slots in a pool of the whole share).
        # count(<k_lo) <= upper(k_lo) <= count, so k_lo qualifies; no k > k_hi does.
        lo, hi = k_lo, k_hi
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if frames_before(mid) <= count else (lo, mid - 1)
        before = frames_before(lo)
        return (lo, count - before) if before <= count else (k_lo, count)

    def _narrow(self, count: int, k_lo: int, k_hi: int, lower: np.ndarray) -> tuple[int, int]:
        """A narrower ``[k_lo, k_hi]`` holding the slot where emit ``count`` falls, from no keys.

        Stratified keys (and unshuffled ones, each mid-stratum) put segment i's j-th key in the j-th
        of n_i equal strata of [a_i, b_i), so its keys below slot k number floor(x) or floor(x) + 1,
        x = (k - a_i) n_i / (b_i - a_i).
        Bounds one apart per open segment (two, for rounding) leave a bracket of a few slots, so
        ``_position`` draws the keys of about one pool of segments rather than two.
        """
        open_ = range(int(np.searchsorted(self._b, k_lo, side="right")), int(np.searchsorted(self._a, k_hi, side="left")))
        if len(open_) < _NARROW_FROM_SEGMENTS:  # drawing a few segments' keys costs less than the bisection
            return k_lo, k_hi
        a = self._a[open_.start:open_.stop].astype(np.float64)
        b = self._b[open_.start:open_.stop]
        n = self._lengths[open_.start:open_.stop]

        def bounds(k: int) -> tuple[int, int]:
            live = (a < k) & (b > k)
            whole = np.floor(np.clip((k - a) * n / (b - a), 0, n))
            return (int(lower[k] + np.maximum(whole - 1, 0)[live].sum()),
                    int(lower[k] + np.minimum(whole + 2, n)[live].sum()))

        def last(lo: int, hi: int, fits) -> int:  # the last k in [lo, hi] that fits (lo fits); both bounds grow with k
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
            return lo

        new_hi = last(k_lo, k_hi, lambda k: bounds(k)[0] <= count)  # no later slot's least count fits
        new_lo = last(k_lo, new_hi, lambda k: bounds(k)[1] <= count)  # this slot's greatest count fits
        return new_lo, new_hi

    # -- the steps ----------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        """Whether iterating has begun (``skip`` always starts from the beginning of the schedule)."""
        return self._steps is not None

    def __iter__(self) -> Iterator[Step]:
        return self

    def __next__(self) -> Step:
        if self._steps is None:
            self._steps = self.skip(0)
        return next(self._steps)

    def skip(self, count: int) -> Iterator[Step]:
        """The steps after the first ``count`` EMITs, starting by admitting what the pool holds then."""
        if count < self.pool_frames:
            # From the first slot nothing was emitted yet: no position to find (a pool of the whole
            # share would draw every key for it).
            yield from self._pool_steps(*(self._position(count) if count else (0, 0)))
            count = 0
        else:
            count -= self.pool_frames
        for i, step in enumerate(self._fill_steps()):
            if i >= 3 * count:
                yield step

    def consumed(self, count: int) -> tuple[list[tuple[int, Frames]], list[tuple[int, np.ndarray]]]:
        """What the first ``count`` EMITs took: ``(episode_index, frames)`` pieces of the share's
        segments (each frame at most once; whole segments as their own ``frames``), and the
        fill-ins among them (repeats of frames of this rank's part)."""
        if count >= self.pool_frames:
            # Anchors, not the frames they emit: resume removes anchors (``Segment``).
            fills = list(self._fill_picks())[:count - self.pool_frames]
            return ([(s.episode_index, s.frames) for s in self._segments],
                    [(seg.episode_index, np.array([anchor])) for seg, anchor in fills])
        slot, offset = self._position(count)
        done = int(np.searchsorted(self._b, slot, side="right"))
        whole = self._segments[:done]  # ~10^5 at 90% of a DROID-sized epoch: map() is ~2x a generator's speed
        pieces: list[tuple[int, Frames]] = list(zip(map(attrgetter("episode_index"), whole),
                                                    map(attrgetter("frames"), whole)))
        opened = int(np.searchsorted(self._a, slot, side="right"))
        if opened <= done:
            return pieces, []
        keys, lengths, segment, order, first = self._open_keys(slot, offset, done, opened)
        frames = _concatenated_frames(self._segments[done:opened], lengths)[order]
        cuts = np.bincount(segment, weights=keys < slot, minlength=len(lengths)).astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        episodes = [s.episode_index for s in self._segments[done:opened]]
        pieces += [(episode, frames[start:start + cut]) for episode, start, cut in zip(episodes, starts.tolist(),
                                                                                      cuts.tolist())]
        pieces += [(episodes[k], np.array([frame])) for k, frame in zip(segment[first].tolist(), frames[first].tolist())]
        return pieces, []

    def left(self, count: int) -> list[tuple[int, Frames]] | None:
        """What the first ``count`` EMITs left of the share: ``(segment number, frames)`` for every
        segment not wholly consumed, in share order, each segment's frames in their own order (an
        untouched segment's own ``frames``). None once fill-ins were emitted (``consumed`` says which).

        The complement of ``consumed``, found without comparing frames: an elastic resume of a pool
        of the whole share leaves every episode partly consumed, and comparing what each consumer
        took with every episode's frames cost most of the re-plan (docs/resume.md). The frames a key
        emits come from the same permutation as ``consumed``'s; its inverse marks them in place."""
        n = len(self._segments)
        if count > self.pool_frames:
            return None
        if count == self.pool_frames:
            return []
        if not count:
            return [(i, s.frames) for i, s in enumerate(self._segments)]
        slot, offset = self._position(count)
        done = int(np.searchsorted(self._b, slot, side="right"))
        opened = int(np.searchsorted(self._a, slot, side="right"))
        out: list[tuple[int, Frames]] = []
        if opened > done:
            # How many frames each open segment left is counted per segment, not per frame
            # (``_keys_below``): its keys below the slot, and of the slot's own keys (a few per
            # segment) the first ``offset`` by key. Which frames those are needs the segment's
            # permutation too, drawn at first use (``LeftFrames``): an elastic re-plan asks every
            # old consumer what it left, and the new consumer then uses its own share's, where
            # sorting every old share's frames cost most of the re-plan.
            lengths = self._lengths[done:opened]
            below = self._keys_below(np.arange(done, opened, dtype=np.int64), slot)
            segment, j = self._slot_firsts(slot, offset, done, opened, below)
            left_per = lengths - below - np.bincount(segment - done, minlength=len(lengths))
            first_of: dict[int, list[int]] = {}
            for k, key_number in zip((segment - done).tolist(), j.tolist()):
                first_of.setdefault(k, []).append(key_number)
            for k, (left_k, length) in enumerate(zip(left_per.tolist(), lengths.tolist())):
                if left_k == length:
                    out.append((done + k, self._segments[done + k].frames))
                elif left_k:
                    out.append((done + k, LeftFrames(self, done + k, slot, first_of.get(k, ()), left_k)))
        out += [(i, self._segments[i].frames) for i in range(max(opened, done), n)]
        return out

    def _slot_firsts(self, slot: int, offset: int, done: int, opened: int,
                     below: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The keys of ``slot`` emitted before the position (``slot``, ``offset``), among segments
        ``done..opened-1``: its first ``offset`` by key, ties in segment order, as emitted; as
        (segment, key number) arrays. Counted and placed per segment (``_keys_below``, ``_key_at``):
        a slot holds a few keys per segment. ``below``: those segments' keys below ``slot``, if known."""
        open_ = np.arange(done, opened, dtype=np.int64)
        if below is None:
            below = self._keys_below(open_, slot)
        in_slot = self._keys_below(open_, slot + 1) - below
        segment = np.repeat(open_, in_slot)
        j = np.arange(len(segment), dtype=np.int64) - np.repeat(np.cumsum(in_slot) - in_slot - below, in_slot)
        first = np.argsort(self._key_at(segment, j), kind="stable")[:offset]
        return segment[first], j[first]

    def _open_keys(self, slot: int, offset: int, done: int,
                   opened: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """What ``consumed`` needs of segments ``done..opened-1``, open at the position (``slot``,
        ``offset``), all at once (a pool of the whole share opens every segment): their keys
        (``_window_keys``), lengths, each key's segment (0-based among them), ``order`` (key j emits
        frame ``order[j]`` of their frames laid end to end) and ``first``, the keys of ``slot`` emitted
        before the position (``_slot_firsts``, as indices into the keys). Frames with keys below
        ``slot``, and ``first``, are what was consumed of them."""
        keys = self._window_keys(done, opened)
        lengths = self._lengths[done:opened]
        segment = np.repeat(np.arange(len(lengths)), lengths)
        if not self.shuffle:
            order = np.arange(len(keys))
        else:
            bits = self._order_bits(done, opened)
            if len(lengths) < 2**(64 - _ORDER_BITS):
                order = np.argsort(segment.astype(np.uint64) << np.uint64(_ORDER_BITS) | bits, kind="stable")
            else:  # too many segments for the bits above: the same order, slower
                order = np.lexsort((bits, segment))
        first_segment, first_j = self._slot_firsts(slot, offset, done, opened)
        first = self._before[first_segment] - self._before[done] + first_j
        return keys, lengths, segment, order, first

    def _pool_steps(self, first_slot: int, offset: int) -> Iterator[Step]:
        a, b, segments = self._a, self._b, self._segments
        live: dict[int, None] = {}  # the open segments, in the order they were admitted
        # segment -> [frames it emits in key order, keys, next position], the first two None until
        # the segment is first due: its keys and permutation are drawn when it first emits, so a
        # pool of the whole share admits every segment at once without drawing them all before its
        # first sample.
        unemitted: dict[int, list] = {}
        # (slot of a segment's next key, segment): a slot takes keys only from the segments due in
        # it, popped in index order, which is the order they were admitted in. Looking in every
        # open segment at every slot cost a look-up per open segment and slot: most of a wide
        # pool's planning (~pool / 20 microseconds a sample). Keys are >= 0: int() is their floor.
        due: list[tuple[int, int]] = []
        # Resumed segments admitted at their first emit after the position, not at it: a pool of the
        # whole share resumes with every segment open, and holding ~10^4 episodes before its first
        # sample cost a resume more than the position did; the first slot's emits need a few hundred.
        deferred: set[int] = set()

        def admit(lo: int, hi: int, from_slot: int) -> Iterator[Step]:
            """Admit segments ``lo..hi-1``, each from its first key at or after ``from_slot`` (a
            resumed segment that emitted all of its keys already is left out; the others are
            admitted when first due, ``deferred``)."""
            if lo >= hi:
                return
            if not from_slot:  # each segment's first key alone
                firsts = self._first_keys(lo, hi).astype(np.int64).tolist()
                for i, first_slot_of_i in zip(range(lo, hi), firsts):
                    live[i] = None
                    unemitted[i] = [None, None, 0]
                    heapq.heappush(due, (first_slot_of_i, i))
                    yield Step(ADMIT, segments[i].episode_index, NO_FRAME)
                return
            # Each segment's first key at or after the slot, counted and placed per segment
            # (``_keys_below``, ``_key_at``), not drawn for all: its keys are drawn when it is due.
            # One consumed already is not admitted, so its rows are never read (a pool of the whole
            # share resumes with every segment open, many of them done).
            segment = np.arange(lo, hi, dtype=np.int64)
            first = self._keys_below(segment, from_slot)
            left = first < self._lengths[lo:hi]
            segment, first = segment[left], first[left]
            for i, first_i, due_i in zip(segment.tolist(), first.tolist(),
                                         self._key_at(segment, first).astype(np.int64).tolist()):
                deferred.add(i)
                unemitted[i] = [None, None, first_i]
                due.append((due_i, i))
            heapq.heapify(due)

        yield from admit(int(np.searchsorted(b, first_slot, side="right")),
                         int(np.searchsorted(a, first_slot, side="right")), first_slot)
        for slot in range(first_slot, self._slots):
            if slot > first_slot:
                for i in range(int(np.searchsorted(b, slot - 1, side="right")),
                               int(np.searchsorted(b, slot, side="right"))):
                    if i in live:  # not a resumed segment left out as consumed
                        del live[i]
                        yield Step(EVICT, segments[i].episode_index, NO_FRAME)
                yield from admit(int(np.searchsorted(a, slot, side="left")), int(np.searchsorted(a, slot, side="right")), 0)
            parts = []
            while due and due[0][0] == slot:
                i = heapq.heappop(due)[1]
                if i in deferred:
                    deferred.discard(i)
                    live[i] = None
                    yield Step(ADMIT, segments[i].episode_index, NO_FRAME)
                entry = unemitted[i]
                if entry[0] is None:
                    entry[0] = segments[i].emitted(as_array(segments[i].frames)[self._frame_order(i)])
                    if entry[1] is None:
                        entry[1] = self._window_keys(i, i + 1)
                frames, keys, position = entry
                end = int(np.searchsorted(keys, slot + 1, side="left"))
                parts.append((keys[position:end], frames[position:end], segments[i].episode_index))
                if end < len(keys):
                    entry[2] = end
                    heapq.heappush(due, (int(keys[end]), i))
                else:
                    del unemitted[i]
            if not parts:
                continue
            if len(parts) == 1:  # one segment's keys, sorted already
                keys, frames, episode = parts[0]
                episodes = [episode] * len(keys)
                frame_list = frames.tolist()
            else:
                order = np.argsort(np.concatenate([keys for keys, _, _ in parts]), kind="stable")
                lengths = [len(keys) for keys, _, _ in parts]
                episodes = np.repeat([episode for _, _, episode in parts], lengths)[order].tolist()
                frame_list = np.concatenate([frames for _, frames, _ in parts])[order].tolist()
            start = offset if slot == first_slot else 0
            for episode, frame in zip(episodes[start:], frame_list[start:]):
                yield Step(EMIT, episode, frame)
        for i in live:
            yield Step(EVICT, segments[i].episode_index, NO_FRAME)

    def fill_frames(self) -> list[tuple[int, int]]:
        """``(episode_index, frame)`` each fill-in emits (what a remote source fetches for them)."""
        return [(seg.episode_index, anchor % seg.period if seg.period else anchor)
                for seg, anchor in self._fill_picks()]

    def _fill_picks(self) -> Iterator[tuple[Segment, int]]:
        """The fill-ins: each one's segment and anchor."""
        share = self.share
        if not share.fill_ins:
            return
        fill_rng = make_rng(self._fill_seed % 2**32, 0, _FILL)
        starts = np.concatenate([[0], np.cumsum(_frames_of(share.fill_pool))])
        picks = fill_rng.choice(int(starts[-1]), size=share.fill_ins, replace=starts[-1] < share.fill_ins)
        for i in picks:
            k = bisect.bisect_right(starts, i) - 1
            seg = share.fill_pool[k]
            yield seg, int(seg.frames[i - starts[k]])

    def _fill_steps(self) -> Iterator[Step]:
        for seg, anchor in self._fill_picks():
            yield Step(ADMIT, seg.episode_index, NO_FRAME)
            yield Step(EMIT, seg.episode_index, anchor % seg.period if seg.period else anchor)
            yield Step(EVICT, seg.episode_index, NO_FRAME)


class LeftFrames:
    """The frames of a consumer's share segment ``index`` that its emits up to a position left
    (``ConsumerSchedule.left``), in the segment's own order: a ``FrameSequence`` drawn at first use,
    then kept. ``slot``: the position's slot (keys below it were emitted); ``first``: the segment's
    key numbers in that slot emitted before the position; ``length``: how many frames are left.
    The same frames as the batched draw (one expression for a segment's keys and for a share's, one
    stable order of its bits), so an elastic re-plan gives the same segments either way."""

    __slots__ = ("_schedule", "_index", "_slot", "_first", "_length", "_array")

    def __init__(self, schedule: ConsumerSchedule, index: int, slot: int, first: Sequence[int], length: int) -> None:
        self._schedule, self._index, self._slot, self._first = schedule, index, slot, first
        self._length = length
        self._array: np.ndarray | None = None

    def _frames(self) -> np.ndarray:
        if self._array is None:
            schedule, i = self._schedule, self._index
            taken = schedule._window_keys(i, i + 1) < self._slot
            if len(self._first):  # (an empty tuple would index the whole array)
                taken[list(self._first)] = True
            kept = np.ones(len(taken), dtype=bool)
            kept[schedule._frame_order(i)[taken]] = False
            self._array = as_array(schedule._segments[i].frames)[kept]
        return self._array

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: Any) -> Any:
        return self._frames()[index]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        frames = self._frames()
        return frames if dtype is None else frames.astype(dtype, copy=False)

    def __reduce__(self) -> tuple[Any, ...]:
        return np.array, (self._frames(),)  # pickled as its frames, not the schedule behind them

    def __repr__(self) -> str:
        return f"LeftFrames({self._frames()!r})"


def consumer_schedule(share: ConsumerShare, *, pool_size: int, shuffle: bool,
                      rng: np.random.Generator) -> ConsumerSchedule:
    """The steps of one consumer (see ``ConsumerSchedule``); ``rng`` is the consumer's generator."""
    return ConsumerSchedule(share, pool_size=pool_size, shuffle=shuffle, rng=rng)
