"""What a wider episode pool costs on real decoding: EpisodeLoader (or DataLoader) samples/s, peak RSS,
decoder-cache behaviour and batch diversity, by ``episode_pool_size``, side by side in one run.

Many short episodes are where a wide pool costs most (more episodes, so more files and decoders,
per batch). By default two synthetic datasets are written once under ``--cache-dir``: 200 episodes of
30-60 frames, 2 cameras 240x320 textured AV1, as v3.0 (episodes packed into shared files) and v2.1
(a file per episode and camera). Each round streams one epoch per (dataset, dtype, pool size), the
pool sizes alternating in direction from round to round; ratios are to pool 16 of the same round.

    python benchmarks/streaming/benchmark_pool_cost.py --rounds 2
    python benchmarks/streaming/benchmark_pool_cost.py --pool-sizes 16,256 --dtypes uint8 --versions v2.1
    python benchmarks/streaming/benchmark_pool_cost.py --pool-sizes 16,256 --dtypes uint8 --versions v2.1 --max-decoders 512
    python benchmarks/streaming/benchmark_pool_cost.py --pool-sizes 16,auto --versions v2.1 --num-workers 2

Each epoch runs in a fresh Python process (the loader's threads run in it), so its peak RSS is its
own: what earlier epochs freed but the allocator kept does not count. Samples per CPU-second (this
process's user + system time, all threads) is printed beside samples/s: on a machine shared with
other jobs it moves far less than wall-clock rates. With ``--num-workers N`` a torch DataLoader with N
worker processes streams the epoch instead: its CPU counts the workers' too, its peak RSS is the
largest worker's (the decoders live there), and their decoder caches are not reported.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from episodestream import EpisodeLoader, EpisodeStreamingDataset
from episodestream._plan.shuffle_quality import shuffle_quality
from episodestream._runtime.stream import summed_stats
from episodestream.tools.synthetic import write_synthetic_dataset

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_streaming import _peak_rss_mb  # noqa: E402


def dataset_root(cache_dir: str, version: str, episodes: int, lengths: tuple[int, int],
                 per_file: int | None = None) -> Path:
    packing = f"-{per_file}perfile" if per_file else ""
    root = Path(cache_dir) / f"pool-cost-{version}-{episodes}x{lengths[0]}-{lengths[1]}{packing}"
    if not (root / "meta" / "info.json").exists():
        print(f"writing {root}", file=sys.stderr, flush=True)
        write_synthetic_dataset(root, num_episodes=episodes, episode_length=lengths, height=240, width=320,
                                texture=True, version=version, max_episodes_per_video_file=per_file,
                                overwrite=True)
    return root


def epoch(root: Path, *, pool_size: int | str, uint8: bool, threads: int, batch_size: int,
          max_decoders: int | None = None, num_workers: int = 0) -> dict:
    """One epoch in a fresh process (this file with ``--one``)."""
    command = [sys.executable, __file__, "--one",
               json.dumps([str(root), pool_size, uint8, threads, batch_size, max_decoders, num_workers])]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cpu_s() -> float:
    """User + system CPU of this process and of its children waited for (DataLoader workers, once joined)."""
    return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, (resource.RUSAGE_SELF,
                                                                       resource.RUSAGE_CHILDREN)))


def _one_epoch(root: Path, pool_size: int | str, uint8: bool, threads: int, batch_size: int,
               max_decoders: int | None, num_workers: int = 0) -> dict:
    torch.set_num_threads(1)
    if max_decoders is not None:  # the lever "a decoder cache sized for the pool", in this process only
        import episodestream._sample.video.decoder_cache as decoder_cache
        # decoder_limit then gives exactly max_decoders, whatever the frames' memory.
        decoder_cache.MAX_DECODERS = decoder_cache.DECODERS_CEILING = max_decoders
        decoder_cache.DECODER_BUDGET_BYTES = 0
    dataset = EpisodeStreamingDataset(root, episode_pool_size=pool_size, seed=0, return_uint8=uint8)
    loader: EpisodeLoader | torch.utils.data.DataLoader = (
        torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=num_workers) if num_workers
        else EpisodeLoader(dataset, batch_size, num_threads=threads))
    episodes = []
    # The workers' CPU is counted once they are joined (the DataLoader joins them when the epoch ends).
    cpu_s = _cpu_s()
    start = time.perf_counter()
    for batch in loader:
        episodes.append(batch["episode_index"].numpy().copy())
        del batch
    elapsed_s = time.perf_counter() - start
    cpu_s = _cpu_s() - cpu_s
    cache = None
    if isinstance(loader, EpisodeLoader):
        time.sleep(0.2)  # the decode threads hand their decoders back as they end
        cache = summed_stats(list(loader._spares._spares))  # a local pass leaves its decoders for the next
        loader.close()
    # A fresh process per epoch (``epoch``): its only children are this epoch's workers.
    peak_rss_mb = (resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024 if num_workers
                   else _peak_rss_mb())
    ids = np.concatenate(episodes)
    quality = shuffle_quality(ids, batch_size)
    return {"pool_resolved": dataset.episode_pool_size, "samples_per_s": len(ids) / elapsed_s,
            "samples_per_cpu_s": len(ids) / cpu_s, "peak_rss_mb": peak_rss_mb, "decoder_cache": cache,
            "distinct": quality.distinct, "global_distinct": quality.global_distinct,
            "windows": {w.window: [w.distinct, w.uniform_distinct] for w in quality.windows if w.windows}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", help="comma-separated LeRobot folders (default: the synthetic ones)")
    parser.add_argument("--versions", default="v3.0,v2.1")
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--min-frames", type=int, default=30)
    parser.add_argument("--max-frames", type=int, default=60)
    parser.add_argument("--episodes-per-video-file", type=int,
                        help="v3.0: episodes packed into each mp4 (default: all, up to 200 MB a file)")
    parser.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "episodestream-bench"))
    parser.add_argument("--pool-sizes", default="16,64,128,256", help="comma-separated; 'auto' for the default's choice")
    parser.add_argument("--dtypes", default="float32,uint8")
    parser.add_argument("--threads", type=int, default=2, help="EpisodeLoader's decode threads")
    parser.add_argument("--num-workers", type=int, default=0,
                        help="0: EpisodeLoader; N > 0: a torch DataLoader with N worker processes")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-decoders", type=int, help="raise the decoder cache's cap (128) for every pool "
                        "size: capacity becomes min(this, pool x cameras) per thread")
    parser.add_argument("--output", help="write every epoch's row to this JSON file")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # one epoch, in the process ``epoch`` starts
    args = parser.parse_args(argv)
    if args.one:
        root, *rest = json.loads(args.one)
        print(json.dumps(_one_epoch(Path(root), *rest)))
        return 0
    roots = ([Path(p) for p in args.datasets.split(",")] if args.datasets else
             [dataset_root(args.cache_dir, v, args.episodes, (args.min_frames, args.max_frames),
                           args.episodes_per_video_file)
              for v in args.versions.split(",")])
    pools = [p if p == "auto" else int(p) for p in args.pool_sizes.split(",")]  # "auto": the default's choice
    dtypes = args.dtypes.split(",")
    rows = []
    for round_ in range(args.rounds):
        order = pools if round_ % 2 == 0 else pools[::-1]
        for root in roots:
            for dtype in dtypes:
                base = {}
                for pool in order:
                    row = {"round": round_, "dataset": root.name, "dtype": dtype, "pool": pool,
                           **epoch(root, pool_size=pool, uint8=dtype == "uint8", threads=args.threads,
                                   batch_size=args.batch_size, max_decoders=args.max_decoders,
                                   num_workers=args.num_workers)}
                    base[pool] = row
                    rows.append(row)
                ref = base[pools[0]]
                for pool in pools:
                    row = base[pool]
                    row["speed_vs_first"] = row["samples_per_s"] / ref["samples_per_s"]
                    row["rss_vs_first"] = row["peak_rss_mb"] / ref["peak_rss_mb"]
                    row["cpu_vs_first"] = row["samples_per_cpu_s"] / ref["samples_per_cpu_s"]
                    cache = row["decoder_cache"] or {}
                    shown = pool if pool != "auto" else f"auto ({row['pool_resolved']})"
                    print(f"round {round_} {root.name} {dtype} pool {shown}: {row['samples_per_s']:.0f} samples/s "
                          f"({row['speed_vs_first']:.2f}x pool {pools[0]}), {row['samples_per_cpu_s']:.0f} per CPU-second "
                          f"({row['cpu_vs_first']:.2f}x), peak RSS{' (largest worker)' if args.num_workers else ''} "
                          f"{row['peak_rss_mb']:.0f} MB "
                          f"({row['rss_vs_first']:.2f}x), decoder cache misses {cache.get('misses')} evictions "
                          f"{cache.get('evictions')} hits {cache.get('hits')}; distinct {row['distinct']:.1f} / "
                          f"{row['global_distinct']:.1f} ({row['distinct'] / row['global_distinct']:.2f})"
                          + "".join(f"; {int(w):,} samples {d:.0f} / {u:.0f} ({d / u:.2f})"
                                    for w, (d, u) in row["windows"].items()), flush=True)
    if args.output:
        Path(args.output).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
