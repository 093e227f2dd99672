"""``--decoder stand-in:MS``: the pipeline's own ceiling, with decoding taken out of the picture.

The stand-in replaces each video reader the dataset opens (``episodestream.testing.faults``): per
decoded frame it sleeps ``MS`` milliseconds (the GIL released, as torchcodec's decode calls release
it; sleeping, not computing, so decode capacity grows with the thread count even on 2 cores) and
returns preallocated frames of the dataset's real shape and dtype. Everything else runs for real:
planning, rows, windows, grouping, frame writing, collation, batch memory. The ideal is
``threads / MS`` frames per second; what the pipeline reaches of it is its own ceiling.

Each row is timed in the steady state: epochs run back to back (the benchmark's epoch is 1-2 s at
the rates of 8 and more threads, so a row spans several, their boundaries included) and the clock
starts after the warm-up batches, the ones that fill the pipeline and fault in fresh batch memory.
A sarm float32 batch is 472 MB and 16 threads keep ~8 in flight: first touching those 4 GB took
1-7 s on these VMs, longer than a 2 s window, which made rows timed from the first batch look like a
collapse (benchmarks/LOG.md). The warm-up is the batches that fill the pipeline, then as many as
it takes until one batch costs this process under ``STEADY_FAULTS_PER_BATCH`` page faults (at most
``MAX_WARMUP_S``); its length is reported beside the rate.

``write_frames=False`` (``stand_in_rows.py --skip-frame-writes``) leaves the decoded frames out of the
batches (``FrameWrites`` write nothing; the batches' frames are garbage): what is left is the
pipeline's Python alone, so the row beside the normal one tells what copying the frames into batch
memory costs, a memory-bound copy every loader makes once per frame (benchmarks/LOG.md).

"CPU per frame" is the process's CPU time (``time.process_time``, all threads; for DataLoader
workers theirs too, from /proc) over the frames decoded: the stand-in burns
none, so it is the pipeline's own work per frame, an upper bound on the GIL-held part (the frame
writer and numpy release the GIL for part of it).
"""

from __future__ import annotations

import gc
import math
import multiprocessing
import os
import resource
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from episodestream import EpisodeLoader, EpisodeStreamingDataset
from episodestream._sample.chw import FrameWrites
from episodestream.testing import faults

LOADER_THREADS = (1, 2, 4, 8, 16, 32)
DATALOADER_WORKERS = (2, 4, 8)
MIN_SECONDS = 3.0  # timed per row, after the warm-up batches
MAX_WARMUP_S = 20.0  # the warm-up's bound (first touch of several GB took up to ~7 s here)
STEADY_FAULTS_PER_BATCH = 1000  # minor page faults (4 KB each): a batch this far below its size is in warm memory


class StandInReader:
    """A ``VideoReader`` that costs ``ms`` per frame of sleep and returns preallocated frames."""

    def __init__(self, ms: float, fps: float, counter: Any, frames: _SharedFrames) -> None:
        self._seconds_per_frame = ms / 1000
        self._half_frame_s = 0.5 / fps  # decode_files asks for the frame played half a frame after the query
        self._counter = counter  # a multiprocessing.Value: decoded frames, every process together
        self._frames = frames

    def frames_played_at(self, seconds):
        n = len(seconds)
        time.sleep(self._seconds_per_frame * n)
        with self._counter.get_lock():
            self._counter.value += n
        return self._frames.first(n), np.asarray(seconds, dtype=np.float64) - self._half_frame_s

    def close(self) -> None:
        pass


class _SharedFrames:
    """One process's zero frames, shared by all its stand-in readers: the loader only reads decoded
    frames. A buffer per reader (a thread keeps one per file, up to 16 threads) would put ~1-4 GB
    of zeroed pages into each row, faulted in while the row is timed."""

    def __init__(self, shape: tuple[int, int, int]) -> None:
        self._shape = shape
        self._frames = torch.zeros((0, *shape), dtype=torch.uint8)

    def first(self, n: int) -> torch.Tensor:
        frames = self._frames
        if n > len(frames):  # threads growing it at once each make one; the last kept serves later calls
            frames = self._frames = torch.zeros((max(n, 2 * len(frames)), *self._shape), dtype=torch.uint8)
        return frames[:n]


@dataclass
class _Wrap:
    """Picklable for DataLoader workers: the reader ``faults.wrap_video_readers`` installs."""

    ms: float
    shape: tuple[int, int, int]
    fps: float
    counter: Any
    _frames: _SharedFrames | None = field(default=None, repr=False)  # per process: never pickled

    def __call__(self, reader, path):
        reader.close()
        if self._frames is None:
            self._frames = _SharedFrames(self.shape)
        return StandInReader(self.ms, self.fps, self.counter, self._frames)

    def __getstate__(self):
        return {**self.__dict__, "_frames": None}


def _cpu_s(batches: Any) -> float:
    """This process's CPU time and, for a DataLoader, its live workers' (read from /proc: persistent
    workers are not reaped during the timed window, so ``RUSAGE_CHILDREN`` would not count them)."""
    workers = getattr(getattr(batches, "_iterator", None), "_workers", None) or ()
    return time.process_time() + sum(_process_cpu_s(worker.pid) for worker in workers)


def _process_cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _warmup_batches(loader: str, count: int, batch_size: int, group_size: int) -> int:
    """Batches until the pipeline is full and every batch buffer it keeps in flight has been
    written once: EpisodeLoader plans ``prefetch_batches`` (2) batches and a decode group per thread
    ahead; a DataLoader keeps ``prefetch_factor`` (2) batches per worker. Two more for the batch the
    trainer holds and the one it just let go of."""
    if loader == "episode":
        return math.ceil((2 * batch_size + count * group_size) / batch_size) + 2
    return 2 * count + 2


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _epochs(batches):
    """Epoch after epoch (each ``iter`` continues with the next one, as in training)."""
    while True:
        yield from batches


@contextmanager
def _frames_unwritten():
    """``FrameWrites`` forget their writes instead of copying (benchmark-only; restored after): both
    ``flush`` and ``chw.flush_all`` take the writes through ``_kernel_job``, and find none."""
    kernel_job = FrameWrites._kernel_job

    def forget(self: FrameWrites) -> None:
        self._pairs = []

    FrameWrites._kernel_job = forget  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        FrameWrites._kernel_job = kernel_job  # type: ignore[method-assign]


def stream_row(dataset: EpisodeStreamingDataset, *, ms: float, loader: str, count: int, batch_size: int,
               write_frames: bool = True) -> dict:
    """One row: ``count`` EpisodeLoader threads or DataLoader workers over the stand-in, timed in
    the steady state (see the module doc); ``write_frames=False`` skips copying frames into batches."""
    if not write_frames:
        if loader != "episode":
            raise ValueError("write_frames=False is for EpisodeLoader rows (a DataLoader's workers collate "
                             "by themselves)")
        with _frames_unwritten():
            return stream_row(dataset, ms=ms, loader=loader, count=count, batch_size=batch_size)
    # The previous row's dataset is in reference cycles (the readers ``faults`` installed): freed
    # now, not by a collection inside this row's timed window.
    gc.collect()
    video_key = dataset.typed_meta.video_keys[0]
    height, width, channels = dataset.typed_meta.features[video_key].shape
    counter = multiprocessing.get_context("fork").Value("q", 0)
    faults.wrap_video_readers(dataset, _Wrap(ms, (height, width, channels), dataset.typed_meta.fps, counter))
    if loader == "episode":
        batches = EpisodeLoader(dataset, batch_size, num_threads=count)
    else:
        # Persistent workers, as a tuned training loop keeps them: epoch after epoch without restarts.
        batches = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=count,
                                              multiprocessing_context="fork", persistent_workers=True)
    warmup = _warmup_batches(loader, count, batch_size, dataset.decode_group_size)
    iterator = _epochs(batches)
    started = time.perf_counter()
    next(iterator)
    first_batch_s = time.perf_counter() - started
    for _ in range(warmup - 1):
        next(iterator)
    # Then until a batch no longer faults in fresh memory (batches in flight when the count ran out
    # may still be taking their first pages; a steady batch reuses warm ones), within a bound:
    # DataLoader workers' shared memory is fresh for every batch, but in the workers, not here.
    paged, deadline = _minor_faults(), time.perf_counter() + MAX_WARMUP_S
    while time.perf_counter() < deadline:
        next(iterator)
        warmup, paged, before = warmup + 1, _minor_faults(), paged
        if paged - before < STEADY_FAULTS_PER_BATCH:
            break
    start, frames_at_start, cpu_at_start = time.perf_counter(), counter.value, _cpu_s(batches)
    batches_timed = 0
    for _ in iterator:
        batches_timed += 1
        if time.perf_counter() - start >= MIN_SECONDS:
            break
    elapsed_s = time.perf_counter() - start
    frames = counter.value - frames_at_start
    cpu_s = _cpu_s(batches) - cpu_at_start
    iterator.close()
    close = getattr(batches, "close", None) or getattr(getattr(batches, "_iterator", None), "_shutdown_workers", None)
    if close is not None:
        close()
    ideal = count / (ms / 1000)
    return {"loader": loader, "threads_or_workers": count, "stand_in_ms": ms, "batches_timed": batches_timed,
            "frames": frames, "elapsed_s": elapsed_s, "frames_per_s": frames / elapsed_s,
            "ideal_frames_per_s": ideal, "fraction_of_ideal": frames / elapsed_s / ideal,
            "cpu_us_per_frame": 1e6 * cpu_s / frames if frames else None, "first_batch_s": first_batch_s,
            "warmup_batches": warmup, "warmup_s": start - started}


def run(root, *, ms: float, modes, dtypes, delta_timestamps, batch_size: int, pool_size: int | str,
        threads=LOADER_THREADS, workers=DATALOADER_WORKERS, group_size: int | None = None,
        write_frames: bool = True) -> list[dict]:
    """The rows of every (mode, dtype, loader, count); ``group_size`` None keeps the dataset's default;
    ``write_frames=False``: EpisodeLoader rows without copying frames into batches (see the module doc)."""
    grouping = {} if group_size is None else {"decode_group_size": group_size}
    rows = []
    for mode in modes:
        for dtype in dtypes:
            for loader, counts in (("episode", threads), ("dataloader", workers)):
                for count in counts:
                    dataset = EpisodeStreamingDataset(root, episode_pool_size=pool_size, seed=0,
                                                      return_uint8=dtype == "uint8",
                                                      delta_timestamps=delta_timestamps(mode), **grouping)
                    row = {"mode": mode, "dtype": dtype, "frames_written": write_frames,
                           **stream_row(dataset, ms=ms, loader=loader, count=count, batch_size=batch_size,
                                        write_frames=write_frames)}
                    cpu = row["cpu_us_per_frame"]
                    print(f"[stand-in {ms} ms {mode} {dtype} {loader} x{count}] {row['frames_per_s']:.0f} frames/s "
                          f"of ideal {row['ideal_frames_per_s']:.0f} = {row['fraction_of_ideal']:.2f}; CPU "
                          f"{cpu:.0f} us/frame; first batch {row['first_batch_s']:.2f} s, warm after {row['warmup_s']:.2f} s" if cpu else "", flush=True)
                    rows.append(row)
    return rows
