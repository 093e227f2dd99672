"""Fixtures for fault-injection tests: the session dataset on a FakeHub (and S3) behind a
ShapingProxy, download knobs set through ``EPISODESTREAM_DOWNLOAD_*`` (as the dataset
constructors read them), and a private permits directory per test so no budget leaks between
tests or into other runs on the machine."""

from __future__ import annotations

import os
import shutil
from collections import Counter

# huggingface_hub reads these when it is imported.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")

import pytest


from ..remote_streaming.conftest import REPO, assert_same_samples

# Fast reactions so a faulty epoch of the tiny dataset takes a second or two, not minutes.
FAST_KNOBS = dict(base_backoff_s=0.01, max_backoff_s=0.05, cooldown_s=0.2, increase_interval_s=0.2,
                  max_retry_after_s=0.2, max_attempts=10, request_timeout_s=10.0)


@pytest.fixture(scope="session")
def faults_hub_root(dataset_root, tmp_path_factory):
    """A FakeHub folder holding the session dataset as ``lerobot/main``."""
    root = tmp_path_factory.mktemp("faults-hub")
    shutil.copytree(dataset_root, root / "datasets" / REPO)
    return root


@pytest.fixture
def download_knobs(monkeypatch, tmp_path):
    """``download_knobs(**knobs)`` sets ``EPISODESTREAM_DOWNLOAD_<KNOB>`` for the test, always with a
    private permits directory (the budget and link estimates of this test only)."""

    def set_knobs(**knobs) -> None:
        knobs.setdefault("permits_dir", str(tmp_path / "permits"))
        for name, value in knobs.items():
            monkeypatch.setenv(f"EPISODESTREAM_DOWNLOAD_{name.upper()}", str(value))

    set_knobs()
    return set_knobs


def assert_same_epoch(got: list[dict], expected: list[dict]) -> None:
    """No sample lost or duplicated (index counts), and every sample's values equal, in order."""
    assert Counter(int(s["index"]) for s in got) == Counter(int(s["index"]) for s in expected)
    assert_same_samples(got, expected)


def cuts(fetch, reason: str) -> list:
    """Budget cuts whose reason starts with ``reason`` (e.g. "HTTP 429", "timeout"), all controllers."""
    return [change for controller in fetch.controllers().values() for change in controller.history()
            if change.new_budget < change.old_budget and change.reason.startswith(reason)]
