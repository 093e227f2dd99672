"""Curation as arithmetic: kept frame ranges, episode weights, and the anchors of an epoch.

An *anchor* is what an epoch samples, counts in ``len`` and splits across ranks and workers (once
each). Without curation every frame of every selected episode is one anchor. ``keep_frames`` makes
only the frames inside an episode's kept ranges anchors (windows still read the episode's other
frames: that is the sample builder's business, not this module's), and ``episode_weights`` scales
an episode's anchor count: weight ``w`` gives ``w * n`` anchors for its ``n`` kept frames, the
integer part as whole copies of its kept frames (each copy its own ``Segment``, so each lands in a
fresh place of the epoch's permutation), the rest as a partial copy whose frames are drawn afresh
each epoch. Fractional counts are rounded by one largest-remainder split in exact fractions over
the whole selection (as mixtures split samples between components), so an epoch is a finite,
deterministic list of anchors and the resume arithmetic of ``_plan.resume`` applies unchanged.

Pure: it sees episode indices, lengths and the options' values (JSON already parsed), never files.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from fractions import Fraction
from numbers import Real
from typing import Any

import numpy as np

from episodestream._base.gc_pause import gc_paused
from episodestream._plan.sampling import Segment

# Spawn keys here have three entries and start with this tag, so they never meet ``make_rng``'s
# four-entry or the mixtures' six-entry keys.
_CURATION_TAG = 0x637572  # "cur"


class FrameRanges:
    """Ascending, disjoint frame ranges ``[starts[k], ends[k])`` as one sequence of frames: what a
    ``Segment``'s ``frames`` may be (``len``, an int or slice index, ``np.asarray``, ``+ offset``),
    materialised only when a consumer's schedule draws its keys."""

    __slots__ = ("starts", "ends", "_before", "_length")

    def __init__(self, starts: np.ndarray, ends: np.ndarray, length: int | None = None) -> None:
        self.starts, self.ends = starts, ends
        self._before: np.ndarray | None = None  # frames before each range, when first asked
        # Given when known: a Segment asks len() of each of an epoch's 92,000, and a numpy sum each is 1 s.
        self._length = length

    def _cumulative(self) -> np.ndarray:
        if self._before is None:
            self._before = np.concatenate([[0], np.cumsum(self.ends - self.starts)])
        return self._before

    def __len__(self) -> int:
        if self._length is None:
            self._length = int((self.ends - self.starts).sum())
        return self._length

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        lengths = self.ends - self.starts
        out = np.repeat(self.starts - self._cumulative()[:-1], lengths) + np.arange(int(lengths.sum()))
        return out if dtype is None else out.astype(dtype, copy=False)

    def __iter__(self):
        return iter(np.asarray(self).tolist())

    def __getitem__(self, index: int | slice) -> Any:
        before = self._cumulative()
        n = int(before[-1])
        if isinstance(index, slice):
            lo, hi, step = index.indices(n)
            if step != 1:
                return np.asarray(self)[index]
            if hi <= lo:
                return range(0)
            first = int(np.searchsorted(before, lo, side="right")) - 1
            last = int(np.searchsorted(before, hi, side="left")) - 1
            starts = self.starts[first:last + 1].copy()
            ends = self.ends[first:last + 1].copy()
            starts[0] += lo - int(before[first])
            ends[-1] -= int(before[last + 1]) - hi
            return range(int(starts[0]), int(ends[0])) if len(starts) == 1 else FrameRanges(starts, ends)
        i = int(index) + (n if index < 0 else 0)
        if not 0 <= i < n:
            raise IndexError(index)
        k = int(np.searchsorted(before, i, side="right")) - 1
        return int(self.starts[k]) + i - int(before[k])

    def __add__(self, offset: int) -> FrameRanges:
        return FrameRanges(self.starts + offset, self.ends + offset, self._length)

    def __eq__(self, other: object) -> bool:
        return np.array_equal(np.asarray(self), np.asarray(other))  # type: ignore[call-overload]

    def __repr__(self) -> str:
        return "FrameRanges(" + ", ".join(f"[{a}, {b})" for a, b in zip(self.starts.tolist(), self.ends.tolist())) + ")"


class KeepRanges:
    """Validated ``keep_frames``: half-open ranges ``[start, end)`` of frames, sorted per episode.

    ``range_episode[k]``, ``starts[k]``, ``ends[k]`` describe range ``k`` (sorted by episode, then
    start); ``episodes`` are the episodes named (an episode named with no ranges keeps no frame).
    """

    def __init__(self, episodes: np.ndarray, range_episode: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        self.episodes, self.range_episode, self.starts, self.ends = episodes, range_episode, starts, ends

    def kept_counts(self, episode_index: np.ndarray) -> np.ndarray:
        """Kept frames of each of ``episode_index`` (0 for episodes not named)."""
        per_range = self.ends - self.starts
        first = np.searchsorted(self.range_episode, episode_index, side="left")
        last = np.searchsorted(self.range_episode, episode_index, side="right")
        before = np.concatenate([[0], np.cumsum(per_range)])
        return before[last] - before[first]

    def kept_frames(self, episode_index: np.ndarray) -> list[range | FrameRanges]:
        """Each episode's kept frames: a ``range`` for one range, else ``FrameRanges`` (not
        materialised: DROID's 92,000 episodes keep ~20 million frames, 160 MB as int64)."""
        first = np.searchsorted(self.range_episode, episode_index, side="left").tolist()
        last = np.searchsorted(self.range_episode, episode_index, side="right").tolist()
        starts, ends = self.starts.tolist(), self.ends.tolist()
        out: list[range | FrameRanges] = []
        with gc_paused():
            for lo, hi in zip(first, last):
                if hi - lo == 1:
                    out.append(range(starts[lo], ends[lo]))
                elif hi == lo:
                    out.append(range(0))
                else:
                    out.append(FrameRanges(self.starts[lo:hi], self.ends[lo:hi]))
        return out

    def digest(self) -> str:
        h = hashlib.sha1()
        for array in (self.episodes, self.range_episode, self.starts, self.ends):
            h.update(np.ascontiguousarray(array, np.int64).tobytes())
        return h.hexdigest()[:16]


def _episode_key(key: Any, where: str) -> int:
    if isinstance(key, (bool, np.bool_)):
        raise TypeError(f"{where}: episode key {key!r} is a bool; keys are episode indices (int, or str of an int).")
    if isinstance(key, (int, np.integer)):
        return int(key)
    if isinstance(key, str):
        try:
            return int(key.strip())
        except ValueError:
            pass
    raise TypeError(f"{where}: episode key {key!r} is not an episode index (an int, or a str of an int).")


def _episode_keys(keys: list[Any], where: str) -> np.ndarray:
    """Episode keys as int64: all str (JSON) or all int in one numpy call, else key by key."""
    types = set(map(type, keys))
    if types == {str}:
        try:
            return np.fromiter(map(int, keys), np.int64, len(keys))
        except ValueError:
            pass  # some key is not an int: the loop names it
    elif types <= {int}:
        return np.array(keys, np.int64).reshape(-1)
    return np.array([_episode_key(k, where) for k in keys], np.int64).reshape(-1)


def _ranges_of(episode: int, ranges: Any, where: str) -> np.ndarray:
    """One episode's ranges as an (n, 2) int64 array, every value checked (the slow path: errors)."""
    if isinstance(ranges, (str, bytes, Mapping)) or not isinstance(ranges, (Sequence, np.ndarray)):
        raise TypeError(f"{where}[{episode}] must be a list of (start, end) frame ranges, got {ranges!r:.200}.")
    out = []
    for r in ranges:
        if (isinstance(r, (str, bytes)) or not isinstance(r, (Sequence, np.ndarray)) or len(r) != 2
                or any(isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) for v in r)):
            raise TypeError(f"{where}[{episode}]: range {r!r:.100} is not a (start, end) pair of ints.")
        out.append((int(r[0]), int(r[1])))
    return np.array(out, np.int64).reshape(-1, 2)


def check_keep_frames(value: Mapping[Any, Any], *, episode_index: np.ndarray, lengths: np.ndarray,
                      where: str = "keep_frames") -> KeepRanges:
    """Validate ``{episode_index: [(start, end), ...]}`` against the dataset's episodes (ascending
    ``episode_index`` and their ``lengths``). Errors name ``where``, the episode and the value:
    an unknown episode, a range that is not a pair of ints, empty or reversed, out of the episode,
    or overlapping another range of its episode. Ranges may come in any order; touching is fine."""
    if not isinstance(value, Mapping):
        raise TypeError(f"{where} must be a dict {{episode_index: [(start, end), ...]}} or a path to a JSON "
                        f"file of that shape, got {type(value).__name__}.")
    keys = _episode_keys(list(value), where)
    values = list(value.values())
    pairs = None
    try:
        # One numpy call for every range: ~300,000 ranges for DROID. Anything but a list of
        # (start, end) int pairs per episode ends up ragged, of another shape or not of ints.
        counts = np.fromiter(map(len, values), np.int64, len(values))
        flat = list(itertools.chain.from_iterable(values))
        scalars = np.array(flat) if flat else np.zeros((0, 2), np.int64)
        # Inferred, not cast: a float or a bool would be truncated silently by dtype=int64.
        if scalars.ndim == 2 and scalars.shape[1] == 2 and scalars.dtype.kind in "iu":
            pairs = scalars.astype(np.int64, copy=False)
    except (TypeError, ValueError):
        pass
    if pairs is None:
        # Something is malformed: find which episode, value by value (slow, but only to raise).
        checked = [_ranges_of(k, r, where) for k, r in zip(keys.tolist(), values)]
        counts = np.array([len(c) for c in checked], np.int64)
        pairs = np.concatenate(checked) if checked else np.zeros((0, 2), np.int64)
    pairs = pairs.astype(np.int64, copy=False)
    episodes = keys
    if len(np.unique(episodes)) != len(episodes):
        seen: set[int] = set()
        twice = next(e for e in keys.tolist() if e in seen or seen.add(e))  # type: ignore[func-returns-value]
        raise ValueError(f"{where} names episode {twice} twice (keys {twice!r} and {str(twice)!r}?).")
    rows = np.searchsorted(episode_index, episodes)
    known = (rows < len(episode_index)) & (episode_index[np.minimum(rows, len(episode_index) - 1)] == episodes)
    if not known.all():
        unknown = episodes[~known][:5].tolist()
        raise ValueError(f"{where} names episode(s) {unknown} that the dataset does not have (episode indices "
                         f"{int(episode_index[0])}..{int(episode_index[-1])}, {len(episode_index)} episodes).")
    range_episode = np.repeat(episodes, counts)
    range_length = np.repeat(lengths[rows], counts)
    starts, ends = pairs[:, 0], pairs[:, 1]
    for bad, why in ((starts >= ends, "is empty or reversed (start >= end)"),
                     ((starts < 0) | (ends > range_length), "is out of the episode")):
        if bad.any():
            k = int(np.argmax(bad))
            raise ValueError(f"{where}[{int(range_episode[k])}]: range ({int(starts[k])}, {int(ends[k])}) {why}; "
                             f"episode {int(range_episode[k])} has {int(range_length[k])} frames [0, {int(range_length[k])}).")
    order = np.lexsort((starts, range_episode))
    range_episode, starts, ends = range_episode[order], starts[order], ends[order]
    overlap = (range_episode[1:] == range_episode[:-1]) & (starts[1:] < ends[:-1])
    if overlap.any():
        k = int(np.argmax(overlap))
        raise ValueError(f"{where}[{int(range_episode[k])}]: ranges ({int(starts[k])}, {int(ends[k])}) and "
                         f"({int(starts[k + 1])}, {int(ends[k + 1])}) overlap.")
    return KeepRanges(np.sort(episodes), range_episode, starts, ends)


def check_weights(value: Mapping[Any, Any] | np.ndarray, *, episode_index: np.ndarray,
                  where: str = "episode_weights") -> np.ndarray:
    """Weights aligned with ``episode_index`` (ascending, the dataset's episodes): from a dict
    (episodes not named weigh 1; unknown keys refused) or from an array aligned already (a
    column of the episodes table). An object array when some weight is a ``Fraction``, else
    float64. Negative, NaN, infinite or non-numeric weights are refused, naming the episode."""
    if isinstance(value, np.ndarray):
        weights = value
        names = episode_index
    elif isinstance(value, Mapping):
        keys = _episode_keys(list(value), where)
        rows = np.searchsorted(episode_index, keys)
        known = (rows < len(episode_index)) & (episode_index[np.minimum(rows, len(episode_index) - 1)] == keys)
        if not known.all():
            raise ValueError(f"{where} names episode(s) {keys[~known][:5].tolist()} that the dataset does not have "
                             f"(episode indices {int(episode_index[0])}..{int(episode_index[-1])}).")
        given = list(value.values())
        for key, w in zip(keys.tolist(), given):
            if isinstance(w, (bool, np.bool_)) or not isinstance(w, (Real, np.number)):
                raise TypeError(f"{where}[{key}] = {w!r} is not a number.")
        exact = any(isinstance(w, Fraction) for w in given)
        weights = np.ones(len(episode_index), object if exact else np.float64)
        weights[rows] = given
        names = episode_index
    else:
        raise TypeError(f"{where} must be a dict {{episode_index: weight}} or the name of a numeric column of "
                        f"meta/episodes, got {type(value).__name__}.")
    if weights.dtype != object:
        weights = np.asarray(weights, np.float64)
        bad = ~np.isfinite(weights) | (weights < 0)
    else:
        bad = np.array([not math.isfinite(w) or w < 0 for w in weights], bool)
    if bad.any():
        k = int(np.argmax(bad))
        shown = weights[k] if weights.dtype == object else float(weights[k])
        raise ValueError(f"{where}: episode {int(names[k])} has weight {shown!r}; weights must be finite "
                         f"and >= 0 (0 leaves the episode out).")
    return weights


# An epoch lays each whole copy of an episode out as a segment of its own (so that each lands in a
# fresh place of the permutation): ~300 bytes and ~2 us each. As a mixture refuses an epoch of more
# than ``_plan.mixing.MAX_PASSES_PER_EPOCH`` passes of a component, curation refuses weights whose
# copies an epoch could not lay out in memory and time, before any is made.
MAX_COPIES_PER_EPISODE = 100_000
MAX_COPIES_PER_EPOCH = 10_000_000


def check_epoch_size(kept: np.ndarray, weights: np.ndarray, *, episode_index: np.ndarray,
                     where: str = "episode_weights") -> None:
    """Refuse weights that make an epoch too large to plan: more than ``MAX_COPIES_PER_EPISODE``
    copies of one episode, or ``MAX_COPIES_PER_EPOCH`` in all. ``kept``, ``weights`` and
    ``episode_index`` are aligned (the selected episodes); the error names the argument, the
    episode, its weight and the epoch size they imply (computed in floating point: 1e18 frames
    would wrap an int64)."""
    as_float = np.array([float(w) for w in weights.tolist()], np.float64) if weights.dtype == object \
        else weights.astype(np.float64)
    copies = np.where(kept > 0, np.ceil(as_float), 0.0)
    epoch = float(np.dot(as_float, kept.astype(np.float64)))
    worst = int(np.argmax(copies)) if len(copies) else 0
    if not len(copies) or (copies[worst] <= MAX_COPIES_PER_EPISODE and copies.sum() <= MAX_COPIES_PER_EPOCH):
        return
    limit = (f"at most {MAX_COPIES_PER_EPISODE:,} copies of an episode" if copies[worst] > MAX_COPIES_PER_EPISODE
             else f"at most {MAX_COPIES_PER_EPOCH:,} copies of episodes in all ({copies.sum():,.0f} here)")
    raise ValueError(f"{where}: episode {int(episode_index[worst])} has weight {as_float[worst]:g}, which makes "
                     f"{copies[worst]:,.0f} copies of its {int(kept[worst])} kept frames in each epoch (an epoch of "
                     f"{epoch:,.0f} samples); an epoch lays out {limit}. Lower the weights (weight w samples each "
                     f"kept frame w times per epoch), or train for more epochs.")


def anchor_counts(kept: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
    """Anchors per epoch of each episode: ``weights * kept``, exactly when every product is an
    integer, else the products' rounded total split by largest remainder in exact fractions
    (ties: the lowest position), so the counts add up to ``round(sum(weights * kept))``."""
    if weights is None:
        return kept.astype(np.int64, copy=True)
    if weights.dtype != object and np.array_equal(weights, np.floor(weights)):
        return (weights.astype(np.int64) * kept).astype(np.int64)
    quotas = [Fraction(w) * int(n) for w, n in zip(weights.tolist(), kept.tolist())]
    parts = np.array([math.floor(q) for q in quotas], np.int64)
    total = math.floor(sum(quotas, Fraction(0)) + Fraction(1, 2))
    remainders = [q - int(p) for q, p in zip(quotas, parts.tolist())]
    order = sorted(range(len(quotas)), key=lambda i: (-remainders[i], i))
    parts[order[:total - int(parts.sum())]] += 1
    return parts


def _shifted(frames: range | FrameRanges, by: int) -> range | FrameRanges:
    if isinstance(frames, range):
        return range(frames.start + by, frames.stop + by)
    return frames + by


class Anchors:
    """The selection's anchors: per episode (ascending ``episode_index``) its length, its kept
    frames and its anchors per epoch (``counts``); ``segments(seed, epoch)`` lays them out."""

    def __init__(self, episode_index: np.ndarray, lengths: np.ndarray,
                 kept: KeepRanges | Sequence[range | FrameRanges] | None, counts: np.ndarray) -> None:
        self.episode_index, self.lengths, self.counts = episode_index, lengths, counts
        # None: every frame; KeepRanges: each episode's kept frames made when asked (``kept``), so
        # that neither construction nor pickling to DataLoader workers handles 92,000 objects.
        self._kept = kept
        if kept is None:
            self._kept_count = lengths
        elif isinstance(kept, KeepRanges):
            self._lo = np.searchsorted(kept.range_episode, episode_index, side="left")
            self._hi = np.searchsorted(kept.range_episode, episode_index, side="right")
            self._kept_count = kept.kept_counts(episode_index)
        else:
            self._kept_count = np.fromiter((len(f) for f in kept), np.int64, len(kept))
        self._fixed: list[Segment] | None = None  # when no episode has a partial copy
        self._last: tuple[int, int, list[Segment]] | None = None  # (seed, epoch, segments) otherwise
        self.total = int(counts.sum())

    def __getstate__(self) -> dict:
        # DataLoader workers rebuild the segments if they need them, rather than unpickle 92,000 objects.
        return {**self.__dict__, "_fixed": None, "_last": None}

    def kept(self, k: int) -> range | FrameRanges:
        """The kept frames of the ``k``-th episode: a ``range`` when they are one range."""
        kept = self._kept
        if kept is None:
            return range(int(self.lengths[k]))
        if not isinstance(kept, KeepRanges):
            return kept[k]
        lo, hi = int(self._lo[k]), int(self._hi[k])
        if hi - lo == 1:
            return range(int(kept.starts[lo]), int(kept.ends[lo]))
        return FrameRanges(kept.starts[lo:hi], kept.ends[lo:hi], int(self._kept_count[k]))

    def kept_count(self) -> np.ndarray:
        return self._kept_count

    def _all_kept(self) -> Iterator[range | FrameRanges]:
        """``kept(k)`` for every ``k`` in order, with the per-episode numpy lookups done in bulk."""
        kept = self._kept
        if not isinstance(kept, KeepRanges):
            yield from (self.kept(k) for k in range(len(self.episode_index)))
            return
        starts, ends = kept.starts.tolist(), kept.ends.tolist()
        for lo, hi, n in zip(self._lo.tolist(), self._hi.tolist(), self._kept_count.tolist()):
            if hi - lo == 1:
                yield range(starts[lo], ends[lo])
            else:
                yield FrameRanges(kept.starts[lo:hi], kept.ends[lo:hi], n)

    def varies_by_epoch(self) -> bool:
        return bool((self.counts % np.maximum(self.kept_count(), 1)).any())

    def segments(self, seed: int, epoch: int) -> list[Segment]:
        """The epoch's segments in episode order: each episode's whole copies (anchors shifted by
        ``copy * length``, ``Segment.period``), then its partial copy, a stratified draw from
        (seed, epoch) of its kept frames (one frame from each of ``r`` equal strides)."""
        if self._fixed is not None:
            return self._fixed
        if self._last is not None and self._last[:2] == (seed, epoch):
            return self._last[2]
        kept_count = self.kept_count()
        copies, partial = np.divmod(self.counts, np.maximum(kept_count, 1))
        with gc_paused():  # a Segment per episode and copy, ~10^5 at DROID's size: see _base.gc_pause
            out = self._segments(seed, epoch, kept_count, copies, partial)
        if not partial.any():
            self._fixed = out
        else:
            self._last = (seed, epoch, out)
        return out

    def _segments(self, seed: int, epoch: int, kept_count: np.ndarray, copies: np.ndarray,
                  partial: np.ndarray) -> list[Segment]:
        """``segments``' list, built (the caller pauses the collector and keeps the list)."""
        if self._kept is None and not partial.any() and (copies <= 1).all():
            return [Segment(e, range(n)) for e, n, c in zip(self.episode_index.tolist(), self.lengths.tolist(),
                                                           copies.tolist()) if c]
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_CURATION_TAG, epoch, 0)))
        draws = iter(rng.random(int((partial > 0).sum())).tolist())
        out = []
        for e, length, n, q, r, kept in zip(self.episode_index.tolist(), self.lengths.tolist(),
                                            kept_count.tolist(), copies.tolist(), partial.tolist(), self._all_kept()):
            if not q and not r:
                continue
            period = length if q + (r > 0) > 1 else 0
            for c in range(q):
                out.append(Segment(e, _shifted(kept, c * length) if c else kept, period))
            if r:
                picks = ((np.arange(r) + next(draws)) * n / r).astype(np.int64)
                out.append(Segment(e, np.asarray(kept)[picks] + q * length, period))
        return out

    def digest(self) -> str:
        h = hashlib.sha1(np.ascontiguousarray(self.episode_index, np.int64).tobytes())
        h.update(np.ascontiguousarray(self.counts, np.int64).tobytes())
        return h.hexdigest()[:16]
