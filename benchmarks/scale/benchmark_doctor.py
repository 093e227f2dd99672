"""Seconds per 10,000 episodes of ``episodestream doctor`` on a DROID-sized layout.

Two layouts, each written once under ``--data-dir`` and reused:

- camera-less, ``--episodes`` episodes of ``--episode-length`` (min, max) frames, 1,000 episodes per
  data file (``write_tabular_dataset``, the scale benchmark's ``tabular-N-MIN-MAX`` folders, shared
  with it): metadata, every episode's rows and their checks, tasks;
- with ``--video-episodes`` > 0, a synthetic dataset of that many episodes with 2 AV1 cameras
  (``write_synthetic_dataset``, textured 96x128 frames, 40 episodes per video file): the same plus each
  camera decoded at every episode's first and last frames (``--decode ends``), reported per 10,000
  episodes too (a rate: video episodes cost about the same whatever their number).

Each run is ``python -m episodestream doctor ROOT --json --no-progress --jobs J`` in a fresh process:
the report's own seconds (metadata to report, imports excluded) and the process's wall time.

    python benchmarks/scale/benchmark_doctor.py --episodes 92000 --data-dir /tmp/scale --jobs 2
    python benchmarks/scale/benchmark_doctor.py --episodes 0 --video-episodes 200 --data-dir /tmp/scale
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def tabular_dataset(data_dir: Path, episodes: int, length: tuple[int, int]) -> Path:
    root = data_dir / f"tabular-{episodes}-{length[0]}-{length[1]}"
    if not (root / "meta/info.json").exists():
        from episodestream.tools.synthetic import write_tabular_dataset

        start = time.perf_counter()
        write_tabular_dataset(root, num_episodes=episodes, episode_length=length, overwrite=True)
        print(f"wrote {root} in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return root


def video_dataset(data_dir: Path, episodes: int, length: tuple[int, int]) -> Path:
    root = data_dir / f"video-{episodes}-{length[0]}-{length[1]}"
    if not (root / "meta/info.json").exists():
        from episodestream.tools.synthetic import write_synthetic_dataset

        start = time.perf_counter()
        write_synthetic_dataset(root, num_episodes=episodes, episode_length=length, height=96, width=128,
                                texture=True, max_episodes_per_video_file=40, max_episodes_per_data_file=1000,
                                overwrite=True, progress=True)
        print(f"wrote {root} in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return root


def run_doctor(root: Path, jobs: int, decode: str) -> dict:
    command = [sys.executable, "-m", "episodestream", "doctor", str(root), "--json", "--no-progress",
               "--jobs", str(jobs), "--decode", decode]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy())
    wall_s = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-2000:]}")
    report = json.loads(done.stdout)
    per_10k = report["seconds"] / report["episodes"] * 10_000
    return {"layout": root.name, "episodes": report["episodes"], "frames": report["frames"], "jobs": jobs,
            "decode": decode, "clean": report["clean"], "seconds": report["seconds"], "wall_s": round(wall_s, 2),
            "seconds_per_10k_episodes": round(per_10k, 2), "command": " ".join(command[1:])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=92_000, help="camera-less episodes (0: none)")
    parser.add_argument("--episode-length", type=int, nargs=2, default=(200, 300), metavar=("MIN", "MAX"))
    parser.add_argument("--video-episodes", type=int, default=0, help="episodes of the 2-camera dataset (0: none)")
    parser.add_argument("--video-episode-length", type=int, nargs=2, default=(40, 60), metavar=("MIN", "MAX"))
    parser.add_argument("--data-dir", default="/tmp/scale", help="where the layouts are written once")
    parser.add_argument("--jobs", type=int, nargs="+", default=[os.cpu_count() or 1])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    data_dir = Path(args.data_dir)
    roots = []
    if args.episodes:
        roots.append((tabular_dataset(data_dir, args.episodes, tuple(args.episode_length)), "ends"))
    if args.video_episodes:
        roots.append((video_dataset(data_dir, args.video_episodes, tuple(args.video_episode_length)), "ends"))
    rows = [run_doctor(root, jobs, decode) for root, decode in roots for jobs in args.jobs for _ in range(args.repeats)]
    print("| layout | episodes | jobs | decode | doctor s | process wall s | s per 10,000 episodes |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['layout']} | {row['episodes']:,} | {row['jobs']} | {row['decode']} | {row['seconds']:.2f} | "
              f"{row['wall_s']:.2f} | {row['seconds_per_10k_episodes']:.2f} |")
    print(json.dumps(rows, indent=2), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
