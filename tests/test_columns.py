"""The map-style column cache: same samples as the parquet rows, built once, reused, rebuilt when
the source changes, and safe when several processes build it at once."""

from __future__ import annotations

import multiprocessing
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from episodestream import EpisodeDataset
from episodestream.tools.synthetic import write_tabular_dataset

WINDOW = {"action": [k / 30 for k in range(-2, 5)], "observation.state": [-0.1, 0.0]}


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


@pytest.fixture
def tabular_root(tmp_path):
    return write_tabular_dataset(tmp_path / "ds", num_episodes=40, episode_length=(3, 30), episodes_per_data_file=15)


def _copies(cache_dir) -> list:
    return sorted(p for p in (cache_dir / "columns").rglob("*.arrow"))


def test_samples_equal_parquet_rows_with_videos_and_images(dataset_root, tmp_path):
    cached = EpisodeDataset(dataset_root, delta_timestamps={"action": [-0.1, 0.0, 0.1]}, cache_dir=tmp_path)
    plain = EpisodeDataset(dataset_root, delta_timestamps={"action": [-0.1, 0.0, 0.1]}, column_cache=False)
    for i in np.random.default_rng(0).integers(len(plain), size=25).tolist() + [0, len(plain) - 1]:
        _same(cached[i], plain[i])
    assert len(_copies(tmp_path)) == 3  # one per data file touched (the fixture has 3)


def test_built_once_reused_and_rebuilt_when_the_source_changes(tabular_root, tmp_path):
    cache = tmp_path / "cache"
    first = EpisodeDataset(tabular_root, delta_timestamps=WINDOW, cache_dir=cache)
    expected = [first[i] for i in range(len(first))]
    copies = _copies(cache)
    assert len(copies) == 3
    stamps = [p.stat().st_mtime_ns for p in copies]
    again = EpisodeDataset(tabular_root, delta_timestamps=WINDOW, cache_dir=cache)
    for i in range(0, len(again), 7):
        _same(again[i], expected[i])
    assert _copies(cache) == copies and [p.stat().st_mtime_ns for p in copies] == stamps  # reused, not rebuilt

    # Rewrite one data file with other values: its copy is rebuilt (and the old one removed).
    path = tabular_root / "data/chunk-000/file-001.parquet"
    table = pq.read_table(path)
    state = table.column("observation.state").combine_chunks()
    changed = table.set_column(table.schema.get_field_index("observation.state"), "observation.state",
                               type(state).from_arrays(np.asarray(state.flatten()) + 1, state.type.list_size))
    pq.write_table(changed, path, row_group_size=10**6)
    os.utime(path, ns=(1, 1))  # a different modification time, whatever the clock's resolution
    fresh = EpisodeDataset(tabular_root, delta_timestamps=WINDOW, cache_dir=cache)
    episodes = pq.read_table(tabular_root / "meta/episodes/chunk-000/file-000.parquet").to_pydict()
    first = episodes["dataset_from_index"][episodes["episode_index"].index(20)]  # episode 20 is in file-001
    item = fresh[first]
    assert item["observation.state"][-1][0].item() == expected[first]["observation.state"][-1][0].item() + 1
    assert len(_copies(cache)) == 3 and _copies(cache) != copies


def _read_all(args) -> list:
    root, cache = args
    dataset = EpisodeDataset(root, cache_dir=cache)
    return [dataset[i]["observation.state"].tolist() for i in range(len(dataset))]


def test_processes_building_at_once_agree(tabular_root, tmp_path):
    cache = tmp_path / "cache"
    # Two processes race to build the same copies. Forked: they start within a millisecond of each
    # other (a tighter race than spawned ones, which first spent ~2 s each importing torch).
    with multiprocessing.get_context("fork").Pool(2) as pool:
        results = pool.map(_read_all, [(str(tabular_root), str(cache))] * 2)
    plain = EpisodeDataset(tabular_root, column_cache=False)
    expected = [plain[i]["observation.state"].tolist() for i in range(len(plain))]
    assert all(result == expected for result in results)
    assert len(_copies(cache)) == 3 and not list((cache / "columns").rglob("*.tmp-*"))


def test_a_damaged_copy_is_rebuilt(tabular_root, tmp_path):
    cache = tmp_path / "cache"
    EpisodeDataset(tabular_root, cache_dir=cache)[0]
    (copy,) = _copies(cache)
    copy.write_bytes(b"not arrow")
    _same(EpisodeDataset(tabular_root, cache_dir=cache)[0], EpisodeDataset(tabular_root, column_cache=False)[0])


def test_column_cache_must_be_a_bool(tabular_root):
    with pytest.raises(TypeError, match="column_cache"):
        EpisodeDataset(tabular_root, column_cache="yes")
