"""An episode's tabular rows, read by row group and held as numpy columns.

v3.0 writes one row group per episode, so admitting an episode reads only its own row group(s),
chosen from the ``index`` column statistics in the parquet footer, never the whole data file.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ._files import DatasetFiles
from ._metadata import DatasetFormatError, DatasetMeta, EpisodeInfo


@dataclass(frozen=True)
class EpisodeRows:
    """All rows of one episode. ``columns[k][i]`` is frame ``i``'s value of feature ``k``."""

    episode: EpisodeInfo
    columns: dict[str, np.ndarray]  # numeric: (length,) for scalar columns, (length, *shape) for lists
    strings: dict[str, list]  # string features, and image features as PNG bytes per frame

    @property
    def length(self) -> int:
        return self.episode.length

    @property
    def size_bytes(self) -> int:
        return sum(a.nbytes for a in self.columns.values()) + sum(
            len(v) for values in self.strings.values() for v in values if isinstance(v, (bytes, str)))


def _to_numpy(column: pa.ChunkedArray, shape: tuple[int, ...], where: str) -> np.ndarray:
    array = column.combine_chunks()
    if array.null_count:
        raise DatasetFormatError(f"{where}: {array.null_count} null value(s)")
    if not pa.types.is_list(array.type) and not pa.types.is_fixed_size_list(array.type) \
            and not pa.types.is_large_list(array.type):
        return array.to_numpy(zero_copy_only=False)
    rows = len(array)
    while pa.types.is_list(array.type) or pa.types.is_fixed_size_list(array.type) \
            or pa.types.is_large_list(array.type):
        array = array.flatten()
    flat = array.to_numpy(zero_copy_only=False)
    if flat.size != rows * int(np.prod(shape)):
        raise DatasetFormatError(f"{where}: {flat.size} values for {rows} rows do not fit the declared "
                                 f"shape {list(shape)}")
    return flat.reshape((rows, *shape))


class RowReader:
    """Reads episodes' rows; keeps a few parquet footers open so admitting an episode is one read."""

    def __init__(self, files: DatasetFiles, meta: DatasetMeta, *, max_open_files: int = 8) -> None:
        self._files = files
        self._meta = meta
        self._max_open_files = max_open_files
        self._open: OrderedDict[str, pq.ParquetFile] = OrderedDict()
        self._columns = [k for k, f in meta.features.items() if f.dtype != "video"]

    def _parquet(self, relpath: str) -> pq.ParquetFile:
        handle = self._open.pop(relpath, None)
        if handle is None:
            if not self._files.exists(relpath):
                raise FileNotFoundError(f"Data file {self._files.description}/{relpath} is missing.")
            handle = pq.ParquetFile(self._files.open_input(relpath))
            if len(self._open) >= self._max_open_files:
                self._open.popitem(last=False)
        self._open[relpath] = handle
        return handle

    def _row_groups(self, handle: pq.ParquetFile, episode: EpisodeInfo) -> list[int]:
        """Row groups whose ``index`` range overlaps the episode's; all of them when stats are absent."""
        index_pos = handle.schema_arrow.get_field_index("index")
        groups = []
        for g in range(handle.metadata.num_row_groups):
            stats = handle.metadata.row_group(g).column(index_pos).statistics
            if stats is None or not stats.has_min_max:
                return list(range(handle.metadata.num_row_groups))
            if stats.min < episode.to_index and stats.max >= episode.from_index:
                groups.append(g)
        return groups

    def read(self, episode: EpisodeInfo) -> EpisodeRows:
        relpath = episode.data_relpath
        where = f"{self._files.description}/{relpath} (episode_index {episode.episode_index})"
        handle = self._parquet(relpath)
        missing = [c for c in self._columns if c not in handle.schema_arrow.names]
        if missing:
            raise DatasetFormatError(f"{where}: feature columns {missing} are missing")
        table = handle.read_row_groups(self._row_groups(handle, episode), columns=self._columns)
        index = table.column("index")
        mask = pc.and_(pc.greater_equal(index, episode.from_index), pc.less(index, episode.to_index))
        table = table.filter(mask).sort_by("index")
        found = table.column("index").to_numpy()
        if len(found) != episode.length or (len(found) and (found[0] != episode.from_index or
                                                            found[-1] != episode.to_index - 1)):
            raise DatasetFormatError(
                f"{where}: expected {episode.length} rows with index {episode.from_index}..{episode.to_index - 1}, "
                f"found {len(found)}" + (f" ({found[0]}..{found[-1]})" if len(found) else ""))
        columns, strings = {}, {}
        for name in self._columns:
            feature = self._meta.features[name]
            if feature.dtype == "image":
                values = table.column(name).to_pylist()
                strings[name] = [v["bytes"] if isinstance(v, dict) else v for v in values]
            elif feature.dtype == "string":
                strings[name] = table.column(name).to_pylist()
            else:
                columns[name] = _to_numpy(table.column(name), feature.shape, f"{where}, column {name!r}")
        return EpisodeRows(episode, columns, strings)
