"""Streamed and indexed samples from every kind of remote equal the local ones exactly, and the
cache is empty once the epoch is over and the dataset's files are closed. A ``file://`` URL to a
local folder is read in place, like the folder's path."""

from __future__ import annotations

import itertools

import pickle
from dataclasses import dataclass, field

import pytest
import torch.utils.data

from episodestream import EpisodeDataset, EpisodeStreamingDataset, SourceStats
from episodestream.testing import FakeHub, HttpServer, S3Server, faults

from ..conftest import CAMERAS
from .conftest import REPO, assert_same_samples, cache_files, remote_dataset

FRONT = CAMERAS[0]
TAG_SHA = "0123456789abcdef0123456789abcdef01234567"
STREAM = dict(episode_pool_size=3, prefetch_episodes=2, seed=7, decode_group_size=4,
              delta_timestamps={FRONT: [-2 / 30, 0.0], "observation.state": [-1 / 30, 0.0]})


@dataclass
class Remote:
    source: str
    options: dict = field(default_factory=dict)
    pins: str | None = None  # the commit the description must name


@pytest.fixture(params=["hub", "hub-redirect", "hub-url-tag", "s3", "http"])
def remote(request, hub_root, dataset_root):
    kind = request.param
    if kind.startswith("hub"):
        with FakeHub(hub_root, redirect_resolve=kind == "hub-redirect", revisions={"v3.0": TAG_SHA}) as hub:
            options = {"hub_endpoint": hub.url, "token": False}
            if kind == "hub-url-tag":
                yield Remote(f"hf://datasets/{REPO}@v3.0", options, pins=TAG_SHA)
            else:
                yield Remote(REPO, options, pins=hub.main_sha(REPO))
    elif kind == "s3":
        pytest.importorskip("s3fs")
        with S3Server() as s3:
            s3.upload_folder(dataset_root, "robot-data", "lerobot/main")
            yield Remote("s3://robot-data/lerobot/main", {"storage_options": s3.storage_options()})
    else:  # a plain file server, credentials in the URL
        with HttpServer(dataset_root.parent, credentials=("robot", "pw-0123")) as server:
            yield Remote(server.url_for(dataset_root.name, user="robot", password="pw-0123"))


@pytest.fixture(scope="module")
def local_samples(dataset_root) -> list[dict]:
    """The epoch the remote sources must reproduce, streamed once from the local folder."""
    return list(EpisodeStreamingDataset(dataset_root, **STREAM))


def test_streamed_samples_equal_local_and_cache_empties(remote, local_samples, tmp_path):
    cache_dir = tmp_path / "cache"
    expected = local_samples
    with remote_dataset(EpisodeStreamingDataset, remote.source, cache_dir=cache_dir, **remote.options,
                        **STREAM) as dataset:
        if remote.pins:
            assert remote.pins in dataset.resolved_source
        got = list(dataset)
        assert_same_samples(got, expected)
        # The epoch's video entries (spans, headers) are gone; only the metadata the dataset holds is left.
        left = cache_files(cache_dir)
        assert left and all("/files/meta/" in name for name in left), left
        assert dataset.source_stats().requests > 0
    assert cache_files(cache_dir) == []


@pytest.mark.parametrize("form", ["file://{}", "file://localhost{}", "{}"])
def test_file_url_reads_a_local_folder_in_place(form, dataset_root, local_samples, tmp_path):
    # The first samples are enough to see the same folder read the same way (whole epochs from
    # remote sources are compared with local ones above).
    expected = local_samples[:12]
    source = form.format(dataset_root) if form != "{}" else dataset_root.as_uri()
    dataset = EpisodeStreamingDataset(source, **STREAM)
    assert dataset.node_cache_dir is None
    with pytest.raises(TypeError, match="is read in place: it has no downloads"):
        faults.download_fetch(dataset)
    assert_same_samples(list(itertools.islice(dataset, 12)), expected)
    # cache_dir is used for a local folder too (compute_stats keeps its results there); cache_limit is not.
    with pytest.warns(UserWarning, match=r"^cache_limit only apply to remote sources; .* ignored"):
        EpisodeStreamingDataset(source, cache_dir=tmp_path / "cache", cache_limit="1GB", **STREAM)
    assert not (tmp_path / "cache").exists()
    with pytest.raises(FileNotFoundError, match=r"source 'file:///no/such/dataset' names the local path"):
        EpisodeStreamingDataset("file:///no/such/dataset")


def test_indexed_samples_equal_local(hub_root, dataset_root, tmp_path):
    indices = [0, 22, 23, 100, 162, 200, 289, 5]
    local = EpisodeDataset(dataset_root, delta_timestamps=STREAM["delta_timestamps"])
    with FakeHub(hub_root, redirect_resolve=True) as hub, \
            remote_dataset(EpisodeDataset, REPO, cache_dir=tmp_path / "cache", hub_endpoint=hub.url, token=False,
                           delta_timestamps=STREAM["delta_timestamps"]) as dataset:
        assert_same_samples([dataset[i] for i in indices], [local[i] for i in indices])
        dataset.close()  # the map-style dataset keeps its video per process until closed
    assert cache_files(tmp_path / "cache") == []


def test_source_stats_count_misses_then_hits_through_a_shared_cache_dir(hub_root, dataset_root, tmp_path):
    """The first dataset on an empty cache_dir downloads what it reads into the node cache (misses,
    with their bytes); a second one on the same cache_dir, while the first holds those entries,
    finds them on disk (hits, no download): the metadata when built, an episode's video when indexed."""
    metadata = [p.stat().st_size for p in (dataset_root / "meta").rglob("*") if p.is_file()]
    local = EpisodeDataset(dataset_root)
    index = local.num_frames - 1  # the last episode's last frame
    with FakeHub(hub_root) as hub:
        build = dict(cache_dir=tmp_path / "cache", hub_endpoint=hub.url, token=False)
        with remote_dataset(EpisodeDataset, REPO, **build) as first:
            built = first.source_stats()
            assert (built.cache_hits, built.cache_misses, built.cache_miss_bytes) == (0, len(metadata), sum(metadata))
            assert built.requests > 0 and built.bytes_fetched >= sum(metadata)
            with remote_dataset(EpisodeDataset, REPO, **build) as second:
                assert second.source_stats() == SourceStats(cache_hits=len(metadata))  # not one request
                assert_same_samples([first[index]], [local[index]])
                indexed = first.source_stats()
                video_entries = indexed.cache_misses - built.cache_misses
                assert video_entries >= len(CAMERAS) and indexed.cache_miss_bytes > built.cache_miss_bytes
                assert indexed.requests > built.requests
                assert_same_samples([second[index]], [local[index]])
                again = second.source_stats()
                assert (again.cache_hits, again.cache_misses, again.cache_miss_bytes) == (
                    len(metadata) + video_entries, 0, 0)
                assert 0 < again.bytes_fetched < indexed.bytes_fetched - built.bytes_fetched  # its rows only
    assert cache_files(tmp_path / "cache") == []


def test_dataloader_workers_read_s3_through_one_node_cache(dataset_root, tmp_path):
    pytest.importorskip("s3fs")
    loader = dict(batch_size=4, num_workers=2)
    # Four episodes (127 frames) in two mp4 files of each camera: the workers share entries.
    options = dict(STREAM, episodes=[2, 3, 4, 5])
    local = EpisodeStreamingDataset(dataset_root, **options)
    epochs = [list(torch.utils.data.DataLoader(local, **loader)) for _ in range(2)]
    with S3Server() as s3:
        s3.upload_folder(dataset_root, "robot-data", "lerobot/main")
        with remote_dataset(EpisodeStreamingDataset, "s3://robot-data/lerobot/main", cache_dir=tmp_path / "cache",
                            storage_options=s3.storage_options(), **options) as dataset:
            # Workers are forked after the main process made its s3fs client: each makes its own.
            files = faults.source_files(dataset)
            assert files._process is not None
            clone = pickle.loads(pickle.dumps(files))  # as a spawned worker receives it
            assert clone._process is None and clone.read_bytes("meta/info.json") == files.read_bytes("meta/info.json")
            clone.close()
            turns = dataset._runtime.turns._slots  # shared with the (forked) workers
            for iteration, expected in enumerate(epochs, start=1):
                assert_same_samples(list(torch.utils.data.DataLoader(dataset, **loader)), expected)
                # Both workers passed their turns on in this DataLoader iteration.
                assert list(turns[:2]) == [iteration, iteration]
    assert cache_files(tmp_path / "cache") == []
