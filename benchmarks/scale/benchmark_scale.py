"""How construction, first sample, resume, random access and memory grow with the episode count.

For each size (camera-less datasets of ``--episode-length`` (min, max) frames per episode, written
once with ``episodestream.tools.synthetic.write_tabular_dataset``) it measures, each in a fresh Python
process so that RSS and cold caches mean something, for rank 0 of ``--world-size`` with a 16-step
action window and ``--pool-size`` (``episode_pool_size`` of every streaming dataset it builds, default
16; ``auto`` for the library's default, which is 512 on these camera-less datasets):

- construction time (imports excluded) and RSS above an interpreter with torch and episodestream
  imported; ``len``; time from construction to the first streamed sample;
- resume at 50% and 90% of the rank's epoch: time from construction to the first sample
  (``load_state_dict`` included), exact (same layout) and elastic (saved by ``--world-size`` ranks,
  resumed by one rank fewer);
- map-style: the first touch of every data file (opens it and, cold, builds its column cache),
  then the random access rate (``EpisodeDataset[i]`` at uniformly random ``i``);
- ``dataset.compute_stats()`` (exact stats of every tabular column, issue 24): the first pass with a
  cold stats cache, then a new dataset's call read from the cache (construction timed apart), and
  the process's peak RSS above the baseline;
- RSS, PSS (pages shared with other processes, such as the page cache of memory-mapped files,
  counted in shares) and private memory (``RssAnon``: what is not file pages) of the larger of 2
  DataLoader workers after ``--worker-batches`` batches, streaming and map-style (shuffled).
  The map-style column cache is memory-mapped: the kernel maps its readahead around every page a
  sample touches, so RSS grows with the samples read while private memory stays flat.

Prints a markdown table, writes ``results.json`` and ``scale.png`` to ``--output-dir``.

    python benchmarks/scale/benchmark_scale.py --sizes 1000 10000 100000 --output-dir bench_out/scale
    python benchmarks/scale/benchmark_scale.py --sizes 10000 --kinds resume-exact-90 resume-elastic-90 --pool-size 512
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ACTION_STEPS = 16


def _rss_mb(pid: int | str = "self", field: str = "VmRSS") -> float:
    """RSS (``VmRSS``), or its private part (``RssAnon``: not file pages shared with the page cache)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _pss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _window(fps: int = 30) -> dict:
    return {"action": [k / fps for k in range(ACTION_STEPS)]}


def _streaming(root, args, **kwargs):
    from episodestream import EpisodeStreamingDataset
    return EpisodeStreamingDataset(root, delta_timestamps=_window(), rank=0, world_size=kwargs.pop("world_size", args.world_size),
                                   seed=0, episode_pool_size=args.pool_size, **kwargs)


def _state(root, args, fraction: float) -> dict:
    dataset = _streaming(root, args)
    batches = int(len(dataset) // args.batch_size * fraction)
    return {**dataset.state_dict(), "batches_consumed": batches, "batch_size": args.batch_size, "num_workers": 0}


def _first_frame_per_data_file(root: str) -> list[int]:
    """The global index of the first frame of each data file, from the episodes metadata (read
    directly: ``dataset.meta`` is LeRobot-shaped and differs between versions of this library)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    columns = ["data/chunk_index", "data/file_index", "dataset_from_index"]
    tables = [pq.read_table(p, columns=columns) for p in sorted(Path(root, "meta/episodes").rglob("*.parquet"))]
    rows = pa.concat_tables(tables).to_pydict()
    firsts: dict[tuple[int, int], int] = {}
    for chunk, file, start in zip(*(rows[c] for c in columns)):
        firsts[(chunk, file)] = min(start, firsts.get((chunk, file), start))
    return list(firsts.values())


def _worker_memory(loader, batches: int, *, prefix: str) -> dict:
    """The largest RSS, PSS and private (RssAnon) memory of ``loader``'s workers after ``batches``."""
    iterator = iter(loader)
    for _ in range(batches):
        next(iterator)
    pids = [w.pid for w in iterator._workers]
    memory = {f"{prefix}_rss_mb": max(_rss_mb(pid) for pid in pids),
              f"{prefix}_pss_mb": max(_pss_mb(pid) for pid in pids),
              f"{prefix}_anon_mb": max(_rss_mb(pid, "RssAnon") for pid in pids)}
    del iterator
    return memory


def measure(kind: str, root: str, args) -> dict:
    """One measurement, in this (fresh) process."""
    import torch  # noqa: F401  (the baseline RSS includes torch, as in any trainer)
    # The public names load on first use (episodestream/__init__): load them here, so that the
    # baseline holds the package's modules and construction is timed without their imports.
    from episodestream import EpisodeDataset, EpisodeStreamingDataset  # noqa: F401
    base_mb, base_anon_mb = _rss_mb(), _rss_mb(field="RssAnon")
    if kind == "construct":
        start = time.perf_counter()
        dataset = _streaming(root, args)
        built = time.perf_counter()
        rss = _rss_mb() - base_mb
        next(iter(dataset))
        return {"construct_s": built - start, "construct_rss_mb": rss, "len": len(dataset),
                "first_sample_s": time.perf_counter() - built}
    if kind.startswith("resume"):
        _, mode, percent = kind.split("-")
        state = _state(root, args, int(percent) / 100)
        dataset = _streaming(root, args, world_size=args.world_size - (mode == "elastic"))
        start = time.perf_counter()  # from construction, as first_sample_s
        dataset.load_state_dict(state)
        next(iter(dataset))
        return {f"resume_{mode}_{percent}_s": time.perf_counter() - start}
    if kind == "random":
        import numpy as np
        from episodestream import EpisodeDataset
        dataset = EpisodeDataset(root, delta_timestamps=_window())
        rng = np.random.default_rng(0)
        # One episode of every data file first: opens them and (when cold) builds the column cache.
        firsts = _first_frame_per_data_file(root)
        start = time.perf_counter()
        for i in firsts:
            dataset[int(i)]
        first_pass_s = time.perf_counter() - start
        indices = rng.integers(len(dataset), size=args.random_samples).tolist()
        start = time.perf_counter()
        for i in indices:
            dataset[i]
        elapsed = time.perf_counter() - start
        return {"random_samples_per_s": len(indices) / elapsed, "random_rss_mb": _rss_mb() - base_mb,
                "random_anon_mb": _rss_mb(field="RssAnon") - base_anon_mb, "random_first_pass_s": first_pass_s}
    if kind == "map-workers":
        import torch.utils.data
        from episodestream import EpisodeDataset
        dataset = EpisodeDataset(root, delta_timestamps=_window())
        loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, num_workers=2, shuffle=True,
                                             generator=torch.Generator().manual_seed(0))
        return _worker_memory(loader, args.worker_batches, prefix="map_worker")
    if kind == "stats":
        import shutil
        import tempfile
        cache = tempfile.mkdtemp(prefix="episodestream-scale-stats-")  # cold: nothing cached yet
        try:
            dataset = _streaming(root, args, cache_dir=cache)
            start = time.perf_counter()
            stats = dataset.compute_stats()
            first_s = time.perf_counter() - start
            peak_mb = _rss_mb(field="VmHWM") - base_mb
            start = time.perf_counter()
            again = _streaming(root, args, cache_dir=cache)  # another run's dataset: construction timed apart
            built = time.perf_counter()
            again.compute_stats()
            cached_s = time.perf_counter() - built
            return {"stats_first_s": first_s, "stats_cached_s": cached_s, "stats_construct_s": built - start,
                    "stats_peak_rss_mb": peak_mb, "stats_count": int(stats["index"]["count"][0])}
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    if kind == "workers":
        import torch.utils.data
        dataset = _streaming(root, args)
        loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, num_workers=2)
        return _worker_memory(loader, args.worker_batches, prefix="worker")
    raise ValueError(f"unknown measurement {kind!r}")


KINDS = ["construct", "resume-exact-50", "resume-exact-90", "resume-elastic-50", "resume-elastic-90", "random",
         "workers", "map-workers", "stats"]
COLUMNS = [("episodes", "episodes", "{:,}"), ("pool_size", "pool", "{}"), ("len", "len (rank 0)", "{:,}"),
           ("construct_s", "construct s", "{:.2f}"), ("construct_rss_mb", "construct RSS MB", "{:.0f}"),
           ("first_sample_s", "first sample s", "{:.2f}"),
           ("resume_exact_50_s", "resume exact 50% s", "{:.2f}"), ("resume_exact_90_s", "resume exact 90% s", "{:.2f}"),
           ("resume_elastic_50_s", "resume elastic 50% s", "{:.2f}"),
           ("resume_elastic_90_s", "resume elastic 90% s", "{:.2f}"),
           ("random_first_pass_s", "map-style first touch of every file s", "{:.1f}"),
           ("random_samples_per_s", "map-style samples/s", "{:,.0f}"), ("random_rss_mb", "map-style RSS MB", "{:.0f}"),
           ("random_anon_mb", "map-style private MB", "{:.0f}"),
           ("worker_rss_mb", "stream worker RSS MB", "{:.0f}"), ("worker_pss_mb", "stream worker PSS MB", "{:.0f}"),
           ("worker_anon_mb", "stream worker private MB", "{:.0f}"),
           ("map_worker_rss_mb", "map-style worker RSS MB", "{:.0f}"),
           ("map_worker_pss_mb", "map-style worker PSS MB", "{:.0f}"),
           ("map_worker_anon_mb", "map-style worker private MB", "{:.0f}"),
           ("stats_first_s", "compute_stats() first s", "{:.1f}"),
           ("stats_cached_s", "compute_stats() cached s", "{:.3f}"),
           ("stats_peak_rss_mb", "compute_stats() peak RSS MB", "{:.0f}")]


def ensure_dataset(data_dir: Path, episodes: int, length: tuple[int, int]) -> Path:
    root = data_dir / f"tabular-{episodes}-{length[0]}-{length[1]}"
    if not (root / "meta/info.json").exists():
        from episodestream.tools.synthetic import write_tabular_dataset
        start = time.perf_counter()
        write_tabular_dataset(root, num_episodes=episodes, episode_length=length, overwrite=True)
        print(f"wrote {root} in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return root


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    x = [r["episodes"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))

    def series(ax, key: str, label: str) -> bool:
        """Plot what was measured (a kind not run, or one that failed, has no values)."""
        ys = [r.get(key) for r in rows]
        if not any(isinstance(y, (int, float)) and y > 0 for y in ys):
            return False
        ax.plot(x, [y if isinstance(y, (int, float)) and y > 0 else None for y in ys], marker="o", label=label)
        return True

    timed = [series(axes[0], key, label) for key, label in [
        ("construct_s", "construction"), ("first_sample_s", "first sample"),
        ("resume_exact_90_s", "resume exact 90%"), ("resume_elastic_90_s", "resume elastic 90%")]]
    axes[0].set(xscale="log", yscale="log" if any(timed) else "linear", xlabel="episodes", ylabel="seconds",
                title="time")
    series(axes[1], "random_samples_per_s", "episodestream")
    axes[1].set(xscale="log", xlabel="episodes", ylabel="samples/s", title="map-style random access")
    axes[1].set_ylim(bottom=0)
    for key, label in [("construct_rss_mb", "construction RSS"), ("random_rss_mb", "map-style RSS"),
                       ("worker_rss_mb", "stream worker RSS"), ("worker_pss_mb", "stream worker PSS"),
                       ("map_worker_rss_mb", "map-style worker RSS"), ("map_worker_pss_mb", "map-style worker PSS"),
                       ("random_anon_mb", "map-style private"), ("map_worker_anon_mb", "map-style worker private")]:
        series(axes[2], key, label)
    axes[2].set(xscale="log", xlabel="episodes", ylabel="MB (workers: whole process; others: above imports)",
                title="memory")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--episode-length", type=int, nargs=2, default=[200, 300], metavar=("MIN", "MAX"))
    parser.add_argument("--data-dir", default="/tmp/episodestream-scale")
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--random-samples", type=int, default=2000)
    parser.add_argument("--worker-batches", type=int, default=20)
    parser.add_argument("--pool-size", type=lambda v: v if v == "auto" else int(v), default=16,
                        help="episode_pool_size of every streaming dataset (an int, or 'auto')")
    parser.add_argument("--kinds", nargs="+", default=KINDS, choices=KINDS)
    parser.add_argument("--output-dir", default="bench_out/scale")
    parser.add_argument("--cache-dir", help="EPISODESTREAM_CACHE_DIR for the runs (default: a fresh folder in "
                                            "--output-dir, so the map-style column cache is built cold)")
    parser.add_argument("--measure", nargs=2, metavar=("KIND", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure[0], args.measure[1], args)))
        return 0
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    cache_dir = Path(args.cache_dir) if args.cache_dir else out / "cache"
    if not args.cache_dir:
        shutil.rmtree(cache_dir, ignore_errors=True)
    env = {**os.environ, "EPISODESTREAM_CACHE_DIR": str(cache_dir)}
    rows = []
    for episodes in args.sizes:
        root = ensure_dataset(Path(args.data_dir), episodes, tuple(args.episode_length))
        row = {"episodes": episodes, "pool_size": args.pool_size}
        for kind in args.kinds:
            command = [sys.executable, __file__, "--measure", kind, str(root), "--world-size", str(args.world_size),
                       "--batch-size", str(args.batch_size), "--random-samples", str(args.random_samples),
                       "--worker-batches", str(args.worker_batches), "--pool-size", str(args.pool_size)]
            result = subprocess.run(command, capture_output=True, text=True, env=env)
            if result.returncode:
                print(f"{kind} at {episodes} episodes failed:\n{result.stderr[-2000:]}", file=sys.stderr)
                continue
            row.update(json.loads(result.stdout.strip().splitlines()[-1]))
            print(f"{episodes} {kind}: {result.stdout.strip().splitlines()[-1]}", file=sys.stderr, flush=True)
        rows.append(row)
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    present = [c for c in COLUMNS if any(c[0] in r for r in rows)]
    print("| " + " | ".join(label for _, label, _ in present) + " |")
    print("|" + " --- |" * len(present))
    for r in rows:
        print("| " + " | ".join(fmt.format(r[k]) if k in r else "-" for k, _, fmt in present) + " |")
    plot(rows, out / "scale.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
