"""Chosen rows of ``--decoder stand-in:MS`` for one checkout, to compare checkouts side by side.

    python benchmarks/streaming/stand_in_rows.py CHECKOUT --threads 16 32 --dtypes uint8 float32 --ms 1.3 --mode single

Imports episodestream from CHECKOUT (it must have its compiled frame writer; the script refuses
otherwise) and runs ``_stand_in.run`` for EpisodeLoader with the given thread counts on the
benchmark's full local dataset (``benchmark_streaming.py --full`` writes it on its first run); prints one JSON
line per row. Run it once per checkout, alternating, on a quiet machine. ``--skip-frame-writes`` runs
the rows without copying decoded frames into batch memory (``_stand_in``'s module doc).
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout")
    parser.add_argument("--threads", type=int, nargs="+", default=[16])
    parser.add_argument("--workers", type=int, nargs="*", default=[], help="DataLoader worker counts too")
    parser.add_argument("--dtypes", nargs="+", choices=["uint8", "float32"], default=["uint8"])
    parser.add_argument("--ms", type=float, default=1.3)
    parser.add_argument("--mode", choices=["single", "sarm"], default="single")
    parser.add_argument("--decode-group-size", type=int, default=None, help="default: the dataset's")
    parser.add_argument("--dataset", default="/tmp/episodestream-bench/textured-24x300-240x320")
    parser.add_argument("--skip-frame-writes", action="store_true",
                        help="EpisodeLoader rows without copying frames into batch memory (what that copy costs)")
    args = parser.parse_args()
    if args.skip_frame_writes and args.workers:
        parser.error("--skip-frame-writes is for EpisodeLoader rows; leave out --workers")
    checkout = os.path.abspath(args.checkout)
    sys.path[:0] = [checkout, os.path.join(checkout, "benchmarks", "streaming")]
    import episodestream
    from episodestream._sample import chw

    if not episodestream.__file__.startswith(checkout) or not chw.compiled():
        parser.error(f"{checkout}: episodestream imported from {episodestream.__file__}, compiled writer "
                     f"{chw.compiled()}: copy _chw_kernel*.so into its episodestream/_sample/")
    from _stand_in import run
    from benchmark_streaming import delta_timestamps

    keys = episodestream.EpisodeStreamingDataset(args.dataset).typed_meta.video_keys
    rows = run(args.dataset, ms=args.ms, modes=(args.mode,), dtypes=args.dtypes,
               delta_timestamps=lambda mode: delta_timestamps(mode, keys), batch_size=32, pool_size=16,
               threads=tuple(args.threads), workers=tuple(args.workers), group_size=args.decode_group_size,
               write_frames=not args.skip_frame_writes)
    for row in rows:
        print(json.dumps({"checkout": checkout, **row}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
