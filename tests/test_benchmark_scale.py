"""The scale benchmark runs end to end on a tiny dataset and prints its table, results and plot."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from .scripts import load_script, run_own_commands_in_process

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "scale" / "benchmark_scale.py"


def test_scale_benchmark_smoke(tmp_path, capsys, monkeypatch):
    # The script's main() runs in this process, and so does each measurement it starts in a fresh
    # interpreter (its command, --measure entry point and printed row: run_own_commands_in_process):
    # one kind through main(), the others through measure(), the same code.
    data = tmp_path / "data"
    script = load_script(SCRIPT)
    commands = run_own_commands_in_process(script, monkeypatch)
    assert script.main(["--sizes", "40", "--episode-length", "20", "40", "--kinds", "construct",
                        "--random-samples", "20", "--pool-size", "64", "--data-dir", str(data),
                        "--output-dir", str(out := tmp_path / "out")]) == 0
    assert [command[2:4] for command in commands] == [["--measure", "construct"]]
    captured = capsys.readouterr()
    (row,) = json.loads((out / "results.json").read_text())
    assert row["episodes"] == 40 and row["pool_size"] == 64 and row["len"] > 0, captured.err[-4000:]
    assert {"construct_s", "first_sample_s"} <= set(row), captured.err[-4000:]
    assert "| episodes |" in captured.out and (out / "scale.png").stat().st_size > 0
    (root,) = data.iterdir()
    args = argparse.Namespace(world_size=8, batch_size=32, random_samples=20, worker_batches=20, pool_size=64)
    # Exact resume is the same code as elastic with the world size kept: the smoke measures one, with
    # a pool wider than the rank's episodes (--pool-size).
    assert script.measure("resume-elastic-90", str(root), args)["resume_elastic_90_s"] > 0
    assert script.measure("random", str(root), args)["random_samples_per_s"] > 0
    # How a rank's stream starts (the scale table's first-20,000-samples column), on the same data.
    start = load_script(SCRIPT.parent / "benchmark_stream_start.py")
    assert start.main([str(root), "--samples", "30", "--world-size", "2"]) == 0
    assert re.fullmatch(r"pool \d+: construct [0-9.]+ s, first sample [0-9.]+ s, first 30 samples [0-9,]+/s, "
                        r"RSS above the interpreter -?\d+ MB\n", capsys.readouterr().out)
    stats = script.measure("stats", str(root), args)
    assert stats["stats_count"] >= row["len"] and stats["stats_cached_s"] < stats["stats_first_s"] + 1, stats
