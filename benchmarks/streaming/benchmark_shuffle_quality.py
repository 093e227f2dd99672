"""Shuffle quality by episode pool size, from the schedule alone (planning only: no rows, no video).

For a synthetic layout (default: 2,000 episodes of 150-400 frames, one consumer) it plans each pool
size's schedule and prints distinct episodes per batch against a global shuffle's expectation for the
same frames (``episodestream._plan.shuffle_quality``), distinct episodes over training windows of
3,200 and 32,000 consecutive samples (100 and 1,000 steps of 32) against a uniform permutation of the
consumer's own frames, and how many samples pass before an episode's frames recur:

    python benchmarks/streaming/benchmark_shuffle_quality.py
    python benchmarks/streaming/benchmark_shuffle_quality.py --pool-sizes 16,64,256 --batch-sizes 32,256 --num-workers 2
    python benchmarks/streaming/benchmark_shuffle_quality.py --episodes 20000 --pool-sizes 96,1024,auto --batch-sizes 32

``auto`` is what ``episode_pool_size="auto"`` gives a local source whose video files fit the decoder
cache (v3.0's shared files): the selection's episodes + 1, i.e. each consumer's whole share (the rows
budget may hold fewer: the command prints the pool it planned).

With several consumers (``--world-size``, ``--num-workers``) each consumer's batches are compared
with a global shuffle of the whole epoch (what one DataLoader over a map-style dataset draws from),
its windows with a uniform permutation of its own frames, and the table shows the least diverse
consumer in each column.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from episodestream._base.world import World
from episodestream._plan.resume import consumer_schedule_of
from episodestream._plan.sampling import EpochPlan, Segment
from episodestream._plan.shuffle_quality import TRAINING_WINDOWS, emitted_episodes, shuffle_quality


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--min-frames", type=int, default=150)
    parser.add_argument("--max-frames", type=int, default=400)
    parser.add_argument("--pool-sizes", default="16,32,64,128,256,512,1024,auto",
                        help="comma-separated; 'auto': the selection's episodes + 1")
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
          f"{len(consumers)} consumer(s); distinct episodes per batch, ours / global shuffle (ratio); per "
          f"window of consecutive samples, ours / a uniform permutation of the consumer's frames (ratio); "
          f"samples between an episode's consecutive frames")
    header = (["pool"] + [f"batch {b}" for b in batch_sizes] + [f"{w:,} samples" for w in TRAINING_WINDOWS]
              + ["recurs every", "plan s"])
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for text in args.pool_sizes.split(","):
        pool = args.episodes + 1 if text == "auto" else int(text)
        start = time.perf_counter()
        least: list = [None] * (len(batch_sizes) + len(TRAINING_WINDOWS))
        for world in consumers:
            ids = emitted_episodes(consumer_schedule_of(plan, world, pool_size=pool, leg=0))
            rows = [shuffle_quality(ids, b, frame_counts=lengths) for b in batch_sizes]
            measures = [*rows, *rows[0].windows]
            for k, q in enumerate(measures):
                if least[k] is None or q.ratio < least[k].ratio or np.isnan(least[k].ratio):
                    least[k] = q
        cells = [f"{q.distinct:,.1f} / {q.global_distinct:,.1f} ({q.ratio:.2f})" for q in least[:len(batch_sizes)]]
        cells += [f"{w.distinct:,.0f} / {w.uniform_distinct:,.0f} ({w.ratio:.2f})" if w.windows else "-"
                  for w in least[len(batch_sizes):]]
        cells.append(f"{least[0].recur_gap:.0f} (global {least[0].global_recur_gap:.0f})")
        shown = f"auto ({pool})" if text == "auto" else str(pool)
        print(f"| {shown} | " + " | ".join(cells) + f" | {time.perf_counter() - start:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
