"""Exact statistics of tabular values: the numbers LeRobot's ``stats.json`` holds, without its approximations.

What a feature's statistics are (the keys and shapes of LeRobot's ``compute_stats``): for a feature
of shape ``S`` (``(1,)`` for a scalar, ``(D,)`` for a vector), ``mean``, ``std``, ``min``, ``max`` and
the quantiles ``q01``, ``q10``, ``q50``, ``q90``, ``q99`` are float64 arrays of shape ``S``, taken
over the rows elementwise, and ``count`` is an int64 array of shape ``(1,)``: the number of rows.
``std`` is the population standard deviation (``ddof=0``), as LeRobot's.

Weighted rows. The rows come in parts (a dataset, or each component of a mixture), every row of part
``i`` weighing ``w_i > 0`` (a ``Fraction``). With ``W`` the total weight,

- ``mean = sum_j w_j x_j / W`` and ``std = sqrt(sum_j w_j (x_j - mean)^2 / W)``;
- ``min`` / ``max`` over every row (weights do not matter);
- the **weighted q-quantile** is the smallest value whose weighted share of rows at or below it
  reaches ``q``: ``Q(q) = min { x_j : sum_{k: x_k <= x_j} w_k >= q * W }`` (the inverse of the
  weighted empirical distribution function; Hyndman and Fan's type 1, numpy's
  ``method="inverted_cdf"``). With whole-number weights it is exactly
  ``np.quantile(np.repeat(x, w), q, method="inverted_cdf")`` of the rows repeated, and with equal
  weights the plain ``inverted_cdf`` quantile. It is always one of the data's values.

The comparison ``>= q * W`` is made in exact rational arithmetic (row counts times the parts'
``Fraction`` weights), so no rounding decides which value a quantile is. LeRobot instead keeps a
5,000-bin histogram per episode and merges datasets' quantiles as their frame-weighted mean, which
is not a quantile of the merged rows (LeRobot issues #3804, #4156).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction

import numpy as np

QUANTILES: dict[str, Fraction] = {"q01": Fraction(1, 100), "q10": Fraction(1, 10), "q50": Fraction(1, 2),
                                  "q90": Fraction(9, 10), "q99": Fraction(99, 100)}
STAT_NAMES = ("min", "max", "mean", "std", "count", *QUANTILES)


def _rank(q: Fraction, n: int) -> int:
    """The 0-based position of the q-quantile among ``n`` equally weighted sorted values."""
    return max(0, math.ceil(q * n) - 1)


def _as_rows(values: np.ndarray) -> np.ndarray:
    """(N, *shape) values as (N, size) for elementwise statistics (numbers and bools)."""
    return values.reshape(len(values), -1)


def _column_stats(column: np.ndarray) -> list[float]:
    """min, max, mean, std and the QUANTILES of one equally weighted column, in that order.

    The column is copied once into contiguous memory, where the reductions run at memory speed,
    and that copy is partitioned in place for the quantiles (a selection, no full sort)."""
    work = np.array(column, dtype=np.result_type(column.dtype, np.float32) if column.dtype == bool else None)
    n = len(work)
    mean = float(work.mean(dtype=np.float64))
    variance = 0.0
    block = 1 << 20
    for start in range(0, n, block):
        centred = work[start:start + block].astype(np.float64) - mean
        variance += float(np.dot(centred, centred))
    out = [float(work.min()), float(work.max()), mean, float(np.sqrt(variance / n))]
    _select(work, sorted({_rank(q, n) for q in QUANTILES.values()}))
    return out + [float(work[_rank(q, n)]) for q in QUANTILES.values()]


def _select(work: np.ndarray, ranks: list[int], offset: int = 0) -> None:
    """Put the values of ``ranks`` (positions in sorted order) in place, partitioning at the middle
    rank and then each side for its own: numpy's ``partition`` with five kth values at once was
    slower than a full sort, this a fifth of it (benchmarks/LOG.md, "Exact stats")."""
    if not ranks:
        return
    middle = ranks[len(ranks) // 2]
    work.partition(middle - offset)
    _select(work[:middle - offset], [r for r in ranks if r < middle], offset)
    _select(work[middle - offset + 1:], [r for r in ranks if r > middle], middle + 1)


def feature_stats(values: np.ndarray, shape: Sequence[int]) -> dict[str, np.ndarray]:
    """Statistics of equally weighted rows ``values`` (N >= 1 rows of ``shape``)."""
    if not len(values):
        raise ValueError("no rows to compute statistics of")
    rows = _as_rows(values)
    table = np.array([_column_stats(rows[:, d]) for d in range(rows.shape[1])], np.float64).T
    names = ("min", "max", "mean", "std", *QUANTILES)
    out = {name: row.reshape(tuple(shape)) for name, row in zip(names, table)}
    out["count"] = np.array([len(values)], np.int64)
    return {name: out[name] for name in STAT_NAMES}


def weighted_feature_stats(parts: Sequence[np.ndarray], weights: Sequence[Fraction],
                           shape: Sequence[int]) -> dict[str, np.ndarray]:
    """Statistics of the rows of ``parts`` (each (N_i, *shape)), every row of part ``i`` weighing
    ``weights[i]`` (see the module docstring). Parts without rows are left out."""
    kept = [(_as_rows(p), Fraction(w)) for p, w in zip(parts, weights) if len(p)]
    if not kept:
        raise ValueError("no rows to compute statistics of")
    if any(w <= 0 for _, w in kept):
        raise ValueError(f"weights must be positive, got {[str(w) for _, w in kept]}")
    width = kept[0][0].shape[1]
    counts = np.array([len(p) for p, _ in kept], np.float64)
    row_weights = np.array([float(w) for _, w in kept])
    shares = counts * row_weights / float(np.dot(counts, row_weights))  # each part's share of the total weight
    # Means and variances in float64, each part's about its own mean (accurate however large the
    # values), then pooled: the pooled variance is the weighted mean of (variance + squared offset).
    means = np.stack([p.mean(axis=0, dtype=np.float64) for p, _ in kept])
    variances = np.stack([_variance(p, m) for (p, _), m in zip(kept, means)])
    mean = shares @ means
    variance = shares @ (variances + (means - mean) ** 2)
    out: dict[str, np.ndarray] = {
        "min": np.min(np.stack([p.min(axis=0) for p, _ in kept]), axis=0).astype(np.float64),
        "max": np.max(np.stack([p.max(axis=0) for p, _ in kept]), axis=0).astype(np.float64),
        "mean": mean, "std": np.sqrt(variance),
        "count": np.array([int(counts.sum())], np.int64)}
    quantiles = np.stack([weighted_quantiles([p[:, d] for p, _ in kept], [w for _, w in kept])
                          for d in range(width)], axis=1)
    for name, row in zip(QUANTILES, quantiles):
        out[name] = row
    return {name: value if name == "count" else value.reshape(tuple(shape)) for name, value in out.items()}


def _variance(rows: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """Population variance of (N, D) rows about ``mean``, in float64, in blocks (no N x D float64 copy)."""
    total = np.zeros(rows.shape[1], np.float64)
    block = 1 << 20
    for start in range(0, len(rows), block):
        centred = rows[start:start + block].astype(np.float64) - mean
        total += np.einsum("ij,ij->j", centred, centred)
    return total / len(rows)


def weighted_quantiles(columns: Sequence[np.ndarray], weights: Sequence[Fraction],
                       quantiles: Mapping[str, Fraction] = QUANTILES) -> np.ndarray:
    """The weighted quantiles (module docstring) of 1-D ``columns``, each row of column ``i``
    weighing ``weights[i]``: one float64 per entry of ``quantiles``, in its order.

    Each column is sorted once; the weighted count at or below a value ``v`` is then
    ``sum_i w_i * searchsorted(sorted_i, v, "right")``, exact in ``Fraction``s, and the quantile is,
    over the columns, the smallest of each column's smallest value whose count reaches ``q * W``
    (a binary search per column: ``log N`` exact counts)."""
    ordered = [np.sort(c) for c in columns if len(c)]
    parts = [Fraction(w) for c, w in zip(columns, weights) if len(c)]
    total = sum((w * len(c) for c, w in zip(ordered, parts)), Fraction(0))

    def at_or_below(value) -> Fraction:
        return sum((w * int(np.searchsorted(c, value, side="right")) for c, w in zip(ordered, parts)), Fraction(0))

    out = []
    for q in quantiles.values():
        target = q * total
        best = None
        for column in ordered:
            lo, hi = 0, len(column) - 1  # the last value always reaches: its count is the total
            if at_or_below(column[hi]) < target:
                continue
            while lo < hi:
                mid = (lo + hi) // 2
                if at_or_below(column[mid]) >= target:
                    hi = mid
                else:
                    lo = mid + 1
            if best is None or column[lo] < best:
                best = column[lo]
        out.append(float(best))  # type: ignore[arg-type]  # some column always reaches the total
    return np.array(out, np.float64)


def identity_stats(shape: Sequence[int]) -> dict[str, np.ndarray]:
    """Statistics that every LeRobot normalization mode maps to the identity (mean 0, std 1,
    min / q01 / q10 -1, max / q90 / q99 1, q50 0): for padded dimensions and missing keys, whose
    zeros must stay zeros."""
    full = lambda value: np.full(tuple(shape), value, np.float64)  # noqa: E731
    return {"min": full(-1.0), "max": full(1.0), "mean": full(0.0), "std": full(1.0),
            "count": np.array([0], np.int64), "q01": full(-1.0), "q10": full(-1.0), "q50": full(0.0),
            "q90": full(1.0), "q99": full(1.0)}
