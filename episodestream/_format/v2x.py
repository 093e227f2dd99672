"""LeRobot v2.0 / v2.1 metadata, read in place into the same ``DatasetMeta`` the v3.0 reader gives.

The v2.x layout (LeRobot 0.3.x; read from LeRobot's ``convert_dataset_v21_to_v30``) keeps one
parquet file and one mp4 per camera **per episode**, named by info.json's templates
(``data_path`` with ``{episode_chunk}`` and ``{episode_index}``, ``video_path`` with ``{video_key}``
too; ``episode_chunk = episode_index // chunks_size``), and JSON-lines metadata:
``meta/episodes.jsonl`` (``episode_index``, ``tasks``, ``length``) and ``meta/tasks.jsonl``
(``task_index``, ``task``). So an episode is its own data file (its ``length`` rows) and each camera
its own video file whose span runs from 0 to ``length / fps``; the global ``index`` of an episode's
first frame is the sum of the lengths before it, in episode order, as LeRobot's converter writes
``dataset_from_index``. Everything above ``_format`` then runs unchanged.

Episodes must be numbered 0..N-1, once each (LeRobot's converter numbers the episodes' files in
order, so a gap would pair one episode's rows with another's metadata). Every file the templates
name must exist: checked here against one listing of the template's top folder where that costs no
request (a local folder: ``DatasetFiles.knows_every_file``); a remote source is not listed beyond
``meta/`` (a 100k-episode repo holds 300k such files) and checks each episode's files when the
episode is admitted (its rows read, ``EpisodeVideos.check``), naming the file and the episode.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from episodestream._format.episodes import EpisodeTable, VideoColumns
from episodestream._format.files import DatasetFiles
from episodestream._format.metadata import INFO_PATH, DatasetMeta, fail, format_path, parse_features

V2_CODEBASE_VERSIONS = ("v2.0", "v2.1")
EPISODES_JSONL = "meta/episodes.jsonl"
TASKS_JSONL = "meta/tasks.jsonl"
DEFAULT_CHUNKS_SIZE = 1000  # LeRobot's, for an info.json that does not say


def read_jsonl(files: DatasetFiles, relpath: str, required: Sequence[str], *, why: str) -> list[dict[str, Any]]:
    """Every non-blank line of a JSON-lines file as a dict that has the ``required`` fields.

    Errors name the file and the line number; ``why`` says what the file holds (for a missing file).
    """
    where = f"{files.description}/{relpath}"
    if not files.exists(relpath):
        raise FileNotFoundError(f"{where} not found (LeRobot v2.x keeps {why} there).")
    try:
        text = files.read_bytes(relpath).decode("utf-8")
    except UnicodeDecodeError as error:
        raise fail(where, f"not UTF-8 text ({error})") from None
    lines = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue  # a trailing newline, or a blank line between records
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise fail(f"{where} line {number}", f"not valid JSON ({error}): {line[:80]!r}") from None
        if not isinstance(record, dict):
            raise fail(f"{where} line {number}", f"expected a JSON object, got {type(record).__name__}")
        missing = [name for name in required if name not in record]
        if missing:
            raise fail(f"{where} line {number}", f"field(s) {missing} are missing (fields: {sorted(record)})")
        lines.append({**record, "_line": number})
    return lines


def int_field(record: Mapping[str, Any], name: str, where: str, *, low: int) -> int:
    value = record[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise fail(f"{where} line {record['_line']}", f"field {name!r} must be an integer >= {low}, got {value!r}")
    return value


def _read_episodes(files: DatasetFiles, info: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, list[tuple[str, ...]]]:
    """episode_index (0..N-1, ascending), length and tasks of every episode in episodes.jsonl."""
    where = f"{files.description}/{EPISODES_JSONL}"
    records = read_jsonl(files, EPISODES_JSONL, ("episode_index", "length"), why="one line per episode")
    if not records:
        raise fail(where, "no episodes")
    episode = np.array([int_field(r, "episode_index", where, low=0) for r in records], np.int64)
    length = np.array([int_field(r, "length", where, low=1) for r in records], np.int64)
    tasks = []
    for record in records:
        value = record.get("tasks", [])
        if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
            raise fail(f"{where} line {record['_line']}", f"field 'tasks' must be a list of strings, got {value!r}")
        tasks.append(tuple(value))
    order = np.argsort(episode, kind="stable")
    twice = np.flatnonzero(episode[order][1:] == episode[order][:-1])
    if twice.size:
        k = order[twice[0] + 1]
        raise fail(f"{where} line {records[k]['_line']}", f"episode_index {episode[k]} appears twice")
    expected = info.get("total_episodes", len(records))
    expected = expected if isinstance(expected, int) and not isinstance(expected, bool) else len(records)
    found = set(episode.tolist())
    missing, extra = sorted(set(range(expected)) - found), sorted(found - set(range(expected)))
    if missing or extra:
        detail = (f"episode_index {missing[:8]} have no line" if missing else
                  f"episode_index {extra[:8]} are past the last episode")
        raise fail(where, f"{len(records)} episodes, but {files.description}/{INFO_PATH} says total_episodes "
                          f"{expected} and LeRobot v2.x numbers episodes 0..{expected - 1}: {detail}")
    return episode[order], length[order], [tasks[k] for k in order]


def _read_tasks(files: DatasetFiles) -> tuple[str, ...]:
    where = f"{files.description}/{TASKS_JSONL}"
    records = read_jsonl(files, TASKS_JSONL, ("task_index", "task"), why="the task strings")
    by_index = {}
    for record in records:
        index = int_field(record, "task_index", where, low=0)
        if not isinstance(record["task"], str) or index in by_index:
            raise fail(f"{where} line {record['_line']}", f"task_index {index} must appear once, with a string "
                                                         f"'task' (got {record['task']!r})")
        by_index[index] = record["task"]
    if sorted(by_index) != list(range(len(by_index))):
        raise fail(where, f"task_index values must be 0..{len(by_index) - 1}, got {sorted(by_index)}")
    return tuple(by_index[i] for i in range(len(by_index)))


def _chunks_size(info: Mapping[str, Any], where: str) -> int:
    value = info.get("chunks_size", DEFAULT_CHUNKS_SIZE)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise fail(where, f"field 'chunks_size' must be a positive integer, got {value!r}")
    return value


def _top_folder(template: str) -> str:
    """The folder above every file a template can name: its path up to the first field."""
    fixed = template.split("{", 1)[0]
    return fixed.rsplit("/", 1)[0] if "/" in fixed else ""


def _relpaths(files: DatasetFiles, template: str, field: str, episodes: np.ndarray, chunks_size: int,
              info_where: str, **fixed: Any) -> list[str]:
    """Each episode's file named by ``template``; every one must exist (one listing, then set look-ups)
    where the source knows its files, else checked when the episode is admitted."""
    relpaths = [format_path(template, f"{info_where} (field {field!r}, episode_index {e})",
                            episode_chunk=e // chunks_size, episode_index=e, **fixed) for e in episodes.tolist()]
    if not files.knows_every_file:
        return relpaths
    folder = _top_folder(template)
    if folder:
        suffix = "." + template.rsplit(".", 1)[-1] if "." in template.rsplit("/", 1)[-1] else ""
        present = set(files.list_files(folder, suffix=suffix))
        missing = [(e, p) for e, p in zip(episodes.tolist(), relpaths) if p not in present]
    else:  # a template that starts with a field: no folder to list, ask file by file
        missing = [(e, p) for e, p in zip(episodes.tolist(), relpaths) if not files.exists(p)]
    if missing:
        e, path = missing[0]
        raise FileNotFoundError(
            f"{info_where}: field {field!r} ({template!r}) names {files.description}/{path} for episode_index {e}, "
            f"which does not exist ({len(missing)} of the {len(relpaths)} files it names are missing)")
    return relpaths


def load_v2_metadata(files: DatasetFiles, info: Mapping[str, Any]) -> DatasetMeta:
    """A v2.0 / v2.1 dataset's metadata (``info``: its info.json, read by ``metadata.read_info``)."""
    info_where = f"{files.description}/{INFO_PATH}"
    if info["codebase_version"] not in V2_CODEBASE_VERSIONS:
        raise fail(info_where, f"field 'codebase_version' is {info['codebase_version']!r}; this reader reads "
                               f"{', '.join(map(repr, V2_CODEBASE_VERSIONS))} only")
    features = parse_features(info, info_where)
    fps, chunks_size = int(info["fps"]), _chunks_size(info, info_where)
    episode, length, episode_tasks = _read_episodes(files, info)
    ends = np.cumsum(length)
    data_relpaths = _relpaths(files, info["data_path"], "data_path", episode, chunks_size, info_where)
    videos = {}
    for key in [k for k, f in features.items() if f.dtype == "video"]:
        relpaths = _relpaths(files, info["video_path"], "video_path", episode, chunks_size, info_where, video_key=key)
        # Every v2.x mp4 holds one episode and starts at 0; ``to`` is where the converter's would end.
        videos[key] = VideoColumns(np.arange(len(episode)), tuple(relpaths), np.zeros(len(episode)), length / fps,
                                   whole_files=True)
    distinct: dict[tuple[str, ...], int] = {}
    task_id = np.array([distinct.setdefault(t, len(distinct)) for t in episode_tasks], np.int64)
    table = EpisodeTable(episode_index=episode, length=length, from_index=ends - length, to_index=ends,
                         data_file_id=np.arange(len(episode)), data_relpaths=data_relpaths, tasks=list(distinct),
                         task_id=task_id, videos=videos)
    return DatasetMeta(description=files.description, fps=fps, features=features, episodes=table,
                       tasks=_read_tasks(files), info=info,
                       data_file_rows=dict(zip(data_relpaths, length.tolist())), episodes_where=EPISODES_JSONL,
                       tasks_where=TASKS_JSONL, episodes_share_video_files=False)


def lerobot_episodes_table(meta: DatasetMeta) -> pa.Table:
    """``meta.episodes`` with the columns LeRobot's converter writes for v3.0 (stats left out, as
    LeRobot's ``load_episodes`` leaves them). The files are v2.x's own: ``data/chunk_index`` is the
    episode's chunk and ``data/file_index`` its ``episode_index`` (the file's number in its name);
    the same for each camera, whose span runs from 0 to ``length / fps`` in the episode's own mp4."""
    table = meta.episodes
    chunks_size = _chunks_size(meta.info, INFO_PATH)
    chunk = table.episode_index // chunks_size
    columns: dict[str, Any] = {
        "episode_index": table.episode_index, "data/chunk_index": chunk, "data/file_index": table.episode_index,
        "dataset_from_index": table.from_index, "dataset_to_index": table.to_index}
    for key in meta.video_keys:
        columns.update({f"videos/{key}/chunk_index": chunk, f"videos/{key}/file_index": table.episode_index,
                        f"videos/{key}/from_timestamp": np.zeros(len(table)),
                        f"videos/{key}/to_timestamp": table.length / meta.fps})
    columns["tasks"] = pa.array([list(e.tasks) for e in table.values()], pa.list_(pa.string()))
    columns["length"] = table.length
    columns["meta/episodes/chunk_index"] = np.zeros(len(table), np.int64)
    columns["meta/episodes/file_index"] = np.zeros(len(table), np.int64)
    return pa.table(columns)
