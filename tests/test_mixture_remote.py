"""A mixture of a local folder and remote sources (a loopback HTTP server): the same samples as the
all-local mixture, and remote components given one cache_dir share that node cache."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from episodestream import EpisodeMixture, EpisodeStreamingDataset
from episodestream.tools.synthetic import write_synthetic_dataset
from episodestream.testing import HttpServer, faults

CAMERA = "observation.images.front"
STREAM = dict(episode_pool_size=2, prefetch_episodes=1, decode_group_size=3)


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    """A tabular dataset served over HTTP next to a local one, and two small video datasets."""
    base = tmp_path_factory.mktemp("mixture-remote")
    return {"a": write_synthetic_dataset(base / "a", num_episodes=5, episode_length=(5, 10), cameras=(), seed=1),
            "b": write_synthetic_dataset(base / "b", num_episodes=4, episode_length=(5, 10), cameras=(), seed=2),
            "v1": write_synthetic_dataset(base / "v1", num_episodes=4, episode_length=(4, 8), cameras=(CAMERA,),
                                          seed=3),
            "v2": write_synthetic_dataset(base / "v2", num_episodes=3, episode_length=(4, 8), cameras=(CAMERA,),
                                          seed=4)}


@pytest.fixture(scope="module")
def server(roots, tmp_path_factory):
    served = tmp_path_factory.mktemp("served")
    for name in ("b", "v1", "v2"):
        shutil.copytree(roots[name], served / name)
    with HttpServer(served) as running:
        yield running


def _same(got, expected):
    assert len(got) == len(expected) > 0
    for a, b in zip(got, expected):
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(a[key], torch.Tensor):
                assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
            else:
                assert a[key] == b[key], key


def test_local_and_remote_components_mix_as_all_local(roots, server, tmp_path):
    expected = list(EpisodeMixture([EpisodeStreamingDataset(roots["a"], **STREAM),
                                    EpisodeStreamingDataset(roots["b"], **STREAM)], [0.3, 0.7], seed=2))
    remote = EpisodeStreamingDataset(server.url_for("b"), cache_dir=tmp_path / "cache", **STREAM)
    mixture = EpisodeMixture([EpisodeStreamingDataset(roots["a"], **STREAM), remote], [0.3, 0.7], seed=2)
    try:
        _same(list(mixture), expected)
    finally:
        mixture.close()


def test_remote_components_share_one_cache_dir_and_prefetch(roots, server, tmp_path):
    cache = tmp_path / "cache"
    expected = list(EpisodeMixture([EpisodeStreamingDataset(roots["v1"], **STREAM),
                                    EpisodeStreamingDataset(roots["v2"], **STREAM)], seed=5))
    datasets = [EpisodeStreamingDataset(server.url_for(name), cache_dir=cache, **STREAM) for name in ("v1", "v2")]
    mixture = EpisodeMixture(datasets, seed=5)
    try:
        for dataset in datasets:  # remote video is fetched on admit, ahead of the pool's need
            videos = faults.open_episode_videos(dataset)
            assert videos.prefetches
            videos.close()
        _same(list(mixture), expected)
        # One node cache: both sources' entries under the one folder, one budget lock for it.
        files = [p.relative_to(cache).as_posix() for p in Path(cache).rglob("*") if p.is_file()]
        folders = {p.split("/")[0] for p in files if "/" in p}
        assert [f.split("_")[-1][:2] for f in sorted(folders)] == ["v1", "v2"], folders
        assert datasets[0].node_cache_dir == datasets[1].node_cache_dir == cache
    finally:
        mixture.close()
