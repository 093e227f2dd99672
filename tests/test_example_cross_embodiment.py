"""``examples/lerobot/train_cross_embodiment.py``: its arguments and per-embodiment normalizer always;
two training steps of ACT on two synthetic robots (6-dim with one camera, 14-dim with two) where
LeRobot is installed."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.no_network import documented_offline_command, refuse_network

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "lerobot" / "train_cross_embodiment.py"
SMALL_ACT = ["--policy-option", "chunk_size=10", "--policy-option", "n_action_steps=10",
             "--policy-option", "pretrained_backbone_weights=null", "--policy-option", "dim_model=64",
             "--policy-option", "dim_feedforward=128"]


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("train_cross_embodiment_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_arguments(example):
    args = example.parse_args([])
    assert (args.policy, args.steps, args.datasets, args.weights) == ("act", 1000, None, None)
    args = example.parse_args(["--datasets", "a", "b", "--weights", "0.3", "0.7", "--policy-option", "chunk_size=5"])
    assert args.datasets == ["a", "b"] and args.weights == [0.3, 0.7] and dict(args.policy_option) == {"chunk_size": 5}
    for bad in (["--steps", "0"], ["--datasets", "a", "b", "--weights", "1"]):
        with pytest.raises(SystemExit):
            example.parse_args(bad)


def test_each_sample_is_normalized_with_its_own_robots_stats(example):
    stats = [{k: {"mean": np.array([1.0, 2.0, 0.0]), "std": np.array([2.0, 4.0, 1.0])} for k in example.PER_EMBODIMENT},
             {k: {"mean": np.array([10.0, 20.0, 30.0]), "std": np.array([1.0, 1.0, 1.0])} for k in example.PER_EMBODIMENT}]
    normalize = example.PerEmbodimentNormalizer(stats, eps=0.0)
    batch = {"dataset_index": torch.tensor([0, 1]), "observation.state": torch.tensor([[3.0, 6.0, 0.0], [11.0, 22.0, 33.0]]),
             "action": torch.tensor([[[1.0, 2.0, 0.0]] * 2, [[10.0, 20.0, 30.0]] * 2])}  # a window of 2
    out = normalize(batch)
    assert out["observation.state"].tolist() == [[1.0, 1.0, 0.0], [1.0, 2.0, 3.0]]
    assert out["action"].tolist() == [[[0.0, 0.0, 0.0]] * 2, [[0.0, 0.0, 0.0]] * 2]


def test_two_training_steps_on_two_robots(example, tmp_path, capsys):
    if importlib.util.find_spec("lerobot") is None:
        pytest.skip("LeRobot is not installed (pip install lerobot; it needs Python >= 3.12)")
    assert example.main(["--steps", "2", "--batch-size", "4", "--num-threads", "1", "--pool-size", "2",
                         "--log-every", "1", "--output-dir", str(tmp_path), *SMALL_ACT]) == 0
    out = capsys.readouterr().out
    assert "observation.state [14], action [14]" in out and "observation.images.wrist [64, 96, 3]" in out
    assert "step 2: loss" in out
    saved = json.loads((tmp_path / "pretrained_model" / "component_stats.json").read_text())
    assert len(saved) == 2 and saved[0]["observation.state"]["std"][6:] == [1.0] * 8  # the arm's padding: identity


@pytest.mark.slow
def test_the_offline_command_runs_with_the_network_refused(example, tmp_path, monkeypatch, capsys):
    """The docstring's offline command needs no network (issue 49 item 2)."""
    if importlib.util.find_spec("lerobot") is None:
        pytest.skip("LeRobot is not installed (pip install lerobot; it needs Python >= 3.12)")
    argv = documented_offline_command(EXAMPLE)
    refuse_network(monkeypatch, tmp_path)
    assert example.main([*argv, "--output-dir", str(tmp_path / "out")]) == 0
    assert "step 2: loss" in capsys.readouterr().out
