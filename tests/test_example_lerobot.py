"""``examples/lerobot/train_policy.py``: its arguments always; two training steps (and a resume)
where LeRobot is installed."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
import torch

from tests.no_network import documented_offline_command, refuse_network
from tests.test_lerobot_meta import _make_policy_inputs, _normalize, _resolve_delta_timestamps

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "lerobot" / "train_policy.py"
# A small ACT: short action chunks for the short synthetic episodes, and no ImageNet download.
SMALL_ACT = ["--policy-option", "chunk_size=10", "--policy-option", "n_action_steps=10",
             "--policy-option", "pretrained_backbone_weights=null", "--policy-option", "dim_model=64",
             "--policy-option", "dim_feedforward=128"]


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("train_policy_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickling look the module up by name
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_arguments(example):
    args = example.parse_args([])
    assert (args.policy, args.device, args.steps, args.dataset) == ("act", "cpu", 1000, None)
    args = example.parse_args(["--steps", "2", "--dataset", "lerobot/pusht", "--policy", "diffusion",
                               "--policy-option", "chunk_size=10", "--policy-option", "vision_backbone=resnet34",
                               "--policy-option", "pretrained_backbone_weights=null"])
    assert (args.steps, args.dataset, args.policy) == (2, "lerobot/pusht", "diffusion")
    assert dict(args.policy_option) == {"chunk_size": 10, "vision_backbone": "resnet34",
                                        "pretrained_backbone_weights": None}
    for bad in (["--steps", "0"], ["--policy-option", "novalue"]):
        with pytest.raises(SystemExit):
            example.parse_args(bad)


def test_says_how_to_install_lerobot(example, tmp_path, capsys):
    if importlib.util.find_spec("lerobot") is not None:
        pytest.skip("LeRobot is installed; the training test covers the example")
    with pytest.raises(SystemExit, match=r"pip install lerobot \(LeRobot needs Python >= 3.12\)"):
        example.main(["--steps", "1", "--output-dir", str(tmp_path)])
    # The example printed nothing for ~80 s before its first step's line (issue 64 item 9): it says
    # what it does first, before LeRobot's import.
    assert capsys.readouterr().out.splitlines() == ["importing LeRobot and its policies ..."]


def test_says_when_it_writes_the_synthetic_dataset(example, tmp_path, monkeypatch, capsys):
    written = []
    monkeypatch.setattr(example, "write_synthetic_dataset", lambda root, **options: written.append(root))
    assert example.ensure_dataset(example.parse_args(["--output-dir", str(tmp_path)])) == str(tmp_path / "synthetic")
    assert written == [tmp_path / "synthetic"]
    assert capsys.readouterr().out == (f"writing a synthetic dataset (8 episodes of 20-60 frames, AV1 video) to "
                                       f"{tmp_path / 'synthetic'} ...\n")


def test_two_training_steps_then_resume(example, dataset_root, tmp_path, capsys):
    if importlib.util.find_spec("lerobot") is None:
        pytest.skip("LeRobot is not installed (pip install lerobot; it needs Python >= 3.12)")
    common = ["--dataset", str(dataset_root), "--output-dir", str(tmp_path), "--batch-size", "2",
              "--num-threads", "1", "--pool-size", "2", "--log-every", "1", *SMALL_ACT]
    assert example.main(["--steps", "2", *common]) == 0
    assert "step 2: loss" in capsys.readouterr().out
    state = json.loads((tmp_path / "checkpoint" / "stream_state.json").read_text())
    assert state["batches_consumed"] == 2
    assert (tmp_path / "pretrained_model" / "config.json").is_file()
    assert example.main(["--steps", "3", *common]) == 0
    out = capsys.readouterr().out
    assert "resumed at step 2" in out and "step 3: loss" in out and "step 1:" not in out


# -- the example's own loop (checkpoint, resume, save) on a stand-in of LeRobot's factories -------

def _fake_lerobot(seen: list[list[int]]) -> dict[str, types.ModuleType]:
    """lerobot.datasets.factory / lerobot.policies.factory with the signatures the example calls,
    built on the stand-ins of tests/test_lerobot_meta.py (what LeRobot reads from the meta)."""

    class Config:
        type, chunk_size, optimizer_lr = "act", 10, 1e-3
        observation_delta_indices = reward_delta_indices = None

        def __init__(self, device, **options):
            self.device = device
            self.__dict__.update(options)

        @property
        def action_delta_indices(self):
            return list(range(self.chunk_size))

    class Policy(torch.nn.Module):
        def __init__(self, config, state_dim, action_dim):
            super().__init__()
            self.config = config
            self.net = torch.nn.Linear(state_dim, action_dim * config.chunk_size)

        def forward(self, batch):
            seen.append(batch["index"].tolist())
            predicted = self.net(batch["observation.state"]).reshape(batch["action"].shape)
            error = (predicted - batch["action"]) ** 2
            return error[~batch["action_is_pad"]].mean(), {}

        def save_pretrained(self, path):
            Path(path).mkdir(parents=True, exist_ok=True)
            (Path(path) / "config.json").write_text(json.dumps({"type": self.config.type}))

    class Normalizer:
        def __init__(self, stats):
            self.stats = {k: {n: torch.as_tensor(v, dtype=torch.float32) for n, v in s.items()} for k, s in stats.items()}

        def __call__(self, batch):
            return {**batch, **{key: _normalize(batch[key], self.stats[key], "MEAN_STD")
                                for key in ("observation.state", "action")}}

        def save_pretrained(self, path):
            Path(path).mkdir(parents=True, exist_ok=True)

    def make_policy(cfg, ds_meta):
        inputs, outputs, _, _ = _make_policy_inputs(ds_meta)
        return Policy(cfg, inputs["observation.state"][1][0], outputs["action"][1][0])

    def make_pre_post_processors(cfg, dataset_stats):
        return Normalizer(dataset_stats), Normalizer(dataset_stats)

    def resolve_delta_timestamps(cfg, ds_meta):
        return _resolve_delta_timestamps(ds_meta, observation_delta_indices=cfg.observation_delta_indices,
                                         action_delta_indices=cfg.action_delta_indices)

    datasets_factory = types.ModuleType("lerobot.datasets.factory")
    datasets_factory.resolve_delta_timestamps = resolve_delta_timestamps
    policies_factory = types.ModuleType("lerobot.policies.factory")
    policies_factory.make_policy = make_policy
    policies_factory.make_policy_config = lambda policy_type, **kwargs: Config(**kwargs)
    policies_factory.make_pre_post_processors = make_pre_post_processors
    return {"lerobot": types.ModuleType("lerobot"), "lerobot.datasets": types.ModuleType("lerobot.datasets"),
            "lerobot.datasets.factory": datasets_factory, "lerobot.policies": types.ModuleType("lerobot.policies"),
            "lerobot.policies.factory": policies_factory}


def test_loop_checkpoints_and_resumes_on_the_stream(example, dataset_root, tmp_path, monkeypatch, capsys):
    seen: list[list[int]] = []
    for name, module in _fake_lerobot(seen).items():
        monkeypatch.setitem(sys.modules, name, module)
    # 290 frames in batches of 64: 5 batches an epoch, so the runs stop mid-epoch (3) and at an
    # epoch's last batch (5), and the last leg crosses into the next epoch.
    common = ["--dataset", str(dataset_root), "--batch-size", "64", "--num-threads", "1", "--pool-size", "2",
              "--log-every", "1", "--checkpoint-every", "2", "--policy-option", "chunk_size=5"]
    assert example.main(["--steps", "7", "--output-dir", str(tmp_path / "straight"), *common]) == 0
    straight = list(seen)
    seen.clear()
    for steps in (3, 5, 7):
        assert example.main(["--steps", str(steps), "--output-dir", str(tmp_path / "resumed"), *common]) == 0
    out = capsys.readouterr().out
    assert "resumed at step 3" in out and "resumed at step 5" in out and "step 7: loss" in out
    assert [len(b) for b in straight] == [64] * 4 + [34] + [64] * 2
    assert seen == straight  # the resumed runs saw what the straight run saw
    assert (tmp_path / "resumed" / "pretrained_model" / "config.json").is_file()
    assert not list(tmp_path.glob("*/checkpoint.*"))  # no partial or previous checkpoint left behind


@pytest.mark.slow
def test_the_offline_command_runs_with_the_network_refused(example, tmp_path, monkeypatch, capsys):
    """The docstring's offline command needs no network (issue 49 item 2: ACT's ResNet backbone
    downloaded ImageNet weights, a URLError offline, until the command said
    pretrained_backbone_weights=null)."""
    if importlib.util.find_spec("lerobot") is None:
        pytest.skip("LeRobot is not installed (pip install lerobot; it needs Python >= 3.12)")
    argv = documented_offline_command(EXAMPLE)
    refuse_network(monkeypatch, tmp_path)
    assert example.main([*argv, "--output-dir", str(tmp_path / "out")]) == 0
    assert "step 2: loss" in capsys.readouterr().out
