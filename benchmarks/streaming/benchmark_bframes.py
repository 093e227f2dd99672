"""Decode rate and open cost of the readers on HEVC with B-frames (LeRobot's depth and hevc RGB).

Writes a textured synthetic HEVC dataset (x265, B-frames, open GOP, GOP 2) once, then times on
one of its camera files, one thread:
- opening a reader (episodestream's TorchCodecReader builds frame mappings from the mp4 index;
  torchcodec's ``seek_mode="exact"`` scans the file instead; "approximate" is the AV1 path, wrong
  frames here, shown as the speed reference);
- frames/s at random single frames and over a sequential pass;
and, with ``--big FILE`` (any mp4, e.g. an HEVC file of a few hundred MB), the open costs there, also
on a sparse copy holding only the file's header (what a remote span file looks like outside its span).

    PYTHONPATH=<checkout> python benchmarks/streaming/benchmark_bframes.py [--big FILE]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from episodestream._format.mp4 import read_header
from episodestream._sample.video.backends import PyAVReader, TorchCodecReader
from episodestream.tools.synthetic import write_synthetic_dataset

FPS = 30


def _torchcodec(mode: str):
    from torchcodec.decoders import VideoDecoder

    class Reader:
        def __init__(self, path: str) -> None:
            self.decoder = VideoDecoder(path, seek_mode=mode, dimension_order="NHWC", num_ffmpeg_threads=1)

        def frames_played_at(self, seconds):
            batch = self.decoder.get_frames_played_at(seconds=list(seconds))
            return batch.data, batch.pts_seconds.numpy()

        def close(self) -> None:
            self.decoder = None

    return Reader


READERS = {"episodestream torchcodec (mappings)": TorchCodecReader, "torchcodec exact (scan)": _torchcodec("exact"),
           "torchcodec approximate (AV1 path)": _torchcodec("approximate"), "episodestream pyav": PyAVReader}


def _open_ms(reader, path: str, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        reader(path).close()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _rates(reader, path: str, frames: int, *, random_frames: int = 300) -> tuple[float, float, int]:
    """(random frames/s, sequential frames/s, frames whose pts was not the one asked for)."""
    decoder, wrong = reader(path), 0
    order = random.Random(0).sample(range(frames), min(random_frames, frames))
    start = time.perf_counter()
    for i in order:
        _, pts = decoder.frames_played_at([(i + 0.5) / FPS])
        wrong += abs(pts[0] - i / FPS) > 1e-4
    random_rate = len(order) / (time.perf_counter() - start)
    decoder.close()
    decoder = reader(path)
    start = time.perf_counter()
    for first in range(0, frames, 8):
        decoder.frames_played_at([(i + 0.5) / FPS for i in range(first, min(first + 8, frames))])
    sequential_rate = frames / (time.perf_counter() - start)
    decoder.close()
    return random_rate, sequential_rate, wrong


def _sparse_copy(path: str, folder: str) -> str:
    """The file's size with only its header regions written (holes elsewhere)."""
    size = os.path.getsize(path)
    with open(path, "rb") as source:
        def read(start: int, end: int) -> bytes:
            source.seek(start)
            return source.read(end - start)

        header = read_header(read, size)
    out = os.path.join(folder, "sparse.mp4")
    with open(out, "wb") as sink:
        sink.truncate(size)
        for offset, data in header.regions:
            sink.seek(offset)
            sink.write(data)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default=os.path.join(tempfile.gettempdir(), "episodestream-bench", "hevc-8x150"))
    parser.add_argument("--big", help="an mp4 to time opening on (and on a sparse copy of its header)")
    args = parser.parse_args()
    root = Path(args.dataset)
    if not root.exists():
        write_synthetic_dataset(root, num_episodes=8, episode_length=150, fps=FPS, height=240, width=320,
                                cameras=("observation.images.front",), codec="hevc", texture=True)
    path = str(next(root.glob("videos/*/chunk-000/file-000.mp4")))
    frames = 8 * 150
    print(f"{path}: {os.path.getsize(path) / 1e6:.1f} MB, {frames} frames 240x320")
    for name, reader in READERS.items():
        random_rate, sequential_rate, wrong = _rates(reader, path, frames)
        print(f"  {name:38s} open {_open_ms(reader, path):6.1f} ms  random {random_rate:6.0f} frames/s  "
              f"sequential {sequential_rate:6.0f} frames/s  wrong frames {wrong}")
    if args.big:
        folder = tempfile.mkdtemp()
        try:
            sparse = _sparse_copy(args.big, folder)
            print(f"{args.big}: {os.path.getsize(args.big) / 1e6:.0f} MB")
            for name in ("episodestream torchcodec (mappings)", "torchcodec exact (scan)",
                         "torchcodec approximate (AV1 path)"):
                reader = READERS[name]
                print(f"  {name:38s} open {_open_ms(reader, args.big, 3):7.1f} ms, "
                      f"sparse copy {_open_ms(reader, sparse, 3):7.1f} ms")
        finally:
            shutil.rmtree(folder)


if __name__ == "__main__":
    main()
