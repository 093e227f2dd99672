"""Reading an episode's rows: memory that must not grow with the episodes read."""

from __future__ import annotations

import pytest

from episodestream._format.metadata import load_metadata
from episodestream._format.rows import RowReader
from episodestream._runtime.sources import open_source
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
    files = open_source(root, revision=None)
    meta = load_metadata(files)
    reader = RowReader(files, meta, max_open_files=1)
    for index in (0, 1000):  # warm: allocator pools, imports
        reader.read(meta.episodes[index])
    before = _rss_mb()
    for k in range(40):
        rows = reader.read(meta.episodes[(k % 2) * 1000 + k])
        assert rows.columns["episode_index"][0] == (k % 2) * 1000 + k
    grown = _rss_mb() - before
    assert grown < 60, f"RSS grew by {grown:.0f} MB over 40 reads"
