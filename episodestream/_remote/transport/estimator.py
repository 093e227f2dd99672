"""Measuring the link: single-stream bandwidth and transfer-free round trip from finished
transfers (``LinkEstimator``), each transfer classified once (``classify_transfer``)."""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from episodestream._remote.transport.config import ControllerConfig

SampleClass = Literal["bandwidth", "latency"]


@dataclass(frozen=True)
class LinkEstimate:
    """One reading of the estimator. ``*_measured`` is False while the value is the default."""

    bandwidth_bytes_per_s: float
    rtt_s: float
    lowest_rtt_s: float
    object_bytes: float
    bandwidth_samples: int
    latency_samples: int
    bandwidth_measured: bool
    latency_measured: bool

    def describe(self) -> str:
        def source(measured: bool, samples: int) -> str:
            return f"{samples} samples" + ("" if measured else ", default")
        return (f"bandwidth {self.bandwidth_bytes_per_s / 1e6:.2f} MB/s "
                f"({source(self.bandwidth_measured, self.bandwidth_samples)}), "
                f"rtt {self.rtt_s * 1e3:.1f} ms (lowest {self.lowest_rtt_s * 1e3:.1f} ms; "
                f"{source(self.latency_measured, self.latency_samples)}), "
                f"mean request {self.object_bytes / 1024:.0f} KiB")


def classify_transfer(config: ControllerConfig, *, size_bytes: int, duration_s: float) -> SampleClass | None:
    """Which class of sample a finished transfer is (see ``LinkEstimator``); validates it."""
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes < 0:
        raise ValueError(f"size_bytes must be an int >= 0, got {size_bytes!r}.")
    if isinstance(duration_s, bool) or not isinstance(duration_s, (int, float)) \
            or not duration_s >= 0 or not math.isfinite(duration_s):
        raise ValueError(f"duration_s must be a finite number >= 0, got {duration_s!r}.")
    if size_bytes >= config.bandwidth_min_bytes and duration_s > 0:
        return "bandwidth"
    if size_bytes <= config.latency_max_bytes:
        return "latency"
    return None


class LinkEstimator:
    """Single-stream bandwidth and transfer-free round trip, from finished transfers.

    A transfer is a *bandwidth sample* when it moved at least ``bandwidth_min_bytes`` over one
    stream (every read is one request on one stream: no parallel gathers, no hedged requests):
    ``size / duration``, nothing subtracted, so a sample can never be faster than the transfer
    really was. It is a *latency sample* when it moved at most ``latency_max_bytes``; its
    round trip is ``max(min_rtt_s, duration - size / bandwidth)``, using the bandwidth estimate
    current when the round trip is computed. Sizes in between are neither. Each class keeps its
    last ``window_samples`` and reports the median, or the default until ``min_samples`` of that
    class have been seen. The mean of recent request sizes (every transfer) is the model's
    object size. ``lowest_rtt_s`` is the smallest round-trip estimate seen: queueing can only
    raise the round trip, so this is the part of it the link's distance explains.
    """

    def __init__(self, *, config: ControllerConfig) -> None:
        self.config = config
        window = config.window_samples
        self._bandwidth: deque[float] = deque(maxlen=window)
        self._small: deque[tuple[int, float]] = deque(maxlen=window)
        self._sizes: deque[int] = deque(maxlen=window)
        self._bandwidth_count = 0
        self._latency_count = 0
        self._lowest_rtt_s: float | None = None

    def add_transfer(self, *, size_bytes: int, duration_s: float) -> SampleClass | None:
        """Record one finished transfer; returns the class it was a sample of, if any."""
        kind = classify_transfer(self.config, size_bytes=size_bytes, duration_s=duration_s)
        self._sizes.append(size_bytes)
        if kind == "bandwidth":
            self._bandwidth.append(size_bytes / duration_s)
            self._bandwidth_count += 1
        elif kind == "latency":
            self._small.append((size_bytes, float(duration_s)))
            self._latency_count += 1
        if kind is not None and self.latency_measured:
            rtt_s = self.rtt_s()
            self._lowest_rtt_s = rtt_s if self._lowest_rtt_s is None else min(self._lowest_rtt_s, rtt_s)
        return kind

    @property
    def bandwidth_measured(self) -> bool:
        return self._bandwidth_count >= self.config.min_samples

    @property
    def latency_measured(self) -> bool:
        return self._latency_count >= self.config.min_samples

    def bandwidth_bytes_per_s(self) -> float:
        if not self.bandwidth_measured:
            return self.config.default_bandwidth_bytes_per_s
        return statistics.median(self._bandwidth)

    def rtt_s(self) -> float:
        if not self.latency_measured:
            return self.config.default_rtt_s
        bandwidth = self.bandwidth_bytes_per_s()
        return statistics.median(max(self.config.min_rtt_s, duration - size / bandwidth)
                                 for size, duration in self._small)

    def lowest_rtt_s(self) -> float:
        return self.config.default_rtt_s if self._lowest_rtt_s is None else self._lowest_rtt_s

    def object_bytes(self) -> float:
        if len(self._sizes) < self.config.min_samples:
            return float(self.config.default_object_bytes)
        return max(1.0, statistics.fmean(self._sizes))

    def estimate(self) -> LinkEstimate:
        return LinkEstimate(self.bandwidth_bytes_per_s(), self.rtt_s(), self.lowest_rtt_s(),
                            self.object_bytes(), self._bandwidth_count, self._latency_count,
                            self.bandwidth_measured, self.latency_measured)

    def state_dict(self) -> dict[str, Any]:
        return {"bandwidth": list(self._bandwidth), "small": [list(s) for s in self._small],
                "sizes": list(self._sizes), "bandwidth_count": self._bandwidth_count,
                "latency_count": self._latency_count, "lowest_rtt_s": self._lowest_rtt_s}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._bandwidth.clear()
        self._bandwidth.extend(state.get("bandwidth", ()))
        self._small.clear()
        self._small.extend((int(s), float(d)) for s, d in state.get("small", ()))
        self._sizes.clear()
        self._sizes.extend(state.get("sizes", ()))
        self._bandwidth_count = int(state.get("bandwidth_count", 0))
        self._latency_count = int(state.get("latency_count", 0))
        self._lowest_rtt_s = state.get("lowest_rtt_s")
