"""Where the gap to the decoder's ceiling goes: decoding in the workers vs moving frames out of them.

In one run, per mode (``single``, ``sarm``), on the local benchmark dataset with the same
DataLoader (2 workers, batch 32, pool 16), it streams one epoch three ways and times each against
the same-grouping torchcodec ceiling of ``benchmark_streaming.py``:

    decode only   the workers build every sample (decode included) and yield only its ``index``:
                  everything but the transfer of frames to the main process
    uint8         the samples as they are with ``return_uint8=True`` (CHW uint8, 1 byte a pixel)
    float32       the default samples (LeRobot's float32 in [0, 1], 4 bytes a pixel)

``decode only`` minus ``uint8`` is what collating uint8 frames into shared memory and handing them
to the main process costs; ``uint8`` minus ``float32`` is what 4x the bytes cost on that path.

    python benchmarks/streaming/benchmark_transfer.py --output-dir bench_out
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch.utils.data

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_streaming import (
    DEFAULT_SIZE,
    SARM_STEPS,
    add_dataset_arguments,
    ceiling,
    decode_calls,
    delta_timestamps,
    ensure_dataset,
)

from episodestream import EpisodeStreamingDataset

WAYS = ("decode only", "uint8", "float32")


class _IndexOnly(torch.utils.data.IterableDataset):
    """Builds every sample in the worker (decode included) and yields only its index."""

    def __init__(self, inner: EpisodeStreamingDataset) -> None:
        self.inner = inner

    def __iter__(self):
        for sample in self.inner:
            yield {"index": sample["index"]}


def _dataset(root: Path, mode: str, episodes, video_keys, *, uint8: bool, pool_size: int):
    return EpisodeStreamingDataset(root, episodes=episodes, episode_pool_size=pool_size, seed=0,
                                   delta_timestamps=delta_timestamps(mode, video_keys), return_uint8=uint8)


def run_way(way: str, root: Path, mode: str, episodes, video_keys, args) -> dict:
    dataset = _dataset(root, mode, episodes, video_keys, uint8=way != "float32", pool_size=args.pool_size)
    wrapped = _IndexOnly(dataset) if way == "decode only" else dataset
    loader = torch.utils.data.DataLoader(wrapped, batch_size=args.batch_size, num_workers=args.num_workers)
    start = time.perf_counter()
    samples = sum(len(batch["index"]) for batch in loader)
    elapsed_s = time.perf_counter() - start
    if samples != len(dataset):
        raise RuntimeError(f"{way}: streamed {samples} samples, expected {len(dataset)}")
    return {"samples": samples, "elapsed_s": elapsed_s, "samples_per_s": samples / elapsed_s}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_dataset_arguments(parser)
    parser.add_argument("--sarm-episodes", type=int, default=DEFAULT_SIZE["local"][2])
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--pool-size", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--mode", choices=("single", "sarm", "both"), default="both")
    parser.add_argument("--output-dir", default="bench_out")
    args = parser.parse_args(argv)
    if args.num_workers < 1:
        parser.error(f"invalid --num-workers ({args.num_workers}): the transfer exists only with workers (>= 1)")

    root = ensure_dataset(args)
    video_keys = EpisodeStreamingDataset(root).typed_meta.video_keys
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {}
    for mode in ("single", "sarm") if args.mode == "both" else (args.mode,):
        episodes = list(range(min(args.episodes, args.sarm_episodes))) if mode == "sarm" else None
        calls = decode_calls(_dataset(root, mode, episodes, video_keys, uint8=True, pool_size=args.pool_size),
                             args.num_workers)
        ceiling_fps, unique_frames = ceiling(calls)
        rows = {}
        for way in WAYS:
            row = run_way(way, root, mode, episodes, video_keys, args)
            # Frames/s in the ceiling's unit: unique frames decoded per second of the epoch.
            row["decoded_frames_per_s"] = unique_frames / row["elapsed_s"]
            row["fraction_of_ceiling"] = row["decoded_frames_per_s"] / ceiling_fps
            rows[way] = row
            print(f"{mode:6} {way:12} {row['samples_per_s']:7.1f} samples/s, "
                  f"{row['decoded_frames_per_s']:6.0f} decoded frames/s = {row['fraction_of_ceiling']:.2f} "
                  f"of the {ceiling_fps:.0f} frames/s ceiling", flush=True)
        frames_per_sample = len(video_keys) * (SARM_STEPS if mode == "sarm" else 1)
        report[mode] = {"ceiling_frames_per_s": ceiling_fps, "unique_frames": unique_frames,
                        "frames_per_sample": frames_per_sample, "ways": rows}
    (out_dir / "transfer.json").write_text(json.dumps(report, indent=2))
    print(f"wrote {out_dir / 'transfer.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
