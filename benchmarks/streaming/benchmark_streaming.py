"""Streaming throughput against the decoder's own ceiling, and remote sources against local disk.

For each mode (``single``: one frame per camera; ``sarm``: each camera windowed at 8 steps spaced
1 s) it streams one epoch through a DataLoader (``--loader dataloader``) and/or ``EpisodeLoader``
(``--loader episode``: decode threads in this process, as many as ``--num-workers``) and reports
samples/s, frames/s, per-sample latency percentiles (DataLoader: time a worker spends producing each
sample), the wait for each batch (p50/p95/p99), first-batch latency, decoder-cache stats and peak
RSS. ``--dtype both`` runs float32 and uint8 frames; ``--train-step-ms`` adds a simulated training
step after each batch, once as a sleep (releases the GIL, like GPU work) and once as a pure-Python
busy loop (holds it), to show how the trainer's own work shares the machine with the loader.

``--source local`` (the default) reads the folder in place. In the same run it times torchcodec
alone decoding exactly the frames our pipeline decoded, in exactly its grouping (one call per file
per decode group), with warm decoders and the same number of processes: ours / that is the
efficiency. It also times the same frames at one timestamp per call and at 32 sorted timestamps per
call, so the gain from grouping is visible.

``--source hub|bucket|warmed_bucket`` serves the same folder from 127.0.0.1 (``_servers.py``: FakeHub,
or S3 through moto) behind a shaped link (``--latency-ms`` before every request, ``--bandwidth-mbps``
MB/s shared by all connections) and streams it through the node cache, starting cold (an empty
cache_dir). ``warmed_bucket`` first runs ``prewarm`` (as ``episodestream prewarm`` does: metadata and
every streamed episode's mp4 header and span fetched and pinned in the cache, untimed), so the
measured epoch reads its video from local disk and only rows cross the link: the cache a previous
epoch or a prewarm step left. Each remote run also streams the same epoch from the local folder
and reports remote / local throughput, over the whole epoch and warm: after the first
``--warmup-batches`` batches (default: one per worker, i.e. once every worker has started), plus
bytes fetched per episode against the episode's own compressed video bytes and the node-cache hit
rate (video entries a consumer found local / all it acquired).

    python benchmarks/streaming/benchmark_streaming.py --output-dir bench_out
    python benchmarks/streaming/benchmark_streaming.py --full --output-dir bench_out
    python benchmarks/streaming/benchmark_streaming.py --loader both --dtype both --train-step-ms 20 --output-dir bench_out
    python benchmarks/streaming/benchmark_streaming.py --source hub --mode single --output-dir bench_out

With no options (what ``episodestream bench`` runs) it is the quick look, about a minute on 2 cores
the first time (writing its dataset: 6 episodes x 100 frames, kept under --cache-dir) and less after:
single frames, float32, EpisodeLoader and a DataLoader with --num-workers workers, each against the
decoder's ceiling. ``--full`` is the long matrix: 24 episodes x 300 frames, both modes, both loaders,
worker RSS at pools 2 and 32 (over 10 minutes on 2 cores, a few of them writing the dataset the first
time). Each prints an estimate before long work; any option given explicitly keeps its value under
either.

Results go to OUTPUT_DIR/<source>-<mode>-<decode>-<dtype>[-episodeloader][-<step>].json and
OUTPUT_DIR/results.csv.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import multiprocessing
import os
import random
import resource
import sys
import tempfile
import time
from collections import Counter
from contextlib import nullcontext
from dataclasses import astuple
from pathlib import Path

import numpy as np
import torch.utils.data
from tqdm import tqdm

from episodestream import EpisodeLoader, EpisodeStreamingDataset, SourceStats
from episodestream.tools.synthetic import write_synthetic_dataset
from episodestream._sample import chw as _chw
from episodestream._base.world import World
from episodestream._plan.shuffle_quality import shuffle_quality
from episodestream._runtime.face import runtime_of
from episodestream._runtime.pool_size import choose_pool_size
from episodestream._runtime.resume.epoch import Claim

if str(Path(__file__).resolve().parent) not in sys.path:  # `episodestream bench` runs this file by path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from _servers import REMOTE_KINDS, serve  # noqa: E402

SOURCES = ("local",) + REMOTE_KINDS
MODES = ("single", "sarm")
SARM_STEPS = 8
# Synthetic dataset size when --episodes / --episode-length are not given: "local" under --full (and
# the other benchmarks' shared dataset); "quick", the default run, written in ~20 s on 2 CPU cores;
# remote runs are smaller so that one (both modes, each against a local pass) takes well under two
# minutes on 2 CPU cores.
DEFAULT_SIZE = {"local": (24, 300, 6), "quick": (6, 100, 2), "remote": (8, 150, 2)}  # episodes, frames each, episodes in sarm mode
# What the run does where an option is not given: the quick look, and the long matrix (--full).
QUICK_DEFAULTS = {"mode": "single", "rss_pool_sizes": ""}
FULL_DEFAULTS = {"mode": "both", "rss_pool_sizes": "2,32"}
# For the estimates printed before long work (2 CPU cores, 240x320): synthetic frames written per
# second (AV1 encoding dominates), frames decoded per second, seconds a pass costs besides decoding.
WRITE_FRAMES_PER_S, DECODE_FRAMES_PER_S, PASS_OVERHEAD_S = 70, 600, 1.0
LOADERS = ("dataloader", "episode")
FIELDS = ("source", "mode", "decode", "dtype", "loader", "train_step", "num_workers", "pool_size", "samples", "frames", "samples_per_s",
          "frames_per_s", "warm_samples_per_s", "first_batch_s", "latency_ms", "batch_wait_ms", "decoder_cache", "cache_hit_rate",
          "peak_rss_mb", "worker_peak_rss_mb", "ceiling_same_grouping_frames_per_s", "fraction_of_ceiling",
          "ceiling_1_per_call_frames_per_s", "ceiling_32_sorted_frames_per_s", "local_samples_per_s",
          "local_warm_samples_per_s", "remote_over_local", "remote_over_local_warm", "local_first_batch_s",
          "construct_s", "bytes_per_episode", "node_cache", "link", "prewarm", "status")


def _peak_rss_mb() -> float:
    """This process's peak RSS since the last ``_reset_peak_rss`` (Linux), else since it started."""
    try:
        status = Path("/proc/self/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reset_peak_rss() -> None:
    """Start this process's peak RSS afresh, so each run's peak is its own (Linux >= 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _train_step(kind: str, seconds: float) -> None:
    """A simulated training step: ``sleep`` releases the GIL (as GPU work waited on does);
    ``busy`` holds it in pure Python for the same wall time (a trainer doing Python work)."""
    if kind == "sleep":
        time.sleep(seconds)
    elif kind == "busy":
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass


class _Timed(torch.utils.data.IterableDataset):
    """Wraps the dataset in each worker: records the time to produce each sample, the decoder
    cache stats, the worker's peak RSS and, for remote sources, what it fetched (its
    ``source_stats()``: node-cache hits, misses and their bytes, bytes read) into ``stats_dir``
    when its stream ends."""

    def __init__(self, inner: EpisodeStreamingDataset, stats_dir: str, *, remote: bool) -> None:
        self.inner, self.stats_dir, self.remote = inner, stats_dir, remote
        # What building the dataset fetched, left out when the stream runs in the same process
        # (num_workers=0); a worker process counts its own reads from zero.
        self.built = (os.getpid(), inner.source_stats())

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
        if self.remote:
            stats = self.inner.source_stats()
            if os.getpid() == self.built[0]:
                stats = SourceStats(*(now - then for now, then in zip(astuple(stats), astuple(self.built[1]))))
            record["node_cache"] = {"hits": stats.cache_hits, "misses": stats.cache_misses,
                                    "miss_bytes": stats.cache_miss_bytes}
            record["reader_bytes"] = stats.bytes_fetched
        Path(self.stats_dir, f"worker-{os.getpid()}.json").write_text(json.dumps(record))


def delta_timestamps(mode: str, video_keys: list[str]) -> dict | None:
    if mode == "single":
        return None
    return {key: [float(s - SARM_STEPS + 1) for s in range(SARM_STEPS)] for key in video_keys}


def _warm_samples_per_s(arrivals: list[tuple[float, int]], warmup_batches: int) -> float | None:
    """Samples per second after the first ``warmup_batches`` batches: from that batch's arrival to the last's."""
    if len(arrivals) <= warmup_batches + 1:
        return None
    (t0, _), (t1, _) = arrivals[warmup_batches - 1], arrivals[-1]
    return sum(n for _, n in arrivals[warmup_batches:]) / (t1 - t0) if t1 > t0 else None


def stream(source, *, mode: str, num_workers: int, pool_size: int | str, batch_size: int, episodes: list[int] | None,
           uint8: bool, video_keys: list[str], decode_device: str = "cpu", warmup_batches: int = 1,
           remote_options: dict | None = None, keep_dataset: bool = False, loader_kind: str = "dataloader",
           train_step: tuple[str, float] | None = None) -> dict:
    # What earlier passes left (their datasets, loaders and decoders, in reference cycles) is freed
    # now: a full collection that comes due from it would otherwise land in this pass, in a remote
    # build most often (benchmarks/LOG.md, "One frame-writer call per decode group, and what limits
    # 32 threads at 0.2 ms").
    gc.collect()
    _reset_peak_rss()
    built_s = time.perf_counter()
    dataset = EpisodeStreamingDataset(source, episodes=episodes, episode_pool_size=pool_size, seed=0,
                                      delta_timestamps=delta_timestamps(mode, video_keys), return_uint8=uint8,
                                      decode_device=decode_device, **(remote_options or {}))
    construct_s = time.perf_counter() - built_s
    remote = remote_options is not None
    metadata_bytes = dataset.source_stats().bytes_fetched  # fetched while building, in this process
    with tempfile.TemporaryDirectory() as stats_dir:
        if loader_kind == "episode":
            # The loader's decode threads stand in for the DataLoader's worker processes.
            loader = EpisodeLoader(dataset, batch_size, num_threads=max(1, num_workers))
        else:
            loader = torch.utils.data.DataLoader(_Timed(dataset, stats_dir, remote=remote), batch_size=batch_size,
                                                 num_workers=num_workers)
        start = time.perf_counter()
        arrivals, waits_s = [], []
        iterator = iter(loader)
        while True:
            asked = time.perf_counter()
            batch = next(iterator, None)
            if batch is None:
                break
            arrivals.append((time.perf_counter() - start, len(batch["index"])))
            waits_s.append(time.perf_counter() - asked)
            if train_step is not None:
                _train_step(*train_step)
            del batch
        elapsed_s = time.perf_counter() - start
        workers = [json.loads(p.read_text()) for p in Path(stats_dir).glob("worker-*.json")]
        if loader_kind == "episode":  # everything ran in this process
            workers = [{"latencies_s": [], "peak_rss_mb": _peak_rss_mb()}]
    samples = sum(n for _, n in arrivals)
    if samples != len(dataset):
        raise RuntimeError(f"streamed {samples} samples, expected {len(dataset)}")
    frames_per_sample = len(video_keys) * (SARM_STEPS if mode == "sarm" else 1)
    # EpisodeLoader has no worker to time per sample: its batch waits say what the trainer sees.
    latencies_ms = np.concatenate([w["latencies_s"] for w in workers]) * 1000 if loader_kind != "episode" else None
    cache = (None if loader_kind == "episode"
             else {k: sum(w["decoder_cache"][k] for w in workers) for k in ("hits", "misses", "evictions")})
    result = {"pool_size": dataset.episode_pool_size,  # what "auto" chose
              "samples": samples, "frames": samples * frames_per_sample, "elapsed_s": elapsed_s,
              "samples_per_s": samples / elapsed_s, "frames_per_s": samples * frames_per_sample / elapsed_s,
              "warm_samples_per_s": _warm_samples_per_s(arrivals, warmup_batches),
              "first_batch_s": arrivals[0][0], "construct_s": construct_s,
              "latency_ms": None if latencies_ms is None else {f"p{q}": float(np.percentile(latencies_ms, q))
                                                               for q in (50, 95, 99)},
              "batch_wait_ms": {f"p{q}": float(np.percentile(np.asarray(waits_s) * 1000, q)) for q in (50, 95, 99)},
              "loader": loader_kind, "train_step": None if train_step is None else f"{train_step[0]}:{train_step[1] * 1000:g}ms",
              "decoder_cache": cache, "peak_rss_mb": _peak_rss_mb(),
              "worker_peak_rss_mb": max(w["peak_rss_mb"] for w in workers)}
    if remote:
        counts = Counter()
        for w in workers:
            counts.update(w["node_cache"])
        acquired = counts["hits"] + counts["misses"]
        result["node_cache"] = {"hits": counts["hits"], "misses": counts["misses"], "miss_bytes": counts["miss_bytes"]}
        result["cache_hit_rate"] = counts["hits"] / acquired if acquired else None
        result["reader_bytes"] = sum(w["reader_bytes"] for w in workers)
        result["metadata_bytes"] = metadata_bytes
        dataset.close()
    if keep_dataset:
        result["dataset"] = dataset
    return result


def planned_shuffle_quality(root: Path, *, pool_size: int | str, num_workers: int, batch_sizes) -> list:
    """One consumer's shuffle quality, from its schedule alone (no rows, no video): worker 0 of
    ``num_workers``, against a global shuffle of the epoch (``_plan.shuffle_quality``)."""
    runtime = runtime_of(EpisodeStreamingDataset(root, episode_pool_size=pool_size, seed=0))
    lengths = [s.length for s in runtime.segments(0)]
    steps = list(runtime.schedule(World(0, 1, 0, max(1, num_workers)), 0))
    return [shuffle_quality(steps, b, frame_counts=lengths) for b in batch_sizes]


def selected_episodes(root: Path, episodes: list[int] | None) -> list[int]:
    """The episode indices a dataset built with ``episodes=`` streams (all of them for None)."""
    return EpisodeStreamingDataset(root, episodes=episodes).episode_indices


def own_video_bytes(root: Path, episodes) -> int:
    """The episodes' own compressed video bytes, all cameras: the packets PyAV demuxes in [from, to)."""
    import av

    wanted: dict[str, list[tuple[float, float]]] = {}
    for episode in episodes:
        for span in episode.videos.values():
            wanted.setdefault(span.relpath, []).append((span.from_timestamp_s, span.to_timestamp_s))
    total = 0
    for relpath, spans in wanted.items():
        with av.open(str(root / relpath)) as container:
            video = container.streams.video[0]
            packets = [(float(p.pts * video.time_base), p.size) for p in container.demux(video) if p.size]
        total += sum(size for pts, size in packets for start, end in spans if start - 1e-6 <= pts < end - 1e-6)
    return total


def decode_calls(dataset: EpisodeStreamingDataset, num_workers: int) -> list[list[tuple[str, list[float]]]]:
    """Per worker, the decoder calls our pipeline makes: (file, sorted unique times) per file per group."""
    per_worker = []
    half_frame_s = 0.5 / dataset.typed_meta.fps
    for worker in range(max(1, num_workers)):
        world = World(rank=0, world_size=1, worker=worker, num_workers=max(1, num_workers))
        calls = []
        stream = runtime_of(dataset).consumer_stream(world, Claim(0))  # epoch 0 from its start
        for group in stream.groups():
            wanted: dict[str, set[float]] = {}
            for pending in group.pendings:
                for query in pending.queries:
                    wanted.setdefault(query.path, set()).update(query.timestamps_s)
            calls += [(path, [t + half_frame_s for t in sorted(stamps)]) for path, stamps in wanted.items()]
        stream.close()
        per_worker.append(calls)
    return per_worker


def _decode_worker(calls, device: str, ready=None) -> tuple[float, float, int]:
    """Decode ``calls`` with torchcodec alone: (start time, end time, frames). Every file is opened
    and decoded once first, off the clock; with ``ready`` (a barrier) the clock then starts when
    every process has warmed up."""
    from torchcodec.decoders import VideoDecoder

    decoders = {}
    for path, _ in calls:
        if path not in decoders:
            decoders[path] = VideoDecoder(path, seek_mode="approximate", num_ffmpeg_threads=1, device=device)
            decoders[path].get_frames_played_at(seconds=[0.0])
    if ready is not None:
        ready.wait(timeout=_WARM_UP_TIMEOUT_S)
    start = time.time()
    frames = 0
    for path, seconds in calls:
        frames += len(decoders[path].get_frames_played_at(seconds=seconds).pts_seconds)
    if device != "cpu":
        torch.cuda.synchronize()
    return start, time.time(), frames


def _decode_process(calls, device: str, ready, results) -> None:
    try:
        results.put(_decode_worker(calls, device, ready))
    except BaseException as error:
        ready.abort()  # the other processes stop waiting for this one
        results.put(repr(error))


_WARM_UP_TIMEOUT_S = 600.0  # opening a large dataset's files can take a while; a dead process should not hang us


def ceiling(per_worker_calls, device: str = "cpu") -> tuple[float, int]:
    """Frames/s of torchcodec alone over these calls, one process per worker, started together
    (GPU decoding: in this process, as the pipeline with num_workers=0)."""
    if device != "cpu":
        results = [_decode_worker(calls, device) for calls in per_worker_calls]
    else:
        # A barrier rather than a fixed start time: the clock starts as soon as every process has
        # opened and warmed its decoders (a fixed delay either wasted seconds or started too early).
        context = multiprocessing.get_context("fork")
        ready, queue = context.Barrier(len(per_worker_calls)), context.SimpleQueue()
        processes = [context.Process(target=_decode_process, args=(calls, device, ready, queue), daemon=True)
                     for calls in per_worker_calls]
        for process in processes:
            process.start()
        results = []
        while len(results) < len(processes):
            if not queue.empty():
                results.append(queue.get())
                continue
            # A process killed outright (the OOM killer, a crash in FFmpeg) reports nothing, and the
            # others wait at the barrier for it: look for one that died rather than wait forever.
            dead = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
            if dead:
                for process in processes:
                    process.kill()
                raise RuntimeError(f"a ceiling decode process died without reporting (exit codes {dead}; "
                                   f"negative: killed by that signal)")
            time.sleep(0.05)  # the processes time themselves: this wait does not change the result
        for process in processes:
            process.join()
        failed = [r for r in results if isinstance(r, str)]
        if failed:
            raise RuntimeError(f"a ceiling decode process failed: {failed}")
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


def add_dataset_arguments(parser: argparse.ArgumentParser) -> None:
    """The options ``ensure_dataset`` reads, for the benchmarks that share this one's dataset
    (mixture, resume, transfer): an existing folder, or the synthetic one and its size."""
    parser.add_argument("--dataset", help="an existing LeRobot v3.0 folder (default: the synthetic benchmark one)")
    parser.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "episodestream-bench"),
                        help="where the synthetic dataset is written and kept (shared by the streaming benchmarks)")
    parser.add_argument("--episodes", type=int, default=DEFAULT_SIZE["local"][0])
    parser.add_argument("--episode-length", type=int, default=DEFAULT_SIZE["local"][1])
    parser.add_argument("--height", type=int, default=240)
    parser.add_argument("--width", type=int, default=320)


def ensure_dataset(args) -> Path:
    if args.dataset:
        return Path(args.dataset)
    root = Path(args.cache_dir) / f"textured-{args.episodes}x{args.episode_length}-{args.height}x{args.width}"
    if not (root / "meta" / "info.json").exists():
        frames = 2 * args.episodes * args.episode_length  # two cameras
        estimate_s = frames / WRITE_FRAMES_PER_S * (args.height * args.width) / (240 * 320)
        print(f"writing the benchmark dataset ({args.episodes} episodes x {args.episode_length} frames, 2 cameras "
              f"{args.height}x{args.width}) to {root}, once: about {_duration(estimate_s)} on 2 cores",
              file=sys.stderr, flush=True)
        write_synthetic_dataset(root, num_episodes=args.episodes, episode_length=args.episode_length,
                                height=args.height, width=args.width, texture=True, overwrite=True, progress=True)
    return root


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def _say(text: str) -> None:
    """``print`` that leaves the progress bar whole: tqdm clears it, writes the line and redraws it."""
    tqdm.write(text, file=sys.stdout)
    sys.stdout.flush()


def _run_name(mode: str, dtype: str, loader: str, train_step) -> str:
    return f"{mode} {dtype} {loader}" + (f" {train_step[0]} step" if train_step else "")


def _compare_loaders(rows: list[dict], num_workers: int) -> None:
    """The loaders side by side, per mode, dtype and training step: what a user chooses between."""
    names = {"episode": f"EpisodeLoader ({max(1, num_workers)} threads)",
             "dataloader": f"DataLoader ({num_workers} workers)"}
    print("loaders compared (samples/s over the epoch; first batch):")
    for key in dict.fromkeys((r["mode"], r["dtype"], r["train_step"]) for r in rows):
        same = [r for r in rows if (r["mode"], r["dtype"], r["train_step"]) == key]
        print(f"  {' '.join(k for k in key if k)}: " + "; ".join(
            f"{names[r['loader']]} {r['samples_per_s']:.0f}, {r['first_batch_s']:.2f} s" for r in same))


def _estimate_s(args, root: Path, runs, video_keys, rss_passes: int) -> float:
    """About how long the runs take on 2 cores: every pass's decoded frames, scaled to the frame
    size, plus a fixed cost per pass (building the dataset, starting workers)."""
    meta = EpisodeStreamingDataset(root).typed_meta
    lengths = meta.episodes.length
    shape = meta.features[video_keys[0]].shape if video_keys else (240, 320, 3)
    scale = shape[0] * shape[1] / (240 * 320)
    frames = {"single": int(lengths.sum()) * len(video_keys),
              "sarm": int(lengths[:args.sarm_episodes].sum()) * len(video_keys) * SARM_STEPS}
    if args.source == "local":
        # the stream and its same-grouping ceiling; the regrouped ceilings once per (mode, loader)
        passes = [(mode, 2) for mode, _, _, _ in runs]
        passes += [(mode, 2) for mode, _ in {(mode, loader) for mode, _, loader, _ in runs}]
    else:
        passes = [(mode, 2 * args.repeats) for mode, _, _, _ in runs]  # local and remote, per repeat
    passes += [("single", 1)] * rss_passes
    return sum(n * (frames[mode] / DECODE_FRAMES_PER_S * scale + PASS_OVERHEAD_S) for mode, n in passes)


def _latency_text(row: dict) -> str:
    return "/".join(f"{row['latency_ms'][p]:.2f}" for p in ("p50", "p95", "p99"))


def loader_decode_calls(dataset: EpisodeStreamingDataset, num_workers: int, loader_kind: str):
    """The decoder calls of the run, split into ``max(1, num_workers)`` lists, one per ceiling process:
    the DataLoader's per worker; EpisodeLoader's one consumer's calls dealt out in turn (its threads
    share them the same way)."""
    if loader_kind == "dataloader":
        return decode_calls(dataset, num_workers)
    processes = max(1, num_workers)
    calls = decode_calls(dataset, 0)[0]
    return [calls[i::processes] for i in range(processes)]


def run_local(args, root: Path, mode: str, episodes, video_keys, common: dict, *, loader_kind: str = "dataloader",
              train_step=None, ceilings: dict | None = None) -> dict:
    ours = stream(root, mode=mode, video_keys=video_keys, episodes=episodes, keep_dataset=True,
                  loader_kind=loader_kind, train_step=train_step, **common)
    dataset = ours.pop("dataset")
    device = common["decode_device"]
    # The same-grouping ceiling is timed right after each stream, so the ratio compares two
    # passes minutes apart at most; the regrouped ceilings (the same calls whatever the dtype or
    # training step) once per mode and loader.
    calls = loader_decode_calls(dataset, args.num_workers, loader_kind)
    same_fps, decoded = ceiling(calls, device)
    key = (mode, loader_kind)
    if ceilings is None or key not in ceilings:
        one_fps, _ = ceiling(regroup(calls, 1), device)
        sorted32_fps, _ = ceiling(regroup(calls, 32), device)
        if ceilings is not None:
            ceilings[key] = (one_fps, sorted32_fps)
    else:
        one_fps, sorted32_fps = ceilings[key]
    ours_decoded_fps = decoded / ours["elapsed_s"]  # the same decoded frames over our wall time
    row = {**ours, "cache_hit_rate": None,
           "ceiling_same_grouping_frames_per_s": same_fps, "fraction_of_ceiling": ours_decoded_fps / same_fps,
           "ceiling_1_per_call_frames_per_s": one_fps, "ceiling_32_sorted_frames_per_s": sorted32_fps,
           "decoded_frames": decoded, "frame_writer": args.frame_writer if loader_kind == "episode" else None}
    tag = f"[{mode} {common['uint8'] and 'uint8' or 'float32'} {loader_kind}" + (
        f" step {row['train_step']}]" if train_step else "]")
    waits = "/".join(f"{row['batch_wait_ms'][p]:.1f}" for p in ("p50", "p95", "p99"))
    _say(f"{tag} {row['samples']} samples in {row['elapsed_s']:.2f} s: {row['samples_per_s']:.0f} samples/s, "
          f"{row['frames_per_s']:.0f} frames/s; first batch {row['first_batch_s']:.2f} s; batch wait ms "
          f"p50/p95/p99 {waits}; decoder cache {row['decoder_cache']}; peak RSS main "
          f"{row['peak_rss_mb']:.0f} MB, worker {row['worker_peak_rss_mb']:.0f} MB")
    _say(f"{tag} decoded {decoded} unique frames: ours {ours_decoded_fps:.0f} frames/s vs torchcodec "
          f"alone, same grouping {same_fps:.0f} frames/s -> {row['fraction_of_ceiling']:.2f} of ceiling; "
          f"1 per call {one_fps:.0f} frames/s; 32 sorted per call {sorted32_fps:.0f} frames/s")
    return row


def _pair(args, root: Path, remote, mode: str, episodes, video_keys, common: dict) -> tuple[dict, dict]:
    """The epoch from the local folder, then from ``remote`` through a fresh node cache (prewarmed,
    untimed, for warmed_bucket)."""
    from episodestream._format.metadata import load_metadata
    from episodestream._remote.source.open import open_remote_source
    from episodestream._remote.source.prewarm import prewarm

    local = stream(root, mode=mode, video_keys=video_keys, episodes=episodes, **common)
    with tempfile.TemporaryDirectory(prefix="episodestream-bench-cache-") as cache_dir:
        options = {"cache_dir": cache_dir, **remote.options}
        prewarmed = None
        if remote.kind == "warmed_bucket":
            files = open_remote_source(remote.source, **options)
            try:
                meta = load_metadata(files)
                report = prewarm(files, [meta.episodes[e] for e in selected_episodes(root, episodes)], progress=False)
            finally:
                files.close()
            prewarmed = {"seconds": report.seconds, "bytes_fetched": report.bytes_fetched,
                         "entries_pinned": report.entries_pinned, "bytes_pinned": report.bytes_pinned}
        remote.reset_link_stats()
        ours = stream(remote.source, mode=mode, video_keys=video_keys, episodes=episodes, remote_options=options,
                      **common)
        ours["link"] = {"latency_ms": args.latency_ms, "bandwidth_mb_per_s": args.bandwidth_mb_per_s,
                        **remote.link_stats()}
        ours["prewarm"] = prewarmed
    ours["remote_over_local"] = ours["samples_per_s"] / local["samples_per_s"]
    ours["remote_over_local_warm"] = (ours["warm_samples_per_s"] / local["warm_samples_per_s"]
                                      if ours["warm_samples_per_s"] and local["warm_samples_per_s"] else None)
    return local, ours


def run_remote(args, root: Path, remote, mode: str, episodes, video_keys, common: dict) -> dict:
    pairs = [_pair(args, root, remote, mode, episodes, video_keys, common) for _ in range(args.repeats)]
    # Other load on the machine moves single passes a lot: report the pair with the median ratio.
    by_ratio = sorted(pairs, key=lambda pair: pair[1]["remote_over_local_warm"] or pair[1]["remote_over_local"])
    local, ours = by_ratio[len(pairs) // 2]
    link, prewarmed = ours["link"], ours["prewarm"]
    ratio, warm = ours["remote_over_local"], ours["remote_over_local_warm"]
    probe = EpisodeStreamingDataset(root, episodes=episodes)
    selected = [probe.typed_meta.episodes[e] for e in probe.episode_indices]
    n = len(selected)
    own = own_video_bytes(root, selected)
    video = ours["node_cache"]["miss_bytes"]
    per_episode = {"link": link["bytes"] / n, "reader": ours["reader_bytes"] / n, "video_fetched": video / n,
                   "own_video": own / n, "video_fetched_over_own": video / own if own else None}
    row = {**ours, "local_samples_per_s": local["samples_per_s"],
           "local_warm_samples_per_s": local["warm_samples_per_s"], "local_first_batch_s": local["first_batch_s"],
           "warmup_batches": common["warmup_batches"], "bytes_per_episode": per_episode,
           "repeats": [{"local_samples_per_s": lo["samples_per_s"], "samples_per_s": re["samples_per_s"],
                        "remote_over_local": re["remote_over_local"],
                        "remote_over_local_warm": re["remote_over_local_warm"], "first_batch_s": re["first_batch_s"]}
                       for lo, re in pairs]}
    tag = f"[{remote.kind} {mode}]"
    if len(pairs) > 1:
        ratios = ", ".join(f"{r['remote_over_local_warm'] or float('nan'):.2f}" for _, r in pairs)
        _say(f"{tag} {len(pairs)} local/remote pairs, remote/local warm: {ratios}; the median follows")
    warm_text = "n/a (too few batches)" if warm is None else (
        f"{ours['warm_samples_per_s']:.0f} vs {local['warm_samples_per_s']:.0f} samples/s -> {warm:.2f} of local")
    _say(f"{tag} {row['samples']} samples in {row['elapsed_s']:.2f} s: {row['samples_per_s']:.0f} samples/s, "
          f"{row['frames_per_s']:.0f} frames/s; local {local['samples_per_s']:.0f} samples/s -> {ratio:.2f} of local")
    _say(f"{tag} warm (after the first {common['warmup_batches']} batches): {warm_text}")
    _say(f"{tag} first batch {row['first_batch_s']:.2f} s (local {local['first_batch_s']:.2f} s), after "
          f"{row['construct_s']:.2f} s building the dataset (resolve, list, metadata): "
          f"{row['construct_s'] + row['first_batch_s']:.2f} s from construction; latency ms p50/p95/p99 "
          f"{_latency_text(row)}; decoder cache {row['decoder_cache']}")
    hits, misses = ours["node_cache"]["hits"], ours["node_cache"]["misses"]
    hit_rate = "n/a" if row["cache_hit_rate"] is None else f"{row['cache_hit_rate']:.2f}"
    kb = {k: v / 1e3 for k, v in per_episode.items() if k != "video_fetched_over_own"}
    _say(f"{tag} link {args.latency_ms:g} ms/request, {args.bandwidth_mb_per_s:g} MB/s: {link['requests']} "
          f"requests, {link['bytes'] / 1e6:.2f} MB; per episode: video fetched {kb['video_fetched']:.1f} KB vs its "
          f"own {kb['own_video']:.1f} KB ({per_episode['video_fetched_over_own'] or 0:.3f}x), all reads "
          f"{kb['reader']:.1f} KB, link {kb['link']:.1f} KB; node cache hit rate {hit_rate} ({hits} of "
          f"{hits + misses} video entries local)")
    if prewarmed:
        _say(f"{tag} prewarm (untimed above): {prewarmed['bytes_fetched'] / 1e6:.2f} MB in "
              f"{prewarmed['seconds']:.2f} s, {prewarmed['entries_pinned']} entries pinned")
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", choices=SOURCES, default="local",
                        help="local: the folder in place; hub, bucket: served cold through a shaped link; "
                             "warmed_bucket: the bucket with a prewarmed node cache")
    parser.add_argument("--full", action="store_true",
                        help="the long matrix: the 24 x 300 dataset (remote sources: 8 x 150), both modes, worker "
                             "RSS at pools 2 and 32 (over 10 minutes on 2 cores); options given keep their values")
    parser.add_argument("--mode", choices=MODES + ("both",),
                        help="single: one frame per camera; sarm: 8-step windows (default: single; --full: both)")
    parser.add_argument("--decode", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: decode_device='cuda' (NVDEC), frames on the GPU, --num-workers forced to 0")
    parser.add_argument("--dataset", help="an existing LeRobot v3.0 folder (default: a synthetic one)")
    parser.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "episodestream-bench"),
                        help="where synthetic datasets are written and kept between runs (remote runs use a "
                             "fresh temporary node cache)")
    parser.add_argument("--episodes", type=int, help=f"synthetic episodes (default {DEFAULT_SIZE['quick'][0]}, "
                                                     f"--full {DEFAULT_SIZE['local'][0]}; remote sources "
                                                     f"{DEFAULT_SIZE['remote'][0]})")
    parser.add_argument("--episode-length", type=int, help=f"frames per episode (default {DEFAULT_SIZE['quick'][1]}, "
                                                           f"--full {DEFAULT_SIZE['local'][1]}; remote sources "
                                                           f"{DEFAULT_SIZE['remote'][1]})")
    parser.add_argument("--height", type=int, default=240)
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--pool-size", type=lambda v: v if v == "auto" else int(v), default="auto",
                        help="episode_pool_size: an int, or 'auto' (the library's default)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sarm-episodes", type=int, help="episodes streamed in sarm mode (its samples decode 8x "
                        f"the frames; default {DEFAULT_SIZE['quick'][2]}, --full {DEFAULT_SIZE['local'][2]}, remote "
                        f"sources {DEFAULT_SIZE['remote'][2]})")
    parser.add_argument("--rss-pool-sizes", help="pool sizes compared for worker peak RSS, e.g. 2,32 (local source "
                        "only; empty: skip; default: skip, --full: 2,32)")
    parser.add_argument("--dtype", choices=("float32", "uint8", "both"), default="float32",
                        help="camera frames as LeRobot's float32 in [0, 1], or uint8 (4x less to move "
                             "between processes; convert on the GPU)")
    parser.add_argument("--loader", choices=LOADERS + ("both",),
                        help="dataloader: torch DataLoader with --num-workers worker processes; episode: "
                             "EpisodeLoader with --num-workers decode threads in this process (local source); "
                             "default: both (local source), dataloader (remote sources)")
    parser.add_argument("--train-step-ms", type=float, default=0.0,
                        help="also stream single float32 with a simulated training step of this many ms after "
                             "each batch: a sleep (releases the GIL) and a pure-Python busy loop (holds it); "
                             "local source")
    # (An experiment's third choice, channels-last batches, was removed once measured: benchmarks/LOG.md.)
    parser.add_argument("--frame-writer", choices=("compiled", "numpy"),
                        help="how EpisodeLoader writes frames into batches: compiled (episodestream's C "
                             "kernel, the default where it was built) or numpy (what runs without a C compiler)")
    parser.add_argument("--decoder", default="torchcodec", metavar="torchcodec|stand-in:MS",
                        help="stand-in:MS measures the pipeline's own ceiling: every video reader is replaced by "
                             "one that sleeps MS milliseconds per decoded frame (GIL released) and returns "
                             "preallocated frames of the real shape; rows for EpisodeLoader with 1-32 threads "
                             "and DataLoader with 2/4/8 workers (see benchmarks/streaming/_stand_in.py)")
    parser.add_argument("--warmup-batches", type=int, help="batches left out of the warm throughput "
                        "(default: one per DataLoader worker)")
    link = parser.add_argument_group("remote link (hub, bucket, warmed_bucket)")
    link.add_argument("--latency-ms", type=float, default=50.0, help="delay before each request, as a round "
                      "trip to a far store (default 50)")
    link.add_argument("--bandwidth-mbps", "--bandwidth-mb-per-s", dest="bandwidth_mb_per_s", type=float,
                      default=50.0, help="cap on all connections together, in megabytes (10^6 bytes) per "
                      "second (default 50)")
    link.add_argument("--hub-redirect", action="store_true", help="hub: answer /resolve/ with a redirect to a "
                      "second, equally shaped origin, as the Hub's CDN (two round trips per read)")
    parser.add_argument("--repeats", type=int, default=1, help="remote sources: local/remote pairs of passes "
                        "run, the one with the median remote/local ratio reported (default 1)")
    parser.add_argument("--output-dir", default="bench_out")
    args = parser.parse_args(argv)

    for name, value in (FULL_DEFAULTS if args.full else QUICK_DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.loader is None:
        args.loader = "both" if args.source == "local" else "dataloader"
    size = DEFAULT_SIZE[("local" if args.full else "quick") if args.source == "local" else "remote"]
    args.episodes = size[0] if args.episodes is None else args.episodes
    args.episode_length = size[1] if args.episode_length is None else args.episode_length
    args.sarm_episodes = min(args.episodes, size[2] if args.sarm_episodes is None else args.sarm_episodes)
    if args.frame_writer == "compiled" and not _chw.compiled():
        parser.error("--frame-writer compiled: episodestream._sample._chw_kernel is not built here (installed without a "
                     "C compiler); use --frame-writer numpy")
    if args.frame_writer == "numpy":
        _chw._kernel = None  # this process only: EpisodeLoader's decode threads write here
    args.frame_writer = "compiled" if _chw.compiled() else "numpy"
    print(f"frames written into EpisodeLoader batches by: {args.frame_writer}", file=sys.stderr)
    decode_device = "cpu"
    if args.decode == "cuda":
        if not torch.cuda.is_available():
            parser.error(f"--decode cuda needs a CUDA GPU with a CUDA build of torch and torchcodec; this torch "
                         f"({torch.__version__}) sees none. Use --decode cpu.")
        if args.num_workers:
            print(f"--decode cuda: frames come out on the GPU, so the loader runs in the main process "
                  f"(--num-workers {args.num_workers} -> 0)", file=sys.stderr)
        args.num_workers, decode_device = 0, "cuda"
    if args.latency_ms < 0:
        parser.error(f"invalid --latency-ms ({args.latency_ms}): expected 0 or more")
    for name, value in (("--bandwidth-mbps", args.bandwidth_mb_per_s), ("--repeats", args.repeats),
                        ("--warmup-batches", args.warmup_batches)):
        if value is not None and value <= 0:
            parser.error(f"invalid {name} ({value}): expected a positive number")

    stand_in_ms = None
    if args.decoder != "torchcodec":
        kind, _, ms = args.decoder.partition(":")
        try:
            stand_in_ms = float(ms) if kind == "stand-in" else None
        except ValueError:
            stand_in_ms = None
        if stand_in_ms is None or stand_in_ms <= 0:
            parser.error(f"invalid --decoder ({args.decoder!r}): expected torchcodec or stand-in:MS with MS > 0")

    root = ensure_dataset(args)
    video_keys = EpisodeStreamingDataset(root).typed_meta.video_keys
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dtypes = ("float32", "uint8") if args.dtype == "both" else (args.dtype,)
    # The pool the streamed source gets: "auto" is planned on the local copy, which it may widen,
    # where a remote source gets the spread pool (episodestream._runtime.pool_size; the servers here
    # set no cache_limit).
    planned_pool = args.pool_size
    if planned_pool == "auto":
        local = runtime_of(EpisodeStreamingDataset(root)).core
        planned_pool = choose_pool_size(local.meta, local.episodes, remote=args.source != "local").size
    for loader in LOADERS if args.loader == "both" else (args.loader,):
        workers = 1 if loader == "episode" or args.decode == "cuda" else args.num_workers
        qualities = planned_shuffle_quality(root, pool_size=planned_pool, num_workers=workers,
                                            batch_sizes=sorted({args.batch_size, 256}))
        windows = "; ".join(w.summary() for w in qualities[0].windows)
        print(f"shuffle quality ({loader}, pool {planned_pool}, one consumer of {workers}, planned): "
              + "; ".join(q.summary() for q in qualities) + "; " + qualities[0].recurrence()
              + f"; over training windows of its own frames: {windows}", flush=True)
    if stand_in_ms is not None:
        from _stand_in import run as run_stand_in

        rows = run_stand_in(root, ms=stand_in_ms, modes=MODES if args.mode == "both" else (args.mode,), dtypes=dtypes,
                            delta_timestamps=lambda mode: delta_timestamps(mode, video_keys),
                            batch_size=args.batch_size, pool_size=args.pool_size)
        (out_dir / f"stand_in_{stand_in_ms}ms.json").write_text(json.dumps(rows, indent=2))
        return 0
    loaders = LOADERS if args.loader == "both" else (args.loader,)
    if args.source != "local" and loaders != ("dataloader",):
        parser.error("--loader episode is measured on the local source only")
    if args.train_step_ms < 0:
        parser.error(f"invalid --train-step-ms ({args.train_step_ms}): expected 0 or more")
    common = dict(num_workers=args.num_workers, pool_size=args.pool_size, batch_size=args.batch_size,
                  decode_device=decode_device, warmup_batches=args.warmup_batches or max(1, args.num_workers))
    rows = []
    modes = MODES if args.mode == "both" else (args.mode,)
    servers = nullcontext() if args.source == "local" else serve(
        args.source, root, latency_s=args.latency_ms / 1000, rate_bytes_per_s=args.bandwidth_mb_per_s * 1e6,
        hub_redirect=args.hub_redirect)
    runs = [(mode, dtype, loader, None) for mode in modes for dtype in dtypes for loader in loaders]
    if args.train_step_ms and args.source == "local":
        runs += [("single", "float32", loader, (kind, args.train_step_ms / 1000))
                 for kind in ("sleep", "busy") for loader in loaders]
    ceilings: dict = {}
    rss_pools = [int(p) for p in args.rss_pool_sizes.split(",") if p] if args.source == "local" else []
    print(f"{len(runs)} run(s) ({', '.join(_run_name(*run) for run in runs)})"
          + (f" and {len(rss_pools)} RSS pass(es)" if rss_pools else "")
          + f": about {_duration(_estimate_s(args, root, runs, video_keys, len(rss_pools)))} on 2 cores"
          + ("" if args.full else "; --full runs the long matrix"), file=sys.stderr, flush=True)
    progress = tqdm(total=len(runs) + len(rss_pools), desc="bench", unit="pass", file=sys.stderr,
                    disable=len(runs) + len(rss_pools) < 2)
    with servers as remote, progress:
        for mode, dtype, loader, train_step in runs:
            episodes = list(range(args.sarm_episodes)) if mode == "sarm" else None
            options = {**common, "uint8": dtype == "uint8"}
            if remote is None:
                row = run_local(args, root, mode, episodes, video_keys, options, loader_kind=loader,
                                train_step=train_step, ceilings=ceilings)
            else:
                row = run_remote(args, root, remote, mode, episodes, video_keys, options)
            row = {"source": args.source, "mode": mode, "decode": args.decode, "dtype": dtype,
                   "num_workers": args.num_workers, "pool_size": args.pool_size, **row, "status": "ok"}
            name = f"{args.source}-{mode}-{args.decode}-{dtype}" + ("-episodeloader" if loader == "episode" else "")
            name += f"-{train_step[0]}" if train_step else ""
            (out_dir / f"{name}.json").write_text(json.dumps(row, indent=2))
            rows.append(row)
            progress.update()
        rss = {}
        for pool_size in rss_pools:
            rss[pool_size] = stream(root, mode="single", video_keys=video_keys, episodes=None,
                                    **{**common, "uint8": dtypes[0] == "uint8", "pool_size": pool_size})["worker_peak_rss_mb"]
            progress.update()
    if rss:
        print("worker peak RSS by episode_pool_size (single mode): "
              + ", ".join(f"{p}: {mb:.0f} MB" for p, mb in rss.items()))
        (out_dir / "rss_by_pool_size.json").write_text(json.dumps(rss))
    if len(loaders) > 1:
        _compare_loaders(rows, args.num_workers)
    with open(out_dir / "results.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, dict) else v for k, v in row.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
