"""Reading an episode's rows: memory that must not grow with the episodes read."""

from __future__ import annotations

import pytest

from episodestream.testing.source_files import open_files, read_metadata, row_reader
from episodestream.tools.synthetic import write_tabular_dataset


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_reopening_big_footers_does_not_leak(tmp_path):
    # Two data files of 1,000 one-row-group episodes (a ~7 MB parsed footer each), read
    # alternately through a reader that keeps one file open, so every read reopens a footer.
    # pyarrow 26 leaked a whole footer per reopen when its ParquetSchema was touched: 40 reads
    # grew RSS by ~280 MB; now it stays within a few MB.
    root = write_tabular_dataset(tmp_path / "ds", num_episodes=2000, episode_length=2, episodes_per_data_file=1000)
    files = open_files(root)
    meta = read_metadata(files)
    reader = row_reader(files, meta, max_open_files=1)
    for index in (0, 1000):  # warm: allocator pools, imports
        reader.read(meta.episodes[index])
    before = _rss_mb()
    for k in range(40):
        rows = reader.read(meta.episodes[(k % 2) * 1000 + k])
        assert rows.columns["episode_index"][0] == (k % 2) * 1000 + k
    grown = _rss_mb() - before
    assert grown < 60, f"RSS grew by {grown:.0f} MB over 40 reads"


def test_row_group_statistics_are_read_once_per_file(tmp_path, monkeypatch):
    """An admission picks its row groups from the file's (min, max) index ranges, read from the
    footer once per file (not by a loop over every row group per admission), and reads exactly its
    own rows; a file closed to make room keeps its ranges for when it is reopened."""
    from episodestream._format import rows as rows_module

    root = write_tabular_dataset(tmp_path / "ds", num_episodes=40, episode_length=3, episodes_per_data_file=20)
    files = open_files(root)
    meta = read_metadata(files)
    calls: list[int] = []
    index_ranges = rows_module._index_ranges

    def counted(handle):
        calls.append(handle.metadata.num_row_groups)
        return index_ranges(handle)

    monkeypatch.setattr(rows_module, "_index_ranges", counted)
    reader = row_reader(files, meta, max_open_files=1)
    for index in (0, 7, 19, 3):  # one file
        rows = reader.read(meta.episodes[index])
        assert rows.columns["episode_index"].tolist() == [index] * 3
        assert rows.columns["index"].tolist() == list(range(meta.episodes[index].from_index,
                                                             meta.episodes[index].to_index))
    assert calls == [20]
    reader.read(meta.episodes[25])  # the other file: the first one is closed
    assert reader.read(meta.episodes[1]).columns["episode_index"].tolist() == [1] * 3  # reopened
    assert calls == [20, 20]


def test_held_rows_hold_no_arrow_memory(camera_less_root):
    """An episode's numeric columns are copied out of Arrow's buffers: a pool holds hundreds of
    episodes, and each view's few KB pinned Arrow's allocator pages of that read's temporary buffers
    (~80 MB of freed pages resident with 500 held episodes)."""
    import gc

    import pyarrow as pa

    files = open_files(camera_less_root)
    meta = read_metadata(files)
    reader = row_reader(files, meta)
    before = pa.total_allocated_bytes()
    held = [reader.read(meta.episodes.at(position)) for position in range(len(meta.episodes))]
    assert all(values.flags.owndata for rows in held for values in rows.columns.values())
    del reader  # its open files' buffers; the held rows stay
    gc.collect()
    assert pa.total_allocated_bytes() <= before
