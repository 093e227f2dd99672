"""A LeRobot v2.1 repo on a FakeHub streams end to end: the local folder's samples exactly, each
episode's files fetched once, on admit, at most 1.1x the bytes of the episodes' own files. Building
the dataset lists meta/ only (the templates name the episodes' files, looked up when admitted), so
its requests do not grow with the episodes; a missing file is an error naming it and its episode."""

from __future__ import annotations

import json
import shutil

import pytest

from episodestream import EpisodeDataset, EpisodeLoader, EpisodeStreamingDataset
from episodestream.testing import FakeHub, HttpServer, S3Server
from episodestream.testing import faults
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
        lookups_at_build = dataset.source_stats().lookup_requests
        got = list(dataset)
        stats = hub.stats()
        lookups = dataset.source_stats().lookup_requests - lookups_at_build
    assert_same_samples(got, expected)
    assert cache_files(tmp_path / "cache") == []
    episode_files = [p for p in local_root.rglob("*") if p.is_file() and p.parts[-2] != "meta"
                     and p.suffix in (".parquet", ".mp4")]
    own_bytes = sum(p.stat().st_size for p in episode_files)
    fetched = {key: s for key, s in stats.by_file.items() if key.startswith(V21_REPO)}
    # Sizes come from look-ups by name: one paths-info request per episode (its parquet and mp4s), no listing.
    asked = {path: s.requests for path, s in stats.by_path.items() if "/paths-info/" in path or "/tree/" in path}
    assert all("/paths-info/" in path for path in asked), asked
    assert sum(asked.values()) == len(COMMON["episode_length"]), asked
    assert lookups == sum(asked.values()), (lookups, asked)  # source_stats() counts what the Hub saw
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
    # The pins outlive the run: `cache ls` shows them (every mp4 at least), `cache clear` removes them.
    assert main(["cache", "ls", "--cache-dir", str(cache_dir), "--json"]) == 0
    totals = json.loads(capsys.readouterr().out)["totals"]
    assert totals["pinned"] >= len(list(local_root.rglob("*.mp4"))) and totals["in_use"] == 0
    assert main(["cache", "clear", "--cache-dir", str(cache_dir)]) == 0
    assert f"removed {totals['entries']} entries" in capsys.readouterr().out
    assert cache_files(cache_dir) == []


def _hub_of(tmp_path_factory, name, root):
    hub = tmp_path_factory.mktemp(f"hub-{name}")
    shutil.copytree(root, hub / "datasets" / V21_REPO)
    return hub


def _build_requests(hub_root, tmp_path, cache_limit=None):
    """The requests (by URL path) that building a dataset on ``hub_root``'s repo makes."""
    with FakeHub(hub_root) as hub:
        dataset = EpisodeStreamingDataset(V21_REPO, cache_dir=tmp_path / "cache", hub_endpoint=hub.url, token=False,
                                          cache_limit=cache_limit)
        by_path = {path: s.requests for path, s in hub.stats().by_path.items()}
        dataset.close()
    return by_path


@pytest.mark.parametrize("cache_limit", [None, "1GB"])
def test_building_lists_meta_only_whatever_the_episodes(cache_limit, tmp_path_factory, tmp_path):
    """No listing of data/ or videos/ (or of the root, which holds them), no request per episode:
    as many requests for 3 episodes as for 24. Under a ``cache_limit`` the budget check looks up
    the longest episodes' files (one request), not every episode's."""
    requests = {}
    for num_episodes in (3, 24):
        root = built_once(tmp_path_factory, f"v2x-remote-many-{num_episodes}", lambda root, n=num_episodes: write_synthetic_dataset(
            root, version="v2.1", num_episodes=n, episode_length=2, chunks_size=10, height=64, width=64,
            cameras=("observation.images.front",), seed=1))
        by_path = _build_requests(_hub_of(tmp_path_factory, f"many-{num_episodes}", root), tmp_path / str(num_episodes),
                                  cache_limit)
        listed = sorted(path for path in by_path if "/tree/" in path)
        assert len(listed) == 1 and listed[0].endswith("/meta"), listed
        fetched = sorted(path.split("/resolve/", 1)[1].split("/", 1)[1] for path in by_path if "/resolve/" in path)
        assert all(path.startswith("meta/") for path in fetched), fetched
        asked = sum(n for path, n in by_path.items() if "/paths-info/" in path)
        assert asked == (0 if cache_limit is None else 1), by_path
        requests[num_episodes] = sum(by_path.values())
    assert requests[3] == requests[24], requests


@pytest.mark.parametrize("missing", ["videos/chunk-001/observation.images.front/episode_000002.mp4",
                                     "data/chunk-001/episode_000002.parquet"])
def test_a_missing_file_is_an_error_naming_it_and_its_episode(v21_hub, missing, tmp_path_factory, tmp_path):
    """The dataset builds (its files are not checked one by one at start); admitting episode 2 raises,
    naming the file and the episode, through the dataset and the loader alike, and nothing hangs."""
    local_root, _ = v21_hub
    hub_root = _hub_of(tmp_path_factory, "missing", local_root)
    (hub_root / "datasets" / V21_REPO / missing).unlink()
    episode = r"episode 2\b" if missing.endswith(".mp4") else r"episode_index 2\b"
    with FakeHub(hub_root) as hub:
        for wrap in (list, lambda ds: list(EpisodeLoader(ds, batch_size=4))):
            with remote_dataset(EpisodeStreamingDataset, V21_REPO, cache_dir=tmp_path / "cache", hub_endpoint=hub.url,
                                token=False, **STREAM) as dataset:
                with pytest.raises(FileNotFoundError, match=rf"{missing} .*{episode}"):
                    wrap(dataset)


def test_revision_pins_the_looked_up_files(v21_hub, tmp_path):
    """A tag resolves to its commit once; the per-episode look-ups and reads name that commit."""
    local_root, hub_root = v21_hub
    tag_sha = "ab" * 20
    expected = list(EpisodeStreamingDataset(local_root, **STREAM))
    with FakeHub(hub_root, revisions={"v2.1": tag_sha}) as hub, \
            remote_dataset(EpisodeStreamingDataset, V21_REPO, revision="v2.1", cache_dir=tmp_path / "cache",
                           hub_endpoint=hub.url, token=False, **STREAM) as dataset:
        assert dataset.resolved_source == f"hf://datasets/{V21_REPO}@{tag_sha}"
        hub.reset_stats()
        got = list(dataset)
        paths = hub.stats().by_path
    assert_same_samples(got, expected)
    asked = [path for path in paths if "/paths-info/" in path or "/resolve/" in path]
    assert asked and all(tag_sha in path for path in asked), asked
    assert any("/paths-info/" in path for path in asked)


@pytest.mark.parametrize("kind", ["s3", "http"])
def test_v21_from_a_bucket_or_a_file_server(kind, v21_hub, tmp_path):
    """Object stores and plain HTTP look the episodes' files up one HEAD each, on admit: the same
    samples as the local folder; building sizes meta/'s files only (http: a HEAD per listed file)."""
    local_root, _ = v21_hub
    expected = list(EpisodeStreamingDataset(local_root, **STREAM))
    meta_files = len(list((local_root / "meta").rglob("*.json*")))
    if kind == "s3":
        pytest.importorskip("s3fs")
        with S3Server() as s3:
            s3.upload_folder(local_root, "robot-data", "v21")
            with remote_dataset(EpisodeStreamingDataset, "s3://robot-data/v21", cache_dir=tmp_path / "cache",
                                storage_options=s3.storage_options(), **STREAM) as dataset:
                got = list(dataset)
    else:
        with HttpServer(local_root.parent) as server:
            with remote_dataset(EpisodeStreamingDataset, server.url_for(local_root.name), cache_dir=tmp_path / "cache",
                                **STREAM) as dataset:
                heads_at_build = server.stats().requests.get("HEAD", 0)
                lookups_at_build = dataset.source_stats().lookup_requests
                got = list(dataset)
                heads = server.stats().requests.get("HEAD", 0) - heads_at_build
                lookups = dataset.source_stats().lookup_requests - lookups_at_build
        assert heads_at_build <= meta_files, heads_at_build
        # One HEAD per episode file looked up (its parquet and mp4s), each counted by source_stats().
        episode_files = [p for p in local_root.rglob("*") if p.is_file() and p.suffix in (".parquet", ".mp4")
                         and p.parts[-2] != "meta"]
        assert lookups == heads == len(episode_files), (lookups, heads, len(episode_files))
    assert_same_samples(got, expected)


def test_threads_asking_about_one_episode_share_one_look_up(v21_hub, tmp_path):
    """Eight threads wanting sizes of the same episode's files at once: one paths-info request,
    the sizes the files have, and a path that is not there known to be absent (no error, no hang)."""
    import threading

    from episodestream.testing.source_files import open_remote_files

    local_root, hub_root = v21_hub
    relpaths = ["data/chunk-000/episode_000001.parquet",
                "videos/chunk-000/observation.images.front/episode_000001.mp4"]
    with FakeHub(hub_root) as hub:
        files = open_remote_files(V21_REPO, cache_dir=tmp_path / "cache", hub_endpoint=hub.url, token=False)
        try:
            assert not files.knows_every_file
            hub.reset_stats()
            sizes, start = [], threading.Barrier(8)

            def ask() -> None:
                start.wait()
                files.look_up([*relpaths, "data/chunk-000/episode_999999.parquet"])
                sizes.append([files.size_bytes(p) for p in relpaths])

            threads = [threading.Thread(target=ask) for _ in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            asked = sum(s.requests for path, s in hub.stats().by_path.items() if "/paths-info/" in path)
            assert not files.exists("data/chunk-000/episode_999999.parquet")
        finally:
            files.close()
    assert sizes == [[(local_root / p).stat().st_size for p in relpaths]] * 8
    assert asked == 1, asked


def test_the_auto_pool_narrows_to_what_the_cache_limit_holds(tmp_path_factory, tmp_path):
    """24 v2.1 episodes on the Hub: "auto" holds them all (25) without a cache_limit; under a limit
    that holds 16 pooled episodes but not 25, it takes a narrower pool that fits, and builds."""
    root = built_once(tmp_path_factory, "v2x-remote-many-24", lambda root: write_synthetic_dataset(
        root, version="v2.1", num_episodes=24, episode_length=2, chunks_size=10, height=64, width=64,
        cameras=("observation.images.front",), seed=1))
    hub_root = _hub_of(tmp_path_factory, "auto-limit", root)
    with FakeHub(hub_root) as hub:
        unlimited = EpisodeStreamingDataset(V21_REPO, cache_dir=tmp_path / "a", hub_endpoint=hub.url, token=False)
        assert unlimited.episode_pool_size == 25
        files = faults.source_files(unlimited)
        in_flight = unlimited.prefetch_episodes + 1
        narrow, wide = (files.minimum_cache_bytes(unlimited.typed_meta, pool + in_flight) for pool in (16, 25))
        unlimited.close()
        assert narrow < wide
        limited = EpisodeStreamingDataset(V21_REPO, cache_dir=tmp_path / "b", hub_endpoint=hub.url, token=False,
                                          cache_limit=(narrow + wide) // 2)
        try:
            assert 16 <= limited.episode_pool_size < 25
            fits = faults.source_files(limited).minimum_cache_bytes(limited.typed_meta,
                                                                   limited.episode_pool_size + in_flight)
            assert fits <= (narrow + wide) // 2
        finally:
            limited.close()
