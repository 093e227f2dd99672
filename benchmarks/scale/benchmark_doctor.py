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
the report's own seconds (metadata to report, imports excluded) and the process's wall time. With
``--remote``, each layout is also served as a Hub repo (``FakeHub``, in this process) behind a
``ShapingProxy`` link of ``--latency-ms`` per request and ``--bandwidth-mb-per-s`` in all, and checked
from there into a fresh node cache: what a user checking a Hub dataset waits for, on this link.

    python benchmarks/scale/benchmark_doctor.py --episodes 92000 --data-dir /tmp/scale --jobs 2
    python benchmarks/scale/benchmark_doctor.py --episodes 0 --video-episodes 200 --data-dir /tmp/scale
    python benchmarks/scale/benchmark_doctor.py --episodes 10000 --remote --latency-ms 50 --bandwidth-mb-per-s 50
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HUB_OWNER = "bench"


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


@contextmanager
def served_as_hub(root: Path, *, latency_s: float, rate_bytes_per_s: float) -> Iterator[list[str]]:
    """The doctor options that read ``root`` as the Hub repo ``bench/<name>`` through a shaped link,
    into a node cache of its own."""
    from episodestream.testing import FakeHub, LinkSettings, ShapingProxy

    with tempfile.TemporaryDirectory(prefix="episodestream-doctor-bench-") as scratch:
        hub_root = Path(scratch) / "hub"
        (hub_root / "datasets" / HUB_OWNER).mkdir(parents=True)
        (hub_root / "datasets" / HUB_OWNER / root.name).symlink_to(root.resolve(), target_is_directory=True)
        settings = LinkSettings(latency_s=latency_s, rate_bytes_per_s=rate_bytes_per_s)
        with FakeHub(hub_root) as hub, ShapingProxy(hub.url, settings=settings) as proxy:
            yield [f"{HUB_OWNER}/{root.name}", "--hub-endpoint", proxy.url, "--cache-dir", str(Path(scratch) / "cache")]


def run_doctor(root: Path, jobs: int, decode: str, remote: list[str] | None = None) -> dict:
    source = remote or [str(root)]
    command = [sys.executable, "-m", "episodestream", "doctor", *source, "--json", "--no-progress",
               "--jobs", str(jobs), "--decode", decode]
    # A fresh process that sends nothing past the loopback link: no telemetry, no Xet, no stored token.
    env = {**os.environ, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "0"}
    if remote:
        env["HF_HOME"] = str(Path(remote[-1]).parent / "hf")
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    wall_s = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-2000:]}")
    report = json.loads(done.stdout)
    per_10k = report["seconds"] / report["episodes"] * 10_000
    return {"layout": root.name, "where": "remote" if remote else "local", "episodes": report["episodes"],
            "frames": report["frames"], "jobs": jobs, "decode": decode, "clean": report["clean"],
            "seconds": report["seconds"], "wall_s": round(wall_s, 2), "seconds_per_10k_episodes": round(per_10k, 2),
            "requests": report["fetched"]["requests"], "bytes_fetched": report["fetched"]["bytes_fetched"],
            "command": " ".join(command[1:])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=92_000, help="camera-less episodes (0: none)")
    parser.add_argument("--episode-length", type=int, nargs=2, default=(200, 300), metavar=("MIN", "MAX"))
    parser.add_argument("--video-episodes", type=int, default=0, help="episodes of the 2-camera dataset (0: none)")
    parser.add_argument("--video-episode-length", type=int, nargs=2, default=(40, 60), metavar=("MIN", "MAX"))
    parser.add_argument("--data-dir", default="/tmp/scale", help="where the layouts are written once")
    parser.add_argument("--jobs", type=int, nargs="+", default=[os.cpu_count() or 1])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--remote", action="store_true", help="also check each layout served as a Hub repo")
    parser.add_argument("--remote-only", action="store_true", help="check the layouts served as Hub repos only")
    parser.add_argument("--latency-ms", type=float, default=50.0, help="the link's delay per request")
    parser.add_argument("--bandwidth-mb-per-s", type=float, default=50.0, help="the link's bandwidth, all connections")
    args = parser.parse_args(argv)
    data_dir = Path(args.data_dir)
    roots = []
    if args.episodes:
        roots.append((tabular_dataset(data_dir, args.episodes, tuple(args.episode_length)), "ends"))
    if args.video_episodes:
        roots.append((video_dataset(data_dir, args.video_episodes, tuple(args.video_episode_length)), "ends"))
    rows = []
    for root, decode in roots:
        for jobs in args.jobs:
            for _ in range(args.repeats):
                if not args.remote_only:
                    rows.append(run_doctor(root, jobs, decode))
                if args.remote or args.remote_only:
                    with served_as_hub(root, latency_s=args.latency_ms / 1000,
                                       rate_bytes_per_s=args.bandwidth_mb_per_s * 1e6) as remote:
                        rows.append(run_doctor(root, jobs, decode, remote))
    link = f"{args.latency_ms:g} ms, {args.bandwidth_mb_per_s:g} MB/s"
    print("| layout | where | episodes | jobs | decode | doctor s | process wall s | s per 10,000 episodes | requests, MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        where = f"remote ({link})" if row["where"] == "remote" else "local"
        print(f"| {row['layout']} | {where} | {row['episodes']:,} | {row['jobs']} | {row['decode']} | "
              f"{row['seconds']:.2f} | {row['wall_s']:.2f} | {row['seconds_per_10k_episodes']:.2f} | "
              f"{row['requests']:,}, {row['bytes_fetched'] / 1e6:.1f} |")
    print(json.dumps(rows, indent=2), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
