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
  uniformly placed points among ``N``), averaged over the same pairs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from episodestream._plan.sampling import EMIT, Step


@dataclass(frozen=True)
class ShuffleQuality:
    """One stream's shuffle against a global shuffle of the same frames (see the module docstring)."""

    batch_size: int
    batches: int  # full batches measured
    distinct: float  # mean distinct episodes per full batch
    global_distinct: float  # a global shuffle's expectation
    recur_gap: float  # mean samples between consecutive frames of one episode (nan: no episode recurs)
    global_recur_gap: float  # a global shuffle's expectation, over the same pairs

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


def emitted_episodes(steps: Iterable[Step]) -> np.ndarray:
    """The episode index of each EMIT of a schedule, in order (walks every step)."""
    return np.fromiter((episode for kind, episode, _ in steps if kind == EMIT), dtype=np.int64)


def shuffle_quality(emitted: Iterable[Step] | Sequence[int] | np.ndarray, batch_size: int, *,
                    frame_counts: Sequence[int] | np.ndarray | None = None) -> ShuffleQuality:
    """The shuffle quality of a stream, from its schedule's steps (a ``ConsumerSchedule``) or the
    episode index of each sample in order.

    ``frame_counts``: the frames per episode a global shuffle would draw from (default: what the
    stream itself emits, i.e. the same data). Pass the whole epoch's to compare one consumer of
    several against a global shuffle of the epoch.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size!r}.")
    if isinstance(emitted, np.ndarray):
        ids = emitted.astype(np.int64, copy=False)
    else:
        items = list(emitted)
        ids = (emitted_episodes(items) if items and isinstance(items[0], tuple)
               else np.asarray(items, dtype=np.int64))
    if frame_counts is None:
        frame_counts = np.unique(ids, return_counts=True)[1]
    batches = len(ids) // batch_size
    if batches:
        rows = np.sort(ids[:batches * batch_size].reshape(batches, batch_size), axis=1)
        distinct = float((1 + (np.diff(rows, axis=1) != 0).sum(axis=1)).mean())
    else:
        distinct = float("nan")
    # Gaps between consecutive emits of one episode: positions grouped by episode, in order.
    order = np.argsort(ids, kind="stable")
    same = ids[order][1:] == ids[order][:-1]
    gaps = np.diff(order)[same]
    recur_gap = float(gaps.mean()) if len(gaps) else float("nan")
    return ShuffleQuality(batch_size, batches, distinct, global_distinct(frame_counts, batch_size),
                          recur_gap, global_recur_gap(frame_counts))
