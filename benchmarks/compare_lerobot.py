"""Our loaders against LeRobot 0.6's own on the same LeRobot-written data, side by side in one run.

The data: a dataset written by LeRobot's own writer (``LeRobotDataset.create`` / ``add_frame`` /
``save_episode``: its default AV1 encoder) with one 240x320 camera of camera-like texture, a state
and an action, made once at ``--data``. Needs LeRobot 0.6 importable (it is the reference); rows:

  - lerobot map + DataLoader: ``LeRobotDataset`` in a DataLoader (``--workers`` workers, shuffle=True: a
    global shuffle), LeRobot's training setup;
  - lerobot streaming + DataLoader: LeRobot's ``StreamingLeRobotDataset`` over the same folder;
  - ours map + DataLoader: ``EpisodeDataset`` in the same DataLoader (a global shuffle too);
  - ours stream + DataLoader: ``EpisodeStreamingDataset`` (pool of ``--pool`` episodes);
  - ours EpisodeLoader: the same stream, decoded on ``--workers`` threads in the trainer's process.

Each row runs in a fresh process (its imports, its memory), rows alternate over ``--rounds`` rounds
(the machine is noisy: read the ratios), and each reports samples/s over ``--batches`` batches of
``--batch-size`` after the first, the first batch's time from construction, and the peak resident
memory of the process and its DataLoader workers together. Our samples equal LeRobot's (tests/with_lerobot).

    python benchmarks/compare_lerobot.py --data /tmp/lerobot-bench
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROWS = ("lerobot map + DataLoader", "lerobot streaming + DataLoader", "ours map + DataLoader",
        "ours stream + DataLoader", "ours EpisodeLoader")
CAMERA = "observation.images.front"


def write(root: Path, *, episodes: int, length: int) -> None:
    import numpy as np
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {CAMERA: {"dtype": "video", "shape": (240, 320, 3), "names": ["height", "width", "channels"]},
                "observation.state": {"dtype": "float32", "shape": (6,), "names": None},
                "action": {"dtype": "float32", "shape": (6,), "names": None}}
    dataset = LeRobotDataset.create("bench/lerobot", fps=30, features=features, root=root, use_videos=True)
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (260, 400, 3), dtype=np.uint8)  # a texture that pans, as a camera's view
    for episode in range(episodes):
        for frame in range(length):
            x, y = (frame * 2 + episode * 7) % 80, (frame + episode * 3) % 20
            state = rng.normal(size=6).astype(np.float32)
            dataset.add_frame({CAMERA: base[y:y + 240, x:x + 320], "observation.state": state,
                               "action": state + 0.1, "task": f"task {episode % 3}"})
        dataset.save_episode()
    dataset.finalize()


def _loader(row: str, root: Path, args) -> tuple[object, float]:
    import torch.utils.data

    start = time.perf_counter()
    loader_options = dict(batch_size=args.batch_size, num_workers=args.workers, persistent_workers=False)
    if row.startswith("lerobot"):
        from lerobot.datasets.lerobot_dataset import LeRobotDataset
        from lerobot.datasets.streaming_dataset import StreamingLeRobotDataset

        if row == "lerobot map + DataLoader":
            dataset = LeRobotDataset("bench/lerobot", root=root)
            return torch.utils.data.DataLoader(dataset, shuffle=True, **loader_options), start
        dataset = StreamingLeRobotDataset("bench/lerobot", root=root)
        return torch.utils.data.DataLoader(dataset, **loader_options), start
    from episodestream import EpisodeDataset, EpisodeLoader, EpisodeStreamingDataset

    if row == "ours map + DataLoader":
        return torch.utils.data.DataLoader(EpisodeDataset(root), shuffle=True, **loader_options), start
    stream = EpisodeStreamingDataset(root, episode_pool_size=args.pool, seed=0)
    if row == "ours stream + DataLoader":
        return torch.utils.data.DataLoader(stream, **loader_options), start
    return EpisodeLoader(stream, batch_size=args.batch_size, num_threads=args.workers), start


def _tree_rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and its descendants (DataLoader workers), from /proc."""
    total = 0.0
    try:
        with open(f"/proc/{pid}/status") as status:
            total += next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as children:
                total += sum(_tree_rss_mb(int(child)) for child in children.read().split())
    except (OSError, StopIteration):  # a worker that just exited
        pass
    return total


class _PeakRss:
    """The peak of this process's and its workers' resident memory together, sampled every 20 ms
    (``ru_maxrss`` would carry the parent's peak over exec, and counts no worker's)."""

    def __init__(self) -> None:
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak_mb = max(self.peak_mb, _tree_rss_mb(os.getpid()))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak_mb


def run_row(row: str, root: Path, args) -> dict:
    rss = _PeakRss()
    loader, start = _loader(row, root, args)
    iterator = iter(loader)
    next(iterator)
    first_s = time.perf_counter() - start
    began, samples = time.perf_counter(), 0
    for _ in range(args.batches):
        batch = next(iterator)
        samples += len(batch[CAMERA])
    rate = samples / (time.perf_counter() - began)
    peak = rss.stop()
    del iterator, loader
    return {"row": row, "samples_per_s": rate, "first_batch_s": first_s, "rss_mb": peak}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="the dataset folder (written by LeRobot if absent)")
    parser.add_argument("--episodes", type=int, default=12, help="episodes to write (default 12)")
    parser.add_argument("--length", type=int, default=150, help="frames per episode to write (default 150)")
    parser.add_argument("--batch-size", type=int, default=32, help="batch size (default 32)")
    parser.add_argument("--batches", type=int, default=30, help="batches timed after the first (default 30)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers / EpisodeLoader threads (default 2)")
    parser.add_argument("--pool", type=int, default=16, help="our episode pool (default 16)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (default 2)")
    parser.add_argument("--rows", default=",".join(ROWS), help="the rows to run, comma-separated")
    parser.add_argument("--one-row", help=argparse.SUPPRESS)  # a child process runs one row
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.one_row:
        print(json.dumps(run_row(args.one_row, args.data, args)))
        return 0
    if not (args.data / "meta/info.json").exists():
        shutil.rmtree(args.data, ignore_errors=True)
        write(args.data, episodes=args.episodes, length=args.length)
    rows = [r for r in args.rows.split(",") if r]
    results: dict[str, list[dict]] = {row: [] for row in rows}
    passed = [a for a in (argv if argv is not None else sys.argv[1:])]
    for _ in range(args.rounds):
        for row in rows:
            done = subprocess.run([sys.executable, __file__, *passed, "--one-row", row], capture_output=True, text=True)
            if done.returncode:
                print(f"{row}: failed ({done.stderr.strip().splitlines()[-1] if done.stderr.strip() else '?'})")
                continue
            results[row].append(json.loads(done.stdout.strip().splitlines()[-1]))
    base = [r["samples_per_s"] for r in results.get(ROWS[0], [])]
    print(f"LeRobot-written 240x320 AV1, batch {args.batch_size}, {args.workers} workers/threads, "
          f"{args.batches} batches timed, {args.rounds} rounds (median; per round):")
    print("| loader | samples/s | against LeRobot map | first batch s | peak RSS MB (process and workers) |")
    print("| --- | --- | --- | --- | --- |")
    for row, runs in results.items():
        if not runs:
            continue
        rate = statistics.median(r["samples_per_s"] for r in runs)
        ratio = f"{rate / statistics.median(base):.2f}x" if base else "-"
        each = ", ".join(f"{r['samples_per_s']:.0f}" for r in runs)
        print(f"| {row} | {rate:.0f} ({each}) | {ratio} | "
              f"{statistics.median(r['first_batch_s'] for r in runs):.2f} | "
              f"{statistics.median(r['rss_mb'] for r in runs):.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
