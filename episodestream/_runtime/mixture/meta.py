"""``mixture.meta``: each source's metadata, the mixture's features and its stats.

``stats`` and ``component_stats`` are exact, computed on first use (``mixture.stats``). This
module also keeps ``lerobot_stats``: the sources' ``stats.json`` aggregated as LeRobot does.
LeRobot's ``aggregate_stats`` (``lerobot.datasets.compute_stats``) combines datasets' stats weighted
by their ``count`` (frames): the count-weighted mean, the pooled variance (each source's variance
plus its mean's squared distance from the combined mean, count-weighted) as ``std``, elementwise
``min`` / ``max``, the summed ``count``; quantiles (``q01`` ...) as the count-weighted mean of the
sources' quantiles (an approximation, as there). A feature missing from some source's stats is
aggregated over the sources that have it; one whose shapes differ (a padded key) is left out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

_EXACT = ("min", "max", "mean", "std", "count")


def aggregate_stats(stats: Sequence[Mapping[str, Mapping[str, np.ndarray]] | None]
                    ) -> dict[str, dict[str, np.ndarray]] | None:
    """Stats of the sources together (None entries, sources without ``stats.json``, are skipped;
    None when none has stats)."""
    present = [s for s in stats if s is not None]
    if not present:
        return None
    keys = list(dict.fromkeys(key for s in present for key in s))
    out = {}
    for key in keys:
        parts = [s[key] for s in present if key in s]
        if len({np.shape(p["mean"]) if "mean" in p else None for p in parts}) == 1:  # widths that differ do not aggregate (as in LeRobot)
            out[key] = _aggregate_feature(parts)
    return out


def _aggregate_feature(parts: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if not all("count" in p and "mean" in p for p in parts):
        return dict(parts[0])  # nothing to weight by: the first source's, as given
    means = np.stack([np.asarray(p["mean"], np.float64) for p in parts])
    counts = np.array([float(np.ravel(p["count"])[0]) for p in parts])  # frames per source, shape (1,) each
    weights = (counts / counts.sum()).reshape((len(parts),) + (1,) * (means.ndim - 1))
    mean = (weights * means).sum(0)
    out: dict[str, np.ndarray] = {"mean": mean, "count": np.array([int(counts.sum())], np.int64)}
    if all("std" in p for p in parts):
        stds = np.stack([np.asarray(p["std"], np.float64) for p in parts])
        out["std"] = np.sqrt((weights * (stds**2 + (means - mean) ** 2)).sum(0))
    for name, combine in (("min", np.min), ("max", np.max)):
        if all(name in p for p in parts):
            out[name] = combine(np.stack([np.asarray(p[name]) for p in parts]), axis=0)
    for name in parts[0]:
        if name not in _EXACT and all(name in p for p in parts):
            out[name] = (weights * np.stack([np.asarray(p[name], np.float64) for p in parts])).sum(0)
    return out


def rename_stats(stats: Mapping[str, Any] | None, rename: Mapping[str, str]) -> dict[str, Any] | None:
    return None if stats is None else {rename.get(key, key): value for key, value in stats.items()}


class MixtureMeta:
    """What a mixture's ``meta`` gives (docs/mixtures.md, "meta" and "Stats"):

    - ``sources``: each component's own ``meta`` (a ``LeRobotMeta``, unrenamed; its ``stats`` is
      that dataset's ``stats.json``, as LeRobot's);
    - ``features``: the mixture's own feature table (info.json dicts: dtype, shape, names; padded
      names say "pad");
    - ``stats``: exact statistics of the mixture as it is sampled (``mixture.stats``), computed on
      first use from the components' rows and cached; ``provenance`` says, per key, which are exact
      and which (cameras) come from the components' ``stats.json``;
    - ``component_stats[i]``: component ``i``'s own exact statistics in mixture keys and shapes;
    - ``lerobot_stats``: the components' ``stats.json`` aggregated as LeRobot's ``aggregate_stats``
      does (frame-weighted, quantiles averaged; see the module docstring), for comparison;
    - ``fps`` per source, ``weights``, ``total_frames`` (selected frames per source), ``robot_types``.
    """

    def __init__(self, *, sources: Sequence[Any], renames: Sequence[Mapping[str, str]],
                 weights: Sequence[float], frames: Sequence[int], features: Mapping[str, Any] | None = None,
                 stats: Any = None) -> None:
        self.sources = list(sources)
        self._renames = [dict(r) for r in renames]
        self.lerobot_stats = aggregate_stats([rename_stats(m.stats, r) for m, r in zip(sources, renames)])
        self.features = dict(features) if features is not None else {
            renames[0].get(key, key): spec for key, spec in sources[0].features.items()}
        self.fps = [m.fps for m in sources]
        self.weights = list(weights)
        self.total_frames = list(frames)
        self.robot_types = [m.robot_type for m in sources]
        self._exact = stats  # a mixture.stats.MixtureStats, or None: stats are LeRobot's aggregate
        self._stats: dict | None = None
        self._component_stats: list | None = None

    @property
    def component_stats(self) -> list[dict[str, dict[str, np.ndarray]]]:
        """Each component's own exact statistics, in mixture keys and shapes (computed on first use)."""
        if self._component_stats is None:
            self._component_stats = self._exact.component_stats() if self._exact is not None else [
                rename_stats(m.stats, {}) or {} for m in self.sources]
        return self._component_stats

    @property
    def stats(self) -> dict[str, dict[str, np.ndarray]] | None:
        """The mixture's exact statistics, weighted by each component's share of the epoch."""
        if self._stats is None:
            self._stats = self._exact.stats(self.component_stats) if self._exact is not None else self.lerobot_stats
        return self._stats

    @property
    def provenance(self) -> dict[str, str]:
        """Per key of ``stats``: exact, or combined from the components' stats.json (cameras)."""
        return self._exact.provenance() if self._exact is not None else {}

    @property
    def camera_keys(self) -> list[str]:
        return [key for key, spec in self.features.items() if spec["dtype"] in ("video", "image")]

    @property
    def video_keys(self) -> list[str]:
        return [key for key, spec in self.features.items() if spec["dtype"] == "video"]

    @property
    def depth_keys(self) -> list[str]:
        """The mixture's cameras that are depth maps in some component (as each component's ``depth_keys``)."""
        renamed = {key for m, r in zip(self.sources, self._renames) for key in (r.get(k, k) for k in m.depth_keys)}
        return [key for key in self.features if key in renamed]

    @property
    def has_language_columns(self) -> bool:
        """Whether a component has LeRobot 0.6's language columns (they are never renamed)."""
        return any(m.has_language_columns for m in self.sources)

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The components' tool schemas (each one's ``meta.tools``), each distinct one once, in order."""
        seen: list[dict[str, Any]] = []
        for m in self.sources:
            seen += [tool for tool in m.tools if tool not in seen]
        return seen

    def __repr__(self) -> str:
        return (f"MixtureMeta({len(self.sources)} sources: {[m.repo_id for m in self.sources]}, "
                f"weights={self.weights}, features={list(self.features)})")
