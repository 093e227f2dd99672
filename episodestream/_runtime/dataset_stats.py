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

from episodestream._format.stats_pass import Progress, cached_exact_stats, default_stats_dir

StatsDict = dict[str, dict[str, np.ndarray]]


@contextmanager
def progress_bar(total: int, *, enabled: bool, description: str) -> Iterator[Progress | None]:
    """A tqdm bar counting rows (None when not ``enabled``)."""
    if not enabled:
        yield None
        return
    from tqdm import tqdm

    with tqdm(total=total, unit="rows", unit_scale=True, desc=description) as bar:
        yield bar.update


def exact_stats(core: Any, *, cache: bool, progress: bool) -> StatsDict:
    """Exact statistics of ``core``'s (a ``DatasetCore``'s) selected episodes (tabular), with camera
    keys from stats.json."""
    stats_dir = default_stats_dir(core.cache_dir) if cache else None
    with progress_bar(core.num_frames, enabled=progress, description="stats") as update:
        stats = cached_exact_stats(core.files, core.meta, core.episodes, revision=core.revision,
                                   stats_dir=stats_dir, progress=update)
    from_file = core.lerobot_meta.stats or {}
    for key in core.meta.camera_keys:
        if key in from_file:
            stats[key] = {name: np.array(value) for name, value in from_file[key].items()}
    return stats
