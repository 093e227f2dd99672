"""Batches as LeRobot 0.6.1's trainer gets them (issue 62 item 11), against LeRobot itself.

LeRobot's ``lerobot_train`` collates a dataset that declares language columns with
``lerobot_collate_fn``: the raw ``language_persistent`` / ``language_events`` left out, the
``messages`` / ``message_streams`` / ``target_message_indices`` that ``render_messages_processor``
renders from them kept as lists. Compared here key by key and value by value, on a dataset that
LeRobot's own writer and annotation pipeline wrote: LeRobot's DataLoader with its collate against
``episodestream.collate``, ``EpisodeLoader`` and ``make_train_eval_datasets``' datasets; the same
after a recipe is rendered by LeRobot's ``RenderMessagesStep``; and (slow) such a recipe through
``episodestream lerobot-train`` and LeRobot's own ``lerobot-train``, step for step.

Skips without LeRobot (see ``tests/with_lerobot/__init__.py``).
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

try:
    from lerobot.annotations.steerable_pipeline.executor import Executor  # noqa: F401
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.utils.collate import lerobot_collate_fn
except ImportError as error:  # CI: LeRobot is not installed
    pytest.skip(f"LeRobot 0.6 (with its annotation pipeline) is not importable here ({error})",
                allow_module_level=True)

import episodestream
from episodestream import EpisodeDataset, EpisodeLoader, EpisodeStreamingDataset
from episodestream.lerobot import make_train_eval_datasets
from tests.with_lerobot.lerobot_written import LANGUAGE_KEYS, LANGUAGE_LENGTHS, write_language_dataset
from tests.with_lerobot.render_recipe import render

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RECORDER = HERE / "record_render_train.py"
MESSAGE_KEYS = ("messages", "message_streams", "target_message_indices")
TINY_ACT = ["--policy.type=act", "--policy.device=cpu", "--policy.push_to_hub=false",
            "--policy.pretrained_backbone_weights=null", "--policy.dim_model=32", "--policy.n_heads=2",
            "--policy.n_encoder_layers=1", "--policy.n_decoder_layers=1", "--policy.dim_feedforward=32",
            "--policy.latent_dim=8", "--policy.chunk_size=4", "--policy.n_action_steps=4",
            "--wandb.enable=false", "--log_freq=1"]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Episode 1 unannotated, as the pipeline may leave an episode."""
    return write_language_dataset(tmp_path_factory.mktemp("batches-lerobot") / "ds")


@pytest.fixture(scope="module")
def annotated(tmp_path_factory):
    """Every episode annotated: a recipe renders every sample (LeRobot refuses a batch of rendered
    and unrendered samples)."""
    return write_language_dataset(tmp_path_factory.mktemp("batches-lerobot") / "all", unannotated=())


def _equal(ours, theirs, where: str) -> None:
    """The same keys; each value of the same type; tensors of the same dtype, shape and values."""
    assert type(ours) is type(theirs), where
    assert set(ours) == set(theirs), f"{where}: keys differ: {sorted(set(ours) ^ set(theirs))}"
    for key, value in theirs.items():
        assert type(ours[key]) is type(value), f"{where}: {key}: {type(ours[key]).__name__}, not {type(value).__name__}"
        if isinstance(value, torch.Tensor):
            assert ours[key].dtype == value.dtype and torch.equal(ours[key], value), f"{where}: {key}"
        else:  # repr: the same nested types too (float, not numpy; None, not a missing key)
            assert repr(ours[key]) == repr(value), f"{where}: {key}"


def _lerobots_batch(theirs: LeRobotDataset, indices: list[int], *, rendered: bool = False):
    samples = [theirs[i] for i in indices]
    return lerobot_collate_fn([render(s) for s in samples] if rendered else samples)


def test_dataloader_and_loader_batches_equal_lerobots(written):
    theirs = LeRobotDataset("local/language", root=written)
    assert theirs.meta.has_language_columns and EpisodeDataset(written).meta.has_language_columns
    reference = list(torch.utils.data.DataLoader(theirs, batch_size=4, collate_fn=lerobot_collate_fn))
    assert not set(LANGUAGE_KEYS) & set(reference[0])  # what LeRobot 0.6.1's collate does (not its docstring)
    ours = torch.utils.data.DataLoader(EpisodeDataset(written), batch_size=4, collate_fn=episodestream.collate)
    for i, (mine, expected) in enumerate(zip(ours, reference, strict=True)):
        _equal(mine, expected, f"DataLoader batch {i}")
    # The streaming dataset through EpisodeLoader: each batch is LeRobot's collate of the same samples.
    for i, batch in enumerate(EpisodeLoader(EpisodeStreamingDataset(written, seed=7), batch_size=4, num_threads=2)):
        _equal(batch, _lerobots_batch(theirs, batch["index"].tolist()), f"EpisodeLoader batch {i}")
    # Asked for, the raw columns are kept: one list entry per sample, LeRobotDataset[i]'s.
    keep = functools.partial(episodestream.collate, language_columns="keep")
    for loader in (torch.utils.data.DataLoader(EpisodeStreamingDataset(written, seed=7), batch_size=4, collate_fn=keep),
                   EpisodeLoader(EpisodeStreamingDataset(written, seed=7), batch_size=4, language_columns="keep")):
        for batch in loader:
            indices = batch["index"].tolist()
            for key in LANGUAGE_KEYS:
                assert type(batch[key]) is list and repr(batch[key]) == repr([theirs[i][key] for i in indices])
            _equal({k: v for k, v in batch.items() if k not in LANGUAGE_KEYS}, _lerobots_batch(theirs, indices), "kept")


def _config(root, **dataset):
    from lerobot.configs.default import DatasetConfig
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.policies.act.configuration_act import ACTConfig

    cfg = TrainPipelineConfig(dataset=DatasetConfig(repo_id="local/language", root=str(root), **dataset),
                              policy=ACTConfig(device="cpu", push_to_hub=False, chunk_size=4, n_action_steps=4),
                              output_dir=Path(root).parent / "unused-output")
    cfg.validate()
    return cfg


def _trainers_loader(dataset, batch_size: int = 4):
    """The DataLoader lerobot_train makes (its collate chosen by ``meta.has_language_columns``)."""
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size,
                                       collate_fn=lerobot_collate_fn if dataset.meta.has_language_columns else None)


def test_the_factorys_datasets_give_lerobots_trainer_batches(written):
    from lerobot.datasets.factory import make_train_eval_datasets as lerobots

    cfg = _config(written, eval_split=0.34)
    their_train, their_eval = lerobots(cfg)
    our_train, our_eval = make_train_eval_datasets(cfg)
    for name, mine, theirs in (("train", our_train, their_train), ("eval", our_eval, their_eval)):
        for i, (got, expected) in enumerate(zip(_trainers_loader(mine), _trainers_loader(theirs), strict=True)):
            _equal(got, expected, f"{name} batch {i}")
    # Streaming: the trainer's DataLoader over our stream, each batch LeRobot's of the same samples
    # (windows of the policy's actions, uint8 frames, as LeRobot's factory asks).
    streaming, _ = make_train_eval_datasets(_config(written, streaming=True))
    full, _ = lerobots(_config(written))
    batches = list(_trainers_loader(streaming))
    assert sum(len(b["index"]) for b in batches) == sum(LANGUAGE_LENGTHS)
    for i, batch in enumerate(batches):
        assert batch["observation.images.front"].dtype == torch.uint8 and batch["action"].shape[1] == 4
        _equal(batch, _lerobots_batch(full, batch["index"].tolist()), f"streaming batch {i}")


def test_rendered_messages_batch_as_lerobots(annotated, written):
    """A recipe rendered per sample by LeRobot's RenderMessagesStep: the messages stay lists."""
    theirs = LeRobotDataset("local/language", root=annotated)
    ours = EpisodeDataset(annotated)
    messages = []
    for start in range(0, len(theirs), 4):
        indices = list(range(start, min(start + 4, len(theirs))))
        expected = _lerobots_batch(theirs, indices, rendered=True)
        assert set(MESSAGE_KEYS) <= set(expected) and type(expected["messages"]) is list
        _equal(episodestream.collate([render(ours[i]) for i in indices]), expected, f"rendered {indices}")
        messages += expected["messages"]
    # What the comparison covers: both sub-recipes of the blend, interjections and tool calls.
    assert {m[0]["content"].count(":") for m in messages} == {0, 1}
    assert any(t.get("tool_calls") for m in messages for t in m) and any(t["content"] == "stop" for m in messages
                                                                         for t in m if "content" in t)
    stream = EpisodeStreamingDataset(annotated, seed=3)
    rendered = torch.utils.data.DataLoader(stream, batch_size=4, collate_fn=lambda b: episodestream.collate(
        [render(s) for s in b]))
    for batch in rendered:
        _equal(batch, _lerobots_batch(theirs, batch["index"].tolist(), rendered=True), "rendered stream")
    # An unannotated episode's samples are not rendered: a batch mixing them is refused, as LeRobot refuses it.
    some = LeRobotDataset("local/language", root=written)
    first_of_1 = LANGUAGE_LENGTHS[0]
    mixed = [render(EpisodeDataset(written)[i]) for i in (first_of_1 - 1, first_of_1)]
    with pytest.raises(ValueError, match="Inconsistent batch: 1/2 samples carry"):
        lerobot_collate_fn([render(some[i]) for i in (first_of_1 - 1, first_of_1)])
    with pytest.raises(ValueError, match="Inconsistent batch: 1/2 samples carry"):
        episodestream.collate(mixed)


def _train(record: Path, *args: str, runner: str) -> subprocess.CompletedProcess:
    record.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RECORD_DIR": str(record), "RUNNER": runner, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(RECORDER), *args], env=env, capture_output=True, text=True,
                          timeout=400, cwd=record)


def _steps(record: Path) -> list[dict]:
    return [json.loads(line) for line in (record / "steps.jsonl").read_text().splitlines()]


def _ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, f"training failed:\n{result.stdout[-3000:]}\n{result.stderr[-4000:]}"


@pytest.mark.slow
def test_a_rendered_recipe_trains_through_lerobot_train_as_on_lerobots(annotated, tmp_path):
    steps = 5
    data = ["--dataset.repo_id=local/language", f"--dataset.root={annotated}", "--batch_size=4", "--num_workers=0",
            f"--steps={steps}", "--save_freq=100", *TINY_ACT]
    # Map-style: LeRobot's sampler orders both runs alike, so the steps must match one for one.
    _ok(_train(tmp_path / "lerobot", *data, "--dataset.streaming=false", f"--output_dir={tmp_path / 'o1'}",
               runner="lerobot"))
    _ok(_train(tmp_path / "ours", *data, "--dataset.streaming=false", f"--output_dir={tmp_path / 'o2'}",
               runner="episodestream"))
    theirs, ours = _steps(tmp_path / "lerobot"), _steps(tmp_path / "ours")
    assert len(theirs) == len(ours) == steps
    for step, (mine, expected) in enumerate(zip(ours, theirs)):
        assert mine["keys"] == expected["keys"] and not set(LANGUAGE_KEYS) & set(mine["keys"]), step
        assert set(MESSAGE_KEYS) <= set(mine["keys"]), step
        for key in ("index", *MESSAGE_KEYS):
            assert mine[key] == expected[key], f"step {step}: {key}"
        assert mine["loss"] == expected["loss"], f"step {step}: loss {mine['loss']} != {expected['loss']}"
    # Streaming: our order; each step's messages are LeRobot's rendering of the samples it took.
    _ok(_train(tmp_path / "stream", *data, "--dataset.streaming=true", f"--output_dir={tmp_path / 'o3'}",
               runner="episodestream"))
    reference = LeRobotDataset("local/language", root=annotated)
    streamed = _steps(tmp_path / "stream")
    assert len(streamed) == steps
    for step in streamed:
        expected = _lerobots_batch(reference, step["index"], rendered=True)
        assert step["keys"] == theirs[0]["keys"]
        for key in MESSAGE_KEYS:
            assert step[key] == json.loads(json.dumps(expected[key])), key
        assert math.isfinite(step["loss"])
