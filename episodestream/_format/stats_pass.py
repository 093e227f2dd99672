"""One pass over a selection's data files: its tabular columns as numpy, and their exact statistics, cached.

Why not LeRobot's ``stats.json``: it covers the whole dataset (not the ``episodes=`` a user trains
on) and its quantiles are approximations (``_format.exact_stats``). Cameras are left out: exact
image statistics would mean decoding every frame; ``stats.json`` keeps LeRobot's sampled ones.

The pass reads each data file holding a selected episode once (only the numeric feature columns,
one ``read`` per file), keeps the selected episodes' rows and computes ``exact_stats`` per feature.
Results are cached as JSON under ``<cache_dir>/stats/``, named by a digest of what they depend on:
the dataset's location and revision, the selected episodes, the features, and each data file's
version (size, mtime, inode and ctime for a local file, as ``_format.columns``; the size for a
remote one, whose description pins the revision). A cache folder that cannot be written is not an
error: one warning, and the stats are recomputed next time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from episodestream._base.paths import default_cache_dir
from episodestream._base.warn import warn_user
from episodestream._format.episodes import EpisodeSelection
from episodestream._format.exact_stats import feature_stats
from episodestream._format.files import DatasetFiles, LocalFiles
from episodestream._format.metadata import DatasetFormatError, DatasetMeta, parquet_errors
from episodestream._format.dtypes import sample_values
from episodestream._format.rows import check_file_rows

STATS_CACHE_FORMAT = 1  # bump when the cached files' layout or the statistics' definition change
Progress = Callable[[int], None]  # called with the rows just read


def stat_keys(meta: DatasetMeta) -> list[str]:
    """The features whose statistics come from the tabular columns: numbers and bools (not
    cameras, not strings)."""
    return [key for key, f in meta.features.items() if f.dtype not in ("video", "image", "string", "language")]


def _file_ranges(selection: EpisodeSelection) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per data file id: the selected episodes' ``[from_index, to_index)`` ranges, sorted."""
    table = selection._table
    rows = selection.rows
    file_ids = table.data_file_id[rows]
    out = {}
    for file_id in np.unique(file_ids).tolist():
        mine = rows[file_ids == file_id]
        order = np.argsort(table.from_index[mine], kind="stable")
        out[file_id] = (table.from_index[mine][order], table.to_index[mine][order])
    return out


READ_THREADS = 2  # data files decoded at once: a file's 1,000 row groups decode on one core


def read_columns(files: DatasetFiles, meta: DatasetMeta, selection: EpisodeSelection, keys: Sequence[str], *,
                 progress: Progress | None = None) -> dict[str, np.ndarray]:
    """The selected episodes' rows of ``keys`` as ``{key: (rows, *shape)}`` numpy arrays (file by
    file, in each file's row order). A file whose rows do not match meta/episodes is an error that
    names it."""
    table = selection._table
    wanted = list(dict.fromkeys([*keys, "index"]))

    def read_file(item: tuple[int, tuple[np.ndarray, np.ndarray]]) -> tuple[int, dict[str, np.ndarray]]:
        file_id, (starts, ends) = item
        relpath = table.data_relpaths[file_id]
        where = f"{files.description}/{relpath}"
        if not files.exists(relpath):
            raise FileNotFoundError(f"Data file {where} is missing.")
        with parquet_errors(where):
            handle = pq.ParquetFile(files.open_input(relpath))
            # As streaming: a file must hold its episodes' lengths, or the index filter below
            # would keep the listed count of rows of a file that holds another (v2.x: one episode).
            check_file_rows(files, meta, relpath, handle.metadata.num_rows)
            missing = [k for k in wanted if k not in handle.schema_arrow.names]
            if missing:
                raise DatasetFormatError(f"{where}: feature columns {missing} are missing")
            # use_threads=False: the files are read READ_THREADS at a time already, and pyarrow's
            # own pool per file only adds hand-offs (0.33 s against 0.40 s a file of 1,000 row groups).
            data = handle.read(columns=wanted, use_threads=False)
        index = data.column("index").to_numpy()
        expected = int((ends - starts).sum())
        if len(index) != expected:
            at = np.searchsorted(starts, index, side="right") - 1
            keep = (at >= 0) & (index < ends[np.maximum(at, 0)])
            if int(keep.sum()) != expected:
                raise DatasetFormatError(f"{where}: {int(keep.sum())} rows have the index of a selected episode, "
                                         f"but meta/episodes gives those episodes {expected} frames")
            data = data.filter(pa.array(keep))

        def row_label(row: int) -> str:  # only for an error: the row's episode, looked up then
            at_index, rows = int(data.column("index")[row].as_py()), selection.rows
            at = rows[(table.from_index[rows] <= at_index) & (table.to_index[rows] > at_index)][0]
            return f"episode_index {table.episode_index[at]}, frame {at_index - table.from_index[at]}"

        return expected, {key: sample_values(data.column(key), meta.features[key].dtype, meta.features[key].shape,
                                             f"{where}, column {key!r}", as_sample=False, row_label=row_label)
                          for key in keys}

    parts: dict[str, list[np.ndarray]] = {key: [] for key in keys}
    ranges = _file_ranges(selection)
    files.look_up(table.data_relpaths[file_id] for file_id in ranges)  # one request, not one per file
    with ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="episodestream-stats") as pool:
        for rows, columns in pool.map(read_file, ranges.items()):
            for key in keys:
                parts[key].append(columns[key])
            if progress is not None:
                progress(rows)
    return {key: np.concatenate(chunks) if len(chunks) != 1 else chunks[0] for key, chunks in parts.items()}


def compute_exact_stats(files: DatasetFiles, meta: DatasetMeta, selection: EpisodeSelection, *,
                        progress: Progress | None = None) -> dict[str, dict[str, np.ndarray]]:
    """Exact statistics of every tabular feature over the selected episodes (``exact_stats``)."""
    keys = stat_keys(meta)
    columns = read_columns(files, meta, selection, keys, progress=progress)
    out = {}
    for key in keys:
        values = columns.pop(key)  # freed once its statistics are taken
        stats = feature_stats(values, meta.features[key].shape)
        if not (np.isfinite(stats["mean"]).all() and np.isfinite(stats["std"]).all()):
            raise DatasetFormatError(_not_finite(files, meta, selection, key, values))
        out[key] = stats
    return out


def _not_finite(files: DatasetFiles, meta: DatasetMeta, selection: EpisodeSelection, key: str,
                values: np.ndarray) -> str:
    row = int(np.flatnonzero(~np.isfinite(values.reshape(len(values), -1).astype(np.float64)).all(axis=1))[0])
    lengths = selection.lengths
    position = int(np.searchsorted(np.cumsum(lengths), row, side="right"))
    episode = selection[position]
    frame = row - int(np.cumsum(lengths)[position] - lengths[position])
    return (f"{files.description}/{episode.data_relpath} (episode_index {episode.episode_index}) frame {frame}: "
            f"{key!r} is {values[row].tolist()!r}, not finite; its statistics cannot be computed")


# -- the cache ------------------------------------------------------------------------------------

def default_stats_dir(cache_dir: str | os.PathLike | None) -> Path:
    """``<cache_dir>/stats``; ``cache_dir`` defaults as for remote sources (``EPISODESTREAM_CACHE_DIR``)."""
    return Path(cache_dir if cache_dir is not None else default_cache_dir()).expanduser() / "stats"


def stats_cache_key(files: DatasetFiles, meta: DatasetMeta, selection: EpisodeSelection, *,
                    revision: str | None) -> str:
    """A digest of everything the statistics depend on (see the module docstring)."""
    table = selection._table
    versions = []
    file_ids = np.unique(table.data_file_id[selection.rows]).tolist()
    files.look_up(table.data_relpaths[file_id] for file_id in file_ids)
    for file_id in file_ids:
        relpath = table.data_relpaths[file_id]
        if isinstance(files, LocalFiles):
            stat = os.stat(files.local_path(relpath))
            versions.append([relpath, stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_ctime_ns])
        else:
            versions.append([relpath, files.size_bytes(relpath)])
    episodes = hashlib.sha1(np.ascontiguousarray(selection.episode_indices, np.int64).tobytes()).hexdigest()
    features = {k: [f.dtype, list(f.shape)] for k, f in meta.features.items()}
    what = [STATS_CACHE_FORMAT, files.description, revision, episodes, features, versions]
    return hashlib.sha1(json.dumps(what).encode()).hexdigest()[:20]


def _to_json(stats: dict[str, dict[str, np.ndarray]]) -> dict:
    return {key: {name: value.tolist() for name, value in entry.items()} for key, entry in stats.items()}


def _from_json(raw: dict) -> dict[str, dict[str, np.ndarray]]:
    return {key: {name: np.array(value, np.int64 if name == "count" else np.float64) for name, value in entry.items()}
            for key, entry in raw.items()}


def read_stats_file(path: Path) -> dict[str, dict[str, np.ndarray]] | None:
    """Statistics written by ``write_stats_file``; None when absent or damaged (then computed again)."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
        raw = json.loads(path.read_text())
        if raw["format"] == STATS_CACHE_FORMAT:
            return _from_json(raw["stats"])
    return None


def write_stats_file(path: Path, stats: dict[str, dict[str, np.ndarray]], **about) -> None:
    """Keep ``stats`` at ``path`` (atomically: a reader never sees a partial file); a folder that
    cannot be written gives one warning, not an error."""
    payload = json.dumps({"format": STATS_CACHE_FORMAT, **about, "stats": _to_json(stats)})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(payload)
            os.replace(temporary, path)
        finally:
            Path(temporary).unlink(missing_ok=True)  # gone already once renamed
    except OSError as error:
        warn_user(f"episodestream: cannot write the stats cache under {path.parent} ({type(error).__name__}: "
                      f"{error}); the statistics will be computed again next time. Pass cache_dir= a writable "
                      f"folder to keep them.", RuntimeWarning)


def cached_stats(path: Path | None, compute: Callable[[], dict[str, dict[str, np.ndarray]]],
                 **about: Any) -> dict[str, dict[str, np.ndarray]]:
    """Statistics read from ``path`` when computed before, else ``compute()``'s, kept there with
    ``about`` (what they describe); ``path`` None: no cache."""
    stats = read_stats_file(path) if path is not None else None
    if stats is None:
        stats = compute()
        if path is not None:
            write_stats_file(path, stats, **about)
    return stats


def cached_exact_stats(files: DatasetFiles, meta: DatasetMeta, selection: EpisodeSelection, *,
                       revision: str | None, stats_dir: Path | None,
                       progress: Progress | None = None) -> dict[str, dict[str, np.ndarray]]:
    """``compute_exact_stats``, read from ``stats_dir`` when computed before (None: no cache)."""
    path = (stats_dir / f"{stats_cache_key(files, meta, selection, revision=revision)}.json"
            if stats_dir is not None else None)
    return cached_stats(path, lambda: compute_exact_stats(files, meta, selection, progress=progress),
                        source=files.description, episodes=len(selection))
