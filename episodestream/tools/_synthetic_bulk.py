"""Write camera-less LeRobot v3.0 datasets of DROID size (100,000 episodes) in seconds.

``write_synthetic_dataset`` builds every episode in Python (ids in pixels, per-episode stats,
encoders), which is right for a few hundred episodes and far too slow for 100,000. This writer
builds whole data files at once with numpy and writes them with one row group per episode, as
LeRobot does, so reading costs what it costs on a real dataset. Values follow the same rules as
``write_synthetic_dataset`` (``observation.state[j] = episode*1000 + frame + j/8``, ``action =
state + 0.5``, ``task_index = episode % num_tasks``), stored as float32: past 2,048 episodes that
is rounded, but the stored value is what every loader reads, so comparisons stay exact.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from episodestream.tools._write_folder import check_root, invalid, write_into_place

_DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
_EPISODES_PATH = "meta/episodes/chunk-000/file-000.parquet"
_MAX_EPISODES = 10_000_000


def _lengths(episode_length, num_episodes: int, seed: int) -> np.ndarray:
    if isinstance(episode_length, int) and episode_length >= 1:
        return np.full(num_episodes, episode_length, np.int64)
    if (isinstance(episode_length, tuple) and len(episode_length) == 2
            and all(isinstance(n, int) for n in episode_length) and 1 <= episode_length[0] <= episode_length[1]):
        low, high = episode_length
        return np.random.default_rng(seed).integers(low, high + 1, size=num_episodes).astype(np.int64)
    if isinstance(episode_length, Sequence) and len(episode_length) == num_episodes:
        lengths = np.asarray(episode_length, np.int64)
        if lengths.size and lengths.min() >= 1:
            return lengths
    raise invalid("episode_length", episode_length,
                   f"a positive int, an inclusive (min, max) tuple, or a list of {num_episodes} positive lengths")


def _features(state_dim: int) -> dict:
    scalar = lambda dtype: {"dtype": dtype, "shape": [1], "names": None}  # noqa: E731
    vector = {"dtype": "float32", "shape": [state_dim], "names": [f"motor_{j}" for j in range(state_dim)]}
    return {"observation.state": vector, "action": dict(vector), "timestamp": scalar("float32"),
            "frame_index": scalar("int64"), "episode_index": scalar("int64"), "index": scalar("int64"),
            "task_index": scalar("int64"), "next.done": scalar("bool")}


def _file_columns(lengths: np.ndarray, first_episode: int, first_index: int, *, fps: int, state_dim: int,
                  num_tasks: int) -> dict[str, np.ndarray]:
    """Every frame of consecutive episodes, as numpy columns (no per-episode Python)."""
    total = int(lengths.sum())
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    frames = np.arange(total, dtype=np.int64) - starts
    episodes = np.repeat(np.arange(first_episode, first_episode + len(lengths), dtype=np.int64), lengths)
    state = (episodes[:, None] * 1000 + frames[:, None] + np.arange(state_dim)[None, :] / 8).astype(np.float32)
    ends = np.cumsum(lengths) - 1
    done = np.zeros(total, bool)
    done[ends] = True
    return {"observation.state": state, "action": state + np.float32(0.5),
            "timestamp": (frames / fps).astype(np.float32), "frame_index": frames, "episode_index": episodes,
            "index": np.arange(first_index, first_index + total, dtype=np.int64),
            "task_index": episodes % num_tasks, "next.done": done}


def _arrow(columns: dict[str, np.ndarray]) -> pa.Table:
    return pa.table({k: pa.FixedSizeListArray.from_arrays(v.reshape(-1), v.shape[1]) if v.ndim == 2 else pa.array(v)
                     for k, v in columns.items()})


def _stats(columns: dict[str, np.ndarray]) -> dict[str, dict]:
    out = {}
    for key, values in columns.items():
        flat = values.reshape(len(values), -1).astype(np.float64)
        out[key] = {"min": flat.min(0).tolist(), "max": flat.max(0).tolist(), "mean": flat.mean(0).tolist(),
                    "std": flat.std(0).tolist(), "count": [len(values)]}
    return out


def write_tabular_dataset(root: str | os.PathLike, *, num_episodes: int, episode_length=250, fps: int = 30,
                          state_dim: int = 6, num_tasks: int = 2, episodes_per_data_file: int = 1000,
                          chunks_size: int = 1000, seed: int = 0, overwrite: bool = False) -> pathlib.Path:
    """Write a camera-less LeRobot v3.0 dataset of ``num_episodes`` episodes at ``root``, fast.

    ``episode_length``: an int, an inclusive ``(min, max)`` tuple drawn per episode from ``seed``, or
    a list of lengths. ``episodes_per_data_file`` episodes go to each data parquet (one row group
    each); ``chunks_size`` files per chunk folder. Built in a sibling temporary folder and renamed
    into place; a non-empty ``root`` is refused unless ``overwrite``.
    """
    for name, value, low, high in (("num_episodes", num_episodes, 1, _MAX_EPISODES), ("fps", fps, 1, 1000),
                                   ("state_dim", state_dim, 1, 1024), ("num_tasks", num_tasks, 1, 2**20),
                                   ("episodes_per_data_file", episodes_per_data_file, 1, _MAX_EPISODES),
                                   ("chunks_size", chunks_size, 1, 2**20)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise invalid(name, value, f"integers in [{low}, {high}]")
    lengths = _lengths(episode_length, num_episodes, seed)
    root = pathlib.Path(root)
    check_root(root, overwrite=overwrite)
    return write_into_place(root, lambda staging: _write(
        staging, lengths, fps=fps, state_dim=state_dim, num_tasks=num_tasks, per_file=episodes_per_data_file,
        chunks_size=chunks_size))


def _write(out: pathlib.Path, lengths: np.ndarray, *, fps: int, state_dim: int, num_tasks: int, per_file: int,
           chunks_size: int) -> None:
    num_episodes = len(lengths)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    file_of = np.arange(num_episodes) // per_file
    stats_parts = []
    for file_number in range(int(file_of[-1]) + 1):
        first, last = file_number * per_file, min(num_episodes, (file_number + 1) * per_file)
        columns = _file_columns(lengths[first:last], first, int(starts[first]), fps=fps, state_dim=state_dim,
                                num_tasks=num_tasks)
        stats_parts.append(_stats(columns))
        table = _arrow(columns)
        path = out / _DATA_PATH.format(chunk_index=file_number // chunks_size, file_index=file_number % chunks_size)
        path.parent.mkdir(parents=True, exist_ok=True)
        with pq.ParquetWriter(path, table.schema) as writer:
            offset = 0
            for length in lengths[first:last].tolist():  # one row group per episode, as LeRobot writes
                writer.write_table(table.slice(offset, length), row_group_size=length)
                offset += length
    tasks = np.array([f"synthetic task {t}" for t in range(num_tasks)], dtype=object)
    episode_index = np.arange(num_episodes, dtype=np.int64)
    episodes = pa.table({
        "episode_index": episode_index,
        "tasks": pa.array([[t] for t in tasks[episode_index % num_tasks].tolist()], pa.list_(pa.string())),
        "length": lengths, "data/chunk_index": file_of // chunks_size, "data/file_index": file_of % chunks_size,
        "dataset_from_index": starts, "dataset_to_index": ends,
        "meta/episodes/chunk_index": np.zeros(num_episodes, np.int64),
        "meta/episodes/file_index": np.zeros(num_episodes, np.int64)})
    (out / _EPISODES_PATH).parent.mkdir(parents=True)
    pq.write_table(episodes, out / _EPISODES_PATH)
    pq.write_table(pa.table({"task": tasks.tolist(), "task_index": pa.array(range(num_tasks), pa.int64())}),
                   out / "meta/tasks.parquet")
    (out / "meta/stats.json").write_text(json.dumps(_pool(stats_parts), indent=4))
    info = {"codebase_version": "v3.0", "robot_type": "synthetic", "total_episodes": num_episodes,
            "total_frames": int(ends[-1]), "total_tasks": num_tasks, "chunks_size": chunks_size,
            "data_files_size_in_mb": 100, "video_files_size_in_mb": 200, "fps": fps,
            "splits": {"train": f"0:{num_episodes}"}, "data_path": _DATA_PATH, "video_path": None,
            "features": _features(state_dim)}
    (out / "meta/info.json").write_text(json.dumps(info, indent=4))


def _pool(parts: list[dict[str, dict]]) -> dict[str, dict]:
    """Dataset stats from per-file stats: pooled mean and population variance."""
    pooled = {}
    for key in parts[0]:
        counts = np.array([p[key]["count"][0] for p in parts], np.float64)
        means, stds = np.array([p[key]["mean"] for p in parts]), np.array([p[key]["std"] for p in parts])
        weights = (counts / counts.sum())[:, None]
        mean = (weights * means).sum(0)
        variance = (weights * (stds**2 + (means - mean) ** 2)).sum(0)
        pooled[key] = {"min": np.min([p[key]["min"] for p in parts], 0).tolist(),
                       "max": np.max([p[key]["max"] for p in parts], 0).tolist(), "mean": mean.tolist(),
                       "std": np.sqrt(variance).tolist(), "count": [int(counts.sum())]}
    return pooled
