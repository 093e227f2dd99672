"""How a remote source shuffles over training windows, and what it costs: window diversity, bytes
fetched, node-cache disk and the first batch, by ``episode_pool_size``, side by side in one run.

A synthetic v3.0 dataset (``--episodes`` episodes of 30-60 frames, 2 cameras, 64x96 AV1, many
episodes per mp4) is written once under ``--cache-dir`` and served as the Hub (``FakeHub``) behind the
shaping proxy (``--latency-ms`` before each request, ``--bandwidth-mb-per-s`` for all connections).
Each round streams one epoch per pool size (alternating in direction from round to round), each in
a fresh process on an empty node cache, through ``EpisodeLoader`` (batch 32, ``--threads`` decode threads), and
reports:

- the first batch, seconds from construction (building the dataset included);
- samples/s over the epoch;
- window diversity: distinct episodes over 3,200 and 32,000 consecutive samples against a uniform
  permutation of the same frames (``_plan.shuffle_quality``), from the episodes the batches held;
- bytes through the link against the epoch's video bytes (the mp4 files' sizes);
- the loader process's peak RSS;
- the node cache's peak size on disk (sampled every 0.25 s by a process of its own: a walk of a
  wide pool's thousand files in the loader's process held its GIL long enough to slow the loader
  by ~10%) and ``cache_limit`` (none by default).

    python benchmarks/streaming/benchmark_remote_shuffle.py --rounds 2
    python benchmarks/streaming/benchmark_remote_shuffle.py --pool-sizes 64,auto --cache-limit 20MB

``64`` is what ``auto`` chose for every remote source before pools were bounded by disk.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WINDOWS = (3_200, 32_000)


def dataset_root(cache_dir: str, episodes: int) -> Path:
    from episodestream.tools.synthetic import write_synthetic_dataset

    root = Path(cache_dir) / f"remote-shuffle-v3.0-{episodes}x30-60"
    if not (root / "meta" / "info.json").exists():
        print(f"writing {root}", file=sys.stderr, flush=True)
        write_synthetic_dataset(root, num_episodes=episodes, episode_length=(30, 60), texture=True,
                                overwrite=True, progress=True)
    return root


def _watch_disk(folder: str, peak, done) -> None:
    """In a process of its own: the largest ``_disk_bytes`` of ``folder`` until ``done`` is set."""
    while not done.wait(0.25):
        peak.value = max(peak.value, _disk_bytes(Path(folder)))
    peak.value = max(peak.value, _disk_bytes(Path(folder)))


def _disk_bytes(folder: Path) -> int:
    """Bytes the files under ``folder`` take on disk (sparse files count their written blocks)."""
    total = 0
    for dirpath, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_blocks * 512
            except FileNotFoundError:  # evicted while walking
                pass
    return total


def _one(root: str, pool: str, args: argparse.Namespace) -> dict:
    """In the child: one epoch (see the module docstring)."""
    import numpy as np
    import torch

    from episodestream import EpisodeLoader, EpisodeStreamingDataset
    from episodestream._plan.shuffle_quality import window_diversity

    sys.path.insert(0, str(HERE))
    from _servers import serve

    torch.set_num_threads(1)
    pool, _, prefetch = pool.partition(":")
    pool_size: int | str = pool if pool == "auto" else int(pool)
    more = {"prefetch_episodes": int(prefetch)} if prefetch else {}
    video_bytes = sum(p.stat().st_size for p in Path(root, "videos").rglob("*.mp4"))
    with (serve("hub", root, latency_s=args.latency_ms / 1000, rate_bytes_per_s=args.bandwidth_mb_per_s * 1e6) as remote,
          tempfile.TemporaryDirectory(prefix="episodestream-remote-shuffle-") as cache_dir):
        spawn = multiprocessing.get_context("spawn")  # a fork would copy the servers' threads' locks
        peak, done = spawn.Value("q", 0), spawn.Event()
        watcher = spawn.Process(target=_watch_disk, args=(cache_dir, peak, done), daemon=True)
        watcher.start()
        remote.reset_link_stats()
        start = time.perf_counter()
        dataset = EpisodeStreamingDataset(remote.source, cache_dir=cache_dir, cache_limit=args.cache_limit,
                                          episode_pool_size=pool_size, seed=0, **more, **remote.options)
        loader = EpisodeLoader(dataset, 32, num_threads=args.threads)
        episodes, first_batch_s = [], None
        for batch in loader:
            if first_batch_s is None:
                first_batch_s = time.perf_counter() - start
            episodes.append(batch["episode_index"].numpy().copy())
        elapsed_s = time.perf_counter() - start
        loader.close()
        done.set()
        watcher.join()
        link = remote.link_stats()
        dataset.close()
    ids = np.concatenate(episodes)
    diversity = {w: window_diversity(ids, w) for w in WINDOWS}
    import resource

    return {"pool": dataset.episode_pool_size, "first_batch_s": first_batch_s, "samples": len(ids),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "samples_per_s": len(ids) / elapsed_s, "link_bytes": link["bytes"], "requests": link["requests"],
            "video_bytes": video_bytes, "peak_cache_bytes": peak.value,
            "windows": {w: [d.distinct, d.uniform_distinct, d.windows] for w, d in diversity.items()}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "episodestream-bench"))
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--pool-sizes", default="64,auto",
                        help="POOL[:PREFETCH] by commas (PREFETCH: prefetch_episodes; default the dataset's)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--bandwidth-mb-per-s", type=float, default=50.0)
    parser.add_argument("--threads", type=int, default=2, help="EpisodeLoader's decode threads")
    parser.add_argument("--cache-limit", default=None, help='e.g. "200MB" (default: none, as a user gets)')
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(_one(args.one[0], args.one[1], args)))
        return 0
    root = dataset_root(args.cache_dir, args.episodes)
    pools = args.pool_sizes.split(",")
    rows = []
    for round_ in range(args.rounds):
        for pool in (pools if round_ % 2 == 0 else pools[::-1]):
            command = [sys.executable, __file__, "--one", str(root), pool, "--latency-ms", str(args.latency_ms),
                       "--bandwidth-mb-per-s", str(args.bandwidth_mb_per_s), "--threads", str(args.threads)]
            if args.cache_limit:
                command += ["--cache-limit", args.cache_limit]
            result = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
            result["asked"] = pool
            rows.append(result)
            windows = "  ".join(f"W={int(w):,}: {d:.0f}/{u:.0f} ({d / u:.2f}, {n} windows)"
                                for w, (d, u, n) in result["windows"].items() if n)
            print(f"round {round_} pool {pool:>4} ({result['pool']}): first batch {result['first_batch_s']:.2f} s, "
                  f"{result['samples_per_s']:.0f} samples/s, link {result['link_bytes'] / result['video_bytes']:.2f}x "
                  f"the video bytes ({result['requests']} requests), peak cache {result['peak_cache_bytes'] / 1e6:.1f} MB"
                  f" (video {result['video_bytes'] / 1e6:.1f} MB), peak RSS {result['peak_rss_mb']:.0f} MB; {windows}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
