"""LeRobot v3.0 metadata as plain, validated data.

Reads ``meta/info.json``, the episodes parquet files and ``meta/tasks.parquet`` once, checks them
(row ranges here, video spans in ``video_spans``), and exposes what the rest of the library needs:
features, per-episode row ranges, data files and per-camera video spans. Errors name the file, the
field and the value.
"""

from __future__ import annotations

import json
import string
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from episodestream._format.depth import is_depth
from episodestream._format.dtypes import READABLE_DTYPES, not_supported
from episodestream._format.episodes import EpisodeInfo, EpisodeTable, VideoColumns, VideoSpan  # noqa: F401  (re-exported)
from episodestream._format.files import DatasetFiles, check_relpath
from episodestream._base.errors import DatasetFormatError  # noqa: F401  (re-exported: the format's error)
from episodestream._format.video_spans import check_video_spans

SUPPORTED_CODEBASE_VERSION = "v3.0"
# What ``read_info`` accepts; the v2.x layout is read by ``_format.v2x`` (``_format.versions`` picks).
READABLE_CODEBASE_VERSIONS = ("v2.0", "v2.1", SUPPORTED_CODEBASE_VERSION)
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


@dataclass(frozen=True)
class Feature:
    name: str
    dtype: str
    shape: tuple[int, ...]
    info: Mapping[str, Any] = field(default_factory=dict)
    depth: bool = False  # a depth map (``_format.depth``): float32 (1, H, W) in the output unit


@dataclass(frozen=True)
class DatasetMeta:
    description: str
    fps: int
    features: Mapping[str, Feature]
    episodes: EpisodeTable  # a Mapping[int, EpisodeInfo] by episode_index, ascending, held as columns
    tasks: tuple[str, ...]  # task string by task_index
    info: Mapping[str, Any]
    # Rows each data file must hold: the sum of its episodes' lengths (checked when it is opened).
    data_file_rows: Mapping[str, int] = field(default_factory=dict)
    # Where the episodes' lengths were read from, for errors ("meta/episodes", "meta/episodes.jsonl").
    episodes_where: str = EPISODES_DIR
    # Where the task strings were read from, for errors ("meta/tasks.parquet", "meta/tasks.jsonl").
    tasks_where: str = TASKS_PATH
    # Whether episodes share video files (v3.0) or each has files of its own (v2.x). Decode groups
    # read it: frames of one file share a decoder call, so one-file-per-episode layouts need
    # larger groups for the same calls per frame (``default_decode_group_size``).
    episodes_share_video_files: bool = True
    # v3.0: the episodes files' rows as read here (no ``stats/`` columns), by episode_index, for
    # ``meta.episodes`` (``versions.load_lerobot_episodes``), so that a dataset reads them once.
    episode_rows: pa.Table | None = field(default=None, repr=False, compare=False)

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
    def depth_keys(self) -> list[str]:
        """The cameras that are depth maps (video or image), as LeRobot's ``meta.depth_keys``."""
        return [k for k, f in self.features.items() if f.depth]

    @property
    def total_frames(self) -> int:
        return self.episodes.total_frames


def fail(where: str, message: str) -> DatasetFormatError:
    """The format's error, ``where: message`` (``where`` names the file, and the episode or line)."""
    return DatasetFormatError(f"{where}: {message}")


_fail = fail  # the name this module's own checks use


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


def read_info(files: DatasetFiles) -> dict[str, Any]:
    """``meta/info.json`` with the fields every readable version shares checked (``codebase_version``
    one of ``READABLE_CODEBASE_VERSIONS``, ``fps``, ``data_path``, ``features``)."""
    where = f"{files.description}/{INFO_PATH}"
    if not files.exists(INFO_PATH):
        # Pointing at the meta folder itself (it holds info.json) is the usual slip: say which folder.
        inside = (" It looks like a dataset's meta folder: pass the dataset's root, the folder above it."
                  if files.description.rstrip("/").rsplit("/", 1)[-1] == "meta" else "")
        raise FileNotFoundError(f"{where} not found: {files.description} is not a LeRobot dataset "
                                f"(every LeRobot dataset, v2.0 to v3.0, has {INFO_PATH}).{inside}")
    try:
        info = json.loads(files.read_bytes(INFO_PATH))
    except json.JSONDecodeError as error:
        raise _fail(where, f"not valid JSON ({error})") from None
    if not isinstance(info, dict):
        raise _fail(where, f"expected a JSON object, got {type(info).__name__}")
    version = info.get("codebase_version")
    if version not in READABLE_CODEBASE_VERSIONS:
        raise _fail(where, f"field 'codebase_version' is {version!r}; episodestream reads "
                           f"{', '.join(map(repr, READABLE_CODEBASE_VERSIONS))} datasets (convert older ones "
                           f"to v2.1 or v3.0 with LeRobot's conversion scripts)")
    fps = info.get("fps")
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or fps <= 0 or int(fps) != fps:
        raise _fail(where, f"field 'fps' must be a positive integer, got {fps!r}")
    for key in ("data_path", "features"):
        if key not in info:
            raise _fail(where, f"required field {key!r} is missing")
    if not isinstance(info["data_path"], str):
        raise _fail(where, f"field 'data_path' must be a path template string, got {info['data_path']!r}")
    for key in ("data_path", "video_path"):
        if isinstance(info.get(key), str):
            _check_template(where, key, info[key])
    return info


def _template_fields(template: str) -> list[str]:
    """The field names of ``template``, those nested in a format spec (``{file_index:{width}}``) too."""
    fields = []
    for _, name, spec, _ in string.Formatter().parse(template):
        if name is not None:
            fields += [name, *_template_fields(spec or "")]
    return fields


def _check_template(where: str, key: str, template: str) -> None:
    """A path template names its fields only: ``{chunk_index.foo}`` or ``{chunk_index[0]}`` reach into
    the values (a bare AttributeError, far from info.json), and a dataset's file has no business
    doing that to our objects."""
    try:
        fields = _template_fields(template)
    except ValueError as error:
        raise _fail(where, f"field {key!r} ({template!r}) is not a valid path template: {error}") from None
    reaching = [name for name in fields if "." in name or "[" in name]
    if reaching:
        raise _fail(where, f"field {key!r} ({template!r}) uses attribute or index access ({reaching[0]!r}); a path "
                           f"template names its fields only, as LeRobot writes them "
                           f"(e.g. 'data/chunk-{{chunk_index:03d}}/file-{{file_index:03d}}.parquet')")


def parse_features(info: Mapping[str, Any], where: str) -> dict[str, Feature]:
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
        if spec["dtype"] not in READABLE_DTYPES:
            raise not_supported(name, spec["dtype"], where)
        features[name] = Feature(name, str(spec["dtype"]), tuple(shape), dict(spec.get("info") or {}),
                                 depth=spec["dtype"] in ("video", "image") and is_depth(spec.get("info"),
                                                                                      spec.get("video_info")))
    missing = [name for name in REQUIRED_FEATURES if name not in features]
    if missing:
        raise _fail(where, f"features {missing} are missing (every LeRobot dataset has {list(REQUIRED_FEATURES)})")
    if any(f.dtype == "video" for f in features.values()) and not isinstance(info.get("video_path"), str):
        raise _fail(where, f"field 'video_path' must be a path template when there are video features, "
                           f"got {info.get('video_path')!r}")
    return features


def format_path(template: str, where: str, **values: Any) -> str:
    """``template`` formatted with ``values``, as a checked dataset-relative path; errors say ``where``."""
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
        # One footer parse; pq.read_table goes through the dataset machinery, slower for a small file.
        with pq.ParquetFile(files.local_path(TASKS_PATH)) as parquet:
            table = parquet.read()
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
        with parquet_errors(f"{files.description}/{relpath}"):
            tables.append((relpath, read_episodes_file(files.local_path(relpath))))
    return tables


def read_episodes_file(path: str) -> pa.Table:
    """An episodes parquet file without its per-episode ``stats/`` columns: they are many and
    unused here, and skipping them keeps start-up fast. One open parses the footer once
    (``pq.read_schema`` then ``pq.read_table`` parsed it twice, in every dataset construction)."""
    with pq.ParquetFile(path) as parquet:
        return parquet.read(columns=[c for c in parquet.schema_arrow.names if not c.startswith("stats/")])


def _int_column(table: pa.Table, name: str, where: str) -> np.ndarray:
    column = table.column(name)
    if not pa.types.is_integer(column.type):
        raise _fail(where, f"column {name!r} must hold integers, got {column.type}")
    if column.null_count:
        raise _fail(where, f"column {name!r} has {column.null_count} null value(s)")
    return column.to_numpy().astype(np.int64, copy=False)


def _check_episode_ranges(tables: list[tuple[str, pa.Table]], description: str) -> dict[str, np.ndarray]:
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
    return cols


def _row_where(tables: list[tuple[str, pa.Table]], description: str, row: int, episode: int) -> str:
    """``file (episode_index e)`` for row ``row`` of the concatenated episodes tables."""
    for relpath, table in tables:
        if row < table.num_rows:
            return f"{description}/{relpath} (episode_index {episode})"
        row -= table.num_rows
    return f"{description}/{EPISODES_DIR} (episode_index {episode})"


def _column(tables: list[tuple[str, pa.Table]], name: str) -> pa.ChunkedArray | None:
    if not all(name in table.column_names for _, table in tables):
        return None
    types = {table.schema.field(name).type for _, table in tables}
    if len(types) > 1:  # files written by different LeRobot versions: int32 in one, int64 in another
        return pa.concat_tables([table.select([name]) for _, table in tables],
                                promote_options="permissive").column(name)
    return pa.chunked_array([chunk for _, table in tables for chunk in table.column(name).chunks],
                            type=tables[0][1].schema.field(name).type)


def _file_ids(tables, template: str, description: str, episodes: np.ndarray, names: dict[str, str],
              **fixed: Any) -> tuple[np.ndarray, list[str]]:
    """Each episode's file as an id into the distinct formatted paths: the template is formatted
    once per distinct (chunk, file), not once per episode. ``names`` maps template fields to columns."""
    columns = {field: _column(tables, column) for field, column in names.items()}
    nulls = [field for field, column in columns.items() if column is None or column.null_count]
    if nulls:  # format the first such row as it is, so that the error names what is wrong
        row = min(int(np.flatnonzero(columns[f].is_null().to_numpy(zero_copy_only=False))[0])
                  if columns[f] is not None else 0 for f in nulls)
        values = {f: (c[row].as_py() if c is not None else None) for f, c in columns.items()}
        format_path(template, _row_where(tables, description, row, int(episodes[row])), **fixed, **values)
    ints = {field: column.to_numpy() for field, column in columns.items()}
    keys = np.stack([ints[f] for f in names], axis=1) if len(episodes) else np.zeros((0, len(names)), np.int64)
    distinct, first, ids = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    relpaths = [format_path(template, _row_where(tables, description, int(row), int(episodes[row])), **fixed,
                             **{f: v.item() for f, v in zip(names, key)})
                for key, row in zip(distinct, first)]
    return ids.reshape(-1), relpaths


def _episode_table(tables: list[tuple[str, pa.Table]], info: Mapping[str, Any], video_keys: list[str],
                   description: str, ranges: dict[str, np.ndarray]) -> EpisodeTable:
    episodes = ranges["episode_index"]
    data_ids, data_relpaths = _file_ids(tables, info["data_path"], description, episodes,
                                        {"chunk_index": "data/chunk_index", "file_index": "data/file_index"})
    videos = {}
    for key in video_keys:
        prefix = f"videos/{key}/"
        needed = [prefix + c for c in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")]
        columns = {c: _column(tables, c) for c in needed}
        absent = [c for c in needed if columns[c] is None]
        null_rows = [int(np.flatnonzero(columns[c].is_null().to_numpy(zero_copy_only=False))[0])
                     for c in needed if columns[c] is not None and columns[c].null_count]
        if absent or null_rows:
            row = min(null_rows, default=0)
            nulls = absent + [c for c in needed if columns[c] is not None and not columns[c][row].is_valid]
            raise _fail(_row_where(tables, description, row, int(episodes[row])),
                        f"columns {nulls} are missing or null for video key {key!r}")
        ids, relpaths = _file_ids(tables, info["video_path"], description, episodes,
                                  {"chunk_index": needed[0], "file_index": needed[1]}, video_key=key)
        videos[key] = VideoColumns(ids, tuple(relpaths), columns[needed[2]].to_numpy().astype(np.float64),
                                   columns[needed[3]].to_numpy().astype(np.float64))
        check_video_spans(key, videos[key], ranges["length"], int(info["fps"]), episodes,
                          lambda row: _row_where(tables, description, row, int(episodes[row])), description,
                          f"{description}/{INFO_PATH}")
    tasks_column = _column(tables, "tasks")
    distinct_tasks: dict[tuple[str, ...], int] = {}
    if tasks_column is None:
        task_id = np.zeros(len(episodes), np.int64)
        distinct_tasks[()] = 0
    else:
        task_id = np.fromiter((distinct_tasks.setdefault(tuple(t or ()), len(distinct_tasks))
                               for t in tasks_column.to_pylist()), np.int64, len(episodes))
    return EpisodeTable(episode_index=episodes, length=ranges["length"], from_index=ranges["dataset_from_index"],
                        to_index=ranges["dataset_to_index"], data_file_id=data_ids, data_relpaths=data_relpaths,
                        tasks=list(distinct_tasks), task_id=task_id, videos=videos)


def load_metadata(files: DatasetFiles, info: Mapping[str, Any] | None = None) -> DatasetMeta:
    """Read and validate a v3.0 dataset's metadata (``info``: its info.json, when read already).

    ``_format.versions.load_metadata`` reads any readable version; this one refuses the others.
    """
    info = read_info(files) if info is None else info
    if info["codebase_version"] != SUPPORTED_CODEBASE_VERSION:
        raise _fail(f"{files.description}/{INFO_PATH}", f"field 'codebase_version' is "
                                                        f"{info['codebase_version']!r}; this reader reads "
                                                        f"{SUPPORTED_CODEBASE_VERSION!r} only")
    features = parse_features(info, f"{files.description}/{INFO_PATH}")
    video_keys = [k for k, f in features.items() if f.dtype == "video"]
    tables = _read_episode_tables(files)
    for relpath, table in tables:
        missing = [c for c in _EPISODE_COLUMNS if c not in table.column_names]
        if missing:
            raise _fail(f"{files.description}/{relpath}", f"columns {missing} are missing "
                                                         f"(columns: {table.column_names})")
    if not sum(table.num_rows for _, table in tables):
        raise _fail(f"{files.description}/{EPISODES_DIR}", "no episodes")
    ranges = _check_episode_ranges(tables, files.description)
    episodes = _episode_table(tables, info, video_keys, files.description, ranges)
    rows = np.bincount(episodes.data_file_id, weights=episodes.length, minlength=len(episodes.data_relpaths))
    data_file_rows = {relpath: int(n) for relpath, n in zip(episodes.data_relpaths, rows)}
    # Files written by different LeRobot versions may differ in column types (int32 vs int64).
    episode_rows = pa.concat_tables([table for _, table in tables], promote_options="permissive")
    return DatasetMeta(description=files.description, fps=int(info["fps"]), features=features,
                       episodes=episodes, tasks=_read_tasks(files), info=info, data_file_rows=data_file_rows,
                       episode_rows=episode_rows.sort_by("episode_index"))
