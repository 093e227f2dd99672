"""What writing decoded frames into batch memory costs, beside a plain copy of the same bytes.

    python benchmarks/streaming/frame_copy.py --batches 1 16 64

The compiled frame writer (``episodestream/_sample/_chw_kernel.c``) turns a decode group's (H, W, 3)
uint8 frames into (3, H, W) frames of a batch, uint8 or float32 / 255, in one call. This times that
call for a group of ``--group`` frames written into ``--batches`` batch arrays in turn (the batch
memory a loader keeps in flight: the more arrays, the less of them stays in the CPU's caches)
(each array a group at a time) against ``np.copyto`` of the same uint8 bytes without the de-interleave, in this process, one core.
Where the two are close, the writer runs at the machine's copy speed and only writing fewer bytes
(or fewer batches in flight) makes it cheaper. Results: benchmarks/LOG.md.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from episodestream._sample import chw


def _per_frame_us(write, targets: list[np.ndarray], group: int, min_s: float) -> float:
    """Each target's frames written a group at a time, target after target, for ``min_s``."""
    starts = range(0, len(targets[0]) - group + 1, group)
    for out in targets:  # every array written once before timing: warm pages, as a steady loader's
        for start in starts:
            write(out[start:start + group])
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < min_s:
        for out in targets:
            for start in starts:
                write(out[start:start + group])
                count += group
    return (time.perf_counter() - started) / count * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64],
                        help="batch arrays written in turn (each --batch-size frames of one camera)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--group", type=int, default=16, help="frames per writer call (a decode group)")
    parser.add_argument("--height", type=int, default=240)
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--seconds", type=float, default=1.0, help="timed per row")
    args = parser.parse_args()
    if args.group < 1 or args.batch_size % args.group:
        parser.error(f"--batch-size ({args.batch_size}) must be a multiple of --group ({args.group})")
    if not chw.compiled():
        parser.error("the compiled frame writer is not built here (install the package with a C compiler)")
    from episodestream._sample import _chw_kernel

    shape = (args.height, args.width, 3)
    frame_bytes = int(np.prod(shape))
    source = np.random.default_rng(0).integers(0, 256, (args.group, *shape), dtype=np.uint8)
    pairs = np.array([[i, i] for i in range(args.group)], dtype=np.int64).ravel()
    flat_source = source.reshape(args.group, -1)
    print(f"{args.group} frames of {args.height}x{args.width} per call; us per frame (GB/s of frame bytes written)")
    for batches in args.batches:
        for dtype in (np.uint8, np.float32):
            targets = [np.empty((args.batch_size, 3, args.height, args.width), dtype) for _ in range(batches)]
            in_flight_mb = batches * targets[0].nbytes / 1e6
            writer_us = _per_frame_us(lambda out: _chw_kernel.hwc_to_chw_rows(source, out, pairs), targets,
                                      args.group, args.seconds)
            line = (f"{batches:3d} batch arrays ({in_flight_mb:6.0f} MB) {np.dtype(dtype).name:7s} writer "
                    f"{writer_us:6.2f} us ({frame_bytes * np.dtype(dtype).itemsize / writer_us / 1e3:5.1f} GB/s)")
            if dtype == np.uint8:
                copy_us = _per_frame_us(lambda out: np.copyto(out.reshape(args.group, -1), flat_source),
                                        targets, args.group, args.seconds)
                line += f"   np.copyto {copy_us:6.2f} us ({frame_bytes / copy_us / 1e3:5.1f} GB/s)"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
