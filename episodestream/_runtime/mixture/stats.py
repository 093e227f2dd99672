"""``mixture.meta.stats`` and ``mixture.meta.component_stats``: exact statistics of a mixture as it is sampled.

Each anchor of component ``i`` weighs ``c_i / A_i``: its share of the epoch (``c_i`` samples of it
per rank, ``_plan.mixing``) spread over its ``A_i`` anchors per epoch; without ``weights`` every
anchor weighs the same (the mixture is then the components' concatenation). A row carries its
anchors: 1 without curation, and for a curated component what its own ``compute_stats()`` gives it
(its episode's anchors over its kept frames; 0 outside ``keep_frames``). With these weights,
``mean``, ``std``, ``min``, ``max`` and the quantiles are ``_format.exact_stats``'s over the
components' rows together, in mixture keys and the mixture's shapes; ``count`` is the frames that
entered (rows of non-zero weight, not weights). For a padded key, each dimension counts only the components for which it is real, so the
zeros of padding never enter; a key missing from some components counts the others.

Cameras keep the components' ``stats.json`` values (exact ones would mean decoding every frame),
combined by the same weights: weighted mean, pooled variance as ``std``, elementwise min and max,
and quantiles as the weighted mean of the components' (an approximation, as LeRobot's).
``provenance`` says which keys are which.

``component_stats[i]`` is component ``i``'s own exact statistics (``dataset.compute_stats()``) in
mixture keys and shapes, for per-embodiment normalization: its padded dimensions and the keys it
lacks get the identity statistics (``exact_stats.identity_stats``), so normalizing leaves their
zeros at zero.

The mixture's statistics are cached beside the first component's (``<cache_dir>/stats``), named by
everything they are computed from (``MixtureStats._cache_path``): the components' own cache keys and
curation, the renames, the schema, the weights and the component statistics they combine (the cameras'
come from stats.json, depth in each component's ``depth_output_unit``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from episodestream._format.exact_stats import identity_stats, weighted_feature_stats
from episodestream._format.stats_pass import (
    default_stats_dir,
    read_columns,
    cached_stats,
    stats_cache_key,
)
from episodestream._runtime.dataset_stats import StatsDict, curated_row_weights, exact_stats
from episodestream._runtime.mixture.schema import MixtureKey, MixtureSchema

EXACT = "exact (tabular rows, weighted by each component's share of the epoch)"
# Keys of these kinds have no statistics, as in a dataset's own (``stats_pass.stat_keys``): a mixture's
# stats feed LeRobot's normalization, which would fail on a language column's entry.
NO_STATS = ("string", "language")
FROM_STATS_JSON = ("components' stats.json combined by the weights (cameras: quantiles are the weighted mean "
                   "of the components', an approximation)")


def row_weights(rank_counts: Sequence[int], anchors: Sequence[int], weighted: bool) -> list[Fraction]:
    """Each component's weight per anchor: ``c_i / A_i``, or 1 for every anchor without mixture weights."""
    if not weighted:
        return [Fraction(1) for _ in anchors]
    return [Fraction(c, a) for c, a in zip(rank_counts, anchors)]


def _padded_values(values: np.ndarray, m: MixtureKey, width: int) -> np.ndarray:
    """(N, *shape_i) rows (a scalar's as (N,)) zero-padded on the last axis to the mixture's shape,
    as (N, elements)."""
    values = values.reshape(len(values), *m.shape[:-1], width)
    extra = m.shape[-1] - width
    if extra:
        values = np.pad(values, [(0, 0)] * (values.ndim - 1) + [(0, extra)])
    return values.reshape(len(values), -1)


def _real_elements(m: MixtureKey, width: int) -> np.ndarray:
    """Which flattened elements of the mixture's shape are real for a component of last-axis ``width``."""
    return np.broadcast_to(np.arange(m.shape[-1]) < width, m.shape).reshape(-1)


def _combine_cameras(parts: Sequence[dict[str, np.ndarray]], shares: Sequence[float]) -> dict[str, np.ndarray]:
    weights = np.asarray(shares, np.float64) / float(np.sum(shares))
    means = np.stack([np.asarray(p["mean"], np.float64) for p in parts])
    w = weights.reshape((-1,) + (1,) * (means.ndim - 1))
    mean = (w * means).sum(0)
    out: dict[str, np.ndarray] = {"mean": mean}
    if all("std" in p for p in parts):
        stds = np.stack([np.asarray(p["std"], np.float64) for p in parts])
        out["std"] = np.sqrt((w * (stds**2 + (means - mean) ** 2)).sum(0))
    for name, combine in (("min", np.min), ("max", np.max)):
        if all(name in p for p in parts):
            out[name] = combine(np.stack([np.asarray(p[name], np.float64) for p in parts]), axis=0)
    if all("count" in p for p in parts):
        out["count"] = np.array([int(sum(int(np.ravel(p["count"])[0]) for p in parts))], np.int64)
    for name in parts[0]:
        if name.startswith("q") and all(name in p for p in parts):
            out[name] = (w * np.stack([np.asarray(p[name], np.float64) for p in parts])).sum(0)
    return out


class MixtureStats:
    """Computes (once) and holds a mixture's ``stats``, ``component_stats`` and ``provenance``."""

    def __init__(self, components: Sequence[Any], schema: MixtureSchema, renames: Sequence[Mapping[str, str]],
                 weights: Sequence[Fraction]) -> None:
        self._cores = [c.core for c in components]  # DatasetRuntime.core: files, meta, selection
        self._schema, self._renames, self._weights = schema, [dict(r) for r in renames], list(weights)

    def provenance(self) -> dict[str, str]:
        """Which statistics each mixture key has (see the module docstring)."""
        return {k: FROM_STATS_JSON if m.kind == "camera" else EXACT
                for k, m in self._schema.keys.items() if m.kind not in NO_STATS}

    def component_stats(self) -> list[StatsDict]:
        out = []
        for i, core in enumerate(self._cores):
            own = exact_stats(core, cache=True, progress=False)
            renamed = {self._renames[i].get(k, k): v for k, v in own.items()}
            mine: StatsDict = {}
            for key, m in self._schema.keys.items():
                if m.kind in NO_STATS:
                    continue
                if key not in renamed:
                    mine[key] = identity_stats((3, 1, 1) if m.kind == "camera" else m.shape)
                elif m.kind == "camera" or m.widths[i] == m.shape[-1]:
                    mine[key] = renamed[key]
                else:
                    real = _real_elements(m, m.widths[i] or 0)
                    identity = identity_stats(m.shape)
                    entry = {}
                    for name, value in renamed[key].items():
                        if name == "count":
                            entry[name] = value
                            continue
                        full = identity[name].reshape(-1).copy()
                        full[real] = _padded_values(np.asarray(value)[None], m, m.widths[i] or 0)[0][real]
                        entry[name] = full.reshape(m.shape)
                    mine[key] = entry
            out.append(mine)
        return out

    def _cache_path(self, component_stats: Sequence[StatsDict]):
        """The one place the mixture's cache key is built: from every input of ``_compute``, so that
        nothing that changes its numbers can be answered by a file another mixture wrote."""
        first = self._cores[0]
        keys = [stats_cache_key(c.files, c.meta, c.episodes, revision=c.revision) for c in self._cores]
        schema = {k: [m.kind, list(m.shape), list(m.widths)] for k, m in self._schema.keys.items()}
        # Curation changes which rows count and how much, not the selected episodes the keys cover.
        curation = [c.curation for c in self._cores]
        # The cameras' values are not in the rows: they are stats.json's as each component gives them,
        # depth rescaled to its depth_output_unit (or entries use_imagenet_stats overwrote).
        given = [{k: {n: np.asarray(v).tolist() for n, v in sorted(entry.items())} for k, entry in sorted(s.items())}
                 for s in component_stats]
        what = ["mixture", keys, curation, self._renames, schema, [str(w) for w in self._weights], given]
        digest = hashlib.sha1(json.dumps(what).encode()).hexdigest()[:20]
        return default_stats_dir(first.cache_dir) / f"mixture-{digest}.json"

    def stats(self, component_stats: Sequence[StatsDict]) -> StatsDict:
        return cached_stats(self._cache_path(component_stats), lambda: self._compute(component_stats),
                            source="mixture", components=len(self._cores))

    def _compute(self, component_stats: Sequence[StatsDict]) -> StatsDict:
        schema, weights = self._schema, self._weights
        out: StatsDict = {}
        need_rows = [k for k, m in schema.keys.items() if m.kind == "number"
                     and sum(w is not None for w in m.widths) > 1]
        columns: list[dict[str, np.ndarray]] = []
        self._row_groups: list[list[tuple[np.ndarray | None, Fraction]]] = []
        for i, core in enumerate(self._cores):
            back = {self._renames[i].get(k, k): k for k in core.meta.features}
            own = [back[k] for k in need_rows if schema.keys[k].widths[i] is not None]
            curated = core.curation is not None and bool(own)
            wanted = list(dict.fromkeys([*own, "index"])) if curated else own
            read = read_columns(core.files, core.meta, core.episodes, wanted) if own else {}
            # Rows grouped by their weight (mask None: every row, the component's weight).
            groups: list[tuple[np.ndarray | None, Fraction]] = [(None, weights[i])]
            if curated:
                numerator, denominator = curated_row_weights(core, read["index"])
                pairs = sorted(set(zip(numerator.tolist(), denominator.tolist())) - {(0, 1)})
                groups = [((numerator == n) & (denominator == d), weights[i] * Fraction(n, d)) for n, d in pairs]
            self._row_groups.append(groups)
            columns.append({self._renames[i].get(k, k): v for k, v in read.items() if k in own})
        for key, m in schema.keys.items():
            having = [i for i, w in enumerate(m.widths) if w is not None]
            if m.kind in NO_STATS:
                continue
            if m.kind == "camera":
                # Components without stats.json values for it (identity: count 0) do not count.
                known = [i for i in having if int(np.ravel(component_stats[i][key].get("count", [1]))[0]) > 0]
                if known:
                    out[key] = _combine_cameras([component_stats[i][key] for i in known],
                                                [float(weights[i]) * int(self._cores[i].num_anchors) for i in known])
                continue
            if len(having) == 1:
                (i,) = having
                out[key] = component_stats[i][key]
                continue
            out[key] = self._combined(m, [(i, columns[i][key]) for i in having])
        return out

    def _combined(self, m: MixtureKey, parts: Sequence[tuple[int, np.ndarray]]) -> dict[str, np.ndarray]:
        """One numeric key over the components that have it, each element over those for which it is real."""
        padded = [(i, _padded_values(v, m, m.widths[i] or 0), _real_elements(m, m.widths[i] or 0)) for i, v in parts]
        elements = int(np.prod(m.shape))
        out = {name: np.zeros(elements, np.float64) for name in
               ("min", "max", "mean", "std", "q01", "q10", "q50", "q90", "q99")}
        count = sum(len(v) if mask is None else int(mask.sum()) for i, v in parts for mask, _ in self._row_groups[i])
        patterns: dict[tuple[int, ...], list[int]] = {}
        for e in range(elements):
            patterns.setdefault(tuple(i for i, _, real in padded if real[e]), []).append(e)
        for members, chosen in patterns.items():
            group = [(values[:, chosen] if mask is None else values[mask][:, chosen], weight)
                     for i, values, _ in padded if i in members for mask, weight in self._row_groups[i]]
            stats = weighted_feature_stats([g for g, _ in group], [w for _, w in group], (len(chosen),))
            for name in out:
                out[name][chosen] = stats[name]
        result = {name: value.reshape(m.shape) for name, value in out.items()}
        result["count"] = np.array([count], np.int64)
        return result


