"""Samples equal LeRobot 0.6's ``LeRobotDataset[i]`` on datasets its own writer made with every feature type
beyond RGB video (``lerobot_written``): depth video and depth images in "mm" and "m", PNG image cameras,
float64 / int32 / bool / Array2D features, HEVC with B-frames; in map, shuffled-stream and
``EpisodeLoader`` order, plain, with windows, ``return_uint8`` and the PyAV backend. Every value is
compared bit for bit (``torch.equal``, dtypes and shapes included).

LeRobot's own answers are read in index order: on B-frame video its torchcodec seeks are approximate,
and in random order it raises ``FrameTimestampError`` for some indices (12 of 30 in one run) and for
windows, where ours must still be exact; read in order it decodes forward and is right. A window on
B-frame video is compared with LeRobot's single-frame samples of the same frames.

Skips without LeRobot: it needs Python >= 3.12 and torchvision (see ``tests/with_lerobot/__init__.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

try:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from tests.with_lerobot.lerobot_written import (
        DEPTH, DEPTH_M, DEPTH_MM, FPS, LENGTHS, RGB, STILL, write_depth_image_dataset, write_video_dataset)
except ImportError as error:  # CI: LeRobot is not installed
    pytest.skip(f"LeRobot 0.6 is not importable here ({error}); run these in a LeRobot 0.6 venv",
                allow_module_level=True)

from episodestream import EpisodeDataset, EpisodeLoader, EpisodeStreamingDataset

TOTAL = sum(LENGTHS)
WINDOWS = {DEPTH: [-2 / FPS, 0.0, 1 / FPS], RGB: [-1 / FPS, 0.0], "observation.state": [-1 / FPS, 0.0, 2 / FPS],
           "action": [0.0, 1 / FPS]}
IMAGE_WINDOWS = {DEPTH_MM: [-1 / FPS, 0.0], DEPTH_M: [0.0, 2 / FPS], "counter": [-2 / FPS, 0.0]}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    base = tmp_path_factory.mktemp("lerobot-written")
    return {"av1": write_video_dataset(base / "av1"), "hevc": write_video_dataset(base / "hevc", rgb_codec="hevc"),
            "images": write_depth_image_dataset(base / "images")}


def assert_same(ours: dict, theirs: dict, where) -> None:
    assert ours.keys() == theirs.keys(), (where, sorted(set(ours) ^ set(theirs)))
    for key, expected in theirs.items():
        got = ours[key]
        if isinstance(expected, torch.Tensor):
            assert isinstance(got, torch.Tensor), (where, key)
            assert (got.dtype, tuple(got.shape)) == (expected.dtype, tuple(expected.shape)), (where, key)
            assert torch.equal(got, expected), (where, key, float((got.double() - expected.double()).abs().max()))
        else:
            assert got == expected, (where, key)


def theirs_of(root, **kwargs) -> LeRobotDataset:
    return LeRobotDataset("local/x", root=root, **kwargs)


_IN_ORDER: dict = {}


def theirs_in_order(root, **kwargs) -> list[dict]:
    """LeRobot's samples of every index, read in index order (see the module docstring); cached."""
    key = (str(root), tuple(sorted((k, repr(v)) for k, v in kwargs.items())))
    if key not in _IN_ORDER:
        dataset = theirs_of(root, **kwargs)
        _IN_ORDER[key] = [dataset[i] for i in range(len(dataset))]
    return _IN_ORDER[key]


@pytest.mark.parametrize("options", [{}, {"return_uint8": True}, {"video_backend": "pyav"},
                                     {"depth_output_unit": "m"}], ids=["plain", "uint8", "pyav", "metres"])
@pytest.mark.parametrize("name", ["av1", "hevc"])
def test_map_style_equals_lerobot(written, name, options):
    theirs = theirs_of(written[name], **options)
    expected = theirs_in_order(written[name], **options)
    ours = EpisodeDataset(written[name], **options)
    assert len(ours) == len(theirs) == TOTAL
    order = np.random.default_rng(3).permutation(TOTAL)  # random access: seeks back and forth
    for i in order.tolist():
        assert_same(ours[i], expected[i], (name, options, i))
    assert ours.meta.depth_keys == theirs.meta.depth_keys == [DEPTH]
    for key, stats in theirs.meta.stats.items():
        for stat, value in stats.items():
            np.testing.assert_array_equal(ours.meta.stats[key][stat], value, err_msg=f"{key} {stat}")


@pytest.mark.parametrize("windows", [WINDOWS, {RGB: [-1 / FPS], DEPTH: [0.0], "observation.state": [0.0]}],
                         ids=["windows", "one-step"])
def test_windows_equal_lerobot(written, windows):
    theirs = theirs_of(written["av1"], delta_timestamps=windows)
    ours = EpisodeDataset(written["av1"], delta_timestamps=windows)
    for i in range(TOTAL):
        assert_same(ours[i], theirs[i], i)


def test_windows_on_b_frame_video_are_the_frames_lerobot_gives_one_by_one(written):
    """LeRobot raises on these windows; ours must hold exactly the frames its single samples hold."""
    single = theirs_in_order(written["hevc"])
    ours = EpisodeDataset(written["hevc"], delta_timestamps=WINDOWS)
    starts = np.cumsum((0, *LENGTHS))
    for i in np.random.default_rng(4).permutation(TOTAL).tolist():
        sample = ours[i]
        episode = int(np.searchsorted(starts, i, side="right") - 1)
        for key in (DEPTH, RGB):
            wanted = i + np.round(np.asarray(WINDOWS[key]) * FPS).astype(int)
            rows = np.clip(wanted, starts[episode], starts[episode + 1] - 1)
            expected = torch.stack([single[int(r)][key] for r in rows])
            assert torch.equal(sample[key], expected), (i, key)
            assert sample[f"{key}_is_pad"].tolist() == ((wanted < starts[episode]) | (wanted >= starts[episode + 1])).tolist()


@pytest.mark.parametrize("name", ["av1", "hevc"])
def test_shuffled_stream_and_loader_equal_lerobot(written, name):
    theirs = theirs_in_order(written[name])
    streamed = list(EpisodeStreamingDataset(written[name], seed=5, episode_pool_size=2))
    assert sorted(int(s["index"]) for s in streamed) == list(range(TOTAL))
    for sample in streamed:
        assert_same(sample, theirs[int(sample["index"])], ("stream", int(sample["index"])))
    loader = EpisodeLoader(EpisodeStreamingDataset(written[name], seed=6, episode_pool_size=2), batch_size=4,
                           num_threads=2)
    seen = 0
    for batch in loader:
        for row, index in enumerate(batch["index"].tolist()):
            expected = theirs[index]
            for key, value in expected.items():
                got = batch[key][row] if isinstance(batch[key], torch.Tensor) else batch[key][row]
                if isinstance(value, torch.Tensor):
                    assert got.dtype == value.dtype and torch.equal(got, value), ("loader", index, key)
                else:
                    assert got == value, ("loader", index, key)
            seen += 1
    assert seen == TOTAL


@pytest.mark.parametrize("unit", ["mm", "m"])
def test_depth_images_in_parquet_equal_lerobot(written, unit):
    theirs = theirs_of(written["images"], depth_output_unit=unit, delta_timestamps=IMAGE_WINDOWS)
    ours = EpisodeDataset(written["images"], depth_output_unit=unit, delta_timestamps=IMAGE_WINDOWS)
    for i in range(TOTAL):
        assert_same(ours[i], theirs[i], (unit, i))
    streamed = list(EpisodeStreamingDataset(written["images"], depth_output_unit=unit, return_uint8=True, seed=1))
    plain = theirs_of(written["images"], depth_output_unit=unit)
    for sample in streamed:
        assert_same(sample, plain[int(sample["index"])], (unit, "stream", int(sample["index"])))
    for key, stats in theirs.meta.stats.items():
        for stat, value in stats.items():
            np.testing.assert_array_equal(ours.meta.stats[key][stat], value, err_msg=f"{key} {stat}")


def test_image_camera_is_float_even_with_return_uint8(written):
    theirs = theirs_of(written["av1"], return_uint8=True)
    ours = EpisodeDataset(written["av1"], return_uint8=True)
    assert ours[3][STILL].dtype == theirs[3][STILL].dtype == torch.float32
    assert ours[3][RGB].dtype == theirs[3][RGB].dtype == torch.uint8
    assert ours[3][DEPTH].dtype == theirs[3][DEPTH].dtype == torch.float32


@pytest.mark.parametrize("unit", ["mm", "m"])
def test_train_factory_gives_lerobots_depth_samples(written, unit):
    """``make_train_eval_datasets`` on a depth dataset (it used to refuse them): LeRobot's factory's
    samples, in ``cfg.dataset.depth_output_unit``, stats rescaled alike."""
    from pathlib import Path

    from lerobot.configs.default import DatasetConfig
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.datasets.factory import make_train_eval_datasets as lerobots
    from lerobot.policies.act.configuration_act import ACTConfig

    from episodestream.lerobot import make_train_eval_datasets

    root = written["av1"]
    cfg = TrainPipelineConfig(dataset=DatasetConfig(repo_id="local/x", root=str(root), depth_output_unit=unit),
                              policy=ACTConfig(device="cpu", push_to_hub=False, chunk_size=4, n_action_steps=4),
                              output_dir=Path(root).parent / "unused-output")
    cfg.validate()
    ours, _ = make_train_eval_datasets(cfg)
    theirs, _ = lerobots(cfg)
    expected = [theirs[i] for i in range(len(theirs))]  # in order (module docstring)
    for i in np.random.default_rng(7).permutation(len(theirs)).tolist():
        assert_same(ours[i], expected[i], (unit, i))
    np.testing.assert_array_equal(ours.meta.stats[DEPTH]["mean"], theirs.meta.stats[DEPTH]["mean"])
