"""`episodestream cache ls|unpin|clear` and `episodestream prewarm` against a fake Hub on 127.0.0.1:
prewarm fetches each episode's video once and pins it, a later run reads it from the cache (the
server's counters show no video or metadata bytes), clear never removes what a live process uses,
and a cache full of pins is said at once (with how to unpin) instead of stalling."""

from __future__ import annotations

import json
import os
import re
import shutil
import time

# huggingface_hub reads these when it is imported.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")

import pytest  # noqa: E402

from episodestream import CacheFullError, EpisodeStreamingDataset  # noqa: E402
from episodestream.tools.cli import main  # noqa: E402
from episodestream.remote import EntryState, NodeCache  # noqa: E402
from episodestream.testing.source_files import open_remote_files
from episodestream.testing import FakeHub, faults  # noqa: E402

from .remote_streaming.conftest import assert_same_samples, cache_files  # noqa: E402

REPO = "lerobot/main"
STREAM = dict(episode_pool_size=3, prefetch_episodes=2, seed=7)


@pytest.fixture(scope="module")
def hub_root(dataset_root, tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    shutil.copytree(dataset_root, root / "datasets" / REPO)
    return root


def _bytes_by_kind(stats) -> dict[str, int]:
    kinds = {"video": 0, "meta": 0, "data": 0}
    for key, path_stats in stats.by_file.items():
        relpath = key[len(REPO) + 1:]
        kinds["video" if relpath.endswith(".mp4") else relpath.split("/")[0]] += path_stats.bytes_sent
    return kinds


def test_prewarm_pins_and_a_later_run_fetches_no_video(hub_root, dataset_root, tmp_path, capsys):
    cache_dir = tmp_path / "cache"
    expected = list(EpisodeStreamingDataset(dataset_root, **STREAM))
    with FakeHub(hub_root) as hub:
        assert main(["prewarm", REPO, "--cache-dir", str(cache_dir), "--hub-endpoint", hub.url]) == 0
        out, err = capsys.readouterr()
        assert f"prewarmed 6 episodes of hf://datasets/{REPO}@{hub.main_sha(REPO)}" in out
        assert "prewarm: 100%" in err  # the progress bar, in bytes
        first = _bytes_by_kind(hub.stats())
        assert first["video"] > 0 and first["meta"] > 0

        # Everything is pinned: prewarming again fetches no video or metadata.
        hub.reset_stats()
        assert main(["prewarm", REPO, "--cache-dir", str(cache_dir), "--hub-endpoint", hub.url,
                     "--no-progress"]) == 0
        assert "fetched 0 B" in capsys.readouterr().out
        assert _bytes_by_kind(hub.stats()) == {"video": 0, "meta": 0, "data": 0}

        # A training run over the same source and cache reads rows only (ranged reads in place).
        hub.reset_stats()
        dataset = EpisodeStreamingDataset(REPO, hub_endpoint=hub.url, token=False, cache_dir=cache_dir, **STREAM)
        try:
            assert_same_samples(list(dataset), expected)
        finally:
            dataset.close()
        warm = _bytes_by_kind(hub.stats())
    data_bytes = sum(p.stat().st_size for p in (dataset_root / "data").rglob("*.parquet"))
    assert warm["video"] == 0 and warm["meta"] == 0 and 0 < warm["data"] <= data_bytes

    # The pins outlive the run; ls shows them, clear removes them.
    assert main(["cache", "ls", "--cache-dir", str(cache_dir), "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    totals = listing["totals"]
    assert totals["entries"] == totals["pinned"] > 0 and totals["in_use"] == 0
    kinds = {entry["file"].split("/")[0] for entry in listing["entries"]}
    assert kinds == {"files", "headers", "spans"}
    assert all(entry["state"] == "local" and entry["users"] == 0 for entry in listing["entries"])
    assert main(["cache", "ls", "--cache-dir", str(cache_dir)]) == 0
    text = capsys.readouterr().out
    assert "source hub_lerobot_main_" in text and "local" in text and "yes" in text
    assert f"total: {totals['entries']} entries" in text and f"{totals['pinned']} pinned" in text
    assert main(["cache", "clear", "--cache-dir", str(cache_dir), "--source", REPO]) == 0
    assert f"removed {totals['entries']} entries" in capsys.readouterr().out
    assert cache_files(cache_dir) == []


def test_clear_keeps_entries_a_live_process_uses(tmp_path, capsys):
    root = tmp_path / "cache"
    cache = NodeCache(root)
    write = lambda tmp: tmp.write_bytes(b"x" * 5000)  # noqa: E731
    in_use, pinned, other = "s3_bucket_a-1/files/in_use.bin", "s3_bucket_a-1/files/pinned.bin", "hub_b-2/files/b.bin"
    for name in (in_use, pinned, other):
        cache.acquire(name, "test", write, size_bytes=5000)
    for name in (pinned, other):
        cache.pin(name)
        cache.release(name, "test")  # pinned: kept after the last user lets go
    assert all(cache.state(n) is EntryState.LOCAL for n in (in_use, pinned, other))

    assert main(["cache", "ls", "--cache-dir", str(root), "--source", "s3://bucket_a"]) == 0
    text = capsys.readouterr().out
    assert "source s3_bucket_a-1: 2 entries" in text and "hub_b-2" not in text
    assert re.search(r"total: 2 entries, [0-9.]+ KB on disk; 1 pinned; 1 in use by live processes", text), text

    assert main(["cache", "clear", "--cache-dir", str(root), "--source", "s3_bucket_a-*"]) == 0
    text = capsys.readouterr().out
    assert "removed 1 entries" in text and "skipped 1 in use by live processes" in text and in_use in text
    assert cache.state(pinned) is EntryState.REMOTE
    assert cache.state(in_use) is EntryState.LOCAL and cache.state(other) is EntryState.LOCAL

    assert main(["cache", "clear", "--cache-dir", str(root)]) == 0
    assert "removed 1 entries" in capsys.readouterr().out
    assert cache.state(other) is EntryState.REMOTE and cache.state(in_use) is EntryState.LOCAL
    assert cache.release(in_use, "test")  # its last user lets go: deleted as usual
    assert cache_files(root) == []


def test_prewarm_arguments_and_local_folders(dataset_root, capsys):
    assert main(["prewarm", str(dataset_root)]) == 0
    assert "read in place and never cached: nothing to prewarm" in capsys.readouterr().out
    for bad in (["--episodes", "1-x"], ["--storage-options", "[1]"]):
        with pytest.raises(SystemExit) as stop:
            main(["prewarm", "s3://bucket/prefix", *bad])
        assert stop.value.code == 2
    assert "expected a JSON object of fsspec options" in capsys.readouterr().err


def _prewarm_needs(source: str, cache_dir, hub_url: str) -> tuple[int, int, int]:
    """Metadata bytes; metadata + every episode's video as estimated from above (what `prewarm`
    checks) and from the episodes' share of their files only (what `prewarm()` without meta checks)."""
    from episodestream.testing.source_files import read_metadata, video_share_bytes

    files = open_remote_files(source, cache_dir=cache_dir, hub_endpoint=hub_url, token=False)
    try:
        meta = read_metadata(files)
        metadata = files.metadata_bytes()
        return (metadata, metadata + files.video_cache_bytes(meta),
                metadata + video_share_bytes(files, list(meta.episodes.values())))
    finally:
        files.close()


def test_prewarm_beyond_cache_limit_ends_with_a_clear_error(hub_root, tmp_path, capsys):
    from episodestream.testing.source_files import prewarm, read_metadata

    cache_dir = tmp_path / "cache"
    with FakeHub(hub_root) as hub:
        metadata, upper, shares = _prewarm_needs(REPO, tmp_path / "scratch", hub.url)
        base = ["prewarm", REPO, "--cache-dir", str(cache_dir), "--hub-endpoint", hub.url, "--no-progress"]
        # Too small (the "300KB over a larger source" case): refused before any video is fetched.
        hub.reset_stats()
        for limit in (metadata + 10_000, upper - 1):
            assert main([*base, "--cache-limit", str(limit)]) == 1
            err = capsys.readouterr().err
            assert re.search(r"CacheFullError: Prewarming 6 episodes of hf://datasets/lerobot/main@[0-9a-f]{40} pins "
                             r"about \d+ bytes .* Prewarm fewer episodes \(--episodes\), raise --cache-limit", err), err
        assert _bytes_by_kind(hub.stats())["video"] == 0
        # The estimate is from above: a limit of it is enough.
        assert main([*base, "--cache-limit", str(upper)]) == 0
        assert NodeCache(cache_dir).usage_bytes() <= upper
        assert main(["cache", "unpin", "--cache-dir", str(cache_dir)]) == 0
        assert cache_files(cache_dir) == []
        # Checked only by the episodes' share (no meta given), the real spans overflow: the budget
        # ends it, within the cache wait, instead of a prewarm that never ends.
        files = open_remote_files(REPO, cache_dir=cache_dir, hub_endpoint=hub.url, token=False, cache_limit=shares,
                                   cache_wait_s=1)
        try:
            episodes = list(read_metadata(files).episodes.values())
            start_s = time.monotonic()
            with pytest.raises(CacheFullError, match=r"^cache_limit=\d+ bytes .* is full"):
                prewarm(files, episodes, progress=False)
            assert time.monotonic() - start_s < 60
        finally:
            files.close()
        capsys.readouterr()


def test_pinned_cache_fails_fast_at_construction_until_unpinned(hub_root, dataset_root, tmp_path, capsys):
    cache_dir = tmp_path / "cache"
    other = tmp_path / "hub"
    shutil.copytree(hub_root, other)
    shutil.copytree(dataset_root, other / "datasets" / "lerobot" / "other")
    with FakeHub(other) as hub:
        build = dict(cache_dir=cache_dir, hub_endpoint=hub.url, token=False, **STREAM)
        assert main(["prewarm", REPO, "--cache-dir", str(cache_dir), "--hub-endpoint", hub.url, "--no-progress"]) == 0
        capsys.readouterr()
        pinned = NodeCache(cache_dir).usage_bytes()
        unlimited = EpisodeStreamingDataset(REPO, **build)
        need = faults.source_files(unlimited).minimum_cache_bytes(unlimited.typed_meta,
                                                                  episodes_in_flight=6)  # 3 + 2 + 1
        unlimited.close()
        limit = need + pinned // 2  # enough for either source alone, not for "other" beside the pins
        # The prewarmed source itself reads its pins: they do not count twice.
        dataset = EpisodeStreamingDataset(REPO, cache_limit=limit, **build)
        assert len(list(dataset)) == len(dataset)
        dataset.close()
        # Another source: refused now, not stalled mid-epoch.
        start_s = time.monotonic()
        with pytest.raises(CacheFullError) as caught:
            EpisodeStreamingDataset("lerobot/other", cache_limit=limit, **build)
        assert time.monotonic() - start_s < 30
        message = str(caught.value)
        assert re.search(rf"is full of pinned \(prewarmed\) entries: {pinned} bytes pinned \(\d+ entries "
                         rf"\([\d.]+ MB\) of hub_lerobot_main_[0-9a-f]{{12}}-[0-9a-f]{{12}}\)", message), message
        assert f"`episodestream cache unpin --cache-dir {cache_dir}`" in message
        assert main(["cache", "unpin", "--cache-dir", str(cache_dir)]) == 0
        assert re.search(r"unpinned \d+ entries .*; deleted \d+ no live process uses", capsys.readouterr().out)
        assert cache_files(cache_dir) == []
        dataset = EpisodeStreamingDataset("lerobot/other", cache_limit=limit, **build)
        dataset.close()
