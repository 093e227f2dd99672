"""Shuffle quality by episode pool size, from the schedule alone (planning only: no rows, no video).

For a synthetic layout (default: 2,000 episodes of 150-400 frames, one consumer) it plans each pool
size's schedule and prints distinct episodes per batch against a global shuffle's expectation for the
same frames (``episodestream._plan.shuffle_quality``), and how many samples pass before an episode's
frames recur:

    python benchmarks/streaming/benchmark_shuffle_quality.py
    python benchmarks/streaming/benchmark_shuffle_quality.py --pool-sizes 16,64,256 --batch-sizes 32,256 --num-workers 2

With several consumers (``--world-size``, ``--num-workers``) each consumer's batches are compared
with a global shuffle of the whole epoch (what one DataLoader over a map-style dataset draws from),
and the table shows the consumer with the fewest distinct episodes.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from episodestream._base.world import World
from episodestream._plan.resume import consumer_schedule_of
from episodestream._plan.sampling import EpochPlan, Segment
from episodestream._plan.shuffle_quality import emitted_episodes, shuffle_quality


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--min-frames", type=int, default=150)
    parser.add_argument("--max-frames", type=int, default=400)
    parser.add_argument("--pool-sizes", default="16,32,64,128,256,512,1024")
    parser.add_argument("--batch-sizes", default="32,256")
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    lengths = np.random.default_rng(args.seed).integers(args.min_frames, args.max_frames + 1, args.episodes)
    plan = EpochPlan([Segment(i, range(int(n))) for i, n in enumerate(lengths)], seed=args.seed, epoch=0,
                     shuffle=True, world_size=args.world_size)
    batch_sizes = _ints(args.batch_sizes)
    consumers = [World(rank, args.world_size, worker, args.num_workers)
                 for rank in range(args.world_size) for worker in range(args.num_workers)]
    print(f"{args.episodes} episodes of {args.min_frames}-{args.max_frames} frames ({int(lengths.sum())} frames), "
          f"{len(consumers)} consumer(s); distinct episodes per batch, ours / global shuffle (ratio); "
          f"samples between an episode's consecutive frames")
    header = ["pool"] + [f"batch {b}" for b in batch_sizes] + ["recurs every", "plan s"]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for pool in _ints(args.pool_sizes):
        start = time.perf_counter()
        worst = None
        for world in consumers:
            ids = emitted_episodes(consumer_schedule_of(plan, world, pool_size=pool, leg=0))
            rows = [shuffle_quality(ids, b, frame_counts=lengths) for b in batch_sizes]
            if worst is None or rows[0].distinct < worst[0].distinct:
                worst = rows
        assert worst is not None
        cells = [f"{q.distinct:.1f} / {q.global_distinct:.1f} ({q.ratio:.2f})" for q in worst]
        cells.append(f"{worst[0].recur_gap:.0f} (global {worst[0].global_recur_gap:.0f})")
        print(f"| {pool} | " + " | ".join(cells) + f" | {time.perf_counter() - start:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
