"""A v2.x dataset's ``stats`` as LeRobot's converter makes them: v2.1's per-episode stats
(``meta/episodes_stats.jsonl``) aggregated; v2.0's ``meta/stats.json`` as it is.

``convert_dataset_v21_to_v30`` loads every line's ``stats`` as numpy arrays (each leaf at least
1-D) and writes ``aggregate_stats`` of them as the v3.0 ``stats.json``, which LeRobot then loads. Per
feature, over the episodes that have it: ``min`` and ``max`` elementwise, ``mean`` weighted by
``count``, ``std`` from the pooled variance (each episode's variance plus its mean's squared
distance from the overall mean, weighted by count), ``count`` summed, and each ``qNN`` quantile
present in every episode the count-weighted mean of the episodes' ones. Arithmetic is in numpy's
float64 in the same order as LeRobot's, so the values are LeRobot's to the bit (the JSON round trip
of the converter keeps float64 exactly).

A v2.x dataset without these stats is refused: LeRobot's converter needs them, and a policy
normalises with them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from episodestream._format.files import DatasetFiles
from episodestream._format.metadata import STATS_PATH, fail
from episodestream._format.stats import load_stats
from episodestream._format.v2x import int_field, read_jsonl

EPISODES_STATS_JSONL = "meta/episodes_stats.jsonl"
Stats = dict[str, dict[str, np.ndarray]]


def _column(parts: Sequence[Mapping[str, Any]], name: str, where: str) -> np.ndarray:
    """Statistic ``name`` of every episode, stacked: (episodes, *shape), each episode's value at
    least 1-D as LeRobot casts it. One numpy call for all episodes, not one per episode: a dataset
    of 100,000 episodes has millions of these values."""
    try:
        values = [p[name] for p in parts]
    except KeyError:
        raise fail(where, f"statistic {name!r} is missing from some episode's stats") from None
    try:
        stacked = np.array(values)
        if stacked.dtype == object:
            raise ValueError("ragged")
    except ValueError:  # scalars in some episodes and [x] in others, or shapes that differ
        try:
            stacked = np.stack([np.atleast_1d(np.array(v)) for v in values])
        except ValueError as error:
            raise fail(where, f"episodes' {name!r} do not stack ({error})") from None
    if stacked.dtype.kind not in "biuf":
        raise fail(where, f"statistic {name!r} must hold numbers, got {values[0]!r:.80}")
    return stacked[:, None] if stacked.ndim == 1 else stacked  # per-episode scalars as shape (1,)


def _aggregate_feature(parts: Sequence[Mapping[str, Any]], where: str) -> dict[str, np.ndarray]:
    means, stds, counts = (_column(parts, name, where) for name in ("mean", "std", "count"))
    if means.shape[1:] != stds.shape[1:]:
        raise fail(where, f"episodes' stats do not stack (mean {means.shape[1:]}, std {stds.shape[1:]})")
    total = counts.sum(axis=0)
    while counts.ndim < means.ndim:  # (episodes, 1) counts against (episodes, *shape) means
        counts = np.expand_dims(counts, axis=-1)
    try:
        mean = (means * counts).sum(axis=0) / total
        variance = ((stds**2 + (means - mean) ** 2) * counts).sum(axis=0) / total
    except ValueError as error:
        raise fail(where, f"episodes' stats do not stack ({error})") from None
    out = {"min": np.min(_column(parts, "min", where), axis=0), "max": np.max(_column(parts, "max", where), axis=0),
           "mean": mean, "std": np.sqrt(variance), "count": total}
    for name in [k for k in parts[0] if k.startswith("q") and k[1:].isdigit()]:
        if all(name in p for p in parts):
            out[name] = (_column(parts, name, where) * counts).sum(axis=0) / total
    return out


def aggregate_episode_stats(files: DatasetFiles) -> Stats:
    """``meta/episodes_stats.jsonl`` aggregated over episodes (see the module docstring)."""
    where = f"{files.description}/{EPISODES_STATS_JSONL}"
    records = read_jsonl(files, EPISODES_STATS_JSONL, ("episode_index", "stats"), why="per-episode stats")
    if not records:
        raise fail(where, "no episodes' stats")
    # LeRobot's converter keys the lines by episode (a repeated episode's last line wins) and
    # aggregates them sorted by episode.
    by_episode = {int_field(record, "episode_index", where, low=0): record for record in records}
    by_feature: dict[str, list[Mapping[str, Any]]] = {}
    for _, record in sorted(by_episode.items()):
        stats = record["stats"]
        if not isinstance(stats, dict) or not all(isinstance(v, dict) for v in stats.values()):
            raise fail(f"{where} line {record['_line']}", "field 'stats' must be an object of "
                                                         "{feature: {statistic: values}}")
        for key, values in stats.items():
            by_feature.setdefault(key, []).append(values)
    return {key: _aggregate_feature(parts, f"{where} (feature {key!r})") for key, parts in by_feature.items()}


def load_v2_stats(files: DatasetFiles, version: str) -> Stats:
    """v2.1: the aggregated episodes' stats; v2.0: ``meta/stats.json``. Refused when absent."""
    if version == "v2.1":
        return aggregate_episode_stats(files)
    stats = load_stats(files)
    if stats is None:
        raise FileNotFoundError(f"{files.description}/{STATS_PATH} not found: a LeRobot v2.0 dataset keeps its "
                                f"normalisation stats there (v2.1 in {EPISODES_STATS_JSONL}), and without them no "
                                f"policy can be normalised; LeRobot's convert_dataset_v20_to_v21 computes them.")
    return stats
