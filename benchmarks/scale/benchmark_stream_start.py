"""How a rank's stream starts on a large dataset: construction, first sample, the rate of the first N
samples and the RSS after them, in this (fresh) process, no DataLoader workers.

A pool of a whole share reads every episode's rows within its first samples (each episode's first emit
comes within the first 1/length of the stream) and holds them all epoch; a sliding pool reads one episode
per slot. This is where the two differ most, so the scale table measures it:

    python benchmarks/scale/benchmark_stream_start.py /tmp/scale/tabular-92000-200-300 --samples 20000

(the dataset as ``benchmark_scale.py --sizes 92000 --data-dir /tmp/scale`` writes it; rank 0 of 8, a
16-step action window, as there).
"""

from __future__ import annotations

import argparse
import resource
import time


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root")
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--pool-size", type=lambda v: v if v == "auto" else int(v), default="auto")
    args = parser.parse_args(argv)
    import torch  # noqa: F401  (the baseline RSS includes torch, as in any trainer)

    from episodestream import EpisodeStreamingDataset

    base_mb = _rss_mb()
    start = time.perf_counter()
    dataset = EpisodeStreamingDataset(args.root, rank=0, world_size=args.world_size, seed=0,
                                      episode_pool_size=args.pool_size,
                                      delta_timestamps={"action": [k / 30 for k in range(16)]})
    built = time.perf_counter()
    samples = iter(dataset)
    next(samples)
    first = time.perf_counter()
    for _ in range(args.samples - 1):
        next(samples)
    done = time.perf_counter()
    print(f"pool {dataset.episode_pool_size}: construct {built - start:.2f} s, first sample {first - built:.2f} s, "
          f"first {args.samples:,} samples {args.samples / (done - first):,.0f}/s, RSS above the interpreter "
          f"{_rss_mb() - base_mb:.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
