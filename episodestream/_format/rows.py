"""An episode's tabular rows, read by row group, checked against the episode and held as numpy columns.

v3.0 writes one row group per episode, so admitting an episode reads only its own row group(s),
chosen from the ``index`` column statistics in the parquet footer, never the whole data file.
Checks are cheap and catch rows that belong to another episode or frame: a data file's row count
and column types when it is opened (footer only), and each episode's ids and timestamps when it is
admitted.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from episodestream._format.dtypes import sample_values, stores_numbers, value_type
from episodestream._format.files import DatasetFiles
from episodestream._format.language import is_language_type, language_values
from episodestream._format.metadata import INFO_PATH, DatasetFormatError, DatasetMeta, EpisodeInfo, parquet_errors

DEFAULT_TOLERANCE_S = 1e-4  # DatasetCore's default tolerance_s

# What a feature's values must be stored as, by declared dtype; numeric dtypes take ``_NUMERIC``.
_STORED_AS = {"image": ("binary or struct", lambda t: pa.types.is_struct(t) or pa.types.is_binary(t)
                        or pa.types.is_large_binary(t)),
              "string": ("string", lambda t: pa.types.is_string(t) or pa.types.is_large_string(t)),
              "language": ("a list of structs", is_language_type)}
_WHOLE_TYPE = ("image", "language")  # checked as stored, not by the values inside its lists
_NUMERIC = ("numbers or bools (in lists, or datasets' ArrayND columns, for shaped features)", stores_numbers)


@dataclass(frozen=True)
class EpisodeRows:
    """All rows of one episode. ``columns[k][i]`` is frame ``i``'s value of feature ``k``."""

    episode: EpisodeInfo
    columns: dict[str, np.ndarray]  # numeric: (length,) for scalar columns, (length, *shape) for lists
    strings: dict[str, list]  # string features, image features as PNG bytes, language rows: per frame

    @property
    def length(self) -> int:
        return self.episode.length


class RowReader:
    """Reads episodes' rows; keeps a few parquet footers open so admitting an episode is one read."""

    def __init__(self, files: DatasetFiles, meta: DatasetMeta, *, max_open_files: int = 8,
                 max_open_row_groups: int = 1024, tolerance_s: float = DEFAULT_TOLERANCE_S) -> None:
        self._files = files
        self._meta = meta
        self._tolerance_s = tolerance_s  # how far a row's timestamp may be from frame_index / fps
        self._max_open_files = max_open_files
        # A parsed footer costs ~7 KB per row group, and v3.0 writes one row group per episode: 8
        # open files of 1,000 episodes would hold ~56 MB per consumer (DROID-sized datasets). Keep
        # at most this many row groups' footers open (and always the file being read).
        self._max_open_row_groups = max_open_row_groups
        self._open: OrderedDict[str, pq.ParquetFile] = OrderedDict()
        self._open_row_groups = 0
        # Per data file: each row group's ``index`` (min, max) from its statistics, read once (an
        # admission then picks its row groups with one numpy comparison, not a loop over the
        # footer: v3.0 writes a row group per episode); None where the statistics cannot say.
        # Kept after the file is closed (16 bytes a row group, where its footer costs ~7 KB): a
        # reopened file's ranges cost a third of its reopening otherwise.
        self._index_ranges: dict[str, tuple[np.ndarray, np.ndarray] | None] = {}
        self._columns = [k for k, f in meta.features.items() if f.dtype != "video"]

    def _parquet(self, relpath: str, where: str, episode_index: int | None = None) -> pq.ParquetFile:
        handle = self._open.pop(relpath, None)
        if handle is None:
            if not self._files.exists(relpath):
                whose = "" if episode_index is None else f" (episode_index {episode_index} has its rows there)"
                raise FileNotFoundError(f"Data file {self._files.description}/{relpath} is missing{whose}.")
            with parquet_errors(where):
                handle = pq.ParquetFile(self._files.open_input(relpath))
            self._check_file(relpath, handle)
            self._open_row_groups += handle.metadata.num_row_groups
        self._open[relpath] = handle
        while len(self._open) > 1 and (len(self._open) > self._max_open_files
                                       or self._open_row_groups > self._max_open_row_groups):
            _, closed = self._open.popitem(last=False)
            self._open_row_groups -= closed.metadata.num_row_groups
        return handle

    def _check_file(self, relpath: str, handle: pq.ParquetFile) -> None:
        """What the footer alone can tell: the file's row count and its feature columns' types."""
        where = f"{self._files.description}/{relpath}"
        check_file_rows(self._files, self._meta, relpath, handle.metadata.num_rows)
        schema = handle.schema_arrow
        missing = [c for c in self._columns if c not in schema.names]
        if missing:
            raise DatasetFormatError(f"{where}: feature columns {missing} are missing")
        for name in self._columns:
            dtype = self._meta.features[name].dtype
            stored_as, ok = _STORED_AS.get(dtype, _NUMERIC)
            found = schema.field(name).type
            # Numbers are checked through lists and ArrayND wrappers by ``stores_numbers`` itself.
            if not ok(found if dtype in _WHOLE_TYPE or dtype not in _STORED_AS else value_type(found)):
                raise DatasetFormatError(f"{where}: column {name!r} is stored as {found}, but info.json declares "
                                         f"dtype {dtype!r} (stored as {stored_as})")

    def _row_groups(self, relpath: str, handle: pq.ParquetFile, episode: EpisodeInfo) -> list[int]:
        """Row groups whose ``index`` range overlaps the episode's; all of them when stats are absent."""
        if relpath not in self._index_ranges:
            self._index_ranges[relpath] = _index_ranges(handle)
        ranges = self._index_ranges[relpath]
        if ranges is None:
            return list(range(handle.metadata.num_row_groups))
        mins, maxs = ranges
        return np.flatnonzero((mins < episode.to_index) & (maxs >= episode.from_index)).tolist()

    def read(self, episode: EpisodeInfo) -> EpisodeRows:
        relpath = episode.data_relpath
        where = f"{self._files.description}/{relpath} (episode_index {episode.episode_index})"
        if not self._files.knows_every_file:  # the episode's files in one look-up, whoever asks first
            self._files.look_up([relpath, *(video.relpath for video in episode.videos.values())])
        handle = self._parquet(relpath, where, episode.episode_index)
        with parquet_errors(where):
            table = handle.read_row_groups(self._row_groups(relpath, handle, episode), columns=self._columns)
        index = table.column("index")
        mask = pc.and_(pc.greater_equal(index, episode.from_index), pc.less(index, episode.to_index))
        return self._episode_rows(table.filter(mask).sort_by("index"), episode, where)

    def read_many(self, episodes: list[EpisodeInfo]) -> list[EpisodeRows]:
        """The rows of several episodes of one data file, in one read of their row groups.

        Why: a pool of a whole share first emits from thousands of episodes within its first
        batches, in random order across the data files; read one by one, each read reopened a file
        whose footer the reader could not keep open (a parsed footer's size grows with the file's
        row groups), a cost paid per episode (benchmarks/LOG.md, "Rows of a wide pool at
        DROID-like data files"). Read with their file's other pooled episodes, a file is opened
        once. The caller reads them alone when this raises, so an error names its own episode."""
        relpath = episodes[0].data_relpath
        where = f"{self._files.description}/{relpath}"
        if not self._files.knows_every_file:
            self._files.look_up([relpath, *(v.relpath for e in episodes for v in e.videos.values())])
        handle = self._parquet(relpath, where, episodes[0].episode_index)
        groups = sorted({g for e in episodes for g in self._row_groups(relpath, handle, e)})
        if len(groups) > 1:
            # The row groups' bytes in as few requests as their gaps allow, where reads cross a
            # link: pyarrow asks for each row group's chunks apart, a round trip per row group.
            self._files.read_ahead(relpath, lambda: _row_group_bytes(handle, groups))
        with parquet_errors(where):
            table = handle.read_row_groups(groups, columns=self._columns).sort_by("index")
        index = table.column("index").to_numpy()
        out = []
        for episode in episodes:
            lo, hi = (int(v) for v in np.searchsorted(index, [episode.from_index, episode.to_index]))
            out.append(self._episode_rows(table.slice(lo, hi - lo), episode,
                                          f"{where} (episode_index {episode.episode_index})"))
        return out

    def _episode_rows(self, table: pa.Table, episode: EpisodeInfo, where: str) -> EpisodeRows:
        """``table`` (the episode's rows, sorted by ``index``) checked and made an ``EpisodeRows``."""
        found = table.column("index").to_numpy()
        if len(found) != episode.length or (len(found) and (found[0] != episode.from_index or
                                                            found[-1] != episode.to_index - 1)):
            raise DatasetFormatError(self.wrong_length_before(episode, where) or (
                f"{where}: expected {episode.length} rows with index {episode.from_index}..{episode.to_index - 1}, "
                f"found {len(found)}" + (f" ({found[0]}..{found[-1]})" if len(found) else "")))
        columns, strings = {}, {}
        for name in self._columns:
            feature = self._meta.features[name]
            if feature.dtype == "image":
                values = table.column(name).to_pylist()
                strings[name] = [v["bytes"] if isinstance(v, dict) else v for v in values]
            elif feature.dtype == "string":
                strings[name] = table.column(name).to_pylist()
            elif feature.dtype == "language":
                strings[name] = language_values(table.column(name), name)
            else:
                # Copied out of Arrow's memory where it is a view: a held episode's few KB would
                # otherwise pin the allocator pages of each read's temporary buffers, and a wide
                # pool's hundreds of held episodes kept ~80 MB of freed pages (mimalloc, Arrow's
                # default pool) resident per consumer.
                columns[name] = np.require(sample_values(table.column(name), feature.dtype, feature.shape,
                                                         f"{where}, column {name!r}",
                                                         row_label=frame_label), requirements="O")
        check_rows(columns, episode, where, self._files, self._meta, self._tolerance_s)
        return EpisodeRows(episode, columns, strings)


    def _first_index(self, position: int) -> tuple[int, int] | None:
        """The first ``index`` in the data file of the episode at ``position`` and the file's row
        count (from the footer when its statistics say), or None when the file cannot tell."""
        relpath = self._meta.episodes.at(position).data_relpath
        if not self._files.knows_every_file:
            self._files.look_up([relpath])
        try:
            if not self._files.exists(relpath):
                return None
            with pq.ParquetFile(self._files.open_input(relpath)) as handle:
                ranges = _index_ranges(handle)
                if ranges is None:
                    ranges = (handle.read(columns=["index"]).column("index").to_numpy(),) * 2
                return (int(ranges[0].min()), handle.metadata.num_rows) if len(ranges[0]) else None
        except (OSError, ValueError, KeyError, pa.ArrowException):
            return None  # only an error's wording depends on it: the caller's own message stands

    def wrong_length_before(self, episode: EpisodeInfo, where: str) -> str | None:
        """Where each episode has a data file of its own (v2.x), an episode whose file holds its
        ``length`` rows but starts at another ``index`` than the lengths before it add up to is
        not at fault: some earlier ``length`` is. The first episode whose file starts off is found
        by bisection (log2(episodes) footers, remote too) and the one before it named, else None."""
        table = self._meta.episodes
        if len(self._meta.data_file_rows) != len(table) or self._meta.data_file_rows.get(
                episode.data_relpath) != episode.length:
            return None
        high = table.position(episode.episode_index)
        found, first = self._first_index(high), self._first_index(0)
        if found is None or found[0] == episode.from_index or high == 0 or first is None \
                or first[0] != int(table.from_index[0]):
            return None  # the first episode's rows start elsewhere too: the index column itself is off
        low = 0  # its rows start where the lengths say; the episode at ``high``'s do not
        while high - low > 1:
            middle = (low + high) // 2
            first = self._first_index(middle)
            if first is None:
                return None
            if first[0] == int(table.from_index[middle]):
                low = middle
            else:
                high = middle
        culprit = table.at(low)
        rows = self._first_index(low)
        if rows is None or rows[1] == culprit.length:
            return None  # consistent on its own: not one wrong length, do not guess
        return (f"{where}: its rows start at index {found[0]}, not {episode.from_index} as the lengths before it in "
                f"{self._meta.episodes_where} say: episode {culprit.episode_index} is listed with length "
                f"{culprit.length} there, but its data file {self._files.description}/{culprit.data_relpath} holds "
                f"{rows[1]} rows. Correct that episode's 'length' in {self._meta.episodes_where} (every later "
                f"episode's index counts from it).")


def check_file_rows(files: DatasetFiles, meta: DatasetMeta, relpath: str, num_rows: int) -> None:
    """A data file holds its episodes' rows, the sum of their ``length`` (its footer's count)."""
    expected = meta.data_file_rows.get(relpath)
    if expected is not None and num_rows != expected:
        episodes = [e.episode_index for e in meta.episodes.values() if e.data_relpath == relpath]
        raise DatasetFormatError(
            f"{files.description}/{relpath}: holds {num_rows} rows, but its episodes in {meta.episodes_where} "
            f"({_preview(episodes)}) have {expected} frames in all (sum of their 'length')")


def _row_group_bytes(handle: pq.ParquetFile, groups: list[int]) -> list[tuple[int, int]]:
    """The byte range of each of ``groups`` (its column chunks', dictionary pages included)."""
    metadata = handle.metadata
    ranges = []
    for g in groups:
        row_group = metadata.row_group(g)
        starts, ends = [], []
        for c in range(row_group.num_columns):
            column = row_group.column(c)
            start = column.data_page_offset
            if column.has_dictionary_page and column.dictionary_page_offset:
                start = min(start, column.dictionary_page_offset)
            starts.append(start)
            ends.append(start + column.total_compressed_size)
        if starts:
            ranges.append((min(starts), max(ends)))
    return ranges


def _index_ranges(handle: pq.ParquetFile) -> tuple[np.ndarray, np.ndarray] | None:
    """Each row group's (min, max) ``index`` from the footer's statistics; None when a row group
    has none (or ``index`` is nested in a list), so that every row group must be read."""
    # Statistics are per parquet leaf column, not per arrow field: a struct (an image) before
    # ``index`` has two leaves, so the arrow field position would read another column's stats.
    # The leaf is found by ``path_in_schema``, not through ``metadata.schema``: in pyarrow 26 a
    # ParquetSchema leaks its whole footer when the file is closed (~7 MB for a file of 1,000
    # row groups: a streaming consumer grew by ~24 MB per 1,000 samples at 92,000 episodes).
    metadata = handle.metadata
    if metadata.num_row_groups == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    first = metadata.row_group(0)
    index_pos = next((c for c in range(first.num_columns) if first.column(c).path_in_schema == "index"), None)
    if index_pos is None:
        return None
    mins, maxs = [], []
    for g in range(metadata.num_row_groups):
        stats = metadata.row_group(g).column(index_pos).statistics
        if stats is None or not stats.has_min_max:
            return None
        mins.append(stats.min)
        maxs.append(stats.max)
    return np.asarray(mins, dtype=np.int64), np.asarray(maxs, dtype=np.int64)


def check_rows(columns: dict[str, np.ndarray], episode: EpisodeInfo, where: str, files: DatasetFiles,
               meta: DatasetMeta, tolerance_s: float) -> None:
    """The checks every admitted episode's rows pass, whichever store they were read from."""
    _check_ids(columns, episode, where)
    _check_timestamps(columns["timestamp"].reshape(episode.length), episode, where,
                      f"{files.description}/{INFO_PATH}", meta.fps, tolerance_s)


def _check_timestamps(got: np.ndarray, episode: EpisodeInfo, where: str, info_where: str, fps: int,
                      tolerance_s: float) -> None:
    """Row ``f``'s ``timestamp`` must be ``f / fps`` within ``tolerance_s``: a sample's video frames
    are looked up by it, so a timestamp that is off (or an info.json fps that is not the data's)
    gives another frame's image, or a decode error far from its cause."""
    n = len(got)
    expected = np.arange(n) / fps
    # LeRobot stores frame_index / fps as float32, whose rounding passes 1e-4 after ~1,000 s:
    # allow one float32 step on top of the tolerance.
    allowed = tolerance_s + np.spacing(expected.astype(np.float32)).astype(np.float64)
    bad = np.flatnonzero(~(np.abs(got.astype(np.float64) - expected) <= allowed))  # NaN is bad too
    if not bad.size:
        return
    k = bad[0]
    steps = np.diff(got.astype(np.float64))
    step = float(np.median(steps)) if n > 1 else 0.0
    hint = ""
    if step > 0 and abs(step * fps - 1) > 1e-3:
        hint = (f"; its timestamps step by {step:.6g} s ({1 / step:.6g} fps), but {info_where} says fps {fps}: "
                f"is that fps the data's?")
    raise DatasetFormatError(
        f"{where}: row {k} of the episode (frame_index {k}) has timestamp {float(got[k])!r}, expected "
        f"frame_index / fps = {expected[k]:.6g} s within tolerance_s={tolerance_s} ({bad.size} of its {n} rows "
        f"differ){hint}. Video frames are found by timestamp, so these rows would get other frames' images; "
        f"if the timestamps are capture times that jitter, pass a larger tolerance_s.")


def _check_ids(columns: dict[str, np.ndarray], episode: EpisodeInfo, where: str) -> None:
    """Every row must say it is this episode's next frame; a duplicated, misplaced or renumbered
    row would otherwise pair one frame's values with another frame's video, silently."""
    n = episode.length
    expected = {"index": episode.from_index + np.arange(n), "episode_index": np.full(n, episode.episode_index),
                "frame_index": np.arange(n)}
    for name, want in expected.items():
        got = columns[name].reshape(n)
        bad = np.flatnonzero(got != want)
        if bad.size:
            k = bad[0]
            raise DatasetFormatError(
                f"{where}: row {k} of the episode (sorted by index) has {name} {got[k]}, expected {want[k]} "
                f"({bad.size} of its {n} rows differ; rows must be the episode's frames 0..{n - 1} with index "
                f"{episode.from_index}..{episode.to_index - 1}, each once)")


def _preview(values: list, limit: int = 8) -> str:
    shown = ", ".join(map(str, values[:limit]))
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")


def frame_label(row: int) -> str:
    """An episode's row, as errors name it (its rows are read in ``index`` order)."""
    return f"frame {row}"
