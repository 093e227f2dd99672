"""Regression: a workload of video spans only (no small requests, so the round trip is never
measured) must still have healthy windows. The slowdown reference used to stay at the default
bandwidth until both sample classes were measured, so every window of such a workload counted
as "slower than its best" and the budget never rose again (found by benchmarks/network, link b)."""

from __future__ import annotations

from episodestream.remote import ControllerConfig
from episodestream.testing.downloads import DownloadController, NodePermits

from ..remote_controller.test_controller import saturate


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds


def test_spans_only_workload_budget_rises_in_healthy_windows(tmp_path):
    clock = FakeClock()
    # Additive from the start, so each healthy window must add exactly one permit.
    config = ControllerConfig(floor_permits=4, initial_permits=8, slow_start_factor=1.0)
    controller = DownloadController(config=config, clock=clock, sleep=clock.sleep,
                                    permits=NodePermits(directory=tmp_path / "permits", default_budget=8))
    span_bytes, stream_bytes_per_s = 700 * 1024, 2e6  # far slower per stream than the 25 MB/s default
    budgets = []
    for _ in range(10):  # ten windows: busy (someone waits for a permit), steady link, no throttle
        end_s = clock.now_s + config.increase_interval_s
        while clock.now_s < end_s:  # a link with room: each permit carries 4 spans per window, so
            # goodput grows with the budget (from the moment it changes) and every probe is kept
            clock.now_s += config.increase_interval_s / (4 * controller.budget())
            controller.record_transfer(size_bytes=span_bytes, duration_s=0.05 + span_bytes / stream_bytes_per_s)
        saturate(controller)
        budgets.append(controller.budget())
    estimate = controller.estimate()
    assert estimate.bandwidth_measured and not estimate.latency_measured
    # A steady link and demand for more: it rises, one permit per healthy window.
    assert budgets[-1] >= 8 + 5 * config.increase_step
    assert all(0 <= b - a <= config.increase_step for a, b in zip(budgets, budgets[1:]))
