"""``EpisodeMixture``'s ``weights`` and ``stop``, checked once: Python or numpy numbers alike."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from episodestream._base.options import check_int

STOPS = ("all", "first")


def _is_number(value: Any, kind: type) -> bool:
    # numpy registers its scalars with ``numbers`` (np.float32 is a Real, np.int64 an Integral);
    # bools are numbers there too, and never a weight or a count.
    return isinstance(value, kind) and not isinstance(value, (bool, np.bool_))


def check_weights(weights: Sequence[float] | np.ndarray | None, count: int) -> tuple[float, ...] | None:
    """``weights`` normalised to sum 1, as floats; a list, tuple or 1-D array of ``count`` positive numbers."""
    if weights is None:
        return None
    if isinstance(weights, np.ndarray) and weights.ndim == 1:
        weights = weights.tolist()
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence) or len(weights) != count:
        raise ValueError(f"weights must be a list of {count} positive numbers (one per dataset), got {weights!r}.")
    bad = [w for w in weights if not _is_number(w, numbers.Real) or not math.isfinite(w) or w <= 0]
    if bad:
        raise ValueError(f"weights must be positive finite numbers, got {bad[0]!r} in {list(weights)!r}.")
    values = [float(w) for w in weights]
    try:
        total = math.fsum(values)
    except OverflowError:  # [1e308, 1e308]: scaled by the largest first, so that the sum is a float
        largest = max(values)
        values = [v / largest for v in values]
        total = math.fsum(values)
    normalised = tuple(v / total for v in values)
    if min(normalised) == 0.0:
        raise ValueError(f"weights {list(weights)!r} are too far apart: {min(weights)!r} is 0 as a share of their "
                         f"sum {total!r} in floating point. Raise the smallest weights.")
    return normalised


def check_stop(stop: Any) -> str | int:
    """``stop`` as "all", "first" or an int >= 1 (a Python or numpy integer, or a 0-d integer array)."""
    if isinstance(stop, np.ndarray) and stop.ndim == 0:
        stop = stop.item()
    if _is_number(stop, numbers.Integral):
        return check_int("stop", int(stop), minimum=1)
    if isinstance(stop, str) and stop in STOPS:
        return str(stop)
    raise ValueError(f"Invalid stop ({stop!r}). Supported values are 'all', 'first' or an int (samples per "
                     f"epoch across all ranks).")
