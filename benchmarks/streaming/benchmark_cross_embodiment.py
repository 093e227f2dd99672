"""A cross-embodiment mixture's throughput against a same-schema mixture of the same data (issue 24).

The benchmark dataset's episodes are dealt into two selections (even, odd episodes). The
same-schema mixture streams both from the benchmark folder. The cross-embodiment one streams the
odd episodes from a **wide copy** of it instead: the same videos (hard links, not copies) and metadata,
but ``observation.state`` and ``action`` widened from 6 to ``--wide-dim`` dimensions (the extra
ones a constant) and another ``robot_type``, mixed with ``keys="union"``: every sample is padded to
the wide width with ``<key>_dim_mask`` masks and carries ``robot_type``. The frames decoded are
the same in both, so the ratio is the cost of reconciling schemas.

``--missing-camera`` makes the wide copy lack the wrist camera too: its samples then carry a zero
wrist frame and ``_is_missing``, and frames are no longer written in place by ``EpisodeLoader``
(see docs/mixtures.md); its component decodes one camera instead of two, so that ratio is not
about the same work.

Trials alternate the two mixtures so machine noise hits both; prints the medians and their
ratio (goal: cross / same >= 0.95) and writes them as JSON.

    python benchmarks/streaming/benchmark_cross_embodiment.py --loader episode --output-dir bench_out
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch.utils.data

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_streaming import add_dataset_arguments, ensure_dataset  # noqa: E402  (same benchmark dataset)

from episodestream import EpisodeLoader, EpisodeMixture, EpisodeStreamingDataset  # noqa: E402

WRIST = "observation.images.wrist"


def wide_copy(root: Path, width: int, *, missing_camera: bool) -> Path:
    """The benchmark folder with its vectors widened to ``width`` (videos linked), written once."""
    out = root.parent / f"{root.name}-wide{width}{'-nowrist' if missing_camera else ''}"
    if (out / "meta" / "info.json").exists():
        return out
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(root / "meta", partial / "meta")
    for video in sorted((root / "videos").rglob("*.mp4")):
        if missing_camera and video.relative_to(root / "videos").parts[0] == WRIST:
            continue
        target = partial / video.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(video, target)  # hard links: a dataset refuses symlinks that leave its root
    info = json.loads((partial / "meta" / "info.json").read_text())
    info["robot_type"] = f"wide{width}"
    for key in ("observation.state", "action"):
        narrow = info["features"][key]["shape"][0]
        info["features"][key]["shape"] = [width]
        info["features"][key]["names"] = [f"joint_{j}" for j in range(width)]
    if missing_camera:
        del info["features"][WRIST]
    (partial / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    stats = json.loads((partial / "meta" / "stats.json").read_text())
    for key in ("observation.state", "action"):
        stats.pop(key, None)  # the widened values' stats are not the file's: leave them out
    (partial / "meta" / "stats.json").write_text(json.dumps(stats, indent=4))
    for path in sorted((root / "data").rglob("*.parquet")):
        target = partial / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        handle = pq.ParquetFile(path)
        with pq.ParquetWriter(target, _widened(handle.schema_arrow, width)) as writer:
            for group in range(handle.num_row_groups):  # one row group per episode, as the source
                table = handle.read_row_group(group)
                for key in ("observation.state", "action"):
                    values = np.asarray(table.column(key).to_pylist(), np.float32)
                    extra = np.full((len(values), width - narrow), 0.25, np.float32)
                    wide = np.concatenate([values, extra], axis=1)
                    table = table.set_column(table.schema.get_field_index(key), key,
                                             pa.FixedSizeListArray.from_arrays(wide.reshape(-1), width))
                writer.write_table(table, row_group_size=len(table))
    partial.rename(out)
    return out


def _widened(schema: pa.Schema, width: int) -> pa.Schema:
    for key in ("observation.state", "action"):
        index = schema.get_field_index(key)
        schema = schema.set(index, pa.field(key, pa.list_(pa.float32(), width)))
    return schema.remove_metadata()


def build(root: Path, wide: Path, args, *, cross: bool) -> EpisodeMixture:
    options = dict(episode_pool_size=args.pool_size, seed=0, return_uint8=args.uint8)
    episodes = len(EpisodeStreamingDataset(root, **options).typed_meta.episodes)
    even = EpisodeStreamingDataset(root, episodes=list(range(0, episodes, 2)), **options)
    odd = EpisodeStreamingDataset(wide if cross else root, episodes=list(range(1, episodes, 2)), **options)
    return EpisodeMixture([even, odd], seed=0, keys="union" if cross else "same")


def samples_per_s(mixture: EpisodeMixture, args) -> tuple[float, float, int]:
    """The epoch's samples/s from iter() on, and warm: after the first ``--warmup-batches``."""
    if args.loader == "episode":
        loader = EpisodeLoader(mixture, args.batch_size, num_threads=args.num_threads)
    else:
        loader = torch.utils.data.DataLoader(mixture, batch_size=args.batch_size, num_workers=args.num_workers)
    samples = warm_samples = 0
    start = warm_start = time.perf_counter()
    for batch_index, batch in enumerate(loader):
        samples += len(batch["index"])
        if batch_index + 1 == args.warmup_batches:
            warm_start, warm_samples = time.perf_counter(), samples
    end = time.perf_counter()
    if args.loader == "episode":
        loader.close()
    return samples / (end - start), (samples - warm_samples) / (end - warm_start), samples


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_dataset_arguments(parser)
    parser.add_argument("--loader", choices=("episode", "dataloader"), default="episode")
    parser.add_argument("--num-workers", type=int, default=2, help="DataLoader workers (--loader dataloader)")
    parser.add_argument("--num-threads", type=int, default=None, help="EpisodeLoader decode threads")
    parser.add_argument("--pool-size", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--wide-dim", type=int, default=14)
    parser.add_argument("--missing-camera", action="store_true", help="the wide copy lacks the wrist camera too")
    parser.add_argument("--uint8", action="store_true", help="uint8 frames instead of float32")
    parser.add_argument("--warmup-batches", type=int, default=4, help="batches before the warm rate's clock starts")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--output-dir", default="bench_out")
    args = parser.parse_args(argv)
    root = ensure_dataset(args)
    wide = wide_copy(root, args.wide_dim, missing_camera=args.missing_camera)

    runs: dict[str, dict[str, list[float]]] = {name: {"whole": [], "warm": []} for name in ("same", "cross")}
    for _ in range(args.trials):
        counts = {}
        for name in runs:
            whole, warm, counts[name] = samples_per_s(build(root, wide, args, cross=name == "cross"), args)
            runs[name]["whole"].append(whole)
            runs[name]["warm"].append(warm)
        if counts["same"] != counts["cross"]:
            print(f"warning: same-schema yielded {counts['same']} samples, cross {counts['cross']}", file=sys.stderr)
    medians = {name: {kind: statistics.median(v) for kind, v in rates.items()} for name, rates in runs.items()}
    result = {"samples_per_s": runs, "medians": medians,
              "ratio": medians["cross"]["whole"] / medians["same"]["whole"],
              "warm_ratio": medians["cross"]["warm"] / medians["same"]["warm"],
              "settings": {k: v for k, v in vars(args).items() if k != "output_dir"}}
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cross_embodiment.json").write_text(json.dumps(result, indent=2))
    for kind in ("whole", "warm"):
        print(f"{kind}: same-schema {medians['same'][kind]:.1f} samples/s, cross-embodiment "
              f"{medians['cross'][kind]:.1f} samples/s, ratio {medians['cross'][kind] / medians['same'][kind]:.3f} "
              f"(goal >= 0.95); trials same {[round(v, 1) for v in runs['same'][kind]]}, cross "
              f"{[round(v, 1) for v in runs['cross'][kind]]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
