"""The scale benchmark runs end to end on a tiny dataset and prints its table, results and plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "scale" / "benchmark_scale.py"


def test_scale_benchmark_smoke(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, str(SCRIPT), "--sizes", "40", "--episode-length", "20", "40",
                             "--kinds", "construct", "resume-elastic-90", "random",
                             "--random-samples", "20", "--data-dir", str(tmp_path / "data"), "--output-dir", str(out)],
                            capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    (row,) = json.loads((out / "results.json").read_text())
    assert row["episodes"] == 40 and row["len"] > 0 and row["random_samples_per_s"] > 0
    # Each kind runs in a fresh interpreter (~1.8 s here): exact resume is the same code as elastic
    # with the world size kept, so the smoke runs one of them.
    assert {"construct_s", "first_sample_s", "resume_elastic_90_s"} <= set(row)
    assert "| episodes |" in result.stdout and (out / "scale.png").stat().st_size > 0
