"""A remote v2.x source looks its episodes' files up by name when they are admitted: those requests
retry as downloads do (a flaky link still streams the whole epoch, exactly), and when attempts run
out the error names the file, not a hang or a silent skip."""

from __future__ import annotations

import shutil
import threading

import pytest

from episodestream import EpisodeStreamingDataset
from episodestream.testing.source_files import open_remote_files
from episodestream.testing import FakeHub, ShapingProxy
from episodestream.tools.synthetic import write_synthetic_dataset

from ..conftest import built_once
from ..remote_streaming.conftest import remote_dataset
from .conftest import FAST_KNOBS, assert_same_epoch, cuts

V21_REPO = "lerobot/v21-faults"
STREAM = dict(seed=3, episode_pool_size=2, prefetch_episodes=2)
MP4 = "videos/chunk-000/observation.images.front/episode_000001.mp4"


@pytest.fixture(scope="module")
def v21_faults(tmp_path_factory):
    root = built_once(tmp_path_factory, "v2x-lookup-faults", lambda root: write_synthetic_dataset(
        root, version="v2.1", num_episodes=4, episode_length=(6, 9), height=64, width=64,
        cameras=("observation.images.front",), seed=2))
    hub = tmp_path_factory.mktemp("hub-v21-faults")
    shutil.copytree(root, hub / "datasets" / V21_REPO)
    return root, hub


def test_flaky_look_ups_retry_and_the_epoch_is_exact(v21_faults, tmp_path, download_knobs):
    download_knobs(**FAST_KNOBS)
    local_root, hub_root = v21_faults
    expected = list(EpisodeStreamingDataset(local_root, **STREAM))
    with FakeHub(hub_root) as hub, ShapingProxy(hub.url) as proxy:
        with remote_dataset(EpisodeStreamingDataset, V21_REPO, cache_dir=tmp_path / "cache", hub_endpoint=proxy.url,
                            token=False, **STREAM) as dataset:
            proxy.update(error_503_rate=0.3, seed=1)
            got = list(dataset)
            assert proxy.stats().injected_503 > 0
    assert_same_epoch(got, expected)


def test_look_ups_that_keep_failing_name_the_file(v21_faults, tmp_path, download_knobs):
    download_knobs(**{**FAST_KNOBS, "max_attempts": 3})
    _, hub_root = v21_faults
    with FakeHub(hub_root) as hub, ShapingProxy(hub.url) as proxy:
        files = open_remote_files(V21_REPO, cache_dir=tmp_path / "cache", hub_endpoint=proxy.url, token=False)
        try:
            proxy.update(error_503_rate=1.0)
            proxy.reset_stats()
            with pytest.raises(OSError, match=rf"{V21_REPO}@[0-9a-f]{{40}}/{MP4} failed: .*503"):
                files.size_bytes(MP4)
            assert proxy.stats().requests == 3  # bounded attempts, huggingface_hub's own retries not in the way
        finally:
            files.close()


def test_look_ups_hold_download_permits(v21_faults, tmp_path, download_knobs):
    # One permit on the node, held here: a look-up waits for it, as a read would.
    download_knobs(**{**FAST_KNOBS, "floor_permits": 1, "initial_permits": 1, "cap_permits": 1})
    _, hub_root = v21_faults
    with FakeHub(hub_root) as hub, ShapingProxy(hub.url) as proxy:
        files = open_remote_files(V21_REPO, cache_dir=tmp_path / "cache", hub_endpoint=proxy.url, token=False)
        try:
            controller = files.download.controller(files.filesystem())
            proxy.reset_stats()
            with controller.permit():
                asking = threading.Thread(target=files.size_bytes, args=(MP4,))
                asking.start()
                asking.join(0.5)
                assert asking.is_alive() and proxy.stats().requests == 0
            asking.join(10)
            assert not asking.is_alive() and proxy.stats().requests == 1
            assert files.stats().lookup_requests == 1
        finally:
            files.close()


def test_throttled_look_ups_cut_the_download_budget(v21_faults, tmp_path, download_knobs):
    download_knobs(**{**FAST_KNOBS, "max_attempts": 3})
    _, hub_root = v21_faults
    with FakeHub(hub_root) as hub, ShapingProxy(hub.url) as proxy:
        files = open_remote_files(V21_REPO, cache_dir=tmp_path / "cache", hub_endpoint=proxy.url, token=False)
        try:
            controller = files.download.controller(files.filesystem())
            before = controller.budget()
            proxy.update(error_503_rate=1.0)
            proxy.reset_stats()
            with pytest.raises(OSError, match=rf"{MP4} failed: .*503"):
                files.size_bytes(MP4)
            assert proxy.stats().injected_503 == 3
            assert cuts(files.download, "HTTP 503") and controller.budget() < before
        finally:
            files.close()


def test_curation_by_the_episodes_table_and_a_wrong_length_on_a_remote_v21(v21_faults, tmp_path):
    """Issue 48 items 9 and 12, remote: a predicate and a weight column read a remote v2.1's episodes
    table as they read a local one's; an episode listed with the wrong length is named when a later
    episode is read, from the remote files as locally."""
    import json

    import pyarrow.compute as pc

    from episodestream import DatasetFormatError

    local_root, hub_root = v21_faults
    options = dict(episodes=pc.field("length") >= 7, episode_weights="length", seed=0)
    local = EpisodeStreamingDataset(local_root, **options)
    with FakeHub(hub_root) as hub:
        with remote_dataset(EpisodeStreamingDataset, V21_REPO, cache_dir=tmp_path / "cache", hub_endpoint=hub.url,
                            token=False, **options) as remote:
            assert remote.episode_indices == local.episode_indices and len(remote) == len(local)
    damaged_hub = tmp_path / "hub-damaged"
    shutil.copytree(hub_root, damaged_hub)
    episodes = damaged_hub / "datasets" / V21_REPO / "meta/episodes.jsonl"
    rows = [json.loads(line) for line in episodes.read_text().splitlines()]
    lengths = [row["length"] for row in rows]
    rows[1]["length"] -= 1  # episode 1's file holds one row more than listed
    episodes.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with FakeHub(damaged_hub) as hub:
        with remote_dataset(EpisodeStreamingDataset, V21_REPO, cache_dir=tmp_path / "cache2", hub_endpoint=hub.url,
                            token=False, episodes=[3]) as remote:
            with pytest.raises(DatasetFormatError, match=rf"episode 1 is listed with length {lengths[1] - 1} there, but "
                                                         rf"its data file .*episode_000001.parquet holds {lengths[1]} rows"):
                list(remote)
