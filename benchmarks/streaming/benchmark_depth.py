"""Depth camera decode rate: ours against LeRobot 0.6's own ``LeRobotDataset`` on the same data, side by side.

The data is a LeRobot-written depth dataset (``LeRobotDataset.create`` with a depth camera: its default
depth encoder, HEVC ``gray12le``, log-quantised, B-frames), made once at ``--data`` when LeRobot is
importable; without LeRobot our synthetic writer makes the same kind of file (``depth_cameras=``) and
the LeRobot rows are left out. Rows, in alternating rounds (this machine is noisy):
  - lerobot map: ``LeRobotDataset[i]`` at random indices (depth through PyAV, then ``dequantize_depth``)
  - ours map: ``EpisodeDataset[i]`` at the same indices
  - ours loader: ``EpisodeLoader`` over ``EpisodeStreamingDataset`` (decode threads, shuffled pool)
Each prints samples/s (one depth frame a sample), and the ratios to LeRobot's map-style rate.

    python benchmarks/streaming/benchmark_depth.py --data /tmp/depth-bench [--episodes 8 --length 150]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from pathlib import Path

import numpy as np

KEY = "observation.images.depth"


def _write_lerobot(root: Path, *, episodes: int, length: int, height: int, width: int, fps: int) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {KEY: {"dtype": "video", "shape": (height, width, 1), "names": ["height", "width", "channels"],
                      "info": {"is_depth_map": True}},
                "observation.state": {"dtype": "float32", "shape": (2,), "names": None}}
    dataset = LeRobotDataset.create("bench/depth", fps=fps, features=features, root=root, use_videos=True)
    rng = np.random.default_rng(0)
    ramp = np.linspace(400, 6000, height * width, dtype=np.float32).reshape(height, width, 1)
    for episode in range(episodes):
        for frame in range(length):
            depth = ramp + 5 * frame + 100 * episode + rng.normal(0, 20, (height, width, 1)).astype(np.float32)
            dataset.add_frame({KEY: depth.clip(0, 65535).astype(np.uint16),
                               "observation.state": rng.normal(size=2).astype(np.float32), "task": "reach"})
        dataset.save_episode()
    dataset.finalize()


def _write_ours(root: Path, *, episodes: int, length: int, height: int, width: int, fps: int) -> None:
    from episodestream.tools.synthetic import write_synthetic_dataset

    write_synthetic_dataset(root, num_episodes=episodes, episode_length=length, fps=fps, cameras=(),
                            depth_cameras=(KEY,), height=height, width=width)


def _rate(fn, count: int) -> float:
    start = time.perf_counter()
    fn()
    return count / (time.perf_counter() - start)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="the dataset folder (written if absent)")
    parser.add_argument("--episodes", type=int, default=8, help="episodes to write (default 8)")
    parser.add_argument("--length", type=int, default=150, help="frames per episode to write (default 150)")
    parser.add_argument("--height", type=int, default=240, help="depth frame height (default 240)")
    parser.add_argument("--width", type=int, default=320, help="depth frame width (default 320)")
    parser.add_argument("--samples", type=int, default=300, help="random samples per map-style pass (default 300)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--threads", type=int, default=2, help="EpisodeLoader decode threads (default 2)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset
    except ImportError:
        LeRobotDataset = None
    from episodestream import EpisodeDataset, EpisodeLoader, EpisodeStreamingDataset

    if not (args.data / "meta/info.json").exists():
        shutil.rmtree(args.data, ignore_errors=True)
        write = _write_lerobot if LeRobotDataset is not None else _write_ours
        write(args.data, episodes=args.episodes, length=args.length, height=args.height, width=args.width, fps=30)
    ours = EpisodeDataset(args.data)
    indices = np.random.default_rng(1).integers(0, len(ours), args.samples).tolist()
    rows: dict[str, list[float]] = {"ours map": [], "ours loader": []}
    theirs = None
    if LeRobotDataset is not None:
        theirs = LeRobotDataset("bench/depth", root=args.data)
        rows = {"lerobot map": [], **rows}
        assert all(np.array_equal(ours[i][KEY], theirs[i][KEY]) for i in indices[:20]), "depth differs from LeRobot's"
    for _ in range(args.rounds):
        if theirs is not None:
            rows["lerobot map"].append(_rate(lambda: [theirs[i] for i in indices], len(indices)))
        rows["ours map"].append(_rate(lambda: [ours[i] for i in indices], len(indices)))
        loader = EpisodeLoader(EpisodeStreamingDataset(args.data, seed=0), batch_size=32, num_threads=args.threads)
        rows["ours loader"].append(_rate(lambda loader=loader: sum(len(b["index"]) for b in loader), len(ours)))
    base = statistics.median(rows["lerobot map"]) if theirs is not None else None
    print(f"depth {args.height}x{args.width}, {len(ours)} frames, {args.rounds} rounds (median, min-max):")
    for name, values in rows.items():
        ratio = f"  {statistics.median(values) / base:.2f}x lerobot map" if base else ""
        print(f"  {name:12s} {statistics.median(values):8.0f} samples/s ({min(values):.0f}-{max(values):.0f}){ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
