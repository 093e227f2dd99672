"""A v2.1 dataset read in place gives LeRobot 0.6's samples and stats on the v3.0 copy that LeRobot's
own converter (``convert_dataset_v21_to_v30``, run locally, nothing pushed) writes from it.

Skips without LeRobot (see ``tests/with_lerobot/__init__.py``).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

try:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.scripts.convert_dataset_v21_to_v30 import convert_dataset
except ImportError as error:  # CI: LeRobot is not installed
    pytest.skip(f"LeRobot is not importable here ({error}); these tests need a LeRobot 0.6 venv "
                f"(LeRobot needs Python >= 3.12 and torchvision)", allow_module_level=True)

from episodestream import EpisodeDataset, EpisodeStreamingDataset
from episodestream.tools.synthetic import write_synthetic_dataset

CAMERA = "observation.images.front"
LENGTHS = [12, 9, 15, 8]
FPS = 30
WINDOWS = {CAMERA: [-2 / FPS, 0.0], "action": [0.0, 1 / FPS, 2 / FPS], "observation.state": [-1 / FPS, 0.0]}


@pytest.fixture(scope="module")
def v21_and_converted(tmp_path_factory):
    base = tmp_path_factory.mktemp("v2x-lerobot")
    v21 = write_synthetic_dataset(base / "v21", num_episodes=len(LENGTHS), episode_length=LENGTHS, fps=FPS,
                                  cameras=(CAMERA,), height=64, width=64, chunks_size=2, seed=0, version="v2.1")
    work = base / "ds"
    shutil.copytree(v21, work)
    convert_dataset(repo_id="local/ds", root=work, push_to_hub=False)  # work now holds the v3.0 copy
    return v21, work


def test_samples_equal_lerobot_on_its_converted_copy(v21_and_converted):
    v21, converted = v21_and_converted
    theirs = LeRobotDataset("local/ds", root=converted, delta_timestamps=WINDOWS)
    ours = EpisodeDataset(v21, delta_timestamps=WINDOWS)
    try:
        assert len(ours) == len(theirs) == sum(LENGTHS)
        for i in range(len(ours)):
            a, b = ours[i], theirs[i]
            assert a.keys() == b.keys(), i
            for key in a:
                if isinstance(a[key], torch.Tensor):
                    assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), (i, key)
                else:
                    assert a[key] == b[key], (i, key)
        streamed = sorted(EpisodeStreamingDataset(v21, delta_timestamps=WINDOWS, seed=2), key=lambda s: int(s["index"]))
        for sample in streamed:
            expected = theirs[int(sample["index"])]
            assert all(torch.equal(sample[k], expected[k]) if isinstance(sample[k], torch.Tensor)
                       else sample[k] == expected[k] for k in sample)
    finally:
        ours.close()


def test_stats_equal_lerobot_on_its_converted_copy(v21_and_converted):
    v21, converted = v21_and_converted
    theirs = LeRobotDataset("local/ds", root=converted).meta.stats
    ours = EpisodeDataset(v21)
    try:
        assert ours.meta.stats.keys() == theirs.keys()
        for key, values in ours.meta.stats.items():
            assert values.keys() == theirs[key].keys(), key
            for name, value in values.items():
                assert value.dtype == theirs[key][name].dtype and np.array_equal(value, theirs[key][name]), (key, name)
        assert list(ours.meta.episodes["dataset_from_index"]) == list(theirs_episodes(converted, "dataset_from_index"))
    finally:
        ours.close()


def theirs_episodes(root, column):
    return LeRobotDataset("local/ds", root=root).meta.episodes[column]
