"""Building a remote dataset with many episodes, LeRobot v2.1 against v3.0, and one checkout of
episodestream against another: the seconds ``EpisodeStreamingDataset(repo)`` takes and the requests
and bytes that cross the link, through a FakeHub behind a shaped link (``--latency-ms`` before every
request, ``--bandwidth-mbps`` MB/s; ``_servers.py``).

The same episodes are written once per version by the synthetic writer (``--episodes`` of
``--episode-length`` frames, ``--cameras`` 64x64 cameras) under ``--cache-dir``. Each build runs in
a fresh Python process whose ``PYTHONPATH`` is one of the ``--checkout`` folders (imports happen
before the clock starts), with an empty cache; trials go round the checkouts and versions, in the
opposite order every other trial, so that machine noise hits all of them. Prints the median build
seconds, requests and bytes of each (checkout, version), and writes them as JSON.

    python benchmarks/streaming/benchmark_v2x_build.py --checkout new=. --checkout old=/tmp/base
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _servers import serve  # noqa: E402  (the streaming benchmark's loopback servers)

VERSIONS = ("v2.1", "v3.0")


def ensure_copies(args) -> dict[str, Path]:
    from episodestream.tools.synthetic import write_synthetic_dataset

    cameras = tuple(f"observation.images.cam{k}" for k in range(args.cameras))
    roots = {}
    for version in VERSIONS:
        root = Path(args.cache_dir) / f"v2x-build-{version}-{args.episodes}x{args.episode_length}-{args.cameras}cam"
        if not (root / "meta" / "info.json").exists():
            print(f"writing the {version} copy to {root}", file=sys.stderr, flush=True)
            write_synthetic_dataset(root, num_episodes=args.episodes, episode_length=args.episode_length,
                                    height=64, width=64, cameras=cameras, version=version, overwrite=True,
                                    progress=True)
        roots[version] = root
    return roots


def child(source: str, options: dict) -> None:
    """One build, timed after the imports a build makes the first time (huggingface_hub, torch,
    torchcodec, pandas through pyarrow: seconds, paid once per process whatever the dataset)."""
    import huggingface_hub  # noqa: F401
    import pandas  # noqa: F401
    import pyarrow.parquet  # noqa: F401
    import torch  # noqa: F401
    import torchcodec.decoders  # noqa: F401
    from huggingface_hub import HfFileSystem  # noqa: F401

    from episodestream import EpisodeStreamingDataset

    with tempfile.TemporaryDirectory(prefix="episodestream-v2x-build-") as cache_dir:
        start = time.perf_counter()
        dataset = EpisodeStreamingDataset(source, cache_dir=cache_dir, **options)
        seconds = time.perf_counter() - start
        episodes = len(dataset.episode_indices)
        dataset.close()
    print(json.dumps({"seconds": seconds, "episodes": episodes}))


def build_once(checkout: str, remote, options: dict) -> dict:
    remote.reset_link_stats()
    env = {**os.environ, "PYTHONPATH": str(Path(checkout).resolve())}
    done = subprocess.run([sys.executable, __file__, "--child", remote.source, json.dumps(options)], env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"the build with {checkout} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {**result, **remote.link_stats()}


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], json.loads(sys.argv[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", action="append", required=True, metavar="NAME=FOLDER",
                        help="an episodestream checkout to build with (repeat: compared side by side)")
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--bandwidth-mbps", type=float, default=50.0)
    parser.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "episodestream-bench"))
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--episode-length", type=int, default=2)
    parser.add_argument("--cameras", type=int, default=1)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--output-dir", default="bench_out")
    args = parser.parse_args(argv)
    checkouts = dict(item.split("=", 1) for item in args.checkout)
    roots = ensure_copies(args)
    runs: dict[str, dict[str, list[dict]]] = {name: {v: [] for v in VERSIONS} for name in checkouts}
    order = [(name, version) for name in checkouts for version in VERSIONS]
    for version in VERSIONS:
        with serve("hub", roots[version], latency_s=args.latency_ms / 1000,
                   rate_bytes_per_s=args.bandwidth_mbps * 1e6) as remote:
            for trial in range(args.trials):
                for name, v in (order if trial % 2 == 0 else order[::-1]):
                    if v == version:
                        runs[name][version].append(build_once(checkouts[name], remote, remote.options))
    medians = {name: {v: {k: statistics.median(r[k] for r in rs) for k in ("seconds", "requests", "bytes")}
                      for v, rs in by_version.items()} for name, by_version in runs.items()}
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "v2x-build.json").write_text(json.dumps(
        {"runs": runs, "medians": medians, "settings": {k: v for k, v in vars(args).items() if k != "output_dir"}},
        indent=2))
    for name, by_version in medians.items():
        for version, m in by_version.items():
            trials = [round(r["seconds"], 3) for r in runs[name][version]]
            print(f"{name} {version}: build {m['seconds']:.3f} s (trials {trials}), {m['requests']:.0f} requests, "
                  f"{m['bytes'] / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
