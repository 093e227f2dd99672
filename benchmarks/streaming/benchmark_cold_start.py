"""Import + build + first batch of a Hub dataset from a fresh interpreter, for checkouts side by side.

``benchmark_first_batch.py`` measures in a process that has imported torch and episodestream and
streamed a local batch already; a user's first run starts with none of that. Here every trial is a
new ``python -c`` process (``PYTHONPATH=<checkout>``) that imports torch's DataLoader and
episodestream, builds ``EpisodeStreamingDataset`` on a Hub repo and takes the first batch through
``--num-workers`` DataLoader workers. The Hub is ``FakeHub`` serving a synthetic dataset, behind
``ShapingProxy`` (``--latency-ms`` before each request, ``--bandwidth-mb-per-s`` over all
connections), both in this process; ``HF_ENDPOINT`` points at the proxy (so huggingface_hub's own
calls are seen and shaped too), ``HF_HOME`` and the node cache are empty per trial, telemetry is
left as a user has it (on). Checkouts alternate, trial by trial, so other load falls on each alike.

Printed per trial: seconds from the script's first line to the imports done (torch's DataLoader and
episodestream), the dataset built and the first batch, the first batch after the imports, and from
the parent's spawn (interpreter start-up included); the requests the build sent (paths, in order)
and those to ``/api/agent-harnesses`` in the whole trial. Then the medians per checkout::

    python benchmarks/streaming/benchmark_cold_start.py --checkouts /work/main /work/wt-remote --trials 5
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
REPO = "bench/cold-start"

CHILD = r"""
import time
start = time.perf_counter()
import json, sys
import torch.utils.data
from episodestream import EpisodeStreamingDataset
imported = time.perf_counter()
import episodestream
print("FROM", episodestream.__file__, flush=True)
args = json.loads(sys.argv[1])
dataset = EpisodeStreamingDataset(args["repo"], cache_dir=args["cache_dir"], hub_endpoint=args["endpoint"],
                                  token=False, episode_pool_size=args["pool_size"], seed=0)
built = time.perf_counter()
print("BUILT", flush=True)
iterator = iter(torch.utils.data.DataLoader(dataset, batch_size=args["batch_size"], num_workers=args["num_workers"]))
next(iterator)
batch = time.perf_counter()
del iterator
dataset.close()
print(json.dumps({"import_s": imported - start, "build_s": built - start, "first_batch_s": batch - start}))
"""


def _dataset(root: Path, args: argparse.Namespace) -> Path:
    from episodestream.tools.synthetic import write_synthetic_dataset

    folder = root / "datasets" / REPO
    if not (folder / "meta" / "info.json").exists():
        write_synthetic_dataset(folder, num_episodes=args.episodes, episode_length=args.episode_length,
                                height=args.height, width=args.width, seed=0)
    return folder


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkouts", nargs="+", default=[str(HERE.parents[1])],
                        help="repository roots to compare (default: this one)")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--hub-root", default=os.path.join(tempfile.gettempdir(), "episodestream-bench", "cold-hub"),
                        help="where the synthetic dataset is written once (FakeHub's folder)")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--episode-length", type=int, default=100)
    parser.add_argument("--height", type=int, default=96)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--pool-size", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--bandwidth-mb-per-s", type=float, default=50.0)
    args = parser.parse_args(argv)

    os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
    from episodestream.testing import FakeHub, LinkSettings, ShapingProxy

    hub_root = Path(args.hub_root)
    _dataset(hub_root, args)
    settings = LinkSettings(latency_s=args.latency_ms / 1000, rate_bytes_per_s=args.bandwidth_mb_per_s * 1e6)
    results: dict[str, list[dict]] = {checkout: [] for checkout in args.checkouts}
    with FakeHub(hub_root) as hub, ShapingProxy(hub.url, settings=settings) as proxy:
        for trial in range(args.trials):
            for checkout in args.checkouts:
                with tempfile.TemporaryDirectory(prefix="episodestream-cold-") as scratch:
                    env = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "EPISODESTREAM_"))}
                    env.update(PYTHONPATH=checkout, HF_ENDPOINT=proxy.url, HF_HOME=os.path.join(scratch, "hf"),
                               HF_HUB_DISABLE_XET="1", EPISODESTREAM_DOWNLOAD_PERMITS_DIR=os.path.join(scratch, "permits"))
                    child_args = dict(repo=REPO, cache_dir=os.path.join(scratch, "cache"), endpoint=proxy.url,
                                      pool_size=args.pool_size, batch_size=args.batch_size,
                                      num_workers=args.num_workers)
                    hub.reset_stats()
                    spawned = time.perf_counter()
                    # cwd: ``python -c`` puts the working folder first on sys.path, ahead of PYTHONPATH.
                    child = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(child_args)], env=env,
                                             cwd=scratch, stdout=subprocess.PIPE, text=True)
                    assert child.stdout is not None
                    lines = []
                    for line in child.stdout:
                        if line.startswith("BUILT"):
                            build_requests = hub.stats().by_path
                        lines.append(line)
                    batch_wall_s = time.perf_counter() - spawned
                    all_requests = hub.stats().by_path
                    if child.wait() != 0:
                        raise SystemExit(f"{checkout}: the trial failed (exit {child.returncode})")
                row = json.loads(lines[-1])
                origin = next(line.split()[1] for line in lines if line.startswith("FROM"))
                if not origin.startswith(os.path.abspath(checkout)):
                    raise SystemExit(f"{checkout}: the trial imported episodestream from {origin}")
                row["spawn_to_batch_s"] = batch_wall_s
                row["batch_after_import_s"] = row["first_batch_s"] - row["import_s"]
                row["build_requests"] = sum(s.requests for s in build_requests.values())
                row["requests"] = sum(s.requests for s in all_requests.values())
                row["agent_harness_requests"] = sum(s.requests for p, s in all_requests.items() if "agent" in p)
                results[checkout].append(row)
                paths = ", ".join(f"{p.replace('/datasets/' + REPO, '')[:24]} x{s.requests}"
                                  for p, s in build_requests.items())
                print(f"{checkout} #{trial}: imports {row['import_s']:.2f} s, built {row['build_s']:.2f} s, "
                      f"first batch {row['first_batch_s']:.2f} s ({row['batch_after_import_s']:.2f} s after the "
                      f"imports, {batch_wall_s:.2f} s from spawn); "
                      f"{row['build_requests']} build requests: {paths}; {row['requests']} in all, "
                      f"{row['agent_harness_requests']} to /api/agent-harnesses", flush=True)
    for checkout, rows in results.items():
        medians = {key: statistics.median(r[key] for r in rows)
                   for key in ("import_s", "build_s", "first_batch_s", "batch_after_import_s", "spawn_to_batch_s",
                               "build_requests",
                               "agent_harness_requests")}
        print(f"{checkout} medians of {len(rows)}: " + ", ".join(f"{k} {v:.2f}" for k, v in medians.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
