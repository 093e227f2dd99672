"""benchmarks/streaming/benchmark_v2x.py runs end to end on tiny copies, local and from a fake Hub
behind a shaped link, and reports equal sample counts for v2.1 and v3.0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .scripts import run_main

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "streaming" / "benchmark_v2x.py"
TINY = ["--episodes", "2", "--episode-length", "20", "--height", "64", "--width", "64", "--batch-size", "8",
        "--pool-size", "2", "--trials", "1"]


@pytest.mark.slow
@pytest.mark.parametrize("source", ["local", "hub"])
def test_benchmark_v2x_runs(tmp_path, source):
    out = tmp_path / "out"
    run_main(SCRIPT, ["--source", source, *TINY, "--latency-ms", "1", "--cache-dir", str(tmp_path / "datasets"),
                      "--output-dir", str(out)])
    result = json.loads((out / f"v2x-{source}.json").read_text())
    assert set(result["ratios"]) == {"whole", "warm", "first_batch_s"} and result["ratios"]["whole"] > 0
    runs = result["runs"]
    assert result["paired_ratios"]["whole"] == [runs["v2.1"]["whole"][0] / runs["v3.0"]["whole"][0]]
    for version in ("v2.1", "v3.0"):
        assert len(result["runs"][version]["whole"]) == 1
    if source == "hub":
        assert all(link["requests"] > 0 for link in result["link"]["v2.1"])
