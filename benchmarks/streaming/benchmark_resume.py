"""Time to first batch after resuming at 90% of an epoch, against a cold start, in the same run.

Each trial builds a fresh dataset and DataLoader (as a restarted job would), alternating cold and
resumed starts so machine noise hits both; prints medians and their ratio.

    python benchmarks/streaming/benchmark_resume.py --output-dir bench_out
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch.utils.data

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_streaming import add_dataset_arguments, ensure_dataset  # noqa: E402  (same benchmark dataset)

from episodestream import EpisodeStreamingDataset  # noqa: E402


def first_batch_s(root: Path, args, state: dict | None) -> float:
    start = time.perf_counter()
    dataset = EpisodeStreamingDataset(root, episode_pool_size=args.pool_size, seed=0)
    if state is not None:
        dataset.load_state_dict(state)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, num_workers=args.num_workers)
    next(iter(loader))
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_dataset_arguments(parser)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--pool-size", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--fraction", type=float, default=0.9, help="where in the epoch to resume")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--output-dir", default="bench_out")
    args = parser.parse_args(argv)
    root = ensure_dataset(args)

    probe = EpisodeStreamingDataset(root, episode_pool_size=args.pool_size, seed=0)
    batches_per_epoch = -(-len(probe) // args.batch_size)
    consumed = int(batches_per_epoch * args.fraction)
    state = {**probe.state_dict(), "batches_consumed": consumed, "batch_size": args.batch_size,
             "num_workers": args.num_workers}
    cold, resumed = [], []
    for _ in range(args.trials):
        cold.append(first_batch_s(root, args, None))
        resumed.append(first_batch_s(root, args, state))
    result = {"batches_per_epoch": batches_per_epoch, "batches_consumed": consumed,
              "cold_first_batch_s": statistics.median(cold), "resumed_first_batch_s": statistics.median(resumed),
              "cold_trials_s": cold, "resumed_trials_s": resumed}
    result["ratio"] = result["resumed_first_batch_s"] / result["cold_first_batch_s"]
    print(f"resume at batch {consumed} of {batches_per_epoch}: first batch median {result['resumed_first_batch_s']:.3f} s "
          f"vs cold start {result['cold_first_batch_s']:.3f} s -> ratio {result['ratio']:.2f}")
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "resume.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
