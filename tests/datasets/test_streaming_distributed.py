"""`accelerate launch` with 2 CPU processes (gloo) runs the multinode example: ranks get disjoint,
equal-sized shares of the dataset's frames, and a run stopped at a checkpoint resumes with exactly
the remaining samples."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
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


def _dataset_frames(root: Path) -> int:
    """The dataset's frames, counted in its data files (not by the code under test)."""
    return sum(pq.ParquetFile(path).metadata.num_rows for path in sorted(root.glob("data/**/*.parquet")))


@pytest.fixture(scope="module")
def uninterrupted(many_episodes_root, tmp_path_factory) -> list[dict]:
    """Each rank's record of one uninterrupted epoch (both loaders stream the same: one consumer
    per rank, batches of 8)."""
    out = tmp_path_factory.mktemp("full")
    _launch(out, many_episodes_root, "--dummy", "--checkpoint-every", "0", "--loader", "episode")
    return _indices(out)


def test_ranks_get_disjoint_equal_shares_of_the_frames(many_episodes_root, uninterrupted):
    frames = _dataset_frames(many_episodes_root)
    first, second = (r["indices"] for r in uninterrupted)
    assert len(first) == len(second) == -(-frames // 2) == uninterrupted[0]["len"] == uninterrupted[1]["len"]
    assert set(first) | set(second) == set(range(frames))
    # Beyond the documented fill-in (a rank one frame short repeats one of its own), disjoint.
    assert not set(first) & set(second)
    assert len(first) + len(second) - len(set(first + second)) == 2 * len(first) - frames


@pytest.mark.parametrize("saved_by,resumed_by", [("episode", "dataloader"), ("dataloader", "episode")])
def test_resume_after_checkpoint_continues_exactly(many_episodes_root, tmp_path, uninterrupted, saved_by,
                                                   resumed_by):
    """A run stopped at a checkpoint and restarted with the other loader (each resumes the other's
    state) yields exactly the uninterrupted samples; these runs train (the example's loop runs)."""
    _launch(tmp_path, many_episodes_root, "--checkpoint-every", "3", "--max-steps", "3", "--loader", saved_by)
    before = _indices(tmp_path)
    for path in tmp_path.glob("indices-rank*.json"):
        path.unlink()
    _launch(tmp_path, many_episodes_root, "--checkpoint-every", "0", "--loader", resumed_by)
    after = _indices(tmp_path)
    state = json.loads((tmp_path / "checkpoint" / "stream_state.json").read_text())
    assert state["stream"]["batches_consumed"] == 3 and state["step"] == 3
    for full, a, b in zip(uninterrupted, before, after):
        assert len(a["indices"]) == 3 * 8
        assert a["indices"] + b["indices"] == full["indices"]
