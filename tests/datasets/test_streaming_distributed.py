"""`accelerate launch` with 2 CPU processes (gloo) runs the multinode example: ranks get disjoint,
equal-sized shares of the dataset's frames, and a run stopped at a checkpoint resumes with exactly
the remaining samples, a DataLoader resuming EpisodeLoader's state."""

from __future__ import annotations

import json
import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodestream import EpisodeStreamingDataset

from ..scripts import load_script
from ..stream_model import expected_samples
from .forked_ranks import free_port, run_forked_ranks

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "scaling" / "train_streaming_multinode.py"
ACCELERATE_LAUNCH = [sys.executable, "-m", "accelerate.commands.launch"]


def skip_unless_two_processes_can_run() -> None:
    if importlib.util.find_spec("accelerate") is None:
        pytest.skip("accelerate is not installed (pip install 'episodestream[test]'): cannot launch 2 processes")
    if (os.cpu_count() or 1) < 2:
        pytest.skip(f"this machine has {os.cpu_count()} CPU(s): 2 processes cannot run side by side")


def _example_arguments(out: Path, dataset: Path, *extra: str) -> list[str]:
    return ["--dataset", str(dataset), "--output-dir", str(out), "--record-indices", "--num-workers", "1",
            "--num-threads", "1", "--batch-size", "8", "--epochs", "1", *extra]


def documented_cpu_launch() -> tuple[dict[str, str], list[str]]:
    """The example docstring's 2-process CPU command (the line with --dummy): its environment
    assignments and its `accelerate launch` options. It runs Accelerate's launcher with the venv's
    interpreter, as every documented command does (a bare `accelerate` needs the venv activated:
    "accelerate: command not found", issue 64 item 6)."""
    line = next(line for line in EXAMPLE.read_text().split('"""')[1].splitlines() if "--dummy" in line)
    words = shlex.split(line)
    launcher = words.index(".venv/bin/python")
    assert words[launcher + 1:launcher + 3] == ACCELERATE_LAUNCH[1:], line
    env = dict(word.split("=", 1) for word in words[:launcher])
    script = next(i for i, word in enumerate(words) if word.endswith(EXAMPLE.name))
    return env, words[launcher + 3:script]


def _launch(out: Path, dataset: Path, *extra: str) -> str:
    """The example under a real `accelerate launch` with the options and environment its docstring
    gives users (it said `--cpu`, which starts one process); its stdout."""
    skip_unless_two_processes_can_run()
    documented_env, options = documented_cpu_launch()
    # This interpreter's accelerate (not the first on PATH), and this checkout's episodestream in
    # the processes it starts (not another install's); the options after the documented ones only
    # quiet Accelerate's warnings and keep parallel tests off each other's port.
    env = {**os.environ, **documented_env, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [*ACCELERATE_LAUNCH, *options, "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend",
               "no", "--main_process_port", str(free_port()), str(EXAMPLE), *_example_arguments(out, dataset, *extra)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert result.returncode == 0, f"accelerate launch failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def _fork(out: Path, dataset: Path, *extra: str) -> str:
    """The example's main() in 2 ranks forked from this process (forked_ranks: the environment
    `accelerate launch` gives them, without 3 fresh interpreters)."""
    skip_unless_two_processes_can_run()
    example = load_script(EXAMPLE)
    run_forked_ranks(lambda: example.main(_example_arguments(out, dataset, *extra)))
    return ""


def _indices(out: Path) -> list[dict]:
    records = [json.loads(p.read_text()) for p in sorted(out.glob("indices-rank*.json"))]
    assert [r["rank"] for r in records] == [0, 1], f"expected one record per rank, got {records and [r['rank'] for r in records]}"
    assert all(r["world_size"] == 2 for r in records), "the processes did not form a group of 2"
    return records


def _dataset_indices(root: Path) -> dict[tuple[int, int], int]:
    """(episode_index, frame_index) -> index, read from the dataset's data files (not by the code under test)."""
    columns = ["episode_index", "frame_index", "index"]
    table = pa.concat_tables(pq.read_table(path, columns=columns) for path in sorted(root.glob("data/**/*.parquet")))
    return {(e, f): i for e, f, i in zip(*(table[c].to_pylist() for c in columns))}


# One epoch in two launches: EpisodeLoader saves a checkpoint at step 3 and stops (a real
# `accelerate launch`); a DataLoader (one worker per rank) resumes from that state and runs to the
# end (forked ranks). (Each loader resuming the other's state both ways is tested in one process,
# in test_loader and test_resume; a real launch costs ~6 s of CPU here.) (loader, arguments, the
# step its checkpoint is saved at, or None, and how the ranks start).
LEGS = (("episode", ("--checkpoint-every", "3", "--max-steps", "3"), 3, _launch),
        ("dataloader", ("--checkpoint-every", "0"), None, _fork))


@pytest.fixture(scope="module")
def legs(many_episodes_root, tmp_path_factory) -> list[tuple[list[dict], dict | None, str]]:
    """Each launch's per-rank records and the stream state it saved. The first launch trains (the
    example's loop runs) and saves at a checkpoint; the second runs to the end of the epoch."""
    out = tmp_path_factory.mktemp("legs")
    launches = []
    for loader, arguments, saved_at, start in LEGS:
        stdout = start(out, many_episodes_root, "--loader", loader, *arguments)
        records = _indices(out)
        for path in out.glob("indices-rank*.json"):
            path.unlink()
        state = json.loads((out / "checkpoint" / "stream_state.json").read_text()) if saved_at else None
        launches.append((records, state, stdout))
    return launches


def test_the_documented_cpu_command_starts_two_ranks(legs):
    """The docstring's CPU command (`--cpu` before, which ran one process of world size 1 and
    printed "(all ranks)") starts 2 ranks, and the example says the world size it saw; the ranks'
    shares are disjoint (next test)."""
    records, _, stdout = legs[0]  # the real `accelerate launch`
    assert [(r["rank"], r["world_size"]) for r in records] == [(0, 2), (1, 2)]
    assert "world size 2 (MULTI_CPU)" in stdout and "(all 2 ranks)" in stdout, stdout
    assert not set(records[0]["indices"]) & set(records[1]["indices"])


def _per_rank(legs) -> list[list[int]]:
    return [sum((records[rank]["indices"] for records, _, _ in legs), []) for rank in range(2)]


def test_ranks_get_disjoint_equal_shares_of_the_frames(many_episodes_root, legs):
    frames = len(_dataset_indices(many_episodes_root))
    first, second = _per_rank(legs)
    assert len(first) == len(second) == -(-frames // 2) == legs[0][0][0]["len"] == legs[0][0][1]["len"]
    assert set(first) | set(second) == set(range(frames))
    # Beyond the documented fill-in (a rank one frame short repeats one of its own), disjoint.
    assert not set(first) & set(second)
    assert len(first) + len(second) - len(set(first + second)) == 2 * len(first) - frames


def test_resume_with_the_other_loader_continues_exactly(many_episodes_root, legs):
    """A run stopped at a checkpoint by EpisodeLoader and restarted with a DataLoader, which
    resumes the loader's state, yields exactly each rank's uninterrupted stream: the schedule of
    one consumer per rank, which test_stream_properties checks against real loaders."""
    index_of = _dataset_indices(many_episodes_root)
    for (records, state, _), (_, _, saved_at, _) in zip(legs, LEGS):
        if saved_at is not None:
            assert state["step"] == saved_at and state["stream"]["batches_consumed"] == saved_at
            assert all(len(r["indices"]) == 3 * 8 for r in records)
    for rank, streamed in enumerate(_per_rank(legs)):
        dataset = EpisodeStreamingDataset(many_episodes_root, seed=0, rank=rank, world_size=2)
        expected = [index_of[pair] for pair in expected_samples(dataset, num_workers=1, epoch=0)]
        assert streamed == expected, f"rank {rank}"
