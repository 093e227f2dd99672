"""The map-style column cache: same samples as the parquet rows, built once, reused, rebuilt when
the source changes, and safe when several processes build it at once."""

from __future__ import annotations

import errno
import multiprocessing
import os
import tempfile
import warnings

import numpy as np
import pyarrow as pa
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


def _rewrite_uncompressed(path, add: float) -> None:
    """Rewrite a data file in place (same inode) with ``observation.state + add``: no compression
    and no dictionary, so other values keep the file's size byte for byte."""
    table = pq.read_table(path)
    state = table.column("observation.state").combine_chunks()
    changed = table.set_column(table.schema.get_field_index("observation.state"), "observation.state",
                               type(state).from_arrays(np.asarray(state.flatten()) + add, state.type.list_size))
    pq.write_table(changed, path, compression="none", use_dictionary=False, write_statistics=["index"])


def test_a_rewrite_keeping_size_and_mtime_rebuilds_the_copy(tabular_root, tmp_path):
    # What `cp -p` or `rsync -a` of a regenerated file looks like: the same size and mtime.
    path = tabular_root / "data/chunk-000/file-001.parquet"
    _rewrite_uncompressed(path, 0.0)
    before = path.stat()
    cache = tmp_path / "cache"
    first = EpisodeDataset(tabular_root, cache_dir=cache)
    expected = [first[i]["observation.state"] for i in range(len(first))]
    _rewrite_uncompressed(path, 1.0)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    fresh = EpisodeDataset(tabular_root, cache_dir=cache)
    plain = EpisodeDataset(tabular_root, column_cache=False)
    changed = 0
    for i in range(len(fresh)):
        assert torch.equal(fresh[i]["observation.state"], plain[i]["observation.state"]), i
        changed += not torch.equal(fresh[i]["observation.state"], expected[i])
    assert changed > 0  # the rewritten file's rows, not the old copy's


def _unwritable(monkeypatch, cache, error: OSError) -> None:
    """Make writing a copy under ``cache`` fail with ``error`` (tests run as root: chmod cannot)."""
    real_mkstemp, real_osfile = tempfile.mkstemp, pa.OSFile
    if error.errno == errno.ENOSPC:  # the folder and the temporary file can be made; the bytes cannot
        def osfile(path, mode="r", *args, **kwargs):
            if "w" in mode and str(path).startswith(str(cache)):
                raise error
            return real_osfile(path, mode, *args, **kwargs)
        monkeypatch.setattr(pa, "OSFile", osfile)
    else:  # a read-only folder: no file can be created in it
        def mkstemp(*args, dir=None, **kwargs):
            if dir is not None and str(dir).startswith(str(cache)):
                raise error
            return real_mkstemp(*args, dir=dir, **kwargs)
        monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
                                   PermissionError(errno.EACCES, os.strerror(errno.EACCES))],
                         ids=["disk_full", "read_only_folder"])
def test_an_unwritable_cache_falls_back_to_parquet_reads_with_one_warning(tabular_root, tmp_path, monkeypatch,
                                                                           error):
    cache = tmp_path / "cache"
    _unwritable(monkeypatch, cache, error)
    dataset = EpisodeDataset(tabular_root, delta_timestamps=WINDOW, cache_dir=cache)
    plain = EpisodeDataset(tabular_root, delta_timestamps=WINDOW, column_cache=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(0, len(dataset), 5):  # every data file
            _same(dataset[i], plain[i])
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1, messages
    assert str(cache / "columns") in messages[0] and os.strerror(error.errno) in messages[0]
    assert "cache_dir=" in messages[0] and "column_cache=False" in messages[0]
    assert not _copies(cache) and not [p for p in cache.rglob("*") if p.is_file()]
