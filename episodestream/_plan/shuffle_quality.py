"""How well a stream shuffles: distinct episodes per batch against a global shuffle of the same data.

The episode pool (``sampling.ConsumerSchedule``) keeps reads local by emitting frames from a sliding
window of ``pool_size`` episodes; the price is batches more correlated than a global shuffle's (what
``LeRobotDataset`` with ``shuffle=True`` gives). This module measures that price from the episode
indices a consumer emits, in order, which the schedule gives without rows or video:

- distinct episodes per batch (consecutive ``batch_size`` emits; the last, partial batch left out),
  against a global shuffle's expectation for the same frames: a batch of a uniformly random
  permutation is a uniform ``batch_size``-subset, so episode ``e`` of ``n_e`` of the ``N`` frames is
  missing from it with probability ``C(N - n_e, b) / C(N, b)``; the expectation sums ``1 -`` that;
- how soon an episode recurs: the mean number of samples between two consecutive frames of one
  episode, against a global shuffle's ``(N + 1) / (n_e + 1)`` (the expected spacing of ``n_e``
  uniformly placed points among ``N``), averaged over the same pairs;
- window diversity: distinct episodes in ``window`` consecutive samples (a trainer's run of steps,
  ``TRAINING_WINDOWS``), averaged over the stream's consecutive full windows, against the same
  expectation for a ``window``-subset of a uniform permutation. A batch can be as diverse as a global
  shuffle's while a hundred steps in a row still draw from the same few episodes: this says so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from episodestream._plan.sampling import EMIT, Step

# Training windows measured beside batches: 100 and 1,000 steps of batch 32.
TRAINING_WINDOWS = (3_200, 32_000)


@dataclass(frozen=True)
class WindowDiversity:
    """Distinct episodes over ``window`` consecutive samples against a uniform permutation's."""

    window: int  # samples
    windows: int  # full windows measured (0: the stream is shorter than one)
    distinct: float  # mean distinct episodes per full window (0.0 where there is none)
    uniform_distinct: float  # a uniform permutation's expectation over the same frames

    @property
    def ratio(self) -> float:
        """Distinct episodes per window as a fraction of a uniform permutation's (1.0: as diverse)."""
        return self.distinct / self.uniform_distinct if self.windows and self.uniform_distinct else float("nan")

    def summary(self) -> str:
        """In a few words."""
        if not self.windows:
            return f"{self.window:,} samples: the stream is shorter"
        return (f"{self.window:,} samples: {self.distinct:,.0f} distinct episodes, a global shuffle "
                f"{self.uniform_distinct:,.0f} ({self.ratio:.2f})")


@dataclass(frozen=True)
class ShuffleQuality:
    """One stream's shuffle against a global shuffle of the same frames (see the module docstring)."""

    batch_size: int
    batches: int  # full batches measured
    distinct: float  # mean distinct episodes per full batch
    global_distinct: float  # a global shuffle's expectation
    recur_gap: float  # mean samples between consecutive frames of one episode (nan: no episode recurs)
    global_recur_gap: float  # a global shuffle's expectation, over the same pairs
    windows: tuple[WindowDiversity, ...] = ()  # over training windows (``TRAINING_WINDOWS`` by default)

    @property
    def ratio(self) -> float:
        """Distinct episodes per batch as a fraction of a global shuffle's (1.0: as diverse)."""
        return self.distinct / self.global_distinct if self.global_distinct else float("nan")

    def summary(self) -> str:
        """Distinct episodes per batch against a global shuffle's, in a few words."""
        return (f"batch {self.batch_size}: {self.distinct:.1f} distinct episodes per batch, a global shuffle "
                f"{self.global_distinct:.1f} ({self.ratio:.2f})")

    def recurrence(self) -> str:
        """How soon an episode recurs against a global shuffle, in a few words."""
        return (f"an episode's frames recur every {self.recur_gap:.0f} samples, in a global shuffle every "
                f"{self.global_recur_gap:.0f}")


def global_distinct(frame_counts: Sequence[int] | np.ndarray, batch_size: int) -> float:
    """Expected distinct episodes in ``batch_size`` frames drawn without replacement from episodes of
    ``frame_counts`` frames (a batch of a global shuffle)."""
    counts = np.asarray(frame_counts, dtype=np.int64)
    counts = counts[counts > 0]
    total = int(counts.sum())
    b = min(batch_size, total)
    if b <= 0:
        return 0.0
    lengths, episodes = np.unique(counts, return_counts=True)
    expected = 0.0
    for n, k in zip(lengths.tolist(), episodes.tolist()):
        rest = total - n
        # P(no frame of this episode) = C(rest, b) / C(total, b), in logs: the counts reach 10^8.
        missing = 0.0 if rest < b else math.exp(math.lgamma(rest + 1) - math.lgamma(rest - b + 1)
                                                - math.lgamma(total + 1) + math.lgamma(total - b + 1))
        expected += k * (1.0 - missing)
    return expected


def global_recur_gap(frame_counts: Sequence[int] | np.ndarray) -> float:
    """A global shuffle's expected samples between consecutive frames of one episode, averaged over
    every such pair (an episode of ``n`` frames has ``n - 1``); nan when no episode has two frames."""
    counts = np.asarray(frame_counts, dtype=np.float64)
    total = counts.sum()
    pairs = np.clip(counts - 1, 0, None)
    if not pairs.sum():
        return float("nan")
    return float((pairs * (total + 1) / (counts + 1)).sum() / pairs.sum())


def _distinct_per_run(ids: np.ndarray, size: int) -> tuple[int, float]:
    """(full runs of ``size`` consecutive ids, their mean distinct ids); nan when there is none."""
    runs = len(ids) // size
    if not runs:
        return 0, float("nan")
    rows = np.sort(ids[:runs * size].reshape(runs, size), axis=1)
    return runs, float((1 + (np.diff(rows, axis=1) != 0).sum(axis=1)).mean())


def window_diversity(ids: np.ndarray, window: int, *,
                     frame_counts: Sequence[int] | np.ndarray | None = None) -> WindowDiversity:
    """Distinct episodes over ``window`` consecutive samples of ``ids`` (the episode of each sample, in
    order) against a uniform permutation of ``frame_counts`` (default: the frames ``ids`` holds)."""
    if window < 1:
        raise ValueError(f"window must be at least 1 sample, got {window!r}.")
    ids = np.asarray(ids, dtype=np.int64)
    if frame_counts is None:
        frame_counts = np.unique(ids, return_counts=True)[1]
    windows, distinct = _distinct_per_run(ids, window)
    # 0.0 rather than nan where no window is full: equal measures then compare equal.
    return WindowDiversity(window, windows, distinct if windows else 0.0, global_distinct(frame_counts, window))


def emitted_episodes(steps: Iterable[Step]) -> np.ndarray:
    """The episode index of each EMIT of a schedule, in order (walks every step)."""
    return np.fromiter((episode for kind, episode, _ in steps if kind == EMIT), dtype=np.int64)


def shuffle_quality(emitted: Iterable[Step] | Sequence[int] | np.ndarray, batch_size: int, *,
                    frame_counts: Sequence[int] | np.ndarray | None = None,
                    windows: Sequence[int] = TRAINING_WINDOWS,
                    window_frame_counts: Sequence[int] | np.ndarray | None = None) -> ShuffleQuality:
    """The shuffle quality of a stream, from its schedule's steps (a ``ConsumerSchedule``) or the
    episode index of each sample in order.

    ``frame_counts``: the frames per episode a global shuffle would draw from (default: what the
    stream itself emits, i.e. the same data). Pass the whole epoch's to compare one consumer of
    several against a global shuffle of the epoch.

    ``windows``: training-window sizes (samples) measured as ``ShuffleQuality.windows``, against a
    uniform permutation of ``window_frame_counts`` (default: the frames the stream emits, i.e. a
    consumer against a global shuffle of its own share).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size!r}.")
    if isinstance(emitted, np.ndarray):
        ids = emitted.astype(np.int64, copy=False)
    else:
        items = list(emitted)
        ids = (emitted_episodes(items) if items and isinstance(items[0], tuple)
               else np.asarray(items, dtype=np.int64))
    own_counts = np.unique(ids, return_counts=True)[1]
    if frame_counts is None:
        frame_counts = own_counts
    batches, distinct = _distinct_per_run(ids, batch_size)
    diversity = tuple(window_diversity(ids, w, frame_counts=own_counts if window_frame_counts is None
                                       else window_frame_counts) for w in windows)
    # Gaps between consecutive emits of one episode: positions grouped by episode, in order.
    order = np.argsort(ids, kind="stable")
    same = ids[order][1:] == ids[order][:-1]
    gaps = np.diff(order)[same]
    recur_gap = float(gaps.mean()) if len(gaps) else float("nan")
    return ShuffleQuality(batch_size, batches, distinct, global_distinct(frame_counts, batch_size),
                          recur_gap, global_recur_gap(frame_counts), diversity)
