"""`accelerate launch` with 2 CPU processes (gloo) runs the multinode example: ranks get disjoint,
equal-sized shares, and a run stopped at a checkpoint resumes with exactly the remaining samples."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "scaling" / "train_streaming_multinode.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(out: Path, dataset: Path, *extra: str) -> None:
    if shutil.which("accelerate") is None:
        pytest.skip("accelerate is not installed (pip install 'episodestream[test]'): cannot launch 2 processes")
    if (os.cpu_count() or 1) < 2:
        pytest.skip(f"this machine has {os.cpu_count()} CPU(s): 2 processes cannot run side by side")
    # Accelerate runs several CPU processes only through its multi-GPU launcher with
    # ACCELERATE_USE_CPU set; each process then joins a gloo process group.
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    command = ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
               str(EXAMPLE), "--dataset", str(dataset), "--output-dir", str(out), "--record-indices",
               "--num-workers", "1", "--num-threads", "1", "--batch-size", "8", "--epochs", "1", *extra]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert result.returncode == 0, f"accelerate launch failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def _indices(out: Path) -> list[dict]:
    records = [json.loads(p.read_text()) for p in sorted(out.glob("indices-rank*.json"))]
    assert [r["rank"] for r in records] == [0, 1], f"expected one record per rank, got {records and [r['rank'] for r in records]}"
    assert all(r["world_size"] == 2 for r in records), "the processes did not form a group of 2"
    return records


def test_ranks_get_disjoint_equal_shares(many_episodes_root, tmp_path):
    _launch(tmp_path / "run", many_episodes_root, "--dummy")
    ranks = _indices(tmp_path / "run")
    frames = ranks[0]["len"] * 2
    first, second = (r["indices"] for r in ranks)
    assert len(first) == len(second) == ranks[0]["len"]
    overlap = set(first) & set(second)
    total = len({int(i) for i in first + second})
    # Beyond the documented fill-in (a rank one frame short repeats one of its own), disjoint.
    assert not overlap
    assert total >= frames - 1


@pytest.mark.parametrize("loader", ["episode", "dataloader"])
def test_resume_after_checkpoint_continues_exactly(many_episodes_root, tmp_path, loader):
    _launch(tmp_path / "full", many_episodes_root, "--checkpoint-every", "0", "--loader", loader)
    _launch(tmp_path / "resumed", many_episodes_root, "--checkpoint-every", "3", "--max-steps", "3",
            "--loader", loader)
    before = _indices(tmp_path / "resumed")
    for path in (tmp_path / "resumed").glob("indices-rank*.json"):
        path.unlink()
    _launch(tmp_path / "resumed", many_episodes_root, "--checkpoint-every", "0", "--loader", loader)
    after = _indices(tmp_path / "resumed")
    state = json.loads((tmp_path / "resumed" / "checkpoint" / "stream_state.json").read_text())
    assert state["stream"]["batches_consumed"] == 3 and state["step"] == 3
    for full, a, b in zip(_indices(tmp_path / "full"), before, after):
        assert len(a["indices"]) == 3 * 8
        assert a["indices"] + b["indices"] == full["indices"]

