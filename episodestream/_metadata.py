"""LeRobot v3.0 metadata as plain, validated data.

Reads ``meta/info.json``, the episodes parquet files and ``meta/tasks.parquet`` once, checks them,
and exposes what the rest of the library needs: features, per-episode row ranges, data files and
per-camera video spans. Errors name the file, the field and the value.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ._files import DatasetFiles, check_relpath

SUPPORTED_CODEBASE_VERSION = "v3.0"
INFO_PATH = "meta/info.json"
TASKS_PATH = "meta/tasks.parquet"
STATS_PATH = "meta/stats.json"
EPISODES_DIR = "meta/episodes"
REQUIRED_FEATURES = ("timestamp", "frame_index", "episode_index", "index", "task_index")
_EPISODE_COLUMNS = ("episode_index", "length", "data/chunk_index", "data/file_index",
                    "dataset_from_index", "dataset_to_index")
_RANGE_COLUMNS = ("episode_index", "length", "dataset_from_index", "dataset_to_index")
# Errors about where a file is or who may read it, not about its bytes: they keep their own type.
_NOT_FORMAT_ERRORS = (FileNotFoundError, PermissionError, ConnectionError, TimeoutError)


class DatasetFormatError(ValueError):
    """The dataset's files do not follow the LeRobot v3.0 format."""


@dataclass(frozen=True)
class Feature:
    name: str
    dtype: str
    shape: tuple[int, ...]
    info: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class VideoSpan:
    """Where one episode's frames of one camera live: a file and the episode's start time in it."""

    relpath: str
    from_timestamp_s: float
    to_timestamp_s: float


@dataclass(frozen=True)
class EpisodeInfo:
    episode_index: int
    length: int
    from_index: int  # global ``index`` of the episode's first frame
    to_index: int  # end exclusive
    data_relpath: str
    tasks: tuple[str, ...]
    videos: Mapping[str, VideoSpan]


@dataclass(frozen=True)
class DatasetMeta:
    description: str
    fps: int
    features: Mapping[str, Feature]
    episodes: Mapping[int, EpisodeInfo]  # by episode_index, in ascending order
    tasks: tuple[str, ...]  # task string by task_index
    info: Mapping[str, Any]
    # Rows each data file must hold: the sum of its episodes' lengths (checked when it is opened).
    data_file_rows: Mapping[str, int] = field(default_factory=dict)

    @property
    def video_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.dtype == "video"]

    @property
    def image_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.dtype == "image"]

    @property
    def camera_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.dtype in ("video", "image")]

    @property
    def total_frames(self) -> int:
        return sum(ep.length for ep in self.episodes.values())


def _fail(where: str, message: str) -> DatasetFormatError:
    return DatasetFormatError(f"{where}: {message}")


@contextmanager
def parquet_errors(where: str) -> Iterator[None]:
    """Turn pyarrow's errors about a damaged parquet file (``ArrowInvalid``, thrift ``OSError``),
    which name neither file nor episode, into a ``DatasetFormatError`` that says ``where``."""
    try:
        yield
    except _NOT_FORMAT_ERRORS:
        raise
    except (pa.ArrowException, OSError) as error:
        raise _fail(where, f"not a readable parquet file, truncated or corrupt? "
                           f"({type(error).__name__}: {error})") from error


def _read_info(files: DatasetFiles) -> dict[str, Any]:
    where = f"{files.description}/{INFO_PATH}"
    if not files.exists(INFO_PATH):
        raise FileNotFoundError(f"{where} not found: {files.description} is not a LeRobot dataset "
                                f"(every LeRobot v3.0 dataset has {INFO_PATH}).")
    try:
        info = json.loads(files.read_bytes(INFO_PATH))
    except json.JSONDecodeError as error:
        raise _fail(where, f"not valid JSON ({error})") from None
    if not isinstance(info, dict):
        raise _fail(where, f"expected a JSON object, got {type(info).__name__}")
    version = info.get("codebase_version")
    if version != SUPPORTED_CODEBASE_VERSION:
        raise _fail(where, f"field 'codebase_version' is {version!r}; episodestream reads only "
                           f"{SUPPORTED_CODEBASE_VERSION!r} datasets (convert older ones with LeRobot's "
                           f"convert_dataset_v21_to_v30 script)")
    fps = info.get("fps")
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or fps <= 0 or int(fps) != fps:
        raise _fail(where, f"field 'fps' must be a positive integer, got {fps!r}")
    for key in ("data_path", "features"):
        if key not in info:
            raise _fail(where, f"required field {key!r} is missing")
    if not isinstance(info["data_path"], str):
        raise _fail(where, f"field 'data_path' must be a path template string, got {info['data_path']!r}")
    return info


def _parse_features(info: Mapping[str, Any], where: str) -> dict[str, Feature]:
    raw = info["features"]
    if not isinstance(raw, dict):
        raise _fail(where, f"field 'features' must be an object, got {type(raw).__name__}")
    features = {}
    for name, spec in raw.items():
        if not isinstance(spec, dict) or "dtype" not in spec or "shape" not in spec:
            raise _fail(where, f"features[{name!r}] must have 'dtype' and 'shape', got {spec!r}")
        shape = spec["shape"]
        if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and d > 0 for d in shape):
            raise _fail(where, f"features[{name!r}]['shape'] must be a list of positive ints, got {shape!r}")
        features[name] = Feature(name, str(spec["dtype"]), tuple(shape), dict(spec.get("info") or {}))
    missing = [name for name in REQUIRED_FEATURES if name not in features]
    if missing:
        raise _fail(where, f"features {missing} are missing (every v3.0 dataset has {list(REQUIRED_FEATURES)})")
    if any(f.dtype == "video" for f in features.values()) and not isinstance(info.get("video_path"), str):
        raise _fail(where, f"field 'video_path' must be a path template when there are video features, "
                           f"got {info.get('video_path')!r}")
    return features


def _format_path(template: str, where: str, **values: Any) -> str:
    try:
        relpath = template.format(**values)
    except (KeyError, IndexError, ValueError, TypeError) as error:
        raise _fail(where, f"path template {template!r} cannot be formatted with {values}: {error!r}") from None
    return check_relpath(relpath, what=f"{where}: formatted path")


def _read_tasks(files: DatasetFiles) -> tuple[str, ...]:
    where = f"{files.description}/{TASKS_PATH}"
    if not files.exists(TASKS_PATH):
        raise FileNotFoundError(f"{where} not found (LeRobot v3.0 keeps task strings there).")
    with parquet_errors(where):
        table = pq.read_table(files.local_path(TASKS_PATH))
    for column in ("task", "task_index"):
        if column not in table.column_names:
            raise _fail(where, f"column {column!r} is missing (columns: {table.column_names})")
    by_index = dict(zip(table.column("task_index").to_pylist(), table.column("task").to_pylist()))
    if sorted(by_index) != list(range(len(by_index))):
        raise _fail(where, f"task_index values must be 0..{len(by_index) - 1}, got {sorted(by_index)}")
    return tuple(by_index[i] for i in range(len(by_index)))


def _read_episode_tables(files: DatasetFiles) -> list[tuple[str, pa.Table]]:
    relpaths = files.list_files(EPISODES_DIR, suffix=".parquet")
    if not relpaths:
        raise FileNotFoundError(f"{files.description}/{EPISODES_DIR}/ holds no parquet files "
                                f"(LeRobot v3.0 keeps one row per episode there).")
    tables = []
    for relpath in relpaths:
        path = files.local_path(relpath)
        with parquet_errors(f"{files.description}/{relpath}"):
            # Per-episode stats columns are many and unused here; skipping them keeps start-up fast.
            columns = [c for c in pq.read_schema(path).names if not c.startswith("stats/")]
            tables.append((relpath, pq.read_table(path, columns=columns)))
    return tables


def _int_column(table: pa.Table, name: str, where: str) -> np.ndarray:
    column = table.column(name)
    if not pa.types.is_integer(column.type):
        raise _fail(where, f"column {name!r} must hold integers, got {column.type}")
    if column.null_count:
        raise _fail(where, f"column {name!r} has {column.null_count} null value(s)")
    return column.to_numpy().astype(np.int64, copy=False)


def _check_episode_ranges(tables: list[tuple[str, pa.Table]], description: str) -> None:
    """Check every episode's row range at once, vectorised (datasets have up to ~100k episodes).

    LeRobot writes episodes' rows back to back: ``dataset_to_index - dataset_from_index == length``
    and, in episode order, each episode starts where the previous one ends. A range that overlaps
    or skips rows pairs one episode's rows with another's video, so refuse it here.
    """
    where_of = [f"{description}/{relpath}" for relpath, _ in tables]
    file_of = np.repeat(np.arange(len(tables)), [table.num_rows for _, table in tables])
    cols = {name: np.concatenate([_int_column(table, name, where) for (_, table), where in zip(tables, where_of)])
            for name in _RANGE_COLUMNS}
    episode, length = cols["episode_index"], cols["length"]
    start, end = cols["dataset_from_index"], cols["dataset_to_index"]
    bad = np.flatnonzero((length <= 0) | (end - start != length))
    if bad.size:
        k = bad[0]
        raise _fail(f"{where_of[file_of[k]]} (episode_index {episode[k]})",
                    f"length {length[k]} must be positive and equal dataset_to_index - dataset_from_index "
                    f"({end[k]} - {start[k]})")
    order = np.argsort(episode, kind="stable")
    twice = np.flatnonzero(episode[order][1:] == episode[order][:-1])
    if twice.size:
        k = order[twice[0] + 1]
        raise _fail(where_of[file_of[k]], f"episode_index {episode[k]} appears twice")
    gaps = np.flatnonzero(start[order][1:] != end[order][:-1])
    if gaps.size:
        prev, k = order[gaps[0]], order[gaps[0] + 1]
        raise _fail(f"{where_of[file_of[k]]} (episode_index {episode[k]})",
                    f"dataset_from_index {start[k]} is not where the previous episode ({episode[prev]}, "
                    f"{where_of[file_of[prev]]}) ends (dataset_to_index {end[prev]}); LeRobot writes episodes' "
                    f"rows back to back, so the ranges {'overlap' if start[k] < end[prev] else 'skip rows'}")


def _parse_episode(row: Mapping[str, Any], info: Mapping[str, Any], video_keys: list[str],
                   where: str) -> EpisodeInfo:
    # Ranges were checked for all episodes at once (_check_episode_ranges).
    ep = row["episode_index"]
    where = f"{where} (episode_index {ep})"
    length, start, end = row["length"], row["dataset_from_index"], row["dataset_to_index"]
    data_relpath = _format_path(info["data_path"], where, chunk_index=row["data/chunk_index"],
                                file_index=row["data/file_index"])
    videos = {}
    for key in video_keys:
        prefix = f"videos/{key}/"
        needed = [prefix + c for c in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")]
        absent = [c for c in needed if row.get(c) is None]
        if absent:
            raise _fail(where, f"columns {absent} are missing or null for video key {key!r}")
        relpath = _format_path(info["video_path"], where, video_key=key, chunk_index=row[needed[0]],
                               file_index=row[needed[1]])
        videos[key] = VideoSpan(relpath, float(row[needed[2]]), float(row[needed[3]]))
    return EpisodeInfo(ep, length, start, end, data_relpath, tuple(row.get("tasks") or ()), videos)


def load_metadata(files: DatasetFiles) -> DatasetMeta:
    """Read and validate a v3.0 dataset's metadata."""
    info = _read_info(files)
    features = _parse_features(info, f"{files.description}/{INFO_PATH}")
    video_keys = [k for k, f in features.items() if f.dtype == "video"]
    tables = _read_episode_tables(files)
    for relpath, table in tables:
        missing = [c for c in _EPISODE_COLUMNS if c not in table.column_names]
        if missing:
            raise _fail(f"{files.description}/{relpath}", f"columns {missing} are missing "
                                                         f"(columns: {table.column_names})")
    if not sum(table.num_rows for _, table in tables):
        raise _fail(f"{files.description}/{EPISODES_DIR}", "no episodes")
    _check_episode_ranges(tables, files.description)
    episodes: dict[int, EpisodeInfo] = {}
    data_file_rows: dict[str, int] = {}
    for relpath, table in tables:
        for row in table.to_pylist():
            episode = _parse_episode(row, info, video_keys, f"{files.description}/{relpath}")
            episodes[episode.episode_index] = episode
            data_file_rows[episode.data_relpath] = data_file_rows.get(episode.data_relpath, 0) + episode.length
    return DatasetMeta(description=files.description, fps=int(info["fps"]), features=features,
                       episodes=dict(sorted(episodes.items())), tasks=_read_tasks(files), info=info,
                       data_file_rows=data_file_rows)
