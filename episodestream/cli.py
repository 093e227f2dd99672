"""The ``episodestream`` command line. ``demo`` is the main job: write, stream, report throughput."""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path


def _demo(args: argparse.Namespace) -> int:
    import torch.utils.data

    from .streaming import EpisodeStreamingDataset
    from .synthetic import write_synthetic_dataset

    with tempfile.TemporaryDirectory(prefix="episodestream-demo-") as tmp:
        root = Path(args.out) if args.out else Path(tmp) / "synthetic"
        print(f"writing a synthetic dataset ({args.episodes} episodes x {args.episode_length} frames, "
              f"2 cameras {args.height}x{args.width} AV1) to {root}", flush=True)
        write_synthetic_dataset(root, num_episodes=args.episodes, episode_length=args.episode_length,
                                height=args.height, width=args.width, overwrite=True, progress=True)
        dataset = EpisodeStreamingDataset(root, episode_pool_size=args.pool_size, seed=0)
        loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, num_workers=args.num_workers)
        cameras = len(dataset.meta.video_keys)
        print(f"streaming {len(dataset)} samples with {args.num_workers} DataLoader workers, "
              f"batch size {args.batch_size}, episode pool {args.pool_size}", flush=True)
        start = time.perf_counter()
        first_batch_s = None
        samples = 0
        for batch in loader:
            first_batch_s = first_batch_s or time.perf_counter() - start
            samples += len(batch["index"])
        elapsed_s = time.perf_counter() - start
        if samples != len(dataset):
            raise RuntimeError(f"streamed {samples} samples, expected {len(dataset)}")
    print(f"samples: {samples}  first batch: {first_batch_s:.2f} s  total: {elapsed_s:.2f} s")
    print(f"throughput: {samples / elapsed_s:.1f} samples/s, {samples * cameras / elapsed_s:.1f} frames/s")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="episodestream", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="write a small synthetic dataset and stream it through a DataLoader")
    demo.add_argument("--out", help="where to write the dataset (default: a temporary folder, removed after)")
    demo.add_argument("--episodes", type=int, default=24)
    demo.add_argument("--episode-length", type=int, default=100)
    demo.add_argument("--height", type=int, default=96)
    demo.add_argument("--width", type=int, default=128)
    demo.add_argument("--num-workers", type=int, default=2)
    demo.add_argument("--batch-size", type=int, default=32)
    demo.add_argument("--pool-size", type=int, default=8)
    demo.set_defaults(run=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)
