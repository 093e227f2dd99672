"""``dataset.compute_stats()``: exact statistics of a dataset's selected episodes, cached.

The tabular features' statistics are ``_format.stats_pass``'s exact ones over the selection; camera
features keep the values of the dataset's ``meta/stats.json`` (LeRobot's, sampled from decoded
frames of the whole dataset: exact ones would mean decoding every frame), when it has them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

import hashlib
import json
from fractions import Fraction

from episodestream._format.exact_stats import weighted_feature_stats
from episodestream._format.stats_pass import (
    Progress,
    cached_exact_stats,
    cached_stats,
    default_stats_dir,
    read_columns,
    stat_keys,
    stats_cache_key,
)

StatsDict = dict[str, dict[str, np.ndarray]]


@contextmanager
def progress_bar(total: int, *, enabled: bool, description: str) -> Iterator[Progress | None]:
    """A tqdm bar counting rows (None when not ``enabled``), shown from the first rows counted: a
    result read from the cache counts none, and shows no bar (it stood at 0% before)."""
    if not enabled:
        yield None
        return
    bars: list[Any] = []

    def update(rows: int) -> None:
        if not bars:
            from tqdm import tqdm

            bars.append(tqdm(total=total, unit="rows", unit_scale=True, desc=description))
        bars[0].update(rows)

    try:
        yield update
    finally:
        for bar in bars:
            bar.close()


def exact_stats(core: Any, *, cache: bool, progress: bool) -> StatsDict:
    """Exact statistics of ``core``'s (a ``DatasetCore``'s) selected episodes (tabular), with camera
    keys from stats.json."""
    stats_dir = default_stats_dir(core.cache_dir) if cache else None
    with progress_bar(int(core.episodes.lengths.sum()), enabled=progress, description="stats") as update:
        if core.curation is None:
            stats = cached_exact_stats(core.files, core.meta, core.episodes, revision=core.revision,
                                       stats_dir=stats_dir, progress=update)
        else:
            stats = _curated_stats(core, stats_dir, update)
    from_file = core.lerobot_meta.stats or {}
    for key in core.meta.camera_keys:
        if key in from_file:
            stats[key] = {name: np.array(value) for name, value in from_file[key].items()}
    return stats


def _curated_stats(core: Any, stats_dir: Any, progress: Progress | None) -> StatsDict:
    """The statistics of what a curated dataset samples in an epoch: every kept frame weighing its
    episode's anchors per epoch over its kept frames (1 without weights; ``w`` for an integer
    weight; a fractional weight's expected count), frames outside ``keep_frames`` weighing 0."""
    path = None
    if stats_dir is not None:
        key = stats_cache_key(core.files, core.meta, core.episodes, revision=core.revision)
        curation = hashlib.sha1(json.dumps(core.curation, sort_keys=True).encode()).hexdigest()[:12]
        path = stats_dir / f"{key}-{curation}.json"
    return cached_stats(path, lambda: _compute_curated_stats(core, progress), source=core.files.description,
                        episodes=len(core.episodes))


def _compute_curated_stats(core: Any, progress: Progress | None) -> StatsDict:
    keys = stat_keys(core.meta)
    columns = read_columns(core.files, core.meta, core.episodes, list(dict.fromkeys([*keys, "index"])),
                           progress=progress)
    numerator, denominator = curated_row_weights(core, columns["index"])
    groups = sorted(set(zip(numerator.tolist(), denominator.tolist())) - {(0, 1)})
    masks = [(numerator == n) & (denominator == d) for n, d in groups]
    weights = [Fraction(n, d) for n, d in groups]
    return {key: weighted_feature_stats([columns[key][m] for m in masks], weights, core.meta.features[key].shape)
            for key in keys}


def curated_row_weights(core: Any, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's weight (``index``: the rows' global index) as a reduced fraction (numerators,
    denominators): its episode's anchors per epoch over its kept frames, 0 outside the kept frames."""
    anchors, starts = core.anchors, core.episodes.from_indices
    order = np.argsort(starts, kind="stable")
    position = order[np.searchsorted(starts[order], index, side="right") - 1]  # the row's episode, in anchors' order
    frame = index - starts[position]
    kept = np.zeros(len(index), bool)
    # The rows of one episode are contiguous (read file by file, each file's rows in order).
    bounds = np.flatnonzero(np.diff(position)) + 1
    for lo, hi in zip(np.concatenate([[0], bounds]).tolist(), np.concatenate([bounds, [len(index)]]).tolist()):
        frames = anchors.kept(int(position[lo]))
        if isinstance(frames, range):
            kept[lo:hi] = (frame[lo:hi] >= frames.start) & (frame[lo:hi] < frames.stop)
        else:
            kept[lo:hi] = np.isin(frame[lo:hi], np.asarray(frames))
    counts = anchors.counts[position].astype(np.int64)
    kept_counts = np.maximum(anchors.kept_count()[position].astype(np.int64), 1)
    divisor = np.gcd(counts, kept_counts)
    numerator = np.where(kept, counts // divisor, 0)
    denominator = np.where(kept, kept_counts // divisor, 1)
    return numerator, denominator
