"""The ``episodestream`` command line. ``demo`` is the main job: write, stream, report throughput."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path


def _demo(args: argparse.Namespace) -> int:
    import torch.utils.data

    from .streaming import EpisodeStreamingDataset
    from .synthetic import write_synthetic_dataset

    with tempfile.TemporaryDirectory(prefix="episodestream-demo-") as tmp:
        root = Path(args.out) if args.out else Path(tmp) / "synthetic"
        print(f"writing a synthetic dataset ({args.episodes} episodes x {args.episode_length} frames, "
              f"2 cameras {args.height}x{args.width} AV1) to {root}", flush=True)
        write_synthetic_dataset(root, num_episodes=args.episodes, episode_length=args.episode_length,
                                height=args.height, width=args.width, overwrite=True, progress=True)
        dataset = EpisodeStreamingDataset(root, episode_pool_size=args.pool_size, seed=0)
        loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, num_workers=args.num_workers)
        cameras = len(dataset.meta.video_keys)
        print(f"streaming {len(dataset)} samples with {args.num_workers} DataLoader workers, "
              f"batch size {args.batch_size}, episode pool {args.pool_size}", flush=True)
        start = time.perf_counter()
        first_batch_s = None
        samples = 0
        for batch in loader:
            first_batch_s = first_batch_s or time.perf_counter() - start
            samples += len(batch["index"])
        elapsed_s = time.perf_counter() - start
        if samples != len(dataset):
            raise RuntimeError(f"streamed {samples} samples, expected {len(dataset)}")
    print(f"samples: {samples}  first batch: {first_batch_s:.2f} s  total: {elapsed_s:.2f} s")
    print(f"throughput: {samples / elapsed_s:.1f} samples/s, {samples * cameras / elapsed_s:.1f} frames/s")
    return 0


def _human_bytes(size_bytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size_bytes < 1000 or unit == "TB":
            return f"{size_bytes:.1f} {unit}" if unit != "B" else f"{int(size_bytes)} B"
        size_bytes /= 1000
    raise AssertionError("unreachable")


def dataset_info(source: str, *, revision: str | None = None) -> dict:
    """What ``episodestream info`` prints, as data: counts, cameras, codecs, files and sizes."""
    from ._metadata import load_metadata
    from ._sources import open_source

    files = open_source(source, revision=revision)
    meta = load_metadata(files)
    episodes = list(meta.episodes.values())
    data_files = sorted({ep.data_relpath for ep in episodes})
    cameras = {}
    for key in meta.video_keys:
        video_files = sorted({ep.videos[key].relpath for ep in episodes})
        spec = meta.features[key]
        cameras[key] = {"shape": list(spec.shape), "codec": spec.info.get("video.codec"),
                        "pix_fmt": spec.info.get("video.pix_fmt"), "gop": spec.info.get("video.g"),
                        "files": len(video_files),
                        "size_bytes": sum(files.size_bytes(f) for f in video_files)}
    return {"source": files.description, "codebase_version": meta.info.get("codebase_version"),
            "robot_type": meta.info.get("robot_type"), "fps": meta.fps, "episodes": len(episodes),
            "frames": meta.total_frames, "tasks": len(meta.tasks),
            "features": {k: {"dtype": f.dtype, "shape": list(f.shape)} for k, f in meta.features.items()},
            "image_keys": meta.image_keys, "cameras": cameras, "data_files": len(data_files),
            "data_size_bytes": sum(files.size_bytes(f) for f in data_files)}


def _info(args: argparse.Namespace) -> int:
    info = dataset_info(args.source, revision=args.revision)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"{info['source']}  (LeRobot {info['codebase_version']}, robot {info['robot_type']})")
    print(f"episodes {info['episodes']}, frames {info['frames']}, fps {info['fps']}, tasks {info['tasks']}")
    print(f"data: {info['data_files']} parquet file(s), {_human_bytes(info['data_size_bytes'])}")
    for key, camera in info["cameras"].items():
        height, width = camera["shape"][:2]
        print(f"camera {key}: {width}x{height} {camera['codec']} {camera['pix_fmt']} GOP {camera['gop']}, "
              f"{camera['files']} file(s), {_human_bytes(camera['size_bytes'])}")
    for key in info["image_keys"]:
        print(f"image {key}: PNG in the data parquet")
    print("features: " + ", ".join(f"{k} {v['dtype']}{v['shape']}" for k, v in info["features"].items()))
    return 0


def _bench(bench_args: list[str]) -> int:
    import runpy
    import sys

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "streaming" / "benchmark_streaming.py"
    if not script.exists():
        print(f"episodestream bench runs {script.relative_to(script.parents[2])} from a source checkout "
              f"(pip install -e .); it is not part of the installed package.", file=sys.stderr)
        return 2
    sys.argv = [str(script), *bench_args]
    runpy.run_path(str(script), run_name="__main__")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="episodestream", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="write a small synthetic dataset and stream it through a DataLoader")
    demo.add_argument("--out", help="where to write the dataset (default: a temporary folder, removed after)")
    demo.add_argument("--episodes", type=int, default=24)
    demo.add_argument("--episode-length", type=int, default=100)
    demo.add_argument("--height", type=int, default=96)
    demo.add_argument("--width", type=int, default=128)
    demo.add_argument("--num-workers", type=int, default=2)
    demo.add_argument("--batch-size", type=int, default=32)
    demo.add_argument("--pool-size", type=int, default=8)
    demo.set_defaults(run=_demo)

    info = commands.add_parser("info", help="episodes, frames, fps, cameras, codecs, GOP, files and sizes")
    info.add_argument("source", help="a LeRobot v3.0 dataset")
    info.add_argument("--revision")
    info.add_argument("--json", action="store_true", help="print JSON instead of text")
    info.set_defaults(run=_info)

    bench = commands.add_parser("bench", add_help=False,
                                help="run benchmarks/streaming/benchmark_streaming.py (its --help lists options)")
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(run=lambda args: _bench(args.bench_args))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # every option after "bench" is the benchmark's, --help included
        return _bench(argv[1:])
    args = build_parser().parse_args(argv)
    return args.run(args)
