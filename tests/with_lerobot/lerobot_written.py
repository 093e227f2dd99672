"""Small datasets written by LeRobot 0.6's own writer (``LeRobotDataset.create`` / ``add_frame`` /
``save_episode`` / ``finalize``) with every feature type it has beyond RGB video: a depth camera (HEVC
``gray12le``, log-quantised, B-frames), depth images in parquet (uint16 mm and float32 m TIFF), a PNG
image camera, float64 / int32 / bool features, a (2, 3) float32 feature (an ``Array2D`` column), and
HEVC RGB video with B-frames. Imported only by tests that already know LeRobot is importable."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from lerobot.configs.video import RGBEncoderConfig
from lerobot.datasets.lerobot_dataset import LeRobotDataset

HEIGHT, WIDTH, FPS = 64, 96, 10
LENGTHS = (14, 9, 17)
RGB, DEPTH, STILL = "observation.images.rgb", "observation.images.depth", "observation.images.still"
DEPTH_MM, DEPTH_M = "observation.images.depth_mm", "observation.images.depth_m"


def _camera(channels: int, dtype: str, *, depth: bool = False) -> dict:
    spec = {"dtype": dtype, "shape": (HEIGHT, WIDTH, channels), "names": ["height", "width", "channels"]}
    return {**spec, "info": {"is_depth_map": True}} if depth else spec


_TABULAR = {
    "observation.state": {"dtype": "float64", "shape": (3,), "names": None},
    "action": {"dtype": "float32", "shape": (2, 3), "names": None},
    "counter": {"dtype": "int32", "shape": (1,), "names": None},
    "flag": {"dtype": "bool", "shape": (1,), "names": None},
}


def _depth_mm(rng, episode: int, frame: int) -> np.ndarray:
    """Depth in mm over a ramp: 400..7000 mm, every value different, changing each frame."""
    ramp = np.linspace(400, 7000, HEIGHT * WIDTH).reshape(HEIGHT, WIDTH, 1)
    return (ramp + 37 * frame + 500 * episode + rng.integers(0, 30, (HEIGHT, WIDTH, 1))).astype(np.uint16)


def _tabular(rng, episode: int, frame: int) -> dict:
    return {"observation.state": rng.normal(size=3) * 1e3 + 1 / 3,
            "action": rng.normal(size=(2, 3)).astype(np.float32),
            "counter": np.array([frame * 7 + episode], np.int32),
            "flag": np.array([frame % 3 == 0]),
            "task": f"task {episode % 2}"}


def write_video_dataset(root: Path, *, rgb_codec: str = "av1") -> Path:
    """RGB video (``rgb_codec``: "av1", LeRobot's default, or "hevc" with B-frames), a depth video
    camera (LeRobot's default depth encoder), a PNG image camera and the tabular features."""
    features = {RGB: _camera(3, "video"), DEPTH: _camera(1, "video", depth=True), STILL: _camera(3, "image"),
                **_TABULAR}
    encoder = RGBEncoderConfig(vcodec="hevc") if rgb_codec == "hevc" else None
    dataset = LeRobotDataset.create("local/features", fps=FPS, features=features, root=root, use_videos=True,
                                    rgb_encoder=encoder)
    rng = np.random.default_rng(0)
    for episode, length in enumerate(LENGTHS):
        for frame in range(length):
            dataset.add_frame({RGB: rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8),
                               DEPTH: _depth_mm(rng, episode, frame),
                               STILL: rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8),
                               **_tabular(rng, episode, frame)})
        dataset.save_episode()
    dataset.finalize()
    return root


def write_depth_image_dataset(root: Path) -> Path:
    """Depth as images in parquet (no video): a uint16 mm camera and a float32 m camera."""
    features = {DEPTH_MM: _camera(1, "image", depth=True), DEPTH_M: _camera(1, "image", depth=True), **_TABULAR}
    dataset = LeRobotDataset.create("local/depth-images", fps=FPS, features=features, root=root, use_videos=False)
    rng = np.random.default_rng(1)
    for episode, length in enumerate(LENGTHS):
        for frame in range(length):
            mm = _depth_mm(rng, episode, frame)
            dataset.add_frame({DEPTH_MM: mm, DEPTH_M: (mm.astype(np.float32) / 1000 + np.float32(1e-4)),
                               **_tabular(rng, episode, frame)})
        dataset.save_episode()
    dataset.finalize()
    return root
