"""The tests run where pytest-xdist is not installed: LeRobot's venv (tests/with_lerobot's command,
``-o addopts=""``) has no xdist, and a conftest hook of xdist's that pytest cannot validate stops
every test there with an INTERNALERROR before any runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_conftest_loads_without_xdist():
    # ``-p no:xdist`` is a venv without it: xdist's hook specifications are never registered. The
    # conftest loads before any test module; one that imports neither torch nor the package keeps
    # this interpreter at ~0.5 s of CPU (a module importing torch made it ~3 s).
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-o", "addopts=", "-p", "no:cacheprovider",
                          "--collect-only", "-q", "tests/test_slurm.py"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "INTERNALERROR" not in run.stdout + run.stderr
    assert "tests collected" in run.stdout or "test collected" in run.stdout


def test_auto_starts_one_test_process_per_core(monkeypatch):
    """``-n auto`` (pyproject addopts) started 3 workers on 2 cores (issue 64 item 9): one per core now."""
    import os

    from .conftest import pytest_xdist_auto_num_workers

    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    assert pytest_xdist_auto_num_workers(None) == len(os.sched_getaffinity(0))
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "5")
    assert pytest_xdist_auto_num_workers(None) is None  # xdist's own hook reads the variable
