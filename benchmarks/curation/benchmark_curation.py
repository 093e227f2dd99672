"""What curation at load time costs: construction with a DROID-sized keep-ranges JSON, and the
streaming rate of a curated dataset next to the same dataset uncurated (issue 25).

1. Construction: a camera-less dataset of ``--episodes`` episodes (default 92,000, DROID's count;
   200-300 frames each, ``write_tabular_dataset``, written once under ``--data-dir``) and a keep
   JSON of the same shape as DROID's published one (every episode, 1-3 kept ranges, ~74% of the
   frames kept). Each measurement runs in a fresh process (imports excluded): construction wall
   and CPU seconds, ``len`` of rank 0 of 8, and construction to first sample; uncurated and
   curated alternate, ``--repeats`` times.
2. Streaming: a small video dataset (textured frames, so decoding costs what camera video does),
   streamed by ``EpisodeStreamingDataset`` in the main process with a state and an image window,
   uncurated and with a 74% keep JSON, in one process, in turn, ``2 * --repeats`` rounds of
   ``--stream-samples``: samples per second and the ratio curated / uncurated of each round.

    python benchmarks/curation/benchmark_curation.py --output-dir bench_out/curation
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

KEEP_FRACTION = 0.74


def droid_like_keep(lengths: list[int], seed: int = 0) -> dict[str, list[list[int]]]:
    """Per episode 1-3 kept ranges covering ~74% of its frames (idle stretches cut out between)."""
    rng = np.random.default_rng(seed)
    keep = {}
    for episode, n in enumerate(lengths):
        k = int(rng.integers(1, 4))
        kept = max(k, int(round(n * KEEP_FRACTION)))
        idle = n - kept
        # Split kept frames into k ranges and idle frames into k + 1 gaps (the first and last may be empty).
        kept_parts = np.diff(np.sort(np.r_[0, rng.choice(np.arange(1, kept), size=k - 1, replace=False), kept]))
        gaps = np.diff(np.sort(np.r_[0, rng.integers(0, idle + 1, size=k), idle]))
        ranges, at = [], int(gaps[0])
        for part, gap in zip(kept_parts.tolist(), gaps[1:].tolist()):
            ranges.append([at, at + part])
            at += part + gap
        keep[str(episode)] = ranges
    return keep


def _construct(root: str, keep: str | None, world_size: int) -> dict:
    t0 = time.perf_counter()
    from episodestream import EpisodeStreamingDataset  # noqa: F401  (imports excluded below)
    imported = time.perf_counter()
    wall, cpu = time.perf_counter(), time.process_time()
    dataset = EpisodeStreamingDataset(root, rank=0, world_size=world_size, seed=0,
                                      delta_timestamps={"action": [k / 30 for k in range(16)]},
                                      **({"keep_frames": keep} if keep else {}))
    out = {"construct_s": time.perf_counter() - wall, "construct_cpu_s": time.process_time() - cpu,
           "len": len(dataset), "import_s": imported - t0}
    wall = time.perf_counter()
    next(iter(dataset))
    out["first_sample_s"] = time.perf_counter() - wall + out["construct_s"]
    return out


def _stream(root: str, keep: str, samples: int, rounds: int) -> dict:
    """Both datasets in one process, ``rounds`` times in turn (each round a fresh iterator per
    dataset: decoders opened and the pool filled before the clock starts), so that the machine's
    load falls on both alike; samples per second of each round."""
    from episodestream import EpisodeStreamingDataset
    options = dict(seed=0, return_uint8=True, episode_pool_size=8,
                   delta_timestamps={"observation.state": [-0.1, 0.0], "observation.images.front": [-1 / 30, 0.0]})
    datasets = {"uncurated": EpisodeStreamingDataset(root, **options),
                "curated": EpisodeStreamingDataset(root, keep_frames=keep, **options)}
    rates: dict[str, list[float]] = {name: [] for name in datasets}
    cpu_rates: dict[str, list[float]] = {name: [] for name in datasets}
    for r in range(rounds):
        for name in (("uncurated", "curated") if r % 2 == 0 else ("curated", "uncurated")):
            dataset = datasets[name]
            dataset.set_epoch(r)
            iterator = iter(dataset)
            next(iterator)
            start, cpu, count = time.perf_counter(), time.process_time(), 0
            for _ in iterator:
                count += 1
                if count == samples:
                    break
            rates[name].append(count / (time.perf_counter() - start))
            cpu_rates[name].append(count / (time.process_time() - cpu))
            del iterator
    return {"wall": rates, "cpu": cpu_rates}


def _in_fresh_process(kind: str, **kwargs) -> dict:
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import benchmark_curation as b; "
            f"print(json.dumps(b._{kind}(**{kwargs!r})))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=92_000)
    parser.add_argument("--data-dir", default="/tmp/episodestream-scale")
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--stream-samples", type=int, default=800)
    parser.add_argument("--output-dir", default="bench_out/curation")
    parser.add_argument("--skip-construct", action="store_true", help="only the streaming comparison")
    args = parser.parse_args()
    from episodestream.tools.synthetic import write_synthetic_dataset, write_tabular_dataset

    data = Path(args.data_dir)
    root = data / f"tabular-{args.episodes}-200-300"  # the scale benchmark's name: built once for both
    if not (root / "meta" / "info.json").exists():
        write_tabular_dataset(root, num_episodes=args.episodes, episode_length=(200, 300), overwrite=True)
    lengths = json.loads((root / "meta" / "info.json").read_text())["total_episodes"]
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pa.concat_tables([pq.read_table(p, columns=["episode_index", "length"])
                              for p in sorted((root / "meta" / "episodes").rglob("*.parquet"))]).sort_by("episode_index")
    assert table.num_rows == lengths
    keep_path = data / f"keep-{args.episodes}.json"
    keep = droid_like_keep(table.column("length").to_pylist())
    keep_path.write_text(json.dumps(keep))
    kept = sum(b - a for ranges in keep.values() for a, b in ranges) / sum(table.column("length").to_pylist())
    print(f"keep JSON: {keep_path} ({keep_path.stat().st_size / 1e6:.1f} MB, {len(keep)} episodes, "
          f"{sum(len(r) for r in keep.values())} ranges, {kept:.1%} of the frames kept)")

    construct: dict[str, list[dict]] = {"uncurated": [], "curated": []}
    for _ in range(0 if args.skip_construct else args.repeats):
        for name, path in (("uncurated", None), ("curated", str(keep_path))):
            construct[name].append(_in_fresh_process("construct", root=str(root), keep=path,
                                                     world_size=args.world_size))
    video = data / "curation-video"
    if not (video / "meta" / "info.json").exists():
        write_synthetic_dataset(video, num_episodes=24, episode_length=(120, 200), cameras=("observation.images.front",),
                                height=96, width=128, gop=10, texture=True, seed=0, overwrite=True)
    vinfo = pa.concat_tables([pq.read_table(p, columns=["episode_index", "length"])
                              for p in sorted((video / "meta" / "episodes").rglob("*.parquet"))]).sort_by("episode_index")
    video_keep = data / "curation-video-keep.json"
    video_keep.write_text(json.dumps(droid_like_keep(vinfo.column("length").to_pylist(), seed=1)))
    stream = _in_fresh_process("stream", root=str(video), keep=str(video_keep), samples=args.stream_samples,
                               rounds=2 * args.repeats)
    rows = ["| dataset | construct s (wall / CPU) | len, rank 0 of 8 | construct to first sample s |",
            "| --- | --- | --- | --- |"]
    for name in ("uncurated", "curated"):
        c = construct[name]
        if c:
            rows.append(f"| {name} | " + ", ".join(f"{r['construct_s']:.2f} / {r['construct_cpu_s']:.2f}" for r in c)
                        + f" | {c[0]['len']:,} | " + ", ".join(f"{r['first_sample_s']:.2f}" for r in c) + " |")
    print("\n".join(rows))
    for clock in ("wall", "cpu"):
        unc, cur = stream[clock]["uncurated"], stream[clock]["curated"]
        ratios = [b / a for a, b in zip(unc, cur)]
        print(f"stream samples per {clock} second: uncurated {', '.join(f'{r:.0f}' for r in unc)}; curated "
              f"{', '.join(f'{r:.0f}' for r in cur)}; ratio per round {', '.join(f'{r:.2f}' for r in ratios)} "
              f"(median {statistics.median(ratios):.2f})")
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"construct": construct, "stream": stream, "kept_fraction": kept},
                                                 indent=1))


if __name__ == "__main__":
    main()
