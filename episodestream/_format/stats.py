"""``meta/stats.json`` as LeRobot loads it, and a short summary of it for ``episodestream info``.

LeRobot's ``load_stats`` turns every leaf of the file into a numpy array (``np.array``, at least 1-D),
so floats become float64 arrays and ``count`` an int64 array of shape (1,); camera statistics keep
the file's (3, 1, 1) shape. A dataset without the file has no stats: ``None``, as in LeRobot.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from episodestream._format.files import DatasetFiles
from episodestream._format.metadata import STATS_PATH, DatasetFormatError

SUMMARY_DIMS = 3  # dimensions of mean / std that ``summarize_stats`` keeps


def _cast(value: Any, where: str) -> np.ndarray:
    try:
        array = np.atleast_1d(np.array(value))
    except ValueError as error:  # ragged lists
        raise DatasetFormatError(f"{where}: not a rectangular array of numbers ({error})") from None
    if array.dtype.kind not in "biuf":
        raise DatasetFormatError(f"{where}: expected numbers, got {value!r:.80}")
    return array


def to_numpy(tree: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Nested dicts kept as they are, every leaf an array (LeRobot flattens, casts, unflattens: same result)."""
    return {key: to_numpy(value, f"{where}[{key!r}]") if isinstance(value, dict) else
            _cast(value, f"{where}[{key!r}]") for key, value in tree.items()}


def load_stats(files: DatasetFiles) -> dict[str, dict[str, np.ndarray]] | None:
    """The dataset's ``meta/stats.json`` as ``{feature: {statistic: array}}``, or None without the file.

    Read through ``files``, so a remote source downloads it once into its cache like the rest of the
    metadata.
    """
    where = f"{files.description}/{STATS_PATH}"
    if not files.exists(STATS_PATH):
        return None
    try:
        raw = json.loads(files.read_bytes(STATS_PATH))
    except json.JSONDecodeError as error:
        raise DatasetFormatError(f"{where}: not valid JSON ({error})") from None
    if not isinstance(raw, dict):
        raise DatasetFormatError(f"{where}: expected a JSON object of features, got {type(raw).__name__}")
    return to_numpy(raw, where)


def _first(array: np.ndarray, dims: int) -> list[float]:
    return [round(float(v), 6) for v in np.ravel(array)[:dims]]


def summarize_stats(stats: Mapping[str, Mapping[str, np.ndarray]] | None,
                    dims: int = SUMMARY_DIMS) -> dict[str, dict[str, Any]] | None:
    """Per feature: mean and std of its first ``dims`` values, the overall min and max, and the
    number of values (``size``), as plain JSON-able numbers. None when there are no stats."""
    if stats is None:
        return None
    summary = {}
    for key, values in stats.items():
        entry: dict[str, Any] = {}
        for name in ("mean", "std"):
            if name in values:
                entry[name] = _first(values[name], dims)
        if "min" in values:
            entry["min"] = round(float(np.min(values["min"])), 6)
        if "max" in values:
            entry["max"] = round(float(np.max(values["max"])), 6)
        if "mean" in values:
            entry["size"] = int(np.size(values["mean"]))
        summary[key] = entry
    return summary
