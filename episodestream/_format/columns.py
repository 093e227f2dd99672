"""A columnar copy of the tabular columns (Arrow IPC), for map-style random access.

Why: a random ``EpisodeDataset[i]`` almost never hits the few episodes a process keeps, and reading
an episode's parquet row group (footer lookup, decompression, decoding, filtering) capped random
access at a few dozen samples/s at 92,000 episodes, where LeRobot is many times faster with the
``datasets`` library's memory-mapped Arrow copy of the parquet files (benchmarks/LOG.md). We keep the idea (a
once-built uncompressed Arrow copy) with plain pyarrow rather than depend on ``datasets`` for it,
but read it with ``pread`` instead of a memory map: one record batch per episode, so an episode is
one read of its own rows (~20 KB). A memory map is as fast, but every page a sample touches maps
the kernel's fault-around window too (~1 MB a sample here), so each process's RSS climbs toward
the size of the whole copy (1.8 GB at 92,000 episodes) even though those pages are shared. With
reads, the bytes are shared by every process and DataLoader worker of the node in the OS page
cache, and a process holds only the episodes it is using.

Used for local sources only for now: for a remote source the copy would sit beside the node cache
(``remote/_cache``) without its budget, refcounts or ``cache clear``; joining it is future work.

Lifetime: built lazily, per data file, the first time a process needs one of its episodes; kept
under ``<cache_dir>/columns/``; reused by later runs while the source file is unchanged. The file
name carries a digest of (format version, dataset location, file, its size and, for local files,
its modification and change times and inode, the columns), so a changed source builds a new copy
and older copies of that file are deleted; a rewrite that keeps size and mtime (``cp -p``) still
changes the ctime. Two processes building the same file each write a temporary file and rename it
into place (atomic): the loser's rename replaces an identical file, and a reader never sees a
partial one. A cache folder that cannot be written (disk full, read-only) is not an error: the
store warns once and reads the parquet rows instead, as ``column_cache=False`` does.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pyarrow as pa

from episodestream._base.paths import default_cache_dir
from episodestream._base.warn import warn_user
from episodestream._format.files import DatasetFiles, LocalFiles
from episodestream._format.language import language_values
from episodestream._format.metadata import DatasetFormatError, DatasetMeta, EpisodeInfo, parquet_errors
from episodestream._format.dtypes import sample_values
from episodestream._format.rows import DEFAULT_TOLERANCE_S, EpisodeRows, RowReader, check_rows, frame_label

COLUMNS_FORMAT = 2  # bump when the layout of the cached files changes
_STARTS_KEY = b"episodestream.batch_first_index"  # schema metadata: each record batch's first index
_OPEN_FILES = 256  # open readers per process (a file descriptor and a parsed footer each; DROID has 92 files)


def default_columns_dir(cache_dir: str | os.PathLike | None) -> Path:
    """``<cache_dir>/columns``; ``cache_dir`` defaults as for remote sources (``EPISODESTREAM_CACHE_DIR``)."""
    if cache_dir is None:
        cache_dir = default_cache_dir()
    return Path(cache_dir).expanduser() / "columns"


class ColumnStore:
    """Reads episodes' rows from Arrow copies of the data files (``RowReader``'s
    interface and checks: the same ``EpisodeRows`` and the same errors for damaged files)."""

    def __init__(self, files: DatasetFiles, meta: DatasetMeta, columns_dir: Path, *,
                 tolerance_s: float = DEFAULT_TOLERANCE_S) -> None:
        self._files, self._meta, self._tolerance_s = files, meta, tolerance_s
        self._columns = [k for k, f in meta.features.items() if f.dtype != "video"]
        self._dir = columns_dir / _slug(files.description)
        self._reader = RowReader(files, meta, max_open_files=1)  # opens and checks a parquet to build
        # relpath -> (open reader, first ``index`` of each of its record batches), least recent first
        self._open: OrderedDict[str, tuple[pa.ipc.RecordBatchFileReader, np.ndarray]] = OrderedDict()
        self._parquet_rows = RowReader(files, meta, tolerance_s=tolerance_s)  # once a copy cannot be written
        self._unwritable = False

    def read(self, episode: EpisodeInfo) -> EpisodeRows:
        relpath = episode.data_relpath
        where = f"{self._files.description}/{relpath} (episode_index {episode.episode_index})"
        held = None if self._unwritable else self._reader_of(relpath, where)
        if held is None:  # the cache folder cannot be written: read the parquet rows as without a cache
            return self._parquet_rows.read(episode)
        reader, batch_starts = held
        k = max(0, int(np.searchsorted(batch_starts, episode.from_index, side="right")) - 1)
        batch = reader.get_batch(k)  # one pread of this episode's rows: a small private copy
        index = batch.column(self._columns.index("index")).to_numpy()
        lo, hi = np.searchsorted(index, [episode.from_index, episode.to_index])
        if hi - lo != episode.length:
            found = index[lo:hi]
            raise DatasetFormatError(self._reader.wrong_length_before(episode, where) or (
                f"{where}: expected {episode.length} rows with index {episode.from_index}..{episode.to_index - 1}, "
                f"found {len(found)}" + (f" ({found[0]}..{found[-1]})" if len(found) else "")))
        columns, strings = {}, {}
        for position, name in enumerate(self._columns):
            feature = self._meta.features[name]
            values = batch.column(position).slice(lo, hi - lo)
            if feature.dtype == "image":
                strings[name] = [v["bytes"] if isinstance(v, dict) else v for v in values.to_pylist()]
            elif feature.dtype == "string":
                strings[name] = values.to_pylist()
            elif feature.dtype == "language":
                strings[name] = language_values(values, name)
            else:
                columns[name] = sample_values(values, feature.dtype, feature.shape, f"{where}, column {name!r}",
                                               row_label=frame_label)
        check_rows(columns, episode, where, self._files, self._meta, self._tolerance_s)
        return EpisodeRows(episode, columns, strings)

    def _reader_of(self, relpath: str, where: str) -> tuple[pa.ipc.RecordBatchFileReader, np.ndarray] | None:
        """The open copy of ``relpath``, built if needed; None when it cannot be written."""
        held = self._open.pop(relpath, None)
        if held is None:
            path = self._dir / f"{_slug(relpath)}.{self._signature(relpath)}.arrow"
            if not path.exists() and not self._build(relpath, path, where):
                return None
            try:
                held = _open(path)
            except (pa.ArrowException, OSError, ValueError, KeyError):  # damaged outside us: build it again
                if not self._build(relpath, path, where):
                    return None
                held = _open(path)
            if len(self._open) >= _OPEN_FILES:
                self._open.popitem(last=False)
        self._open[relpath] = held
        return held

    def _signature(self, relpath: str) -> str:
        """A digest of what the copy depends on: a changed source file gets a new copy."""
        if isinstance(self._files, LocalFiles):
            stat = os.stat(self._files.local_path(relpath))
            # Size and mtime alone miss a rewrite that keeps both (``cp -p``, ``rsync -a``, a
            # writer that restores the mtime): the copy would serve the old file's rows. A rewrite
            # always sets a new ctime (utime itself does), and a replaced file has a new inode.
            version = [stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_ctime_ns]
        else:  # remote: the description pins the revision where the source has one (the Hub's commit)
            version = [self._files.size_bytes(relpath)]
        what = [COLUMNS_FORMAT, self._files.description, relpath, version, self._columns]
        return hashlib.sha1(json.dumps(what).encode()).hexdigest()[:16]

    def _build(self, relpath: str, path: Path, where: str) -> bool:
        """Write the copy of ``relpath`` at ``path``; False (after one warning) when the cache
        folder cannot be written, so that reads fall back to the parquet rows."""
        handle = self._reader._parquet(relpath, where)  # checks row count and column types (footer)
        with parquet_errors(where):
            table = handle.read(columns=self._columns)
        index = table.column("index").to_numpy()
        if len(index) > 1 and not (index[1:] >= index[:-1]).all():
            table = table.sort_by("index")
            index = table.column("index").to_numpy()
        # One record batch per episode (cut where the file's episodes start), so that reading an
        # episode is one pread of its own rows.
        episodes = self._meta.episodes
        file_id = episodes.data_relpaths.index(relpath) if relpath in episodes.data_relpaths else -1
        starts = np.sort(episodes.from_index[episodes.data_file_id == file_id])
        cuts = np.unique(np.concatenate([[0], np.searchsorted(index, starts), [len(index)]]))
        schema = table.schema.with_metadata({_STARTS_KEY: json.dumps(index[cuts[:-1]].tolist()).encode()})
        table = table.replace_schema_metadata(schema.metadata)
        try:
            _write_copy(table, cuts, schema, path)
        except OSError as error:
            # A full disk or a read-only cache folder: the copy is only a speed-up, so read the
            # parquet rows instead (as column_cache=False does) and say once how to get it back.
            self._unwritable = True
            warn_user(
                f"episodestream: cannot write the column cache under {self._dir} ({type(error).__name__}: "
                f"{error}); reading rows from the parquet files of {self._files.description} instead (slower "
                f"random access). Free space there, pass cache_dir= a writable folder, or column_cache=False "
                f"to not use the cache.", RuntimeWarning)
            return False
        stem = path.name.split(".")[0]
        with contextlib.suppress(OSError):  # a stale copy left behind costs only disk space
            for stale in path.parent.glob(f"{stem}.*.arrow"):  # copies of an older version of the file
                if stale != path:
                    stale.unlink(missing_ok=True)
        return True

    def close(self) -> None:
        self._open.clear()


def _write_copy(table: pa.Table, cuts: np.ndarray, schema: pa.Schema, path: Path) -> None:
    """Write ``table`` at ``path`` as one record batch per ``cuts`` range, atomically (a temporary
    file renamed into place: a reader never sees a partial copy)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    os.close(fd)
    try:
        with pa.OSFile(temporary, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            for lo, hi in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
                writer.write_batch(table.slice(lo, hi - lo).combine_chunks().to_batches()[0])
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _open(path: Path) -> tuple[pa.ipc.RecordBatchFileReader, np.ndarray]:
    reader = pa.ipc.open_file(pa.OSFile(str(path), "r"))
    starts = np.asarray(json.loads(reader.schema.metadata[_STARTS_KEY]), np.int64)
    if len(starts) != reader.num_record_batches:
        raise ValueError(f"{path}: {reader.num_record_batches} record batches for {len(starts)} starts")
    return reader, starts


def _slug(text: str) -> str:
    """A file or folder name that says what it holds, unique by a digest: no dots, so a copy's
    name splits into (what, signature) at its first dot."""
    readable = re.sub(r"[^A-Za-z0-9_-]+", "_", text).strip("_")[-80:]
    return f"{readable}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"
