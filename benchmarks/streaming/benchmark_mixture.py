"""A 3-dataset mixture's throughput against the single-dataset stream on the same data.

The benchmark dataset's episodes are dealt into three disjoint selections (episodes 0, 3, 6, ...;
1, 4, 7, ...; 2, 5, 8, ...), each an ``EpisodeStreamingDataset`` of the same folder, mixed by
``EpisodeMixture`` with default weights (a shuffled concatenation: the same frames, each once, as
the single dataset's epoch). Each component keeps the single dataset's ``episode_pool_size``.
Trials alternate single and mixture so machine noise hits both; prints the medians and their ratio
(goal: mixture / single >= 0.95), and writes them as JSON.

    python benchmarks/streaming/benchmark_mixture.py --output-dir bench_out
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

from episodestream import EpisodeMixture, EpisodeStreamingDataset  # noqa: E402

COMPONENTS = 3


def build(root: Path, args, *, mixture: bool):
    options = dict(episode_pool_size=args.pool_size, seed=0, return_uint8=args.uint8)
    if not mixture:
        return EpisodeStreamingDataset(root, **options)
    episodes = len(EpisodeStreamingDataset(root, **options).typed_meta.episodes)
    return EpisodeMixture([EpisodeStreamingDataset(root, episodes=list(range(i, episodes, COMPONENTS)), **options)
                           for i in range(COMPONENTS)], seed=0)


def samples_per_s(root: Path, args, *, mixture: bool) -> tuple[float, float, int]:
    """The epoch's samples/s from iter() on, and warm: after the first ``--warmup-batches``
    (worker start-up, which pickles one dataset or three, and the first pools' admissions)."""
    dataset = build(root, args, mixture=mixture)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, num_workers=args.num_workers)
    samples = warm_samples = 0
    start = warm_start = time.perf_counter()
    for batch_index, batch in enumerate(loader):
        samples += len(batch["index"])
        if batch_index + 1 == args.warmup_batches:
            warm_start, warm_samples = time.perf_counter(), samples
        if args.max_batches and batch_index + 1 >= args.max_batches:
            break
    end = time.perf_counter()
    return samples / (end - start), (samples - warm_samples) / (end - warm_start), samples


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_dataset_arguments(parser)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--pool-size", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--uint8", action="store_true", help="uint8 frames instead of float32")
    parser.add_argument("--max-batches", type=int, default=0, help="stop each run after this many (0: one epoch)")
    parser.add_argument("--warmup-batches", type=int, default=4, help="batches before the warm rate's clock starts")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--output-dir", default="bench_out")
    args = parser.parse_args(argv)
    root = ensure_dataset(args)

    runs: dict[str, dict[str, list[float]]] = {name: {"whole": [], "warm": []} for name in ("single", "mixture")}
    for _ in range(args.trials):
        counts = {}
        for name in runs:
            whole, warm, counts[name] = samples_per_s(root, args, mixture=name == "mixture")
            runs[name]["whole"].append(whole)
            runs[name]["warm"].append(warm)
        if counts["single"] != counts["mixture"]:
            print(f"warning: single yielded {counts['single']} samples, mixture {counts['mixture']}", file=sys.stderr)
    medians = {name: {kind: statistics.median(v) for kind, v in rates.items()} for name, rates in runs.items()}
    result = {"samples_per_s": runs, "medians": medians,
              "ratio": medians["mixture"]["whole"] / medians["single"]["whole"],
              "warm_ratio": medians["mixture"]["warm"] / medians["single"]["warm"],
              "settings": {k: v for k, v in vars(args).items() if k != "output_dir"}}
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "mixture.json").write_text(json.dumps(result, indent=2))
    for kind in ("whole", "warm"):
        print(f"{kind}: single {medians['single'][kind]:.1f} samples/s, {COMPONENTS}-dataset mixture "
              f"{medians['mixture'][kind]:.1f} samples/s, ratio "
              f"{medians['mixture'][kind] / medians['single'][kind]:.3f} (goal >= 0.95)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
