"""benchmarks/ray/benchmark_ray_train.py runs end to end on a tiny dataset: the Ray Train example's loop
under TorchTrainer and under ``accelerate launch``, each on 2 CPU processes, each training every step it
was asked for (through an epoch's end), and prints their ratio."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("ray.train", reason="Ray Train is not installed: pip install 'episodestream[ray]' (in the test extra)")
pytest.importorskip("accelerate", reason="Accelerate is not installed")

from .scripts import run_main  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ray" / "benchmark_ray_train.py"
STEPS, BATCH, WORKERS = 12, 4, 2  # 4 x 20 frames: 40 samples a rank an epoch, 10 steps: the loop goes into a second


@pytest.mark.slow
def test_both_routes_train_every_step_and_the_ratio_is_printed(tmp_path, capsys):
    run_main(SCRIPT, ["--cache-dir", str(tmp_path), "--episodes", "4", "--length", "20", "--steps", str(STEPS),
                      "--warmup", "2", "--batch-size", str(BATCH), "--workers", str(WORKERS), "--rounds", "1"])
    out = capsys.readouterr().out
    rows = {row["route"]: row for row in map(json.loads, re.findall(r"^\{.*\}$", out, flags=re.M))}
    assert set(rows) == {"ray", "accelerate"}
    for route, row in rows.items():
        assert row["samples"] == STEPS * BATCH * WORKERS, route
        assert row["steps"] == [STEPS] * WORKERS, route
        assert row["samples_per_s"] > 0 and row["startup_s"] > 0 and row["timed_s"] > 0, route
    assert re.search(r"^ray: .*benchmark_ray_train\.py .*--worker ray$", out, flags=re.M)
    assert re.search(r"^accelerate: ACCELERATE_USE_CPU=true .* -m accelerate\.commands\.launch --multi_gpu "
                     r"--num_processes 2 .*--worker accelerate$", out, flags=re.M)
    ratio = float(re.search(r"^round 1: ray / accelerate = ([\d.]+)$", out, flags=re.M).group(1))
    assert ratio == pytest.approx(rows["ray"]["samples_per_s"] / rows["accelerate"]["samples_per_s"], abs=1e-3)
    assert re.search(r"^ray / accelerate per round: [\d.]+; median [\d.]+$", out, flags=re.M)
