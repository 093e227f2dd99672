"""examples/ray/train_ray.py: Ray Train's TorchTrainer over EpisodeLoader, the stream state in Ray
Train's checkpoints; after an injected worker failure every sample of the epoch is trained on once,
in the order an uninterrupted run has (exact), and a rerun with another worker count goes on
elastically."""

from __future__ import annotations

import collections
import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("ray.train", reason="Ray Train is not installed: pip install 'episodestream[ray]' (in the test extra)")

from episodestream import EpisodeStreamingDataset  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ray" / "train_ray.py"
BATCH = 4


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("train_ray_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def recorded(folder: Path, rank: int) -> list[tuple[int, int]]:
    path = folder / f"rank{rank}.jsonl"
    return [tuple(json.loads(line)) for line in path.read_text().splitlines()] if path.exists() else []


def every_frame(root) -> collections.Counter:
    return collections.Counter((int(s["episode_index"]), int(s["frame_index"]))
                               for s in EpisodeStreamingDataset(root, rank=0, world_size=1))


def run(example, root, tmp_path, *extra: str) -> None:
    example.main(["--dataset", str(root), "--storage-path", str(tmp_path / "runs"), "--name", "run",
                  "--batch-size", str(BATCH), "--checkpoint-every", "3", "--record-dir", str(tmp_path / "records"),
                  *extra])


@pytest.mark.slow
def test_a_failed_worker_resumes_exactly(example, many_episodes_root, tmp_path, ray_cluster):
    run(example, many_episodes_root, tmp_path, "--num-workers", "2", "--fail-at-step", "5", "--max-failures", "1")
    assert (tmp_path / "runs" / "run.failed-once").exists()  # the failure happened, and Ray Train restarted
    for rank in range(2):  # each rank's samples: an uninterrupted run's, in its order
        share = EpisodeStreamingDataset(many_episodes_root, rank=rank, world_size=2, seed=0)
        assert recorded(tmp_path / "records", rank) == [(int(s["episode_index"]), int(s["frame_index"]))
                                                        for s in share]
    seen = collections.Counter(recorded(tmp_path / "records", 0) + recorded(tmp_path / "records", 1))
    assert set(seen) == set(every_frame(many_episodes_root))
    assert sum(seen.values()) - len(seen) <= 1  # at most one fill-in (an odd frame count over 2 ranks)


@pytest.mark.slow
def test_a_rerun_with_another_worker_count_resumes_elastically(example, many_episodes_root, tmp_path, ray_cluster):
    run(example, many_episodes_root, tmp_path, "--num-workers", "2", "--max-steps", "6")
    first = len(recorded(tmp_path / "records", 0)) + len(recorded(tmp_path / "records", 1))
    assert first == 2 * 6 * BATCH
    run(example, many_episodes_root, tmp_path, "--num-workers", "1")  # the same run's name: its latest checkpoint
    seen = collections.Counter(recorded(tmp_path / "records", 0) + recorded(tmp_path / "records", 1))
    assert seen == every_frame(many_episodes_root)  # every frame of the epoch once, none again
