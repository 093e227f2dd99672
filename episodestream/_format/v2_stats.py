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

import numpy as np

from episodestream._format.files import DatasetFiles
from episodestream._format.metadata import STATS_PATH, fail
from episodestream._format.stats import load_stats, to_numpy
from episodestream._format.v2x import read_jsonl

EPISODES_STATS_JSONL = "meta/episodes_stats.jsonl"
Stats = dict[str, dict[str, np.ndarray]]


def _aggregate_feature(parts: Sequence[Mapping[str, np.ndarray]], where: str) -> dict[str, np.ndarray]:
    try:
        means = np.stack([p["mean"] for p in parts])
        variances = np.stack([p["std"] ** 2 for p in parts])
        counts = np.stack([p["count"] for p in parts])
        total = counts.sum(axis=0)
        while counts.ndim < means.ndim:  # (episodes, 1) counts against (episodes, *shape) means
            counts = np.expand_dims(counts, axis=-1)
        mean = (means * counts).sum(axis=0) / total
        variance = ((variances + (means - mean) ** 2) * counts).sum(axis=0) / total
        out = {"min": np.min(np.stack([p["min"] for p in parts]), axis=0),
               "max": np.max(np.stack([p["max"] for p in parts]), axis=0),
               "mean": mean, "std": np.sqrt(variance), "count": total}
        for name in [k for k in parts[0] if k.startswith("q") and k[1:].isdigit()]:
            if all(name in p for p in parts):
                out[name] = (np.stack([p[name] for p in parts]) * counts).sum(axis=0) / total
    except KeyError as error:
        raise fail(where, f"statistic {error.args[0]!r} is missing from some episode's stats") from None
    except ValueError as error:  # shapes that differ between episodes
        raise fail(where, f"episodes' stats do not stack ({error})") from None
    return out


def aggregate_episode_stats(files: DatasetFiles) -> Stats:
    """``meta/episodes_stats.jsonl`` aggregated over episodes (see the module docstring)."""
    where = f"{files.description}/{EPISODES_STATS_JSONL}"
    records = read_jsonl(files, EPISODES_STATS_JSONL, ("episode_index", "stats"), why="per-episode stats")
    if not records:
        raise fail(where, "no episodes' stats")
    by_feature: dict[str, list[dict[str, np.ndarray]]] = {}
    for record in sorted(records, key=lambda r: r["episode_index"]):  # LeRobot's order (sorted by episode)
        line = f"{where} line {record['_line']}"
        if not isinstance(record["stats"], dict) or not all(isinstance(v, dict) for v in record["stats"].values()):
            raise fail(line, "field 'stats' must be an object of {feature: {statistic: values}}")
        for key, values in to_numpy(record["stats"], line).items():
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
