"""A LeRobot v2.1 repo on a FakeHub streams end to end: the local folder's samples exactly, each
episode's files fetched once, on admit, at most 1.1x the bytes of the episodes' own files."""

from __future__ import annotations

import shutil

import pytest

from episodestream import EpisodeDataset, EpisodeStreamingDataset
from episodestream.testing import FakeHub
from episodestream.tools.synthetic import write_synthetic_dataset

from ..conftest import built_once
from ..test_v2x import COMMON, WINDOWS
from .conftest import assert_same_samples, cache_files, remote_dataset

V21_REPO = "lerobot/v21"
STREAM = dict(seed=5, episode_pool_size=2, prefetch_episodes=2, delta_timestamps=WINDOWS)


@pytest.fixture(scope="module")
def v21_hub(tmp_path_factory):
    root = built_once(tmp_path_factory, "v2x-remote-v21",
                      lambda root: write_synthetic_dataset(root, version="v2.1", **COMMON))
    hub = tmp_path_factory.mktemp("hub-v21")
    shutil.copytree(root, hub / "datasets" / V21_REPO)
    return root, hub


def test_v21_repo_streams_with_bounded_bytes(v21_hub, tmp_path):
    local_root, hub_root = v21_hub
    expected = list(EpisodeStreamingDataset(local_root, **STREAM))
    with FakeHub(hub_root) as hub, remote_dataset(EpisodeStreamingDataset, V21_REPO, cache_dir=tmp_path / "cache",
                                                  hub_endpoint=hub.url, token=False, **STREAM) as dataset:
        assert dataset.meta.info["codebase_version"] == "v2.1"
        hub.reset_stats()  # what streaming costs, after the metadata the constructor read
        got = list(dataset)
        stats = hub.stats()
    assert_same_samples(got, expected)
    assert cache_files(tmp_path / "cache") == []
    episode_files = [p for p in local_root.rglob("*") if p.is_file() and p.parts[-2] != "meta"
                     and p.suffix in (".parquet", ".mp4")]
    own_bytes = sum(p.stat().st_size for p in episode_files)
    fetched = {key: s for key, s in stats.by_file.items() if key.startswith(V21_REPO)}
    assert all(not key.endswith((".jsonl", ".json")) for key in fetched), sorted(fetched)  # metadata read once, before
    assert len(fetched) == len(episode_files)
    # Each mp4 holds one episode: fetched whole, once, in one request (no header read first).
    assert all(s.requests == 1 for key, s in fetched.items() if key.endswith(".mp4")), fetched
    assert sum(s.bytes_sent for s in fetched.values()) <= 1.1 * own_bytes, (stats.bytes_sent, own_bytes)


def test_v21_repo_map_style(v21_hub, tmp_path):
    local_root, hub_root = v21_hub
    local = EpisodeDataset(local_root)
    with FakeHub(hub_root) as hub, remote_dataset(EpisodeDataset, V21_REPO, cache_dir=tmp_path / "cache",
                                                  hub_endpoint=hub.url, token=False) as dataset:
        picks = [0, 7, len(local) - 1]
        assert_same_samples([dataset[i] for i in picks], [local[i] for i in picks])
    local.close()


def test_prewarm_of_a_v21_repo(v21_hub, tmp_path, capsys):
    from episodestream.tools.cli import main

    local_root, hub_root = v21_hub
    cache_dir = tmp_path / "cache"
    expected = list(EpisodeStreamingDataset(local_root, **STREAM))
    with FakeHub(hub_root) as hub:
        assert main(["prewarm", V21_REPO, "--cache-dir", str(cache_dir), "--hub-endpoint", hub.url,
                     "--no-progress"]) == 0
        assert f"prewarmed {len(COMMON['episode_length'])} episodes" in capsys.readouterr().out
        hub.reset_stats()
        with remote_dataset(EpisodeStreamingDataset, V21_REPO, cache_dir=cache_dir, hub_endpoint=hub.url,
                            token=False, **STREAM) as dataset:
            assert_same_samples(list(dataset), expected)
        mp4 = [key for key, s in hub.stats().by_file.items() if key.endswith(".mp4") and s.bytes_sent]
        assert mp4 == [], "prewarmed video is read from the cache"
