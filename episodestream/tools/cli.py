"""The ``episodestream`` command line. ``demo`` is the main job: write, stream, report throughput.

``info`` describes a dataset, ``doctor`` checks every episode of one before training, ``stats`` computes exact statistics of a selection of its episodes, ``bench`` runs the streaming benchmark, ``cache ls|unpin|clear`` inspects,
unpins and empties the caches (the node cache of remote sources, the column and stats caches) and ``prewarm``
fills the node cache (pinned) ahead of training.
``lerobot-train ARGS`` runs LeRobot's trainer on these datasets (``tools/lerobot_train``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np


# Written into the folder ``demo --out`` fills: only a folder holding it (and nothing but what the
# demo writes) is one the demo may replace.
DEMO_MARKER = ".episodestream-demo"
_DEMO_WRITES = {DEMO_MARKER, "meta", "data", "videos"}
_DEMO_POSITIVE = (("--episodes", "episodes"), ("--episode-length", "episode_length"), ("--height", "height"),
                  ("--width", "width"), ("--batch-size", "batch_size"), ("--pool-size", "pool_size"),
                  ("--num-threads", "num_threads"))


def _check_demo_args(args: argparse.Namespace) -> None:
    for option, name in _DEMO_POSITIVE:
        value = getattr(args, name)
        if value is not None and value != "auto" and value < 1:
            raise ValueError(f"{option} must be an integer >= 1, got {value}")
    if args.num_workers < 0:
        raise ValueError(f"--num-workers must be an integer >= 0, got {args.num_workers}")
    if args.out:
        _check_demo_out(Path(args.out).expanduser())


def _check_demo_out(root: Path) -> None:
    """The demo replaces ``--out`` whole: refuse a folder that holds anything it did not write."""
    if not root.exists():
        return
    if not root.is_dir():
        raise FileExistsError(f"--out {root} is a file, not a folder: pass a new or empty folder")
    entries = {entry.name for entry in root.iterdir()}
    if entries and not (DEMO_MARKER in entries and entries <= _DEMO_WRITES):
        shown = ", ".join(sorted(entries)[:5]) + (", ..." if len(entries) > 5 else "")
        raise FileExistsError(f"--out {root} is not empty ({shown}) and is not a dataset `episodestream demo` wrote; "
                              f"the demo replaces its folder whole, so it writes only into a new or empty folder "
                              f"(or one it wrote before): pass another --out")


def _write_demo(root: Path, write: Callable[[Path], object]) -> None:
    """``write(folder)`` the demo's dataset to ``root``, checked to be new, empty or one the demo wrote.

    The synthetic writer replaces its folder whole (staged beside it, renamed into place): for ``.``
    that staged inside the folder it then removed. An existing folder, perhaps the current one or
    the user's, is kept: the dataset is staged inside it and moved in entry by entry, replacing only
    what the demo wrote there before."""
    if not root.is_dir():
        write(root)
    else:
        with tempfile.TemporaryDirectory(prefix=".episodestream-demo-", dir=root) as staging:
            staged = Path(staging) / "dataset"
            write(staged)
            for name in _DEMO_WRITES:
                old = root / name
                if old.is_dir():
                    shutil.rmtree(old)
                elif old.exists():
                    old.unlink()
            for entry in staged.iterdir():
                entry.rename(root / entry.name)
    (root / DEMO_MARKER).write_text("written by `episodestream demo`; a later `demo --out` here replaces "
                                    "what it wrote\n")


def _demo(args: argparse.Namespace) -> int:
    try:
        _check_demo_args(args)
    except (OSError, ValueError) as error:
        return _user_error("demo", error)

    import torch.utils.data

    from episodestream.loader import EpisodeLoader
    from episodestream.streaming import EpisodeStreamingDataset
    from episodestream.tools.synthetic import write_synthetic_dataset

    with tempfile.TemporaryDirectory(prefix="episodestream-demo-") as tmp:
        root = Path(args.out).expanduser() if args.out else Path(tmp) / "synthetic"
        frames = "flat-block frames" if args.flat else "textured frames"
        print(f"writing a synthetic dataset ({args.episodes} episodes x {args.episode_length} frames, "
              f"2 cameras {args.height}x{args.width} (HxW) AV1, {frames}) to {root}", flush=True)
        # Textured, as `bench` writes: flat blocks decode several times faster than camera video, so
        # their frames/s says little about what a real dataset costs.
        _write_demo(root, lambda into: write_synthetic_dataset(
            into, num_episodes=args.episodes, episode_length=args.episode_length, height=args.height,
            width=args.width, texture=not args.flat, progress=True))
        dataset = EpisodeStreamingDataset(root, episode_pool_size=args.pool_size, seed=0)
        if args.loader == "episode":
            loader = EpisodeLoader(dataset, args.batch_size, num_threads=args.num_threads)
            how = f"EpisodeLoader ({loader.num_threads} decode threads)"
        else:
            loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, num_workers=args.num_workers)
            how = f"a DataLoader ({args.num_workers} worker processes)"
        cameras = len(dataset.typed_meta.video_keys)
        episodes = len(dataset.typed_meta.episodes)
        pool = dataset.episode_pool_size
        # What the pool number means, where it shows: "25" for 24 episodes puzzled a first-day user.
        pooled = (f"more than the {episodes} episodes: each consumer shuffles its whole share, like a global shuffle"
                  if pool > episodes else f"a sliding window of {pool} of the {episodes} episodes")
        print(f"streaming {len(dataset)} samples with {how}, batch size {args.batch_size}, "
              f"episode pool {pool} ({pooled})", flush=True)
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
    print("(flat-block video: decodes several times faster than camera video; not a decode cost)" if args.flat else
          f"(decoding and batching textured {args.height}x{args.width} AV1 video on this machine; "
          f"`episodestream bench` compares loaders)")
    return 0


def _human_bytes(size_bytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size_bytes < 1000 or unit == "TB":
            return f"{size_bytes:.1f} {unit}" if unit != "B" else f"{int(size_bytes)} B"
        size_bytes /= 1000
    raise AssertionError("unreachable")


def dataset_info(source: str, *, revision: str | None = None) -> dict:
    """What ``episodestream info`` prints, as data: counts, cameras, codecs, files and sizes, and a
    summary of the stats (``meta/stats.json``; v2.1: its episodes' stats aggregated; None without)."""
    from episodestream._format.stats import summarize_stats
    from episodestream._format.versions import load_dataset_stats, load_metadata
    from episodestream._runtime.sources import open_source

    files = open_source(source, revision=revision)
    meta = load_metadata(files)
    stats = summarize_stats(load_dataset_stats(files, meta))
    size_bytes = files.size_bytes
    episodes = list(meta.episodes.values())
    data_files = sorted({ep.data_relpath for ep in episodes})
    files.look_up([*data_files, *(span.relpath for ep in episodes for span in ep.videos.values())])
    cameras = {}
    for key in meta.video_keys:
        video_files = sorted({ep.videos[key].relpath for ep in episodes})
        spec = meta.features[key]
        cameras[key] = {"shape": list(spec.shape), "codec": spec.info.get("video.codec"),
                        "pix_fmt": spec.info.get("video.pix_fmt"), "gop": spec.info.get("video.g"),
                        "files": len(video_files),
                        "size_bytes": sum(size_bytes(f) for f in video_files)}
    return {"source": files.description, "codebase_version": meta.info.get("codebase_version"),
            "robot_type": meta.info.get("robot_type"), "fps": meta.fps, "episodes": len(episodes),
            "frames": meta.total_frames, "tasks": len(meta.tasks),
            "features": {k: {"dtype": f.dtype, "shape": list(f.shape)} for k, f in meta.features.items()},
            "image_keys": meta.image_keys, "cameras": cameras, "data_files": len(data_files),
            "data_size_bytes": sum(size_bytes(f) for f in data_files), "stats": stats}


def _user_error(command: str, error: BaseException) -> int:
    """One line on stderr for what the user can fix (a bad path, an unreachable server, a damaged
    file): the error already names the file and what to do, a traceback adds nothing to it."""
    import sys

    message = " ".join(str(error).split())  # one line, whatever the error's own line breaks
    print(f"episodestream {command}: {type(error).__name__}: {message}", file=sys.stderr)
    return 1


def _info(args: argparse.Namespace) -> int:
    from episodestream._remote.cache.node_cache import CacheFullError

    try:
        info = dataset_info(args.source, revision=args.revision)
    except (OSError, ValueError, CacheFullError) as error:  # not found, unreachable, not LeRobot v3.0, damaged
        return _user_error("info", error)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"{info['source']}  (LeRobot {info['codebase_version']}, robot {info['robot_type']})")
    print(f"episodes {info['episodes']}, frames {info['frames']}, fps {info['fps']}, tasks {info['tasks']}")
    print(f"data: {info['data_files']} parquet file(s), {_human_bytes(info['data_size_bytes'])}")
    for key, camera in info["cameras"].items():
        height, width = camera["shape"][:2]  # LeRobot's shape, (H, W, C): sizes read H x W everywhere
        print(f"camera {key}: {height}x{width} (HxW) {camera['codec']} {camera['pix_fmt']} GOP {camera['gop']}, "
              f"{camera['files']} file(s), {_human_bytes(camera['size_bytes'])}")
    for key in info["image_keys"]:
        print(f"image {key}: PNG in the data parquet")
    print("features: " + ", ".join(f"{k} {v['dtype']}{v['shape']}" for k, v in info["features"].items()))
    if info["stats"] is None:
        print("stats: none (the dataset has no meta/stats.json; LeRobot's normalizers need it)")
    for key, entry in (info["stats"] or {}).items():
        more = " ..." if entry.get("size", 0) > len(entry.get("mean", [])) else ""
        print(f"stats {key}: mean {entry.get('mean')}{more} std {entry.get('std')}{more} "
              f"min {entry.get('min')} max {entry.get('max')}")
    return 0


def _cache_root(args: argparse.Namespace) -> Path:
    """The cache folder the command works on; a missing one is an error: listing, clearing or
    unpinning it as if empty would hide a mistyped ``--cache-dir``."""
    from episodestream._base.paths import CACHE_DIR_ENV, default_cache_dir

    root = Path(args.cache_dir).expanduser() if args.cache_dir else default_cache_dir()
    if not root.is_dir():
        given = "--cache-dir" if args.cache_dir else f"${CACHE_DIR_ENV}" if os.environ.get(CACHE_DIR_ENV) else None
        raise FileNotFoundError(f"no cache folder at {root}" + (f" (given by {given})" if given else " (the default)")
                                + ": check the path; a cache folder appears once a remote source, EpisodeDataset's column cache or "
                                  "compute_stats() has used it")
    return root


def _cache_command(run: Callable[[argparse.Namespace, Path], int],
                   name: str) -> Callable[[argparse.Namespace], int]:
    """``cache NAME``: ``run(args, root)`` on an existing cache folder, else the one-line error."""
    def command(args: argparse.Namespace) -> int:
        try:
            root = _cache_root(args)
        except FileNotFoundError as error:
            return _user_error(f"cache {name}", error)
        return run(args, root)
    return command


# The caches beside the node cache (``_format.cache_files``): what each holds.
_DERIVED = {"columns": "EpisodeDataset's Arrow copies of data files, for random access",
            "stats": "compute_stats() and `episodestream stats` results"}


def _cache_ls(args: argparse.Namespace, root: Path) -> int:
    from episodestream._format.cache_files import cache_files
    from episodestream._remote.cache.node_cache import NodeCache
    from episodestream._remote.source.prewarm import source_matches

    entries = [e for e in NodeCache(root).list_entries() if source_matches(e.source, args.source)]
    derived = [f for f in cache_files(root) if f.matches(args.source)]
    totals = {"entries": len(entries), "size_bytes": sum(e.size_bytes for e in entries),
              "pinned": sum(e.pinned for e in entries), "in_use": sum(e.users > 0 for e in entries)}
    if args.json:
        print(json.dumps({"cache_dir": str(root), "totals": totals, "entries": [
            {"source": e.source, "file": e.file, "state": e.state.value, "size_bytes": e.size_bytes,
             "users": e.users, "pinned": e.pinned} for e in entries],
            **{kind: [{"source": f.source, "files": f.files, "size_bytes": f.size_bytes}
                      for f in derived if f.kind == kind] for kind in _DERIVED}}, indent=2))
        return 0
    print(f"cache {root}")
    if not entries:
        print("\nnode cache (remote sources' metadata and video bytes): empty")
    by_source: dict[str, list] = {}
    for entry in entries:
        by_source.setdefault(entry.source, []).append(entry)
    for source, group in by_source.items():
        print(f"\nsource {source}: {len(group)} entries, {_human_bytes(sum(e.size_bytes for e in group))}")
        print(f"  {'state':<9} {'size':>9} {'users':>5} {'pinned':<6} file")
        for e in group:
            pinned = "yes" if e.pinned else "no"
            print(f"  {e.state.value:<9} {_human_bytes(e.size_bytes):>9} {e.users:>5} {pinned:<6} {e.file}")
    print(f"\ntotal: {totals['entries']} entries, {_human_bytes(totals['size_bytes'])} on disk; "
          f"{totals['pinned']} pinned; {totals['in_use']} in use by live processes")
    for kind, what in _DERIVED.items():
        group = [f for f in derived if f.kind == kind]
        print(f"\n{kind} cache ({what}): {len(group)} source(s), {sum(f.files for f in group)} file(s), "
              f"{_human_bytes(sum(f.size_bytes for f in group))}")
        for files in group:
            print(f"  {_human_bytes(files.size_bytes):>9} {files.files:>5} file(s)  {files.source}")
    return 0


def _cache_clear(args: argparse.Namespace, root: Path) -> int:
    from episodestream._format.cache_files import cache_files
    from episodestream._remote.cache.node_cache import NodeCache
    from episodestream._remote.source.prewarm import clear

    report = clear(NodeCache(root), source=args.source)
    print(f"removed {report.removed} entries ({_human_bytes(report.removed_bytes)}) from {root}"
          + (f" (sources matching {args.source!r})" if args.source else "")
          + f"; skipped {report.skipped_in_use} in use by live processes")
    for kind in _DERIVED:
        group = [f for f in cache_files(root) if f.kind == kind and f.matches(args.source)]
        for files in group:
            files.remove()
        print(f"removed the {kind} cache of {len(group)} source(s): {sum(f.files for f in group)} file(s), "
              f"{_human_bytes(sum(f.size_bytes for f in group))}")
    for name in report.skipped_names[:10]:
        print(f"  in use: {name}")
    if report.skipped_in_use > 10:
        print(f"  ... and {report.skipped_in_use - 10} more")
    return 0


def _cache_unpin(args: argparse.Namespace, root: Path) -> int:
    from episodestream._remote.cache.node_cache import NodeCache
    from episodestream._remote.source.prewarm import unpin_all

    report = unpin_all(NodeCache(root), source=args.source)
    print(f"unpinned {report.unpinned} entries ({_human_bytes(report.unpinned_bytes)}) in {root}"
          + (f" (sources matching {args.source!r})" if args.source else "")
          + f"; deleted {report.deleted} no live process uses, the rest go when their users release them")
    return 0


class EpisodeRanges:
    """A parsed ``--episodes`` list ('0,3,5-9'): its ranges, expanded only against a dataset
    (``indices``), so that '0-100000000000' is refused before a list is built."""

    def __init__(self, text: str, ranges: list[tuple[str, int, int]]) -> None:
        self.text, self.ranges = text, ranges  # (token, first, last), inclusive

    def indices(self, episode_index: Sequence[int], description: str) -> list[int]:
        """The episodes named, once each, ascending; a range past the dataset's last episode is refused."""
        last = max(episode_index)
        for token, _, end in self.ranges:
            if end > last:
                raise ValueError(f"--episodes {self.text!r}: {token!r} goes past the last episode of {description} "
                                 f"(episode indices {min(episode_index)}..{last}, {len(episode_index)} episodes)")
        return sorted({e for _, first, end in self.ranges for e in range(first, end + 1)})


def _episode_list(text: str) -> EpisodeRanges:
    """'0,3,5-9': indices and inclusive ranges; a reversed ('5-3') or open ('3-') range is refused,
    naming it, rather than dropped or read as one episode."""
    ranges = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, dash, last = part.partition("-")
        try:
            start, end = int(first), int(last) if dash else int(first)
        except ValueError:
            why = ("an open range: give its last episode too, as in '3-9'" if dash and first.strip()
                   and not last.strip() else "neither an index nor a range like '5-9'")
            raise argparse.ArgumentTypeError(f"invalid episode list ({text!r}): {part!r} is {why}") from None
        if start < 0:
            raise argparse.ArgumentTypeError(f"invalid episode list ({text!r}): {part!r}: episode indices are >= 0")
        if end < start:
            raise argparse.ArgumentTypeError(f"invalid episode list ({text!r}): {part!r} is a reversed range; write "
                                             f"'{end}-{start}'")
        ranges.append((part, start, end))
    if not ranges:
        raise argparse.ArgumentTypeError(f"invalid episode list ({text!r}): it names no episode")
    return EpisodeRanges(text, ranges)


def _source(text: str) -> str:
    """A dataset argument as given, a leading ``~`` expanded (the shell leaves ``--x=~/data`` and a
    quoted ``"~/data"`` alone); URLs and Hub repo ids never start with one."""
    return os.path.expanduser(text) if text.startswith("~") else text


def _pool_size(text: str) -> int | str:
    """``--pool-size``: an int (checked with the other counts), or ``auto``."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 or 'auto', got {text!r}") from None


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"invalid JSON ({error})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object of fsspec options, got {text!r}")
    return value


def _prewarm(args: argparse.Namespace) -> int:
    import sys

    from episodestream._runtime.core import select_episodes
    from episodestream._format.versions import load_metadata
    from episodestream._remote.cache.node_cache import CacheFullError
    from episodestream._remote.source.open import open_remote_source
    from episodestream._remote.source.prewarm import prewarm

    from episodestream._runtime.sources import local_folder

    try:
        local = local_folder(args.source)
    except FileNotFoundError as error:  # a file:// URL naming nothing
        print(f"episodestream prewarm: {error}", file=sys.stderr)
        return 1
    if local is not None:
        print(f"{args.source} is a local folder, read in place and never cached: nothing to prewarm.")
        return 0
    try:
        files = open_remote_source(args.source, revision=args.revision, cache_dir=args.cache_dir,
                                   cache_limit=args.cache_limit, storage_options=args.storage_options,
                                   hub_endpoint=args.hub_endpoint, cache_wait_s=args.cache_wait_s)
        try:
            meta = load_metadata(files)
            wanted = None if args.episodes is None else args.episodes.indices(
                meta.episodes.episode_index.tolist(), files.description)
            episodes = select_episodes(meta, wanted)
            report = prewarm(files, episodes, progress=not args.no_progress, meta=meta)
        finally:
            files.close()
    except (OSError, ValueError, CacheFullError) as error:  # not found, refused, unreachable, bad options
        print(f"episodestream prewarm: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    print(f"prewarmed {report.episodes} episodes of {report.description}: fetched "
          f"{_human_bytes(report.bytes_fetched)} in {report.seconds:.1f} s; {report.entries_pinned} entries "
          f"({_human_bytes(report.bytes_pinned)}) pinned in {report.cache_dir}")
    print("runs with this cache_dir now read these episodes' metadata and video locally (rows are still read "
          "from the source); `episodestream cache unpin` (or `cache clear`) unpins them.")
    return 0


def _bench(bench_args: list[str]) -> int:
    import runpy
    import sys

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "streaming" / "benchmark_streaming.py"
    if not script.exists():
        print(f"episodestream bench runs {script.relative_to(script.parents[2])} from a source checkout "
              f"(pip install -e .); it is not part of the installed package.", file=sys.stderr)
        return 2
    sys.argv = [str(script), *bench_args]
    runpy.run_path(str(script), run_name="__main__")
    return 0


def _check_out_file(path: str) -> Path:
    out = Path(path).expanduser()
    if out.is_dir():
        raise IsADirectoryError(f"--out {path}: is a folder; pass the path of a JSON file to write")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"--out {path}: no folder {out.parent}; create it or pass another path")
    return out


def _stats_episodes(args: argparse.Namespace) -> list[int] | None:
    """``--episodes`` as indices, checked against the dataset's episodes before a list is built."""
    if args.episodes is None:
        return None
    from episodestream._format.versions import load_metadata
    from episodestream._runtime.sources import open_source

    files = open_source(args.source, revision=args.revision, cache_dir=args.cache_dir, local_cache_dir=True)
    try:
        return args.episodes.indices(load_metadata(files).episodes.episode_index.tolist(), files.description)
    finally:
        files.close()


def _stats(args: argparse.Namespace) -> int:
    from episodestream._remote.cache.node_cache import CacheFullError
    from episodestream.streaming import EpisodeStreamingDataset

    try:
        out = _check_out_file(args.out) if args.out else None  # before the pass over the data, not after
        episodes = _stats_episodes(args)
        dataset = EpisodeStreamingDataset(args.source, episodes=episodes, revision=args.revision,
                                          cache_dir=args.cache_dir)
        stats = dataset.compute_stats(cache=not args.no_cache, progress=not args.no_progress)
        as_json = {key: {name: value.tolist() for name, value in entry.items()} for key, entry in stats.items()}
        if out is not None:
            out.write_text(json.dumps(as_json, indent=4))
    except (OSError, ValueError, CacheFullError) as error:
        return _user_error("stats", error)
    if args.json:
        print(json.dumps(as_json, indent=2))
        return 0
    cameras = set(dataset.meta.camera_keys)
    print(f"{dataset.resolved_source}: {dataset.num_episodes} episodes, {dataset.num_frames} frames; exact "
          f"statistics of the tabular features (cameras: the dataset's stats.json)")
    for key, entry in stats.items():
        shape = list(np.shape(entry.get("mean")))
        first = {name: [round(float(v), 6) for v in np.ravel(entry[name])[:3]]
                 for name in ("mean", "std", "q01", "q99") if name in entry}
        print(f"{key} {shape}{' (stats.json)' if key in cameras else ''}: "
              + "  ".join(f"{name} {values}" for name, values in first.items()))
    if args.out:
        print(f"wrote {args.out}")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    """0: no defects; 1: defects (the report says which); 2: no report: the command was used wrongly (as
    argparse), the source could not be opened, or a worker process died."""
    import sys

    from episodestream._base.errors import CacheFullError
    from episodestream._remote.transport.request import DownloadError
    from episodestream.tools.doctor import WorkerDied, run_doctor

    try:
        report = run_doctor(args.source, episodes=args.episodes, decode=args.decode, jobs=args.jobs,
                            tolerance_s=args.tolerance_s, revision=args.revision, cache_dir=args.cache_dir,
                            hub_endpoint=args.hub_endpoint, storage_options=args.storage_options,
                            progress=not args.no_progress)
    except (OSError, ValueError, CacheFullError, DownloadError, WorkerDied) as error:  # no such dataset, ...
        _user_error("doctor", error)  # ... an episode it lacks, a worker that died: nothing to report
        return 2
    print(json.dumps(report.as_json(), indent=2) if args.json else report.text(), file=sys.stdout)
    return report.exit_code


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _frame_offsets(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--frames must be comma-separated frame offsets such as -2,0,2, "
                                         f"got {text!r}") from None


def _show(args: argparse.Namespace) -> int:
    from episodestream._remote.cache.node_cache import CacheFullError
    from episodestream.tools.show import show_sample

    try:
        path = show_sample(args.source, out=args.out, index=args.index, episode=args.episode, frames=args.frames,
                           revision=args.revision)
    except (OSError, ValueError, ImportError, CacheFullError) as error:
        return _user_error("show", error)
    print(f"wrote {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="episodestream", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="write a small synthetic dataset and stream it (EpisodeLoader)")
    demo.add_argument("--out", help="where to write the dataset (default: a temporary folder, removed after)")
    demo.add_argument("--episodes", type=int, default=24, help="episodes to write (default: 24)")
    demo.add_argument("--episode-length", type=int, default=100, help="frames per episode (default: 100)")
    demo.add_argument("--height", type=int, default=96, help="camera frame height in pixels (default: 96)")
    demo.add_argument("--width", type=int, default=128, help="camera frame width in pixels (default: 128)")
    demo.add_argument("--loader", choices=("episode", "dataloader"), default="episode",
                      help="episode: EpisodeLoader, decode threads in this process (default); dataloader: "
                           "torch DataLoader worker processes")
    demo.add_argument("--num-threads", type=int, default=None,
                      help="EpisodeLoader decode threads (default: the cores this process may use, at most 16)")
    demo.add_argument("--num-workers", type=int, default=2, help="DataLoader worker processes")
    demo.add_argument("--flat", action="store_true",
                      help="flat-block frames instead of textured ones: a faster write, but frames that decode "
                           "several times faster than camera video (the throughput is then no decode cost)")
    demo.add_argument("--batch-size", type=int, default=32, help="samples per batch (default: 32)")
    demo.add_argument("--pool-size", type=_pool_size, default="auto",
                      help="episode_pool_size: whole episodes each consumer holds, or 'auto' (the default: "
                           "every episode where the video files are few, else 64 or what the decoder cache holds)")
    demo.set_defaults(run=_demo)

    info = commands.add_parser("info", help="episodes, frames, fps, cameras, codecs, GOP, files and sizes")
    info.add_argument("source", type=_source, help="a LeRobot dataset (v3.0, v2.1 or v2.0): folder, URL or Hub repo id")
    info.add_argument("--revision", help="Hub branch, tag or commit (default: main)")
    info.add_argument("--json", action="store_true", help="print JSON instead of text")
    info.set_defaults(run=_info)

    show = commands.add_parser("show", help="draw one sample as a policy sees it (cameras, depth colour-mapped, "
                                            "state and action windows with padded steps, task) into a PNG")
    show.add_argument("source", help="a LeRobot dataset (folder, URL or Hub repo id)")
    show.add_argument("--index", type=int, help="the sample's index (default 0)")
    show.add_argument("--episode", type=int, help="draw this episode's middle frame instead")
    show.add_argument("--frames", type=_frame_offsets, default=[],
                      help="window offsets in frames for every camera, state and action, e.g. --frames=-2,0,2 "
                           "(default: single frames)")
    show.add_argument("--revision", help="Hub branch, tag or commit (default: main)")
    show.add_argument("--out", default="sample.png",
                      help="the PNG to write (default sample.png; a name without a suffix gets .png, a folder "
                           "gets sample.png inside it)")
    show.set_defaults(run=_show)

    stats = commands.add_parser("stats", help="exact mean, std, min, max, count and q01..q99 of a selection of "
                                              "episodes' tabular features (LeRobot's stats.json layout)")
    stats.add_argument("source", type=_source,
                       help="a LeRobot dataset (v3.0, v2.1 or v2.0): folder, URL or Hub repo id")
    stats.add_argument("--episodes", type=_episode_list, help="episode indices, e.g. 0,3,5-9 (default: all)")
    stats.add_argument("--revision", help="Hub branch, tag or commit (default: main)")
    stats.add_argument("--cache-dir", help="where the result is cached, under stats/ (default: "
                                           "$EPISODESTREAM_CACHE_DIR, else ~/.cache/episodestream)")
    stats.add_argument("--no-cache", action="store_true", help="compute again, and do not keep the result")
    stats.add_argument("--out", help="also write the statistics to this JSON file (stats.json layout)")
    stats.add_argument("--json", action="store_true", help="print JSON instead of text")
    stats.add_argument("--no-progress", action="store_true", help="no progress bar")
    stats.set_defaults(run=_stats)

    doctor = commands.add_parser(
        "doctor", help="check a dataset before training: every check the readers make, on every episode, in "
                       "parallel (rows against meta/episodes, timestamps, dtypes and shapes, stats, tasks, files, "
                       "video at each episode's first and last frames); exit code 0 clean, 1 defects")
    doctor.add_argument("source", type=_source, help="a LeRobot dataset (v3.0, v2.1 or v2.0): folder, URL or Hub "
                                                     "repo id (remote: metadata, row groups and the decoded frames' "
                                                     "bytes are fetched, never whole videos unless --decode all)")
    doctor.add_argument("--revision", help="Hub branch, tag or commit (default: main)")
    doctor.add_argument("--cache-dir", help="a remote source's node cache folder (default: "
                                            "$EPISODESTREAM_CACHE_DIR, else ~/.cache/episodestream)")
    doctor.add_argument("--hub-endpoint", help="Hub endpoint (default: $HF_ENDPOINT, else huggingface.co)")
    doctor.add_argument("--storage-options", type=_json_object,
                        help='fsspec options for bucket URLs as JSON, e.g. \'{"anon": true}\'')
    doctor.add_argument("--episodes", type=_episode_list, help="episode indices, e.g. 0,3,5-9 (default: all)")
    doctor.add_argument("--decode", choices=("ends", "all"), default="ends",
                        help="ends: decode each camera (and parquet image) at every episode's first and last "
                             "frames (default); all: at every frame (slow: decodes the whole dataset)")
    doctor.add_argument("--jobs", type=_positive_int, help="worker processes checking episodes (default: the cores "
                                                           "this process may use; 1: in this process)")
    doctor.add_argument("--tolerance-s", type=float, default=1e-4,
                        help="how far a timestamp or decoded frame may be from its time, as the datasets' "
                             "tolerance_s (default 1e-4)")
    doctor.add_argument("--json", action="store_true", help="print the report as one JSON object")
    doctor.add_argument("--no-progress", action="store_true", help="no progress bar (it is drawn on stderr)")
    doctor.set_defaults(run=_doctor)

    bench = commands.add_parser("bench", add_help=False,
                                help="run benchmarks/streaming/benchmark_streaming.py: with no options a quick look (about "
                                     "a minute: EpisodeLoader and a DataLoader side by side); --full the long "
                                     "matrix (its --help lists options)")
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(run=lambda args: _bench(args.bench_args))

    cache_dir_help = "the cache folder (default: $EPISODESTREAM_CACHE_DIR, else ~/.cache/episodestream)"
    source_help = ("only sources matching: a cache key as `cache ls` prints it, a glob over keys, or text the key "
                   "contains ('lerobot/pusht', 's3://bucket/prefix')")
    commands.add_parser("lerobot-train", add_help=False,
                        help="LeRobot's lerobot-train on episodestream's datasets (same arguments; resumes the data "
                             "stream exactly; multi-GPU with accelerate launch -m episodestream lerobot-train ...)")
    cache = commands.add_parser("cache", help="list, unpin or clear the caches: the node cache of remote sources, "
                                              "the column cache and the stats cache")
    cache_commands = cache.add_subparsers(dest="cache_command", required=True)
    ls = cache_commands.add_parser("ls", help="node-cache entries (source, file, state, size, users, pinned) and "
                                              "totals; the column and stats caches' files and sizes by source")
    ls.add_argument("--cache-dir", help=cache_dir_help)
    ls.add_argument("--source", help=source_help)
    ls.add_argument("--json", action="store_true", help="print JSON instead of text")
    ls.set_defaults(run=_cache_command(_cache_ls, "ls"))
    unpin = cache_commands.add_parser("unpin", help="remove the pins of prewarmed entries, in use or not: unused ones "
                                                    "are deleted now, the others when their users release them")
    unpin.add_argument("--cache-dir", help=cache_dir_help)
    unpin.add_argument("--source", help=source_help)
    unpin.set_defaults(run=_cache_command(_cache_unpin, "unpin"))
    clear = cache_commands.add_parser("clear", help="unpin and remove node-cache entries no live process uses, and "
                                                    "the column and stats caches (rebuilt when next needed)")
    clear.add_argument("--cache-dir", help=cache_dir_help)
    clear.add_argument("--source", help=source_help)
    clear.set_defaults(run=_cache_command(_cache_clear, "clear"))

    prewarm = commands.add_parser(
        "prewarm", help="fetch a remote dataset's metadata and episodes' video bytes into the node cache and pin "
                        "them there, so later runs read them locally")
    prewarm.add_argument("source", type=_source, help="owner/name (Hub), hf://datasets/..., s3://bucket/prefix or another URL")
    prewarm.add_argument("--cache-dir", help=cache_dir_help)
    prewarm.add_argument("--cache-limit", help="disk budget for the whole cache dir, e.g. 20GB "
                                               "(default: $EPISODESTREAM_CACHE_LIMIT, else none)")
    prewarm.add_argument("--cache-wait-s", type=float,
                         help="how long a download waits for other processes to release cache space before failing "
                              "(default: $EPISODESTREAM_CACHE_WAIT_S, else 300); no wait when pins fill the cache")
    prewarm.add_argument("--episodes", type=_episode_list, help="episode indices, e.g. 0,3,5-9 (default: all)")
    prewarm.add_argument("--revision", help="Hub branch, tag or commit (default: main)")
    prewarm.add_argument("--hub-endpoint", help="Hub endpoint (default: $HF_ENDPOINT, else huggingface.co)")
    prewarm.add_argument("--storage-options", type=_json_object,
                         help='fsspec options for bucket URLs as JSON, e.g. \'{"anon": true}\'')
    prewarm.add_argument("--no-progress", action="store_true", help="no progress bar")
    prewarm.set_defaults(run=_prewarm)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # every option after "bench" is the benchmark's, --help included
        return _bench(argv[1:])
    if argv[:1] == ["lerobot-train"]:  # every argument after it is lerobot-train's, --help included
        from episodestream.tools.lerobot_train import main as lerobot_train

        return lerobot_train(argv[1:])
    args = build_parser().parse_args(argv)
    return args.run(args)
