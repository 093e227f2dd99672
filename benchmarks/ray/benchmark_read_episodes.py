"""``episodestream.ray.read_episodes`` against Ray Data's ``read_lerobot`` on the same LeRobot-written data,
side by side in one run, each row on a fresh ``ray.init(num_cpus=--cpus)``.

The data: written once at ``--data`` by LeRobot's own writer (``LeRobotDataset.create`` / ``add_frame`` /
``save_episode``, its default AV1 encoder): ``--cameras`` 240x320 cameras of camera-like texture, a state
and an action. ``read_lerobot`` needs LeRobot importable (it reads the metadata with LeRobot's code), so
run this in a LeRobot 0.6 environment with Ray installed and this checkout on PYTHONPATH. Rows:

  - read_lerobot: ``ray.data.read_lerobot(root)`` at its defaults (``read_granularity="file"``);
  - read_lerobot episode: the same with ``read_granularity="episode"``;
  - read_episodes: ``episodestream.ray.read_episodes(root)`` (one task per CPU, one decode thread each);
  - read_episodes shuffle=False: ``read_episodes(root, shuffle=False)``, episodes and frames in file order
    as ``read_lerobot`` reads them (a shuffled epoch asks the decoder for frames at random: on GOP-2 AV1
    each one costs its keyframe's decode, where in order a keyframe serves the frame after it too);
  - read_episodes + collate_fn: the same as read_episodes through ``iter_torch_batches(collate_fn=collate_fn())``, i.e.
    float32 frames as ``EpisodeStreamingDataset`` gives them;
  - one task without Ray: what read task 0 of 2 runs (its blocks), called in this process, no Ray: the
    cost of our part alone, to tell it from Ray's.

Each row runs in a fresh process (its own Ray instance); rows alternate over ``--rounds`` rounds. Each
reports samples/s over ``--samples`` rows after the first batch and ``--warmup-samples`` more (rows the
tasks made while the first batch was awaited would otherwise count as speed; batches of ``--batch-size``: numpy
batches, uint8 frames, for all rows but collate_fn's), samples per CPU-second of the driver and Ray's
processes over the same rows (what a busy machine changes least), the first batch's time from the dataset's creation
(Ray's start not counted), and the peak memory of the driver and Ray's processes together (the sum of
their proportional set sizes, so the object store's shared pages count once), sampled every
``--memory-interval-s`` by a thread whose own CPU the samples per CPU-second leave out. Before the rounds a
fresh process checks a few samples of each reader against ``LeRobotDataset[i]``: ours as float32
(bit-equal expected), theirs as its uint8 frames against LeRobot's float32 frames times 255.

    .venv/bin/python benchmarks/ray/benchmark_read_episodes.py --data /tmp/ray-bench --rounds 2

with ``.venv`` made by ``bash scripts/setup.sh --lerobot`` and Ray added (``.venv/bin/python -m pip install -e
'.[ray]'``); in another LeRobot environment, put this checkout on ``PYTHONPATH`` instead.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROWS = ("read_lerobot", "read_lerobot episode", "read_episodes", "read_episodes shuffle=False",
        "read_episodes + collate_fn", "one task without Ray")
CAMERAS = ("observation.images.front", "observation.images.wrist")


def write(root: Path, *, episodes: int, length: int, cameras: int) -> None:
    import numpy as np
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    video = {"dtype": "video", "shape": (240, 320, 3), "names": ["height", "width", "channels"]}
    features = {**{camera: video for camera in CAMERAS[:cameras]},
                "observation.state": {"dtype": "float32", "shape": (6,), "names": None},
                "action": {"dtype": "float32", "shape": (6,), "names": None}}
    dataset = LeRobotDataset.create("bench/ray", fps=30, features=features, root=root, use_videos=True)
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (264, 400, 3), dtype=np.uint8)  # a texture that pans, as a camera's view
    for episode in range(episodes):
        for frame in range(length):
            x, y = (frame * 2 + episode * 7) % 80, (frame + episode * 3) % 20
            state = rng.normal(size=6).astype(np.float32)
            views = {camera: base[y + 2 * c:y + 2 * c + 240, x:x + 320] for c, camera in enumerate(CAMERAS[:cameras])}
            dataset.add_frame({**views, "observation.state": state, "action": state + 0.1,
                               "task": f"task {episode % 3}"})
        dataset.save_episode()
    dataset.finalize()


def _pss_mb(pid: int) -> float:
    """Proportional set size of ``pid`` and its descendants (Ray's raylet, workers), from /proc."""
    total = 0.0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            total += next(int(line.split()[1]) for line in rollup if line.startswith("Pss:")) / 1024
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as children:
                total += sum(_pss_mb(int(child)) for child in children.read().split())
    except (OSError, StopIteration):  # a process that just exited
        pass
    return total


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its descendants so far (Ray's workers live as long as
    the instance, so none of the timed window's CPU leaves with an exited process)."""
    total = 0.0
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as children:
                total += sum(_cpu_s(int(child)) for child in children.read().split())
    except (OSError, IndexError, ValueError):  # a process that just exited
        pass
    return total


def _thread_cpu_s(native_id: int) -> float:
    """User + system CPU seconds of this process's thread ``native_id`` so far."""
    with open(f"/proc/self/task/{native_id}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _PeakMemory:
    """Samples the summed PSS every ``interval_s``. Each sample reads every process's smaps_rollup,
    which walks the page tables of Ray's object store mapping: kernel time that grows with the mapped
    size. Sampled too often it takes a share of the cores from the reader being timed, so the interval
    is an option and the thread's own CPU (``cpu_s``) is left out of the samples per CPU-second."""

    def __init__(self, *, interval_s: float) -> None:
        self.peak_mb = 0.0
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.peak_mb = max(self.peak_mb, _pss_mb(os.getpid()))

    def cpu_s(self) -> float:
        """The sampler's CPU seconds so far (0 once it has stopped: read it before ``stop``)."""
        try:
            return _thread_cpu_s(self._thread.native_id or 0)
        except (OSError, IndexError, ValueError):
            return 0.0

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak_mb


def _batches(row: str, root: Path, args):
    import ray.data

    if row.startswith("read_lerobot"):
        granularity = "episode" if row.endswith("episode") else "file"
        dataset = ray.data.read_lerobot(str(root), read_granularity=granularity)
        return dataset.iter_batches(batch_size=args.batch_size, batch_format="numpy")
    from episodestream.ray import collate_fn, read_episodes

    dataset = read_episodes(root, seed=0, shuffle=not row.endswith("shuffle=False"))
    if row.endswith("collate_fn"):
        return dataset.iter_torch_batches(batch_size=args.batch_size, collate_fn=collate_fn())
    return dataset.iter_batches(batch_size=args.batch_size, batch_format="numpy")


def _task_alone(root: Path, args):
    """Read task 0 of ``args.cpus``'s blocks as numpy batches, in this process (no Ray)."""
    from episodestream import EpisodeStreamingDataset
    from episodestream.ray._share import DatasetStream, ShareSpec, dataset_rows, read_share

    frames = len(EpisodeStreamingDataset(root, rank=0, world_size=1))
    spec = ShareSpec(build=DatasetStream(root, {"return_uint8": True, "seed": 0}), epoch=0,
                     rows=dataset_rows(frames, args.cpus), rows_per_block=64, threads_per_task=1)
    blocks = read_share(spec, 0)
    try:
        for block in blocks:
            yield {name: block.column(name).to_numpy() for name in block.column_names}
    finally:
        blocks.close()


def run_row(row: str, root: Path, args) -> dict:
    if row == "one task without Ray":
        batches = _task_alone(root, args)
    else:
        import ray

        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    memory = _PeakMemory(interval_s=args.memory_interval_s)
    start = time.perf_counter()
    iterator = iter(batches if row == "one task without Ray" else _batches(row, root, args))
    first = next(iterator)
    first_s = time.perf_counter() - start
    key = next(k for k in first if k.startswith("observation.images."))
    # Read tasks keep making blocks while the first one is awaited: those rows would count as speed.
    warmed = 0
    while warmed < args.warmup_samples:
        warmed += len(next(iterator)[key])
    began, samples = time.perf_counter(), 0
    cpu_before = _cpu_s(os.getpid()) - memory.cpu_s()
    for batch in iterator:
        samples += len(batch[key])
        if samples >= args.samples:
            break
    rate = samples / (time.perf_counter() - began)
    if row == "one task without Ray":
        iterator.close()  # joins the loader's threads before the process exits
    per_cpu_s = samples / max(1e-9, _cpu_s(os.getpid()) - memory.cpu_s() - cpu_before)
    peak = memory.stop()
    return {"row": row, "samples_per_s": rate, "samples_per_cpu_s": per_cpu_s, "first_batch_s": first_s,
            "peak_mb": peak, "samples": samples, "load_average": os.getloadavg()[0]}


def check_frames(root: Path) -> dict:
    """Whether a few samples' frames equal ``LeRobotDataset[i]``'s, for ours (float32, bit for bit) and
    read_lerobot's (uint8 against LeRobot's float32 times 255, rounded)."""
    import numpy as np
    import ray
    import torch
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from episodestream.ray import collate_fn, read_episodes

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    reference = LeRobotDataset("bench/ray", root=root)
    cameras = [k for k in reference.meta.video_keys]
    ours = next(iter(read_episodes(root, seed=0).iter_torch_batches(batch_size=16, collate_fn=collate_fn())))
    ours_equal = all(torch.equal(ours[camera][j], reference[int(ours["index"][j])][camera])
                     for j in range(16) for camera in cameras)
    theirs = next(iter(ray.data.read_lerobot(str(root)).iter_batches(batch_size=16, batch_format="numpy")))
    theirs_equal, max_diff = True, 0
    for j in range(16):
        expected = reference[int(theirs["index"][j])]
        for camera in cameras:
            want = (expected[camera] * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
            got = np.asarray(theirs[camera][j])
            theirs_equal &= bool(np.array_equal(got, want))
            max_diff = max(max_diff, int(np.abs(got.astype(int) - want.astype(int)).max()))
    return {"ours_bit_equal": ours_equal, "theirs_uint8_equal": theirs_equal, "theirs_max_abs_diff": max_diff}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="the dataset folder (written by LeRobot if absent)")
    parser.add_argument("--episodes", type=int, default=30, help="episodes to write (default 30)")
    parser.add_argument("--length", type=int, default=300, help="frames per episode to write (default 300)")
    parser.add_argument("--cameras", type=int, default=2, choices=(1, 2), help="cameras to write (default 2)")
    parser.add_argument("--cpus", type=int, default=2, help="ray.init(num_cpus=...) (default 2)")
    parser.add_argument("--batch-size", type=int, default=32, help="batch size (default 32)")
    parser.add_argument("--samples", type=int, default=3000, help="samples timed after the warm-up (default 3000)")
    parser.add_argument("--warmup-samples", type=int, default=1500,
                        help="samples read after the first batch before the timing starts (default 1500)")
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds (default 1)")
    parser.add_argument("--memory-interval-s", type=float, default=2.0,
                        help="seconds between peak-memory samples (default 2.0: each sample costs kernel time)")
    parser.add_argument("--rows", default=",".join(ROWS), help="the rows to run, comma-separated")
    parser.add_argument("--one-row", help=argparse.SUPPRESS)  # a child process runs one row
    parser.add_argument("--check-frames", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one_row:
        print(json.dumps(run_row(args.one_row, args.data, args)))
        return 0
    if args.check_frames:
        print(json.dumps(check_frames(args.data)))
        return 0
    if not (args.data / "meta" / "info.json").exists():
        print(f"writing {args.episodes} x {args.length} frames, {args.cameras} camera(s), with LeRobot at {args.data}",
              file=sys.stderr)
        write(args.data, episodes=args.episodes, length=args.length, cameras=args.cameras)
    child = [sys.executable, __file__, "--data", str(args.data), "--cpus", str(args.cpus),
             "--batch-size", str(args.batch_size), "--samples", str(args.samples),
             "--memory-interval-s", str(args.memory_interval_s), "--warmup-samples", str(args.warmup_samples)]
    checked = subprocess.run([*child, "--check-frames"], capture_output=True, text=True)
    print("frames:", checked.stdout.strip().splitlines()[-1] if checked.returncode == 0 else checked.stderr[-2000:])
    results: dict[str, list[dict]] = {}
    for _ in range(args.rounds):
        for row in args.rows.split(","):
            done = subprocess.run([*child, "--one-row", row], capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{row}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
                continue
            result = json.loads(done.stdout.strip().splitlines()[-1])
            results.setdefault(row, []).append(result)
            print(json.dumps(result), flush=True)
    print(f"\n| reader (num_cpus={args.cpus}) | samples/s | samples per CPU-s | first batch (s) | peak memory (MB) |")
    print("| --- | --- | --- | --- | --- |")
    for row, runs in results.items():
        print(f"| {row} | {statistics.median(r['samples_per_s'] for r in runs):.0f} "
              f"| {statistics.median(r['samples_per_cpu_s'] for r in runs):.1f} "
              f"| {statistics.median(r['first_batch_s'] for r in runs):.1f} "
              f"| {statistics.median(r['peak_mb'] for r in runs):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
