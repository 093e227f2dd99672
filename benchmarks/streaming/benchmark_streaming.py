"""Streaming throughput against the decoder's own ceiling, measured side by side in one run.

For each mode (``single``: one frame per camera; ``sarm``: each camera windowed at 8 steps spaced
1 s) it streams one epoch through a DataLoader and reports samples/s, frames/s, per-sample latency
percentiles (time a worker spends producing each sample), first-batch latency, decoder-cache stats
and peak RSS. In the same run it times torchcodec alone decoding exactly the frames our pipeline
decoded, in exactly its grouping (one call per file per decode group), with warm decoders and the
same number of processes: ours / that is the efficiency. It also times the same frames at one
timestamp per call and at 32 sorted timestamps per call, so the gain from grouping is visible.

    python benchmarks/streaming/benchmark_streaming.py --output-dir bench_out

Results go to OUTPUT_DIR/<source>-<mode>-<decode>.json and OUTPUT_DIR/results.csv.
"""

from __future__ import annotations

import argparse
import csv
import json
import multiprocessing
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch.utils.data

from episodestream import EpisodeStreamingDataset, write_synthetic_dataset
from episodestream._world import World

MODES = ("single", "sarm")
SARM_STEPS = 8
FIELDS = ("source", "mode", "decode", "dtype", "num_workers", "pool_size", "samples", "frames", "samples_per_s",
          "frames_per_s", "first_batch_s", "latency_ms", "decoder_cache", "cache_hit_rate", "peak_rss_mb",
          "worker_peak_rss_mb", "ceiling_same_grouping_frames_per_s", "fraction_of_ceiling",
          "ceiling_1_per_call_frames_per_s", "ceiling_32_sorted_frames_per_s", "status")


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _Timed(torch.utils.data.IterableDataset):
    """Wraps the dataset in each worker: records the time to produce each sample, the decoder
    cache stats and the worker's peak RSS into ``stats_dir`` when its stream ends."""

    def __init__(self, inner: EpisodeStreamingDataset, stats_dir: str) -> None:
        self.inner, self.stats_dir = inner, stats_dir

    def __iter__(self):
        latencies_s = []
        start = time.perf_counter()
        for sample in self.inner:
            latencies_s.append(time.perf_counter() - start)
            yield sample
            start = time.perf_counter()
        info = torch.utils.data.get_worker_info()
        record = {"worker": info.id if info else 0, "latencies_s": latencies_s,
                  "decoder_cache": self.inner.decoder_stats(), "peak_rss_mb": _peak_rss_mb()}
        Path(self.stats_dir, f"worker-{os.getpid()}.json").write_text(json.dumps(record))


def delta_timestamps(mode: str, dataset: EpisodeStreamingDataset) -> dict | None:
    if mode == "single":
        return None
    return {key: [float(s - SARM_STEPS + 1) for s in range(SARM_STEPS)] for key in dataset.meta.video_keys}


def stream(root: Path, *, mode: str, num_workers: int, pool_size: int, batch_size: int,
           episodes: list[int] | None, uint8: bool) -> dict:
    probe = EpisodeStreamingDataset(root, episodes=episodes)
    dataset = EpisodeStreamingDataset(root, episodes=episodes, episode_pool_size=pool_size, seed=0,
                                      delta_timestamps=delta_timestamps(mode, probe), return_uint8=uint8)
    with tempfile.TemporaryDirectory() as stats_dir:
        loader = torch.utils.data.DataLoader(_Timed(dataset, stats_dir), batch_size=batch_size,
                                             num_workers=num_workers)
        start = time.perf_counter()
        first_batch_s, samples = None, 0
        for batch in loader:
            first_batch_s = first_batch_s or time.perf_counter() - start
            samples += len(batch["index"])
        elapsed_s = time.perf_counter() - start
        workers = [json.loads(p.read_text()) for p in Path(stats_dir).glob("worker-*.json")]
    if samples != len(dataset):
        raise RuntimeError(f"streamed {samples} samples, expected {len(dataset)}")
    frames_per_sample = len(dataset.meta.video_keys) * (SARM_STEPS if mode == "sarm" else 1)
    latencies_ms = np.concatenate([w["latencies_s"] for w in workers]) * 1000
    cache = {k: sum(w["decoder_cache"][k] for w in workers) for k in ("hits", "misses", "evictions")}
    return {"samples": samples, "frames": samples * frames_per_sample, "elapsed_s": elapsed_s,
            "samples_per_s": samples / elapsed_s, "frames_per_s": samples * frames_per_sample / elapsed_s,
            "first_batch_s": first_batch_s,
            "latency_ms": {f"p{q}": float(np.percentile(latencies_ms, q)) for q in (50, 95, 99)},
            "decoder_cache": cache, "peak_rss_mb": _peak_rss_mb(),
            "worker_peak_rss_mb": max(w["peak_rss_mb"] for w in workers), "dataset": dataset}


def decode_calls(dataset: EpisodeStreamingDataset, num_workers: int) -> list[list[tuple[str, list[float]]]]:
    """Per worker, the decoder calls our pipeline makes: (file, sorted unique times) per file per group."""
    per_worker = []
    half_frame_s = 0.5 / dataset.meta.fps
    for worker in range(max(1, num_workers)):
        world = World(rank=0, world_size=1, worker=worker, num_workers=max(1, num_workers))
        calls = []
        steps = dataset.schedule(world, epoch=0)
        for group, _ in dataset.planned_groups(steps, dataset._core.episode_videos()):
            wanted: dict[str, set[float]] = {}
            for pending in group:
                for query in pending.queries:
                    wanted.setdefault(query.path, set()).update(query.timestamps_s)
            calls += [(path, [t + half_frame_s for t in sorted(stamps)]) for path, stamps in wanted.items()]
        per_worker.append(calls)
    return per_worker


def _decode_worker(args) -> tuple[float, float, int]:
    calls, barrier_time = args
    from torchcodec.decoders import VideoDecoder

    decoders = {}
    for path, _ in calls:  # warm: open every file and decode once before the clock starts
        if path not in decoders:
            decoders[path] = VideoDecoder(path, seek_mode="approximate", num_ffmpeg_threads=1)
            decoders[path].get_frames_played_at(seconds=[0.0])
    while time.time() < barrier_time:
        time.sleep(0.001)
    start = time.time()
    frames = 0
    for path, seconds in calls:
        frames += len(decoders[path].get_frames_played_at(seconds=seconds).pts_seconds)
    return start, time.time(), frames


def ceiling(per_worker_calls) -> tuple[float, int]:
    """Frames/s of torchcodec alone over these calls, one process per worker, started together."""
    barrier_time = time.time() + 3.0  # after every process has opened and warmed its decoders
    with multiprocessing.get_context("fork").Pool(len(per_worker_calls)) as pool:
        results = pool.map(_decode_worker, [(calls, barrier_time) for calls in per_worker_calls])
    wall_s = max(r[1] for r in results) - min(r[0] for r in results)
    frames = sum(r[2] for r in results)
    return frames / wall_s, frames


def regroup(per_worker_calls, per_call: int, seed: int = 0):
    """The same (file, time) pairs, split by file into calls of ``per_call`` sorted times, shuffled."""
    rng = random.Random(seed)
    out = []
    for calls in per_worker_calls:
        by_file: dict[str, list[float]] = {}
        for path, seconds in calls:
            by_file.setdefault(path, []).extend(seconds)
        regrouped = []
        for path, seconds in by_file.items():
            rng.shuffle(seconds)
            regrouped += [(path, sorted(seconds[i:i + per_call])) for i in range(0, len(seconds), per_call)]
        rng.shuffle(regrouped)
        out.append(regrouped)
    return out


def ensure_dataset(args) -> Path:
    if args.dataset:
        return Path(args.dataset)
    root = Path(args.cache_dir) / f"textured-{args.episodes}x{args.episode_length}-{args.height}x{args.width}"
    if not (root / "meta" / "info.json").exists():
        print(f"writing the benchmark dataset to {root}", file=sys.stderr, flush=True)
        write_synthetic_dataset(root, num_episodes=args.episodes, episode_length=args.episode_length,
                                height=args.height, width=args.width, texture=True, overwrite=True, progress=True)
    return root


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", choices=("local",), default="local")
    parser.add_argument("--mode", choices=MODES + ("both",), default="both")
    parser.add_argument("--decode", choices=("cpu",), default="cpu")
    parser.add_argument("--dataset", help="an existing LeRobot v3.0 folder (default: a synthetic one)")
    parser.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "episodestream-bench"))
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--episode-length", type=int, default=300)
    parser.add_argument("--height", type=int, default=240)
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--pool-size", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sarm-episodes", type=int, default=6, help="episodes streamed in sarm mode (its "
                        "samples decode 8x the frames)")
    parser.add_argument("--rss-pool-sizes", default="2,32", help="pool sizes compared for worker peak RSS")
    parser.add_argument("--dtype", choices=("float32", "uint8"), default="float32",
                        help="camera frames as LeRobot's float32 in [0, 1], or uint8 (4x less to move "
                             "between processes; convert on the GPU)")
    parser.add_argument("--output-dir", default="bench_out")
    args = parser.parse_args(argv)

    root = ensure_dataset(args)
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for mode in MODES if args.mode == "both" else (args.mode,):
        episodes = list(range(args.sarm_episodes)) if mode == "sarm" else None
        ours = stream(root, mode=mode, num_workers=args.num_workers, pool_size=args.pool_size,
                      batch_size=args.batch_size, episodes=episodes, uint8=args.dtype == "uint8")
        calls = decode_calls(ours.pop("dataset"), args.num_workers)
        same_fps, decoded = ceiling(calls)
        ours_decoded_fps = decoded / ours["elapsed_s"]  # the same decoded frames over our wall time
        one_fps, _ = ceiling(regroup(calls, 1))
        sorted32_fps, _ = ceiling(regroup(calls, 32))
        row = {"source": args.source, "mode": mode, "decode": args.decode, "dtype": args.dtype,
               "num_workers": args.num_workers,
               "pool_size": args.pool_size, **ours, "cache_hit_rate": None,
               "ceiling_same_grouping_frames_per_s": same_fps, "fraction_of_ceiling": ours_decoded_fps / same_fps,
               "ceiling_1_per_call_frames_per_s": one_fps, "ceiling_32_sorted_frames_per_s": sorted32_fps,
               "decoded_frames": decoded, "status": "ok"}
        print(f"[{mode}] {row['samples']} samples in {row['elapsed_s']:.2f} s: {row['samples_per_s']:.0f} samples/s, "
              f"{row['frames_per_s']:.0f} frames/s; first batch {row['first_batch_s']:.2f} s; latency ms "
              f"p50/p95/p99 {row['latency_ms']['p50']:.2f}/{row['latency_ms']['p95']:.2f}/"
              f"{row['latency_ms']['p99']:.2f}; decoder cache {row['decoder_cache']}; peak RSS main "
              f"{row['peak_rss_mb']:.0f} MB, worker {row['worker_peak_rss_mb']:.0f} MB")
        print(f"[{mode}] decoded {decoded} unique frames: ours {ours_decoded_fps:.0f} frames/s vs torchcodec "
              f"alone, same grouping {same_fps:.0f} frames/s -> {row['fraction_of_ceiling']:.2f} of ceiling; "
              f"1 per call {one_fps:.0f} frames/s; 32 sorted per call {sorted32_fps:.0f} frames/s")
        (out_dir / f"{args.source}-{mode}-{args.decode}-{args.dtype}.json").write_text(json.dumps(row, indent=2))
        rows.append(row)
    rss = {}
    for pool_size in [int(p) for p in args.rss_pool_sizes.split(",") if p]:
        rss[pool_size] = stream(root, mode="single", num_workers=args.num_workers, pool_size=pool_size,
                                batch_size=args.batch_size, episodes=None,
                                uint8=args.dtype == "uint8")["worker_peak_rss_mb"]
    if rss:
        print("worker peak RSS by episode_pool_size (single mode): "
              + ", ".join(f"{p}: {mb:.0f} MB" for p, mb in rss.items()))
        (out_dir / "rss_by_pool_size.json").write_text(json.dumps(rss))
    with open(out_dir / "results.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, dict) else v for k, v in row.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
