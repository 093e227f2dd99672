"""The scale benchmark runs end to end on a tiny dataset and prints its table, results and plot."""

from __future__ import annotations

import json
from pathlib import Path

from .scripts import run_main

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "scale" / "benchmark_scale.py"


def test_scale_benchmark_smoke(tmp_path, capsys):
    # The script's main() runs in this process (another interpreter would cost ~2 s of CPU); each
    # measurement still runs in a fresh interpreter of its own, as the benchmark does.
    run_main(SCRIPT, ["--sizes", "40", "--episode-length", "20", "40", "--kinds", "construct", "resume-elastic-90",
                      "random", "stats", "--random-samples", "20", "--data-dir", str(tmp_path / "data"),
                      "--output-dir", str(out := tmp_path / "out")])
    captured = capsys.readouterr()
    (row,) = json.loads((out / "results.json").read_text())
    assert row["episodes"] == 40 and row["len"] > 0 and row["random_samples_per_s"] > 0, captured.err[-4000:]
    # Each kind runs in a fresh interpreter (~1.8 s here): exact resume is the same code as elastic
    # with the world size kept, so the smoke runs one of them.
    assert {"construct_s", "first_sample_s", "resume_elastic_90_s"} <= set(row), captured.err[-4000:]
    assert row["stats_count"] >= row["len"] and row["stats_cached_s"] < row["stats_first_s"] + 1, captured.err[-4000:]
    assert "| episodes |" in captured.out and (out / "scale.png").stat().st_size > 0
