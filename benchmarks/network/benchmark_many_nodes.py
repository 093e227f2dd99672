"""A launch of many nodes against a rate-limited fake Hub, simulated on one machine.

N nodes x R ranks: every rank a process streaming its share of one epoch (``world_size = N x R``,
ranks numbered node-major: node ``n`` holds ranks ``n*R .. n*R + R-1``) with
``EpisodeStreamingDataset`` + ``EpisodeLoader`` from one ``FakeHub``. Each node has

- its own node cache folder (``cache_dir``), shared by its ranks' processes, as on a real node;
- its own permits folder (``EPISODESTREAM_DOWNLOAD_PERMITS_DIR``: the download controller's
  node-wide budget and ``Retry-After`` pause), which on a real node is ``/dev/shm``;
- its own link: a ``ShapingProxy`` (latency; its counters split the node's bytes by file).

All node links go through one more ``ShapingProxy`` in front of the ``FakeHub``: the Hub's rate
limit, 429 with ``Retry-After`` beyond ``--hub-requests-per-s`` requests started per second, for all
nodes together (one token, as a launch of many ranks that share a login).

Reported: per node, the video bytes fetched against the video of the episodes its ranks stream
(their share: each episode once per node that streams any of its frames) and against the whole
dataset's video; over all nodes, video bytes against the dataset's video; requests per rank;
429s (at the Hub, and as seen by the ranks); failed ranks; each rank's first batch from launch
and the time to every rank's first batch; frames checked against the ids the synthetic dataset
writes into them (``decode_frame_ids``).

    python benchmarks/network/benchmark_many_nodes.py --nodes 4 --ranks 3 --output-dir /tmp/many-nodes
    python benchmarks/network/benchmark_many_nodes.py --nodes 8 --ranks 4 --output-dir /tmp/many-nodes
    python benchmarks/network/benchmark_many_nodes.py --nodes 4 --ranks 3 --height 240 --width 320 --output-dir /tmp/many-nodes
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path

# huggingface_hub reads these when first imported: no telemetry, no Xet, nothing leaves the host.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")

HUB_OWNER = "bench"
CAMERAS = ("observation.images.front", "observation.images.wrist")


def _write_dataset(root: Path, args: argparse.Namespace) -> Path:
    from episodestream.tools.synthetic import write_synthetic_dataset

    return write_synthetic_dataset(
        root, num_episodes=args.episodes, episode_length=(args.min_length, args.max_length), cameras=CAMERAS,
        height=args.height, width=args.width, gop=args.gop, max_episodes_per_video_file=args.episodes_per_file, texture=True,
        seed=args.seed)


def _rank_main(rank: int, world_size: int, node: int, node_url: str, source: str, cache_dir: str,
               permits_dir: str, launch_s: float, check_frames: bool, out_path: str) -> None:
    """One rank's process: its share of epoch 0, then a JSON line of what it cost."""
    os.environ["EPISODESTREAM_DOWNLOAD_PERMITS_DIR"] = permits_dir
    result: dict = {"rank": rank, "node": node, "ok": False}
    try:
        import torch

        torch.set_num_threads(1)
        from episodestream import EpisodeLoader, EpisodeStreamingDataset
        from episodestream.tools.synthetic import decode_frame_ids

        dataset = EpisodeStreamingDataset(source, rank=rank, world_size=world_size, cache_dir=cache_dir,
                                          hub_endpoint=node_url, token=False, seed=0, episode_pool_size=8)
        result["built_s"] = time.time() - launch_s
        loader = EpisodeLoader(dataset, batch_size=8, num_threads=1)
        samples = bad_frames = 0
        for batch in loader:
            if samples == 0:
                result["first_batch_s"] = time.time() - launch_s
            samples += len(batch["index"])
            if check_frames:
                for camera_index, key in enumerate(CAMERAS):
                    for i in range(len(batch["index"])):
                        ids = decode_frame_ids(batch[key][i])
                        want = (int(batch["episode_index"][i]), int(batch["frame_index"][i]), camera_index)
                        bad_frames += ids != want
        result["done_s"] = time.time() - launch_s
        loader.close()
        files = dataset._core.files
        fetch = files.download.stats()
        source_stats = dataset.source_stats()
        result.update(ok=True, samples=samples, bad_frames=bad_frames, requests=source_stats.requests,
                      bytes_fetched=source_stats.bytes_fetched, attempts=fetch.attempts, throttles=fetch.throttles,
                      failed_reads=fetch.failed, cache_hits=source_stats.cache_hits,
                      cache_misses=source_stats.cache_misses)
    except BaseException as error:  # noqa: BLE001 - a failed rank is a result
        result["error"] = f"{type(error).__name__}: {error}"
        result["traceback"] = traceback.format_exc()
    Path(out_path).write_text(json.dumps(result))


def _share_episodes(root: Path, nodes: int, ranks: int) -> tuple[dict[int, set[int]], dict]:
    """Each node's episodes (those its ranks stream any frame of), and the episodes table."""
    from episodestream import EpisodeStreamingDataset
    from episodestream._plan.sampling import EpochPlan

    episodes: dict[int, set[int]] = defaultdict(set)
    world_size = nodes * ranks
    for rank in range(world_size):
        dataset = EpisodeStreamingDataset(root, rank=rank, world_size=world_size, seed=0, episode_pool_size=8)
        runtime = dataset._runtime
        plan = EpochPlan(runtime.segments(0), seed=0, epoch=0, shuffle=True, world_size=world_size)
        for segment in plan.rank_parts[rank]:
            episodes[rank // ranks].add(segment.episode_index)
    return episodes, dataset.typed_meta.episodes


def _video_bytes_of(root: Path, episodes_table, selection: set[int]) -> int:
    """The compressed video bytes of these episodes' frames (every camera): the packets in each
    episode's [from, to), as PyAV demuxes them."""
    import av

    total = 0
    by_file: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for index in selection:
        for span in episodes_table[index].videos.values():
            by_file[span.relpath].append((span.from_timestamp_s, span.to_timestamp_s))
    for relpath, spans in by_file.items():
        with av.open(str(root / relpath)) as container:
            stream = container.streams.video[0]
            for packet in container.demux(stream):
                if packet.pts is None or packet.size == 0:
                    continue
                t = float(packet.pts * stream.time_base)
                total += packet.size * sum(lo - 1e-6 <= t < hi - 1e-6 for lo, hi in spans)
    return total


def run(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="episodestream-many-nodes-"))
    try:
        return _run_in(work, args)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def _run_in(work: Path, args: argparse.Namespace) -> dict:
    from episodestream.testing import FakeHub, LinkSettings, ShapingProxy

    root = _write_dataset(work / "data" / "many_nodes", args)
    nodes, ranks = args.nodes, args.ranks
    world_size = nodes * ranks
    share, table = _share_episodes(root, nodes, ranks)
    every = {e for s in share.values() for e in s}
    video_total = _video_bytes_of(root, table, every)
    mp4_total = sum(p.stat().st_size for p in (root / "videos").rglob("*.mp4"))
    share_video = {n: _video_bytes_of(root, table, share[n]) for n in range(nodes)}

    hub_root = work / "hub"
    (hub_root / "datasets" / HUB_OWNER).mkdir(parents=True)
    (hub_root / "datasets" / HUB_OWNER / root.name).symlink_to(root, target_is_directory=True)
    ctx = multiprocessing.get_context("spawn")
    with ExitStack() as stack:
        hub = stack.enter_context(FakeHub(hub_root))
        limit = LinkSettings(max_requests_per_s=args.hub_requests_per_s, retry_after_s=args.retry_after_s)
        hub_link = stack.enter_context(ShapingProxy(hub.url, settings=limit))
        node_links = [stack.enter_context(ShapingProxy(hub_link.url, settings=LinkSettings(
            latency_s=args.latency_s, rate_bytes_per_s=args.node_rate_mb_s * 1e6, jitter_s=args.latency_s / 2,
            seed=n))) for n in range(nodes)]
        source = f"{HUB_OWNER}/{root.name}"
        launch_s = time.time()
        processes = []
        for rank in range(world_size):
            node = rank // ranks
            out = work / f"rank-{rank}.json"
            process = ctx.Process(target=_rank_main, args=(
                rank, world_size, node, node_links[node].url, source, str(work / f"node-{node}" / "cache"),
                str(work / f"node-{node}" / ("permits" if args.permits == "node" else f"permits-{rank}")), launch_s, not args.no_frame_check, str(out)))
            process.start()
            processes.append((rank, process, out))
        for _, process, _ in processes:
            process.join(args.timeout_s)
        wall_s = time.time() - launch_s
        results = []
        for rank, process, out in processes:
            if process.is_alive():
                process.kill()
                results.append({"rank": rank, "node": rank // ranks, "ok": False, "error": "timed out"})
            elif out.exists():
                results.append(json.loads(out.read_text()))
            else:
                results.append({"rank": rank, "node": rank // ranks, "ok": False,
                                "error": f"exit code {process.exitcode}, no result"})
        hub_stats = hub_link.stats()
        link_stats = [link.stats() for link in node_links]

    per_node = []
    for n, stats in enumerate(link_stats):
        video = sum(b for path, b in stats.bytes_by_path.items() if path.endswith(".mp4"))
        per_node.append({
            "node": n, "video_bytes": video, "share_video_bytes": share_video[n],
            "vs_share": video / share_video[n] if share_video[n] else None, "vs_dataset": video / video_total,
            "other_bytes": stats.bytes_sent - video, "requests": stats.requests,
            "429s": stats.responses_by_status.get(429, 0)})
    ok = [r for r in results if r.get("ok")]
    first = [r["first_batch_s"] for r in ok if "first_batch_s" in r]
    summary = {
        "nodes": nodes, "ranks_per_node": ranks, "world_size": world_size, "episodes": args.episodes,
        "hub_requests_per_s": args.hub_requests_per_s, "permits": args.permits, "dataset_video_bytes": video_total,
        "mp4_file_bytes": mp4_total,
        "video_bytes_all_nodes": sum(n["video_bytes"] for n in per_node),
        "video_vs_dataset": sum(n["video_bytes"] for n in per_node) / video_total,
        "video_vs_shares": sum(n["video_bytes"] for n in per_node) / sum(share_video.values()),
        "hub_requests": hub_stats.requests, "hub_429s": hub_stats.throttled_429,
        "rank_throttles_seen": sum(r.get("throttles", 0) for r in ok),
        "requests_per_rank_median": statistics.median(r["requests"] for r in ok) if ok else None,
        "requests_per_rank_max": max((r["requests"] for r in ok), default=None),
        "failed_ranks": world_size - len(ok), "bad_frames": sum(r.get("bad_frames", 0) for r in ok),
        "samples": sum(r.get("samples", 0) for r in ok),
        "first_batch_s_median": statistics.median(first) if first else None,
        "every_rank_first_batch_s": max(first) if len(first) == world_size else None,
        "every_rank_done_s": max((r["done_s"] for r in ok), default=None), "wall_s": wall_s,
    }
    return {"summary": summary, "nodes": per_node, "ranks": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--ranks", type=int, default=3, help="ranks per node")
    parser.add_argument("--episodes", type=int, default=96)
    parser.add_argument("--min-length", type=int, default=40)
    parser.add_argument("--max-length", type=int, default=120)
    parser.add_argument("--episodes-per-file", type=int, default=24)
    parser.add_argument("--gop", type=int, default=2)
    parser.add_argument("--height", type=int, default=64, help="frame height (each camera)")
    parser.add_argument("--width", type=int, default=96, help="frame width (each camera); every node reads "
                        "every mp4's moov, 1.1%% of the synthetic files' bytes at 64x96 and 0.11%% at 240x320")
    parser.add_argument("--hub-requests-per-s", type=int, default=15)
    parser.add_argument("--retry-after-s", type=float, default=1.0)
    parser.add_argument("--latency-s", type=float, default=0.02)
    parser.add_argument("--node-rate-mb-s", type=float, default=50.0)
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-frame-check", action="store_true")
    parser.add_argument("--permits", choices=("node", "rank"), default="node",
                        help="download controller state (budget, Retry-After pause) per node, as on a real node, "
                             "or per rank (each rank backs off alone: the comparison)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (dataset, caches, rank results)")
    parser.add_argument("--output-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    report = run(args)
    text = json.dumps(report["summary"], indent=1)
    print(text)
    for node in report["nodes"]:
        print(json.dumps(node))
    for rank in report["ranks"]:
        if not rank.get("ok"):
            print(f"rank {rank['rank']} failed: {rank.get('error')}\n{rank.get('traceback', '')}", file=sys.stderr)
    if args.output_dir is not None:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        name = f"many_nodes_{args.nodes}x{args.ranks}.json"
        (args.output_dir / name).write_text(json.dumps(report, indent=1))
    return 0 if report["summary"]["failed_ranks"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
