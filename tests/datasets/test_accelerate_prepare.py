"""`accelerate launch` with 2 CPU processes (gloo): ``accelerator.prepare(DataLoader(dataset))``
re-shards what our dataset already split by rank, and the first batch says so; the Accelerator
``episodestream lerobot-train`` builds places the loader on the device only, so the 2 ranks together
see every frame of the epoch once (the dispatcher, Accelerate's default, is checked in one process
in tests/test_accelerate_guard.py; with LeRobot, tests/with_lerobot trains on 2 processes)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

from .test_streaming_distributed import ACCELERATE_LAUNCH, _free_port

pytestmark = pytest.mark.distributed

SCRIPT = Path(__file__).with_name("accelerate_prepare.py")
REPO = Path(__file__).resolve().parents[2]


def test_prepare_is_refused_and_lerobot_trains_accelerator_covers_the_epoch(camera_less_root, tmp_path):
    if importlib.util.find_spec("accelerate") is None:
        pytest.skip("accelerate is not installed (pip install 'episodestream[test]'): cannot launch 2 processes")
    if (os.cpu_count() or 1) < 2:
        pytest.skip(f"this machine has {os.cpu_count()} CPU(s): 2 processes cannot run side by side")
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [*ACCELERATE_LAUNCH, "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
               str(SCRIPT), str(camera_less_root), str(tmp_path)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert result.returncode == 0, f"accelerate launch failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in records] == [2, 2], "the processes did not form a group of 2"
    for record in records:
        assert "IterableDatasetShard" in record["refused"] and f"rank {record['rank']} of 2" in record["refused"]
    seen = records[0]["indices"] + records[1]["indices"]
    frames = 154  # camera_less_root: sum(TABULAR_LENGTHS)
    assert len(records[0]["indices"]) == len(records[1]["indices"]) == frames // 2
    assert sorted(seen) == list(range(frames)), "every frame once across the 2 ranks"
