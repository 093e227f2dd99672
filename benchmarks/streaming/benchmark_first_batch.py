"""How long a remote first batch takes from ``EpisodeStreamingDataset(...)``, for one or more
checkouts side by side (alternating, so that other load on the machine falls on each alike).

Each repeat runs one process per checkout (``PYTHONPATH=<checkout>``), which serves the benchmark
dataset as ``benchmark_streaming.py --source hub`` does (FakeHub behind the shaping proxy, in the
same process), streams one local batch first (imports and decoders warm, as the benchmark's local
pass does), then twice, each time on an empty node cache: build the dataset, ``iter`` a DataLoader
and take its first batch. The first time pays what a process pays once (huggingface_hub's imports,
its HTTP client); the second does not. ``--import-hub-first`` imports huggingface_hub's API and
filesystem modules before the first time, as a trainer that already uses them has (LeRobot's
``lerobot.datasets.lerobot_dataset`` imports both), so that "cold" pays the rest of a first build
only. Printed per run: building, and the first batch from construction; then the medians per
checkout::

    python benchmarks/streaming/benchmark_first_batch.py --checkouts /path/old /path/new --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _one(root: str, args: argparse.Namespace) -> dict:
    """In the child: the measurement (see the module docstring)."""
    import torch.utils.data

    from episodestream import EpisodeStreamingDataset

    sys.path.insert(0, str(HERE))
    from _servers import serve

    options = dict(episode_pool_size=args.pool_size, seed=0)
    loader = dict(batch_size=args.batch_size, num_workers=args.num_workers)
    next(iter(torch.utils.data.DataLoader(EpisodeStreamingDataset(root, **options), **loader)))
    if args.import_hub_first:
        import huggingface_hub.hf_api  # noqa: F401  (see the module docstring)
        import huggingface_hub.hf_file_system  # noqa: F401
    runs = []
    with serve("hub", root, latency_s=args.latency_ms / 1000, rate_bytes_per_s=args.bandwidth_mb_per_s * 1e6) as remote:
        for _ in range(2):
            with tempfile.TemporaryDirectory(prefix="episodestream-first-batch-") as cache_dir:
                start = time.perf_counter()
                dataset = EpisodeStreamingDataset(remote.source, cache_dir=cache_dir, **remote.options, **options)
                built = time.perf_counter() - start
                iterator = iter(torch.utils.data.DataLoader(dataset, **loader))
                next(iterator)
                runs.append({"build_s": built, "first_batch_s": time.perf_counter() - start})
                del iterator
                dataset.close()
    return {"cold": runs[0], "warm": runs[1]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkouts", nargs="+", default=[str(HERE.parents[1])],
                        help="repository roots to compare (default: this one)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dataset", default=os.path.join(tempfile.gettempdir(), "episodestream-bench",
                                                          "textured-24x300-240x320"),
                        help="the dataset folder (default: benchmark_streaming.py's remote one)")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--pool-size", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--bandwidth-mb-per-s", type=float, default=50.0)
    parser.add_argument("--import-hub-first", action="store_true",
                        help="import huggingface_hub's API and filesystem before the cold run (as LeRobot has)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_one(args.dataset, args)))
        return 0
    if not Path(args.dataset, "meta", "info.json").exists():
        parser.error(f"--dataset {args.dataset}: no dataset there; benchmark_streaming.py --source hub writes it")
    results: dict[str, list[dict]] = {checkout: [] for checkout in args.checkouts}
    child = [sys.executable, __file__, "--child", *[a for a in (argv or sys.argv[1:]) if a != "--child"]]
    for repeat in range(args.repeats):
        for checkout in args.checkouts:
            with tempfile.TemporaryDirectory(prefix="episodestream-permits-") as permits:
                # A download budget of its own: the node's, in /dev/shm, carries other runs' throttles.
                env = {**os.environ, "PYTHONPATH": checkout, "EPISODESTREAM_DOWNLOAD_PERMITS_DIR": permits,
                       "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1"}
                load = os.getloadavg()[0]
                out = subprocess.run(child, env=env, check=True, capture_output=True, text=True).stdout
            row = json.loads(out.strip().splitlines()[-1])
            row["load"] = load
            results[checkout].append(row)
            print(f"{checkout} #{repeat}: cold build {row['cold']['build_s']:.2f} s, first batch "
                  f"{row['cold']['first_batch_s']:.2f} s from construction; warm build {row['warm']['build_s']:.2f} s, "
                  f"first batch {row['warm']['first_batch_s']:.2f} s (load {load:.1f})", flush=True)
    for checkout, rows in results.items():
        med = {f"{kind} {key}": statistics.median(r[kind][key] for r in rows)
               for kind in ("cold", "warm") for key in ("build_s", "first_batch_s")}
        print(f"{checkout} medians of {len(rows)}: " + ", ".join(f"{k} {v:.2f}" for k, v in med.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
