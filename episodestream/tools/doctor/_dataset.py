"""The stats check: the dataset's stats as ``dataset.meta.stats`` loads them (v3.0 and v2.0
``meta/stats.json``, v2.1 its episodes' stats aggregated), present, every value finite. (The other
dataset-wide check, the metadata, is ``_format.versions.load_metadata`` itself.)"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from episodestream._base.errors import DatasetFormatError
from episodestream._format.files import DatasetFiles
from episodestream._format.metadata import STATS_PATH, DatasetMeta
from episodestream._format.v2_stats import EPISODES_STATS_JSONL
from episodestream._format.versions import load_dataset_stats

_SHOWN_VALUES = 6


def stats_where(meta: DatasetMeta) -> str:
    """The file a dataset's stats are read from (v2.1 aggregates its episodes' stats, as LeRobot's converter)."""
    return EPISODES_STATS_JSONL if meta.info.get("codebase_version") == "v2.1" else STATS_PATH


def check_stats(files: DatasetFiles, meta: DatasetMeta) -> None:
    """Raise when the dataset has no stats, or a statistic that is not finite (a NaN mean normalises
    every batch to NaN), naming the feature and the statistic."""
    where = f"{files.description}/{stats_where(meta)}"
    stats = load_dataset_stats(files, meta)  # the reader's own errors (unreadable JSON, ragged values) as they are
    if stats is None:
        raise FileNotFoundError(f"{where} not found: the dataset has no stats, which LeRobot's normalizers read "
                                f"(dataset.meta.stats is None).")
    for key, name, value in _leaves(stats):
        values = np.asarray(value, dtype=np.float64)
        if not np.isfinite(values).all():
            shown = values.ravel()[:_SHOWN_VALUES].tolist()
            raise DatasetFormatError(f"{where}: feature {key!r} statistic {name!r} is not finite "
                                     f"({shown}{' ...' if values.size > _SHOWN_VALUES else ''}).")


def _leaves(stats: Mapping[str, Any]) -> list[tuple[str, str, np.ndarray]]:
    """(feature, statistic, values) of every leaf; a statistic nested deeper is named by its path."""
    out = []
    for key, entry in stats.items():
        if not isinstance(entry, Mapping):  # a feature given one array, not its statistics by name
            out.append((key, "", entry))
            continue
        for name, value in entry.items():
            if isinstance(value, Mapping):
                out += [(key, f"{name}/{inner}", leaf) for _, inner, leaf in _leaves({key: value})]
            else:
                out.append((key, name, value))
    return out
