"""Against the real LeRobot (0.6): ``dataset.meta`` answers as ``LeRobotDatasetMetadata`` does,
``episodestream.lerobot.make_train_eval_datasets`` returns LeRobot's samples and split, and
``episodestream lerobot-train`` trains ACT on the CPU, resumes the data stream exactly from a
checkpoint, refuses another run's checkpoint before training, and trains on 2 processes.

CI has no LeRobot (it needs Python >= 3.12 and torchvision): every test here skips with the reason
there. Locally: a Python venv with LeRobot 0.6 and this package installed (pip install -e .); then
``HF_HUB_OFFLINE=1 VENV/bin/python -m pytest -o addopts= -p no:cacheprovider tests/with_lerobot``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

try:
    import lerobot  # noqa: F401
    from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata
except ImportError as error:  # CI: LeRobot is not installed
    pytest.skip(f"LeRobot is not importable here ({error}); these tests need a LeRobot 0.6 venv "
                f"(LeRobot needs Python >= 3.12 and torchvision)", allow_module_level=True)

from episodestream import EpisodeDataset, EpisodeStreamingDataset, split_episodes
from episodestream.lerobot import make_train_eval_datasets
from episodestream.tools.synthetic import write_synthetic_dataset

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RECORDER = HERE / "record_train.py"
LENGTHS = [12, 9, 15, 8, 10, 11]  # 65 frames: 17 batches of 4, so an epoch ends inside the runs below
TINY_ACT = ["--policy.type=act", "--policy.device=cpu", "--policy.push_to_hub=false",
            "--policy.pretrained_backbone_weights=null", "--policy.dim_model=32", "--policy.n_heads=2",
            "--policy.n_encoder_layers=1", "--policy.n_decoder_layers=1", "--policy.dim_feedforward=32",
            "--policy.latent_dim=8", "--policy.chunk_size=4", "--policy.n_action_steps=4",
            "--wandb.enable=false", "--log_freq=1"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = tmp_path_factory.mktemp("lerobot") / "ds"
    write_synthetic_dataset(path, num_episodes=len(LENGTHS), episode_length=LENGTHS,
                            cameras=("observation.images.front",), height=64, width=64, seed=0)
    return path


def _config(root, **dataset):
    from lerobot.configs.default import DatasetConfig
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.policies.act.configuration_act import ACTConfig

    cfg = TrainPipelineConfig(dataset=DatasetConfig(repo_id="local/ds", root=str(root), **dataset),
                              policy=ACTConfig(device="cpu", push_to_hub=False, chunk_size=4, n_action_steps=4),
                              output_dir=Path(root).parent / "unused-output")
    cfg.validate()
    return cfg


def _equal(ours, theirs, where):
    assert ours.keys() == theirs.keys(), f"{where}: keys differ: {set(ours) ^ set(theirs)}"
    for key, value in theirs.items():
        if isinstance(value, torch.Tensor):
            assert ours[key].dtype == value.dtype and torch.equal(ours[key], value), f"{where}: {key}"
        else:
            assert ours[key] == value, f"{where}: {key}"


def test_meta_answers_as_lerobots(root):
    theirs = LeRobotDatasetMetadata("local/ds", root=root)
    ours = EpisodeStreamingDataset(root).meta
    for name in ("features", "fps", "robot_type", "total_episodes", "total_frames", "total_tasks", "chunks_size",
                 "data_files_size_in_mb", "video_files_size_in_mb", "data_path", "video_path", "video_keys",
                 "image_keys", "camera_keys", "depth_keys", "names", "shapes", "has_language_columns", "tools",
                 "root", "_version"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.info.to_dict() == theirs.info.to_dict()
    assert type(ours.episodes) is type(theirs.episodes)
    assert ours.episodes.column_names == theirs.episodes.column_names
    assert ours.episodes.to_list() == theirs.episodes.to_list()
    assert ours.episodes["tasks"][3] == theirs.episodes["tasks"][3]
    assert ours.tasks.equals(theirs.tasks)
    assert ours.get_task_index("synthetic task 1") == theirs.get_task_index("synthetic task 1")
    for episode in (0, 5):
        assert ours.get_data_file_path(episode) == theirs.get_data_file_path(episode)
        assert ours.get_video_file_path(episode, "observation.images.front") == \
            theirs.get_video_file_path(episode, "observation.images.front")
    assert ours.filter_episodes(lambda e: e["length"] > 10) == theirs.filter_episodes(lambda e: e["length"] > 10)
    assert ours.stats.keys() == theirs.stats.keys()
    for key, stats in theirs.stats.items():
        for name, value in stats.items():
            np.testing.assert_array_equal(ours.stats[key][name], value, err_msg=f"{key}/{name}")


@pytest.mark.parametrize("episodes", [None, [5, 0, 2, 3]])
def test_factory_gives_lerobots_samples_and_split(root, episodes):
    from lerobot.datasets.factory import make_train_eval_datasets as lerobots

    cfg = _config(root, episodes=episodes, eval_split=0.34)
    their_train, their_eval = lerobots(cfg)
    our_train, our_eval = make_train_eval_datasets(cfg)
    assert type(our_train) is EpisodeDataset and type(our_eval) is EpisodeDataset
    assert (our_train.episodes, our_eval.episodes) == (their_train.episodes, their_eval.episodes)
    assert (len(our_train), len(our_eval)) == (len(their_train), len(their_eval))
    assert our_train.absolute_to_relative_idx == their_train.absolute_to_relative_idx
    for i in (0, 7, len(their_train) - 1):
        _equal(our_train[i], their_train[i], f"train[{i}]")
    _equal(our_eval[len(their_eval) - 1], their_eval[len(their_eval) - 1], "eval[-1]")
    # ImageNet stats replace the camera's, as LeRobot's factory does (use_imagenet_stats=True by default).
    torch.testing.assert_close(torch.as_tensor(our_train.meta.stats["observation.images.front"]["mean"]),
                               torch.as_tensor(their_train.meta.stats["observation.images.front"]["mean"]))

    streaming, held_out = make_train_eval_datasets(_config(root, episodes=episodes, streaming=True))
    assert type(streaming) is EpisodeStreamingDataset and held_out is None
    assert streaming.seed == cfg.seed and streaming.episodes == episodes
    assert sorted(s["index"].item() for s in streaming) == sorted([*their_train.hf_dataset["index"],
                                                                   *their_eval.hf_dataset["index"]])


@pytest.mark.parametrize("episodes", [None, [5, 0, 2, 3], [1, 4]])
@pytest.mark.parametrize("fraction", [0.1, 0.34, 0.5])
def test_split_episodes_is_lerobots_split(tasks_root, episodes, fraction):
    """``split_episodes`` (seed None) equals LeRobot's own factory's train/eval episodes."""
    from lerobot.datasets.factory import make_train_eval_datasets as lerobots

    their_train, their_eval = lerobots(_config(tasks_root, episodes=episodes, eval_split=fraction))
    source = tasks_root if episodes is None else EpisodeDataset(tasks_root, episodes=episodes)
    assert split_episodes(source, fraction) == (their_train.episodes, their_eval.episodes)


@pytest.fixture(scope="module")
def tasks_root(tmp_path_factory):
    """10 episodes over 3 tasks, so that groups of several sizes are split."""
    path = tmp_path_factory.mktemp("lerobot") / "tasks"
    write_synthetic_dataset(path, num_episodes=10, episode_length=4, cameras=("observation.images.front",),
                            height=64, width=64, num_tasks=3, seed=0)
    return path


def test_factory_names_the_field_it_cannot_read(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"dataset.root='.*nowhere' is not a folder: nothing is there"):
        make_train_eval_datasets(_config(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match=r"dataset.root='.*_i0'.*meta/info.json not found"):
        make_train_eval_datasets(_config(tmp_path))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(record: Path, *args: str, processes: int = 1) -> subprocess.CompletedProcess:
    record.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RECORD_DIR": str(record), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    if processes == 1:
        command = [sys.executable, str(RECORDER), *args]
    else:
        accelerate = Path(sys.executable).with_name("accelerate")
        env["ACCELERATE_USE_CPU"] = "true"  # several CPU processes, each joining a gloo group
        command = [str(accelerate), "launch", "--multi_gpu", "--num_processes", str(processes), "--num_machines", "1",
                   "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
                   str(RECORDER), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=400, cwd=record)


def _steps(record: Path, rank: int = 0) -> list[list[int]]:
    return [json.loads(line) for line in (record / f"rank{rank}.jsonl").read_text().splitlines()]


def _ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, f"training failed:\n{result.stdout[-3000:]}\n{result.stderr[-4000:]}"


@pytest.mark.slow
def test_lerobot_train_resumes_the_stream_exactly(root, tmp_path):
    data = ["--dataset.repo_id=local/ds", f"--dataset.root={root}", "--dataset.streaming=true", "--batch_size=4"]
    # 18 steps of 4 from 65 frames: the epoch ends after step 17 (a batch of 1), so the resume
    # below at step 16 continues epoch 0 and goes on into epoch 1.
    _ok(_train(tmp_path / "whole", *data, *TINY_ACT, "--num_workers=0", f"--output_dir={tmp_path / 'out'}",
               "--steps=19", "--save_freq=16"))
    whole = _steps(tmp_path / "whole")
    assert [len(b) for b in whole] == [4] * 16 + [1, 4, 4]
    assert sorted(i for b in whole[:17] for i in b) == list(range(65))  # epoch 0: every frame once
    reference = [s["index"].item() for s in torch.utils.data.DataLoader(
        EpisodeStreamingDataset(root, seed=1000, delta_timestamps={"action": [i / 30 for i in range(4)]}))]
    assert [i for b in whole[:17] for i in b] == reference  # the plain DataLoader's order, as LeRobot loops it

    checkpoint = tmp_path / "out/checkpoints/000016"
    state = json.loads((checkpoint / "training_state/episodestream_stream_state.json").read_text())
    assert (state["epoch"], state["batches_consumed"], state["batch_size"]) == (0, 16, 4)
    config = checkpoint / "pretrained_model/train_config.json"
    # Resumed with 2 DataLoader workers (the checkpoint's run had none): elastic, same samples set.
    resumed_run = _train(tmp_path / "resumed", f"--config_path={config}", "--resume=true", "--num_workers=2",
                         "--steps=19")
    _ok(resumed_run)
    resumed = _steps(tmp_path / "resumed")
    assert [len(b) for b in resumed] == [1, 4, 4]
    assert resumed[0] == whole[16], "the rest of epoch 0 is the frame the uninterrupted run had left"
    # The run says what it resumed, through logging ("episodestream"), with this run's worker count.
    logged = resumed_run.stdout + resumed_run.stderr
    assert "resumed epoch 0 after batch 16, elastic: 1 samples left for rank 0" in logged, logged[-3000:]

    # Exactly: the same worker count resumes the uninterrupted run's batches, sample for sample.
    _ok(_train(tmp_path / "short", *data, *TINY_ACT, "--num_workers=0", f"--output_dir={tmp_path / 'out2'}",
               "--steps=4", "--save_freq=2"))
    short = _steps(tmp_path / "short")
    assert short == whole[:4]
    config = tmp_path / "out2/checkpoints/000002/pretrained_model/train_config.json"
    again_run = _train(tmp_path / "again", f"--config_path={config}", "--resume=true", "--steps=4")
    _ok(again_run)
    assert "resumed epoch 0 at batch 2 (exact; 1 rank(s) x 1 consumer(s))" in again_run.stdout + again_run.stderr
    again = _steps(tmp_path / "again")
    assert [i for b in again for i in b] == [i for b in whole for i in b][8:16], "samples 9-16 of the whole run"

    # Another run's checkpoint (here: another seed) is refused before the first step, naming the field.
    refused = _train(tmp_path / "refused", f"--config_path={config}", "--resume=true", "--seed=7", "--steps=4")
    assert refused.returncode == 1 and "seed: saved 1000, this dataset 7" in refused.stderr
    # ... and says what a command-line user can do (strict=False is a Python argument).
    assert "strict=False" not in refused.stderr and "Resume with that run's settings" in refused.stderr
    assert "Traceback" not in refused.stderr and not (tmp_path / "refused/rank0.jsonl").exists()
    nowhere = _train(tmp_path / "unread", "--dataset.repo_id=local/ds", f"--dataset.root={tmp_path / 'nowhere'}",
                     "--dataset.streaming=true", *TINY_ACT, f"--output_dir={tmp_path / 'out3'}", "--steps=4")
    assert nowhere.returncode == 1 and "Traceback" not in nowhere.stderr
    assert nowhere.stderr.strip().splitlines()[-1] == (
        f"episodestream lerobot-train: FileNotFoundError: dataset.root='{tmp_path / 'nowhere'}' is not a folder: "
        f"nothing is there. Pass the folder holding the dataset's meta/info.json, or no root to read "
        f"dataset.repo_id from the Hub.")


@pytest.mark.slow
@pytest.mark.distributed
def test_lerobot_train_on_two_processes_covers_the_epoch_and_resumes_on_one(root, tmp_path):
    if (os.cpu_count() or 1) < 2:
        pytest.skip(f"this machine has {os.cpu_count()} CPU(s): 2 processes cannot run side by side")
    args = ["--dataset.repo_id=local/ds", f"--dataset.root={root}", "--dataset.streaming=true", "--batch_size=4",
            *TINY_ACT, "--num_workers=0", f"--output_dir={tmp_path / 'out'}"]
    _ok(_train(tmp_path / "two", *args, "--steps=9", "--save_freq=4", processes=2))
    ranks = [_steps(tmp_path / "two", rank) for rank in (0, 1)]
    # 65 frames over 2 ranks: 33 each (one fill-in), 9 batches of 4, 4, ..., 1 per rank.
    assert [len(b) for b in ranks[0]] == [len(b) for b in ranks[1]] == [4] * 8 + [1]
    seen = [i for rank in ranks for b in rank for i in b]
    assert len(seen) == 66 and set(seen) == set(range(65)), "every frame once (and one fill-in)"

    # Elastic: the step-4 checkpoint of the 2 processes resumed on 1 process. The 32 samples the two
    # ranks took in steps 1-4 are not seen again; the other 33 frames come once each, in 9 steps.
    config = tmp_path / "out/checkpoints/000004/pretrained_model/train_config.json"
    _ok(_train(tmp_path / "one", f"--config_path={config}", "--resume=true", "--steps=13"))
    resumed = _steps(tmp_path / "one")
    taken = [i for rank in ranks for b in rank[:4] for i in b]
    assert [len(b) for b in resumed] == [4] * 8 + [1]
    assert sorted(taken + [i for b in resumed for i in b]) == list(range(65))


@pytest.mark.slow
def test_the_readmes_lerobot_train_command_runs_as_pasted_with_the_network_refused(tmp_path, monkeypatch):
    """README task 1 as pasted, on the dataset its "Try it" writes, with no network (issue 49: the
    command was run by hand only)."""
    import shlex

    from episodestream.tools.cli import main
    from tests.no_network import refuse_network

    readme = (REPO / "README.md").read_text()
    block = readme.split("**1. Train with `lerobot-train`.**")[1].split("```bash")[1].split("```")[0]
    train = shlex.split(block.replace("\\\n", " "))
    demo = shlex.split(readme.split("## Try it")[1].split("```bash")[1].split("```")[0].splitlines()[1].split("#")[0])
    assert train[:4] == demo[:3] + ["lerobot-train"] == [".venv/bin/python", "-m", "episodestream", "lerobot-train"]
    assert demo[3:] == ["demo", "--out", "data/demo"]
    monkeypatch.chdir(tmp_path)  # the commands' relative paths: data/demo, outputs/act-demo
    refuse_network(monkeypatch, tmp_path / "home")
    assert main(demo[3:]) == 0
    monkeypatch.setattr(sys, "argv", ["lerobot-train", *train[4:]])
    assert main(train[3:]) == 0
    steps = "--steps=2" in train and "--output_dir=outputs/act-demo" in train
    assert steps and (tmp_path / "outputs/act-demo/checkpoints/000002/pretrained_model/config.json").is_file()
    # The resume command after it, as pasted (issue 64 item 2: a bare --resume=true failed as written,
    # "A config_path is expected when resuming a run").
    after = readme.split("**1. Train with `lerobot-train`.**")[1].split("**2.")[0].split("```bash")[2].split("```")[0]
    resume = shlex.split(after.replace("\\\n", " "))
    assert resume[:4] == train[:4] and "--resume=true" in resume and any(a.startswith("--config_path=") for a in resume)
    monkeypatch.setattr(sys, "argv", ["lerobot-train", *resume[4:]])
    assert main(resume[3:]) == 0
    assert (tmp_path / "outputs/act-demo/checkpoints/000004/pretrained_model/config.json").is_file()
