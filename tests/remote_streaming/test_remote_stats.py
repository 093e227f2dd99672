"""``compute_stats()`` of a remote dataset: the same exact stats as the local folder's, read through
the node cache, and cached under the remote ``cache_dir`` for the next dataset."""

from __future__ import annotations

import numpy as np

from episodestream import EpisodeStreamingDataset
from episodestream.testing import FakeHub

from .conftest import REPO, remote_dataset


def test_remote_compute_stats_equal_the_local_folders_and_are_cached(hub_root, dataset_root, tmp_path):
    local = EpisodeStreamingDataset(dataset_root, episodes=[0, 2]).compute_stats()
    with FakeHub(hub_root) as hub:
        with remote_dataset(EpisodeStreamingDataset, REPO, cache_dir=tmp_path / "cache", hub_endpoint=hub.url,
                            token=False, episodes=[0, 2]) as dataset:
            remote = dataset.compute_stats()
        stats_files = sorted(p.name for p in (tmp_path / "cache").rglob("*") if "stats" in p.parts)
        assert stats_files, "the remote dataset's stats were not cached under its cache_dir"
        with remote_dataset(EpisodeStreamingDataset, REPO, cache_dir=tmp_path / "cache", hub_endpoint=hub.url,
                            token=False, episodes=[0, 2]) as dataset:
            again = dataset.compute_stats()
    assert sorted(remote) == sorted(local)
    for key in local:
        assert sorted(remote[key]) == sorted(local[key])
        for stat in local[key]:
            assert np.array_equal(remote[key][stat], local[key][stat]), (key, stat)
            assert np.array_equal(again[key][stat], local[key][stat]), (key, stat)
