"""The LeRobot v2.0 / v2.1 layout for the synthetic writer: one parquet and one mp4 per camera per
episode, and the JSON-lines metadata LeRobot 0.3.x wrote (``meta/episodes.jsonl``,
``meta/tasks.jsonl``, and ``meta/episodes_stats.jsonl`` for v2.1 or ``meta/stats.json`` for v2.0).

The frames and values are the v3.0 writer's (``synthetic._write_episode``), so the same arguments
written as v2.1 and as v3.0 hold the same data: the golden tests compare the two.
"""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

V2_VERSIONS = ("v2.0", "v2.1")
V2_DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V2_VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"


class PerEpisodeFile:
    """One stream's file (the data, or one camera) in the v2.x layout: a new file for every episode.

    The same interface as the v3.0 writer's ``_RollingFile`` (``for_next_episode``, ``close`` and the
    counters ``_write_episode`` reads), so that writing an episode does not care which layout it is
    in. ``num_frames`` restarts at 0 in every file: each v2.x mp4 starts at timestamp 0.
    """

    def __init__(self, path_template: str, *, chunks_size: int, **fields: Any) -> None:
        self.path_template, self.fields, self.chunks_size = path_template, fields, chunks_size
        self.next_episode = 0
        self.chunk_index = self.file_index = self.num_bytes = self.num_episodes = self.num_frames = 0
        self.handle = None

    def for_next_episode(self, out: pathlib.Path, open_file):
        self.close()
        episode_index, self.next_episode = self.next_episode, self.next_episode + 1
        self.chunk_index, self.file_index = episode_index // self.chunks_size, episode_index
        self.num_bytes = self.num_episodes = self.num_frames = 0
        path = out / self.path_template.format(episode_chunk=self.chunk_index, episode_index=episode_index,
                                               **self.fields)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = open_file(path)
        return self.handle

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
        self.handle = None


def _without_quantiles(stats: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    # LeRobot 0.3.x wrote min, max, mean, std and count; the q01..q99 quantiles came with v3.0.
    return {key: {name: value for name, value in values.items() if not name.startswith("q")}
            for key, values in stats.items()}


def _write_jsonl(path: pathlib.Path, lines: Sequence[Mapping[str, Any]]) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def write_v2_metadata(out: pathlib.Path, *, version: str, episode_rows: Sequence[Mapping[str, Any]],
                      episode_stats: Sequence[Mapping[str, Any]], dataset_stats: Mapping[str, Any],
                      fps: int, num_tasks: int, chunks_size: int, cameras: Sequence[str],
                      features: Mapping[str, Any]) -> None:
    """``meta/`` of a v2.0 or v2.1 dataset whose episodes are written already."""
    meta = out / "meta"
    meta.mkdir(parents=True, exist_ok=True)
    _write_jsonl(meta / "episodes.jsonl", [{"episode_index": row["episode_index"], "tasks": row["tasks"],
                                            "length": row["length"]} for row in episode_rows])
    _write_jsonl(meta / "tasks.jsonl", [{"task_index": t, "task": f"synthetic task {t}"} for t in range(num_tasks)])
    if version == "v2.1":
        _write_jsonl(meta / "episodes_stats.jsonl", [
            {"episode_index": row["episode_index"], "stats": _without_quantiles(stats)}
            for row, stats in zip(episode_rows, episode_stats)])
    else:
        (meta / "stats.json").write_text(json.dumps(_without_quantiles(dataset_stats), indent=4))
    num_episodes = len(episode_rows)
    info = {"codebase_version": version, "robot_type": "synthetic", "total_episodes": num_episodes,
            "total_frames": sum(row["length"] for row in episode_rows), "total_tasks": num_tasks,
            "total_videos": num_episodes * len(cameras), "total_chunks": math.ceil(num_episodes / chunks_size),
            "chunks_size": chunks_size, "fps": fps, "splits": {"train": f"0:{num_episodes}"},
            "data_path": V2_DATA_PATH, "video_path": V2_VIDEO_PATH if cameras else None, "features": dict(features)}
    (meta / "info.json").write_text(json.dumps(info, indent=4))
