"""What a GOP pair costs the decoder: a keyframe and the frame after it, asked for apart and together.

A shuffled epoch asks for single frames at random, so each frame that is not a keyframe costs its
keyframe's decode too. This prints, for random keyframes ``k`` of one mp4 whose next frame is not a
keyframe, torchcodec's CPU time per call (one FFmpeg thread, ``seek_mode="exact"``) for frame ``k``
alone, frame ``k + 1`` alone, and both in one call, side by side in one run, and the ratio of the two
apart to the pair together: how much a reader would save by decoding a GOP's frames together (the
lead for a shuffled epoch in docs/benchmarks.md, "On Ray Data").

    python benchmarks/streaming/benchmark_gop_pairs.py --video DATASET/videos/KEY/chunk-000/file-000.mp4

Needs a track shown in decode order (AV1, or H.264 without B-frames: sample ``i`` is frame ``i``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable


def _cpu_ms_per_call(calls: list[Callable[[], object]]) -> float:
    start = time.process_time()
    for call in calls:
        call()
    return (time.process_time() - start) / len(calls) * 1e3


def measure(video: str, *, pairs: int, rounds: int, seed: int) -> dict:
    import numpy as np
    import torch
    from torchcodec.decoders import VideoDecoder

    from episodestream._format.mp4 import read_local_track

    torch.set_num_threads(1)
    track = read_local_track(video)
    if not (np.all(np.diff(track.pts_s) > 0)):
        raise SystemExit(f"{video}: its frames are not shown in decode order (B-frames?); this benchmark needs "
                         "sample i to be frame i.")
    sync = track.is_sync
    firsts = np.flatnonzero(sync[:-1] & ~sync[1:])  # keyframes followed by a frame that is not one
    if not len(firsts):
        raise SystemExit(f"{video}: no keyframe is followed by another frame of its GOP (every frame a keyframe?).")
    rng = random.Random(seed)
    keys = [int(k) for k in rng.choices(firsts.tolist(), k=pairs)]
    decoder = VideoDecoder(video, seek_mode="exact", num_ffmpeg_threads=1)
    decoder.get_frames_at([0])  # opened and warm before any timing
    kinds: dict[str, Callable[[int], Callable[[], object]]] = {
        "keyframe alone": lambda k: lambda: decoder.get_frames_at([k]),
        "the frame after alone": lambda k: lambda: decoder.get_frames_at([k + 1]),
        "both in one call": lambda k: lambda: decoder.get_frames_at([k, k + 1]),
    }
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(rounds):  # alternating, so that a slow spell of the machine falls on every kind
        for kind, call in kinds.items():
            times[kind].append(_cpu_ms_per_call([call(k) for k in keys]))
    ms = {kind: sorted(values)[len(values) // 2] for kind, values in times.items()}
    apart = ms["keyframe alone"] + ms["the frame after alone"]
    return {"video": video, "pairs": pairs, "rounds": rounds, "gop_frames_median": float(np.median(np.diff(
        np.flatnonzero(sync)))) if sync.sum() > 1 else None, "cpu_ms_per_call": ms,
        "apart_over_together": apart / ms["both in one call"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--video", required=True, help="an mp4 whose frames are shown in decode order")
    parser.add_argument("--pairs", type=int, default=300, help="random GOP pairs per round (default 300)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians reported (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    result = measure(args.video, pairs=args.pairs, rounds=args.rounds, seed=args.seed)
    for kind, value in result["cpu_ms_per_call"].items():
        print(f"{kind:>22}: {value:6.2f} CPU-ms per call")
    print(f"two frames of a GOP apart cost {result['apart_over_together']:.2f}x the two in one call")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
