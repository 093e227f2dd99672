"""``--decoder stand-in:MS``: the pipeline's own ceiling, with decoding taken out of the picture.

The stand-in replaces each video reader the dataset opens (``episodestream.testing.faults``): per
decoded frame it sleeps ``MS`` milliseconds (the GIL released, as torchcodec's decode calls release
it; sleeping, not computing, so decode capacity grows with the thread count even on 2 cores) and
returns preallocated frames of the dataset's real shape and dtype. Everything else runs for real:
planning, rows, windows, grouping, frame writing, collation, batch memory. The ideal is
``threads / MS`` frames per second; what the pipeline reaches of it is its own ceiling.

"CPU per frame" is the process's CPU time (``time.process_time``, all threads; for DataLoader
workers the reaped children's ``RUSAGE_CHILDREN`` too) over the frames decoded: the stand-in burns
none, so it is the pipeline's own work per frame, an upper bound on the GIL-held part (the frame
writer and numpy release the GIL for part of it).
"""

from __future__ import annotations

import multiprocessing
import resource
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from episodestream import EpisodeLoader, EpisodeStreamingDataset
from episodestream.testing import faults

LOADER_THREADS = (1, 2, 4, 8, 16, 32)
DATALOADER_WORKERS = (2, 4, 8)
MIN_SECONDS = 2.0  # timed per row after the first batch (or the epoch's end, if sooner)


class StandInReader:
    """A ``VideoReader`` that costs ``ms`` per frame of sleep and returns preallocated frames."""

    def __init__(self, ms: float, shape: tuple[int, int, int], fps: float, counter: Any) -> None:
        self._seconds_per_frame = ms / 1000
        self._half_frame_s = 0.5 / fps  # decode_files asks for the frame played half a frame after the query
        self._shape = shape
        self._counter = counter  # a multiprocessing.Value: decoded frames, every process together
        self._frames = torch.zeros((0, *shape), dtype=torch.uint8)

    def frames_played_at(self, seconds):
        n = len(seconds)
        if n > len(self._frames):
            self._frames = torch.zeros((max(n, 2 * len(self._frames)), *self._shape), dtype=torch.uint8)
        time.sleep(self._seconds_per_frame * n)
        with self._counter.get_lock():
            self._counter.value += n
        return self._frames[:n], np.asarray(seconds, dtype=np.float64) - self._half_frame_s

    def close(self) -> None:
        pass


@dataclass
class _Wrap:
    """Picklable for DataLoader workers: the reader ``faults.wrap_video_readers`` installs."""

    ms: float
    shape: tuple[int, int, int]
    fps: float
    counter: Any

    def __call__(self, reader, path):
        reader.close()
        return StandInReader(self.ms, self.shape, self.fps, self.counter)


def _cpu_s() -> float:
    return time.process_time() + resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime \
        + resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime


def stream_row(dataset: EpisodeStreamingDataset, *, ms: float, loader: str, count: int, batch_size: int) -> dict:
    """One row: ``count`` EpisodeLoader threads or DataLoader workers over the stand-in."""
    video_key = dataset.typed_meta.video_keys[0]
    height, width, channels = dataset.typed_meta.features[video_key].shape
    counter = multiprocessing.get_context("fork").Value("q", 0)
    faults.wrap_video_readers(dataset, _Wrap(ms, (height, width, channels), dataset.typed_meta.fps, counter))
    if loader == "episode":
        batches = EpisodeLoader(dataset, batch_size, num_threads=count)
    else:
        batches = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=count,
                                              multiprocessing_context="fork")
    iterator = iter(batches)
    started = time.perf_counter()
    next(iterator)  # the pipeline is full from here on
    first_batch_s = time.perf_counter() - started
    start, frames_at_start, cpu_at_start = time.perf_counter(), counter.value, _cpu_s()
    batches_timed = 0
    for _ in iterator:
        batches_timed += 1
        if time.perf_counter() - start >= MIN_SECONDS:
            break
    elapsed_s = time.perf_counter() - start
    frames = counter.value - frames_at_start
    close = getattr(batches, "close", None) or getattr(iterator, "_shutdown_workers", None)
    if close is not None:
        close()
    del iterator
    cpu_s = _cpu_s() - cpu_at_start
    ideal = count / (ms / 1000)
    return {"loader": loader, "threads_or_workers": count, "stand_in_ms": ms, "batches_timed": batches_timed,
            "frames": frames, "elapsed_s": elapsed_s, "frames_per_s": frames / elapsed_s,
            "ideal_frames_per_s": ideal, "fraction_of_ideal": frames / elapsed_s / ideal,
            "cpu_us_per_frame": 1e6 * cpu_s / frames if frames else None, "first_batch_s": first_batch_s}


def run(root, *, ms: float, modes, dtypes, delta_timestamps, batch_size: int, pool_size: int,
        threads=LOADER_THREADS, workers=DATALOADER_WORKERS) -> list[dict]:
    rows = []
    for mode in modes:
        for dtype in dtypes:
            for loader, counts in (("episode", threads), ("dataloader", workers)):
                for count in counts:
                    dataset = EpisodeStreamingDataset(root, episode_pool_size=pool_size, seed=0,
                                                      return_uint8=dtype == "uint8",
                                                      delta_timestamps=delta_timestamps(mode))
                    row = {"mode": mode, "dtype": dtype, **stream_row(dataset, ms=ms, loader=loader, count=count,
                                                                      batch_size=batch_size)}
                    cpu = row["cpu_us_per_frame"]
                    print(f"[stand-in {ms} ms {mode} {dtype} {loader} x{count}] {row['frames_per_s']:.0f} frames/s "
                          f"of ideal {row['ideal_frames_per_s']:.0f} = {row['fraction_of_ideal']:.2f}; CPU "
                          f"{cpu:.0f} us/frame; first batch {row['first_batch_s']:.2f} s" if cpu else "", flush=True)
                    rows.append(row)
    return rows
