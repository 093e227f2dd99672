"""Our loaders against LeRobot 0.6's own on the same LeRobot-written data, side by side in one run.

The data: a dataset written by LeRobot's own writer (``LeRobotDataset.create`` / ``add_frame`` /
``save_episode``: its default AV1 encoder) with one 240x320 camera of camera-like texture, a state
and an action, made once at ``--data``. Needs LeRobot 0.6 importable (it is the reference); rows:

  - lerobot map + DataLoader: ``LeRobotDataset`` in a DataLoader (``--workers`` workers, shuffle=True: a
    global shuffle), LeRobot's training setup;
  - lerobot streaming + DataLoader: LeRobot's ``StreamingLeRobotDataset`` over the same folder;
  - ours map + DataLoader: ``EpisodeDataset`` in the same DataLoader (a global shuffle too);
  - ours stream + DataLoader: ``EpisodeStreamingDataset`` (pool of ``--pool`` episodes);
  - ours EpisodeLoader: the same stream, decoded on ``--workers`` threads in the trainer's process;
  - ours EpisodeLoader (pool = episodes + 1): the same with ``episode_pool_size`` above the dataset's
    episodes, so every episode's frames are drawn over the whole epoch (a global shuffle but for the
    pool's start ramp);
  - lance + DataLoader in-process / lance + DataLoader: lerobot-lancedb's ``LanceDBDataset`` (the same
    mp4 bytes in a Lance table with a keyframe index, converted once to ``<--data>-lance``) in a
    DataLoader with shuffle=True, ``num_workers=0`` and ``--workers`` workers (its
    ``lance_mp_context()``); run where ``lerobot_lancedb`` is importable, skipped with a reason elsewhere.

Each row runs in a fresh process (its imports, its memory), rows alternate over ``--rounds`` rounds
(the machine is noisy: read the ratios), and each reports samples/s over ``--batches`` batches of
``--batch-size`` after the first, the first batch's time from construction, the peak resident
memory of the process and its workers together, and the distinct episodes per timed batch (read from
the batches' ``episode_index``) against a global shuffle's expectation for the same data. Before the
rounds a fresh process checks that a few samples' frames are bit-equal across LeRobot, ours and Lance.

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

LANCE_ROWS = ("lance + DataLoader in-process", "lance + DataLoader")
ROWS = ("lerobot map + DataLoader", "lerobot streaming + DataLoader", "ours map + DataLoader",
        "ours stream + DataLoader", "ours EpisodeLoader", "ours EpisodeLoader (pool = episodes + 1)", *LANCE_ROWS)
GLOBAL_ROWS = ("ours map + DataLoader", "ours EpisodeLoader (pool = episodes + 1)")  # ours at a global shuffle
CAMERA = "observation.images.front"


def _lance_root(root: Path) -> Path:
    """Where the Lance copy of ``root`` is cached: beside it."""
    return root.parent / f"{root.name}-lance"


def _lance_missing() -> str | None:
    """Why the Lance rows cannot run here, or None."""
    try:
        import lerobot_lancedb  # noqa: F401
    except ImportError as error:
        return f"lerobot_lancedb is not importable ({error}); pip install lerobot-lancedb lancedb"
    return None


def _convert_to_lance(root: Path) -> Path:
    """Convert ``root`` to the Lance layout once; ``done`` marks a finished conversion."""
    from lerobot_lancedb.convert import convert

    out = _lance_root(root)
    if not (out / "done").exists():
        shutil.rmtree(out, ignore_errors=True)
        print(f"converting {root} to Lance at {out} ...")
        convert(out, root=root)
        (out / "done").write_text("converted by benchmarks/compare_lerobot.py\n")
    return out


def _episode_lengths(root: Path) -> list[int]:
    import pyarrow.parquet as pq

    files = sorted((root / "meta/episodes").rglob("*.parquet"))
    return [n for f in files for n in pq.read_table(f, columns=["length"]).column("length").to_pylist()]


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
    if row.startswith("lance"):
        from lerobot_lancedb import LanceDBDataset, lance_mp_context

        dataset = LanceDBDataset(root=_lance_root(root))
        if row == "lance + DataLoader in-process":
            return torch.utils.data.DataLoader(dataset, shuffle=True, **{**loader_options, "num_workers": 0}), start
        # Lance's runtime holds threads: its workers start by forkserver, as lerobot-lancedb says to.
        return torch.utils.data.DataLoader(dataset, shuffle=True, multiprocessing_context=lance_mp_context(),
                                           **loader_options), start
    from episodestream import EpisodeDataset, EpisodeLoader, EpisodeStreamingDataset

    if row == "ours map + DataLoader":
        return torch.utils.data.DataLoader(EpisodeDataset(root), shuffle=True, **loader_options), start
    # A pool of more episodes than the dataset has puts every episode on the start ramp (a pool of exactly
    # as many leaves the last episode a one-slot window: its frames all come last).
    pool = len(_episode_lengths(root)) + 1 if row == "ours EpisodeLoader (pool = episodes + 1)" else args.pool
    stream = EpisodeStreamingDataset(root, episode_pool_size=pool, seed=0)
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
    began, samples, distinct = time.perf_counter(), 0, []
    for _ in range(args.batches):
        batch = next(iterator)
        samples += len(batch[CAMERA])
        distinct.append(len(set(batch["episode_index"].tolist())))
    rate = samples / (time.perf_counter() - began)
    peak = rss.stop()
    del iterator, loader
    return {"row": row, "samples_per_s": rate, "first_batch_s": first_s, "rss_mb": peak,
            "distinct": statistics.mean(distinct)}


def check_frames(root: Path, lance: bool) -> str:
    """Whether a few samples' frames (episode starts and ends among them) are bit-equal across LeRobot,
    ours and, where ``lance``, Lance, at the same indices."""
    import torch
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from episodestream import EpisodeDataset

    lengths = _episode_lengths(root)
    total = sum(lengths)
    indices = sorted({0, lengths[0] - 1, lengths[0], total // 3, total // 2 + 7, total - 1})
    readers = {"ours": EpisodeDataset(root)}
    if lance:
        from lerobot_lancedb import LanceDBDataset

        readers["lance"] = LanceDBDataset(root=_lance_root(root))
    reference = LeRobotDataset("bench/lerobot", root=root)
    unequal = []
    for index in indices:
        expected = reference[index][CAMERA]
        for name, reader in readers.items():
            got = reader[index][CAMERA]
            if got.shape != expected.shape or not torch.equal(got, expected):
                diff = (got.float() - expected.float()).abs().max().item() if got.shape == expected.shape else "shape"
                unequal.append(f"{name} at {index} (max abs difference {diff})")
    names = " and ".join(readers)
    if unequal:
        return f"frames NOT equal to LeRobot's: {'; '.join(unequal)} (indices {indices})"
    return f"frames bit-equal: {names} against LeRobot at indices {indices}"


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
    parser.add_argument("--check-frames", choices=("with-lance", "without-lance"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.one_row:
        print(json.dumps(run_row(args.one_row, args.data, args)))
        return 0
    if args.check_frames:
        print(check_frames(args.data, args.check_frames == "with-lance"))
        return 0
    if not (args.data / "meta/info.json").exists():
        shutil.rmtree(args.data, ignore_errors=True)
        shutil.rmtree(_lance_root(args.data), ignore_errors=True)
        write(args.data, episodes=args.episodes, length=args.length)
    rows = [r for r in args.rows.split(",") if r]
    lance_missing = _lance_missing() if any(r in LANCE_ROWS for r in rows) else None
    if lance_missing:
        print(f"skipping the Lance rows: {lance_missing}")
        rows = [r for r in rows if r not in LANCE_ROWS]
    elif any(r in LANCE_ROWS for r in rows):
        _convert_to_lance(args.data)
    results: dict[str, list[dict]] = {row: [] for row in rows}
    passed = [a for a in (argv if argv is not None else sys.argv[1:])]
    lance = "with-lance" if any(r in LANCE_ROWS for r in rows) else "without-lance"
    checked = subprocess.run([sys.executable, __file__, *passed, "--check-frames", lance], capture_output=True, text=True)
    print(checked.stdout.strip().splitlines()[-1] if checked.returncode == 0 else
          f"frame check failed: {checked.stderr.strip().splitlines()[-1] if checked.stderr.strip() else '?'}")
    load_before = os.getloadavg()
    for _ in range(args.rounds):
        for row in rows:
            done = subprocess.run([sys.executable, __file__, *passed, "--one-row", row], capture_output=True, text=True)
            if done.returncode:
                print(f"{row}: failed ({done.stderr.strip().splitlines()[-1] if done.stderr.strip() else '?'})")
                continue
            results[row].append(json.loads(done.stdout.strip().splitlines()[-1]))
    from episodestream._plan.shuffle_quality import global_distinct

    expected = global_distinct(_episode_lengths(args.data), args.batch_size)
    rates = {row: statistics.median(r["samples_per_s"] for r in runs) for row, runs in results.items() if runs}
    base = rates.get(ROWS[0])
    print(f"LeRobot-written 240x320 AV1, batch {args.batch_size}, {args.workers} workers/threads, "
          f"{args.batches} batches timed, {args.rounds} rounds (median; per round); load average "
          f"{load_before[0]:.2f} before the rounds, {os.getloadavg()[0]:.2f} after:")
    print(f"| loader | samples/s | against LeRobot map | distinct episodes per batch (a global shuffle: "
          f"{expected:.2f}) | first batch s | peak RSS MB (process and workers) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row, runs in results.items():
        if not runs:
            continue
        ratio = f"{rates[row] / base:.2f}x" if base else "-"
        each = ", ".join(f"{r['samples_per_s']:.0f}" for r in runs)
        distinct = statistics.mean(r["distinct"] for r in runs)
        print(f"| {row} | {rates[row]:.0f} ({each}) | {ratio} | {distinct:.2f} ({distinct / expected:.2f}) | "
              f"{statistics.median(r['first_batch_s'] for r in runs):.2f} | "
              f"{statistics.median(r['rss_mb'] for r in runs):.0f} |")
    lance = rates.get(LANCE_ROWS[0])
    for row in GLOBAL_ROWS:
        if lance and row in rates:
            print(f"{row} (a global shuffle) against lance in-process: {rates[row] / lance:.2f}x (goal 1.5x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
