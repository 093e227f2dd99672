"""The node cache: one download per entry however many threads and processes want it, references
by live processes only, atomic entries, the disk budget, and a process killed mid-download."""

from __future__ import annotations

import errno
import logging
import multiprocessing
import os
import pickle
import signal
import threading
import time
from pathlib import Path

import pytest

from episodestream import EpisodeStreamingDataset
from episodestream.remote import CacheFullError, CacheStats, EntryState, NodeCache
from episodestream.testing.source_files import open_remote_files
from episodestream.tools.cli import main
from episodestream.testing import FakeHub, ShapingProxy

from .conftest import REPO, SPANS_REPO, assert_same_samples, cache_files, remote_dataset

FORK = multiprocessing.get_context("fork")


def _slow_fetch(log: Path, payload: bytes, delay_s: float = 0.3):
    def fetch(tmp: Path) -> None:
        with open(log, "a") as file:  # O_APPEND: one line per download, from any process
            file.write(f"{os.getpid()}\n")
        time.sleep(delay_s)
        tmp.write_bytes(payload)
    return fetch


def _acquire_in_child(root: Path, log: Path, holder: str, acquired, release) -> None:
    cache = NodeCache(root, timeout_s=30)
    path = cache.acquire("entry.bin", holder, _slow_fetch(log, b"x" * 5000), size_bytes=5000)
    assert path.read_bytes() == b"x" * 5000
    acquired.set()
    release.wait(30)
    cache.release("entry.bin", holder)


def _stats_in_child(cache: NodeCache, queue) -> None:
    cache.acquire("b.bin", "child", lambda tmp: tmp.write_bytes(b"b" * 10), size_bytes=10)
    queue.put(cache.stats())
    cache.release("b.bin", "child")


def test_hits_and_misses_are_counted_per_process(tmp_path):
    cache = NodeCache(tmp_path / "cache")
    cache.acquire("a.bin", "me", lambda tmp: tmp.write_bytes(b"a" * 300), size_bytes=300)  # downloads 300 bytes
    cache.acquire("a.bin", "other", lambda tmp: pytest.fail("a complete entry is not fetched again"), size_bytes=300)
    cache.acquire("c.bin", "me", lambda tmp: tmp.touch(), size_bytes=4)  # a fetch that reports no size: 0 bytes
    assert cache.stats() == CacheStats(hits=1, misses=2, miss_bytes=300)
    clone = pickle.loads(pickle.dumps(cache))  # as a spawned DataLoader worker receives it
    assert clone.stats() == CacheStats(0, 0, 0) and clone.root == cache.root
    queue = FORK.Queue()
    child = FORK.Process(target=_stats_in_child, args=(cache, queue))
    child.start()
    assert queue.get(timeout=30) == CacheStats(hits=0, misses=1, miss_bytes=10)  # a forked child counts its own
    child.join(30)
    assert child.exitcode == 0
    assert cache.stats() == CacheStats(hits=1, misses=2, miss_bytes=300)  # and nothing of it reaches the parent
    for name, holder in (("a.bin", "me"), ("a.bin", "other"), ("c.bin", "me")):
        cache.release(name, holder)
    assert cache_files(tmp_path / "cache") == []


def test_one_download_per_entry_across_threads_and_processes(tmp_path):
    root, log = tmp_path / "cache", tmp_path / "fetches.log"
    acquired, release = [FORK.Event() for _ in range(2)], FORK.Event()
    children = [FORK.Process(target=_acquire_in_child, args=(root, log, f"p{i}", acquired[i], release))
                for i in range(2)]
    for child in children:
        child.start()
    cache = NodeCache(root, timeout_s=30)
    paths = []
    threads = [threading.Thread(target=lambda i=i: paths.append(
        cache.acquire("entry.bin", f"t{i}", _slow_fetch(log, b"x" * 5000), size_bytes=5000))) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(event.wait(30) for event in acquired)  # everyone holds it at once
    assert cache.state("entry.bin") is EntryState.LOCAL and cache.refcount("entry.bin") == 5
    assert not any(cache.release("entry.bin", f"t{i}") for i in range(3))  # the children still use it
    release.set()
    for child in children:
        child.join(30)
        assert child.exitcode == 0
    assert len(log.read_text().split()) == 1  # one download, whoever did it
    assert cache.state("entry.bin") is EntryState.REMOTE and cache_files(root) == []


def _acquire_and_die(root: Path, name: str) -> None:
    NodeCache(root).acquire(name, "dead", lambda tmp: tmp.write_bytes(b"held"), size_bytes=4)
    os._exit(0)  # no release: the marker stays behind


def test_a_folder_pruned_while_another_entry_locks_in_it_is_made_again(tmp_path, monkeypatch):
    """Deleting an entry prunes its emptied folders; an acquire in the same folder at that moment
    sees os.mkdir fail with EEXIST and then no folder (pathlib's exist_ok check raises
    FileExistsError). It must make the folder again, not fail (a v2.1 stream over S3 did, when an
    evicted episode's mp4 was the last entry in its camera's folder)."""
    cache = NodeCache(tmp_path / "cache", timeout_s=5)
    cache.acquire("files/videos/cam/episode_0.mp4", "me", lambda tmp: tmp.write_bytes(b"0"), size_bytes=1)
    cache.release("files/videos/cam/episode_0.mp4", "me")  # the last user: deleted, its folders pruned
    folder = cache.path("files/videos/cam/episode_1.mp4").parent
    assert not folder.exists()
    real_mkdir, raced = os.mkdir, []

    def mkdir_that_loses_the_race(path, *args, **kwargs):
        if Path(path) == folder and not raced:  # there when mkdir looked, pruned before pathlib's check
            raced.append(path)
            raise FileExistsError(errno.EEXIST, "File exists", str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir_that_loses_the_race)
    path = cache.acquire("files/videos/cam/episode_1.mp4", "me", lambda tmp: tmp.write_bytes(b"1"), size_bytes=1)
    assert raced and path.read_bytes() == b"1"


def test_a_file_where_an_entry_folder_should_be_is_an_error(tmp_path):
    cache = NodeCache(tmp_path / "cache", timeout_s=5)
    blocker = cache.path("files/videos/cam")
    blocker.parent.mkdir(parents=True)
    blocker.write_bytes(b"not a folder")
    with pytest.raises(FileExistsError):
        cache.acquire("files/videos/cam/episode_1.mp4", "me", lambda tmp: tmp.write_bytes(b"1"), size_bytes=1)


def test_users_that_died_do_not_count(tmp_path):
    root = tmp_path / "cache"
    child = FORK.Process(target=_acquire_and_die, args=(root, "a.bin"))
    child.start()
    child.join(30)
    cache = NodeCache(root)
    assert cache.state("a.bin") is EntryState.LOCAL and cache.refcount("a.bin") == 0
    cache.acquire("a.bin", "me", lambda tmp: pytest.fail("a complete entry is not fetched again"), size_bytes=4)
    # A marker naming this pid with another start time is a former process that had this pid.
    (root / "a.bin.refs" / f"{cache.marker('x').rsplit('-', 2)[0]}-999-old").touch()
    assert cache.refcount("a.bin") == 1
    assert cache.release("a.bin", "me") and cache_files(root) == []
    # What only dead processes used is pruned (opening a remote source does it at start).
    for name in ("b.bin", "c.bin"):
        child = FORK.Process(target=_acquire_and_die, args=(root, name))
        child.start()
        child.join(30)
    cache.acquire("c.bin", "me", lambda tmp: None, size_bytes=4)
    assert cache.prune() == ["b.bin"] and cache.state("c.bin") is EntryState.LOCAL
    cache.release("c.bin", "me")
    assert cache_files(root) == []


def test_budget_waits_for_space_and_evicts_what_nobody_uses(tmp_path):
    root = tmp_path / "cache"
    cache = NodeCache(root, limit_bytes=20_000, timeout_s=0.5, wait_s=0.5)
    cache.acquire("x.bin", "a", lambda tmp: tmp.write_bytes(b"x" * 12_000), size_bytes=12_000)
    assert cache.usage_bytes() == 12_288  # whole 4 KiB blocks
    with pytest.raises(CacheFullError, match=r"cache_limit=20000 bytes .* is full .* y\.bin needs 12288 more; waited"):
        cache.acquire("y.bin", "b", lambda tmp: tmp.write_bytes(b"y" * 12_000), size_bytes=12_000)
    assert cache.state("y.bin") is EntryState.REMOTE
    with pytest.raises(CacheFullError, match="more than cache_limit=20000 bytes allows in all"):
        cache.acquire("z.bin", "b", lambda tmp: None, size_bytes=30_000)
    # Released by another thread while we wait: the download goes ahead.
    threading.Timer(0.2, cache.release, args=("x.bin", "a")).start()
    NodeCache(root, limit_bytes=20_000, timeout_s=5).acquire(
        "y.bin", "b", lambda tmp: tmp.write_bytes(b"y" * 12_000), size_bytes=12_000)
    # An entry whose only user died is deleted when its space is needed, not before.
    child = FORK.Process(target=_acquire_and_die, args=(root, "w.bin"))
    child.start()
    child.join(30)
    assert cache.state("w.bin") is EntryState.LOCAL and cache.usage_bytes() == 12_288 + 4096
    cache.release("y.bin", "b")
    assert cache.state("w.bin") is EntryState.LOCAL
    cache.acquire("v.bin", "c", lambda tmp: tmp.write_bytes(b"v" * 16_000), size_bytes=16_000)
    assert cache.state("w.bin") is EntryState.REMOTE and cache.usage_bytes() == 16_384
    cache.release("v.bin", "c")
    assert cache_files(root) == []


def _payload(size: int):
    return lambda tmp: tmp.write_bytes(b"p" * size)


def test_downloads_under_a_limit_read_the_budgets_ledger_and_a_stale_one_is_walked(tmp_path, monkeypatch):
    """A download under a cache_limit checks the ledger the budget keeps, not every entry's
    reservation (a wide pool keeps thousands); the cache is walked again once the ledger is stale,
    so a reservation it never counted (a killed process's, an older version's) is counted then."""
    root = tmp_path / "cache"
    cache = NodeCache(root, limit_bytes=1_000_000, timeout_s=5, wait_s=0.5)
    walks = []
    walk = NodeCache._reservations
    monkeypatch.setattr(NodeCache, "_reservations", lambda self: (walks.append(1), walk(self))[1])
    for i in range(40):  # a pool's steady state: one in, one out
        cache.acquire(f"e{i}.bin", "a", _payload(4000), size_bytes=4000)
        if i >= 4:
            cache.release(f"e{i - 4}.bin", "a")
    assert len(walks) == 1, "walked once, for the first download (no ledger yet)"
    ledger_bytes = int((root / ".budget.used").read_text().split()[0])
    assert ledger_bytes == cache.usage_bytes() == 4 * 4096  # what releases and completions changed, kept
    # A reservation the ledger never counted, with a user that never goes (a pin):
    (root / "ghost.bin").write_bytes(b"g")
    (root / "ghost.bin.bytes").write_text("990000")
    (root / "ghost.bin.refs").mkdir()
    cache.pin("ghost.bin")
    monkeypatch.setattr("episodestream._remote.cache.node_cache._LEDGER_FRESH_S", 0.0)
    with pytest.raises(CacheFullError, match="pinned"):
        cache.acquire("late.bin", "a", _payload(8000), size_bytes=8000)


def test_pinned_entries_fail_fast_and_waits_are_bounded_and_logged(tmp_path, caplog):
    root = tmp_path / "cache"
    # wait_s is long: only the pins can make this fail at once.
    cache = NodeCache(root, limit_bytes=100_000, timeout_s=5, wait_s=600)
    for name in ("src-a/spans/one.mp4", "src-a/spans/two.mp4", "src-b/files/meta.json"):
        cache.acquire(name, "prewarm", _payload(20_000), size_bytes=20_000)
        cache.pin(name)
        cache.release(name, "prewarm")  # the pin keeps it
    assert cache.pinned() == {"src-a": (2, 40_960), "src-b": (1, 20_480)}
    start_s = time.monotonic()
    with pytest.raises(CacheFullError) as caught:
        cache.acquire("src-c/spans/new.mp4", "reader", _payload(40_000), size_bytes=40_000)
    assert time.monotonic() - start_s < 5
    message = str(caught.value)
    for said in ("61440 of them pinned", "2 entries (0.04 MB) of src-a", "1 entries (0.02 MB) of src-b",
                 "src-c/spans/new.mp4 needs 40960 more", "waiting cannot help",
                 f"episodestream cache unpin --cache-dir {root}"):
        assert said in message, (said, message)
    assert cache.state("src-c/spans/new.mp4") is EntryState.REMOTE

    # Room beside the pins, held by a live user: a bounded wait, logged while it lasts.
    cache.acquire("src-c/spans/held.mp4", "other", _payload(30_000), size_bytes=30_000)
    waiting = NodeCache(root, limit_bytes=100_000, timeout_s=5, wait_s=0.6)
    caplog.set_level(logging.WARNING, logger="episodestream.remote")
    start_s = time.monotonic()
    with pytest.raises(CacheFullError, match=r"needs 32768 more; waited 0.6 s \(EPISODESTREAM_CACHE_WAIT_S\)"):
        waiting.acquire("src-c/spans/next.mp4", "reader", _payload(32_000), size_bytes=32_000)
    assert 0.6 <= time.monotonic() - start_s < 5
    assert "waiting for other users to release theirs" in caplog.text
    # A caller that no longer wants the entry stops waiting at once.
    patient = NodeCache(root, limit_bytes=100_000, timeout_s=5, wait_s=600)
    with pytest.raises(CacheFullError, match="stopped waiting"):
        patient.acquire("src-c/spans/next.mp4", "reader", _payload(32_000), size_bytes=32_000, stop=lambda: True)
    cache.release("src-c/spans/held.mp4", "other")
    patient.acquire("src-c/spans/next.mp4", "reader", _payload(32_000), size_bytes=32_000)
    patient.release("src-c/spans/next.mp4", "reader")


def test_pins_that_fill_the_cache_mid_epoch_end_it_at_once(hub_root, tmp_path, monkeypatch):
    """Pins made after the dataset was built (a prewarm running beside it) leave no room: the
    epoch ends with the cache's CacheFullError, not a TimeoutError after a long wait."""
    monkeypatch.setenv("EPISODESTREAM_CACHE_WAIT_S", "600")
    limit = 2_000_000
    with FakeHub(hub_root) as hub, remote_dataset(EpisodeStreamingDataset, REPO, cache_dir=tmp_path / "cache",
                                                  hub_endpoint=hub.url, token=False, cache_limit=limit,
                                                  episode_pool_size=2) as dataset:
        cache = NodeCache(dataset.node_cache_dir, limit_bytes=limit)  # a prewarm's, beside the dataset
        for entry in cache.list_entries():  # the metadata the dataset holds
            cache.pin(entry.name)
        room = (limit - cache.usage_bytes() - 4096) // 4096 * 4096  # less than any mp4 header is left
        cache.acquire("other-source/files/blob.bin", "prewarm", _payload(room), size_bytes=room)
        cache.pin("other-source/files/blob.bin")
        cache.release("other-source/files/blob.bin", "prewarm")
        start_s = time.monotonic()
        with pytest.raises(CacheFullError) as caught:
            list(dataset)
        assert time.monotonic() - start_s < 30
        message = str(caught.value)
        assert "waiting cannot help" in message and "other-source" in message and "cache unpin" in message
        assert main(["cache", "unpin", "--cache-dir", str(cache.root)]) == 0  # as the message says
    assert cache_files(tmp_path / "cache") == []


def _fetch_span_in_child(files, episode) -> None:
    videos = files.episode_videos()
    videos.path(episode, next(iter(episode.videos)))  # killed while this downloads


def test_process_killed_mid_download_leaves_a_usable_cache(hub_root, spans_root, tmp_path):
    cache_dir = tmp_path / "cache"
    options = dict(episode_pool_size=2, seed=1)
    expected = list(EpisodeStreamingDataset(spans_root, **options))
    with FakeHub(hub_root, redirect_resolve=True) as hub, ShapingProxy(hub.cdn_url) as cdn:
        hub.redirect_base_url = cdn.url  # file bytes come through the shaped link
        files = open_remote_files(SPANS_REPO, cache_dir=cache_dir, hub_endpoint=hub.url, token=False)
        with remote_dataset(EpisodeStreamingDataset, SPANS_REPO, cache_dir=cache_dir, hub_endpoint=hub.url,
                            token=False) as probe:
            meta = probe.typed_meta
        first, second = meta.episodes[0], meta.episodes[1]
        key = next(iter(first.videos))
        assert first.videos[key].relpath == second.videos[key].relpath
        videos = files.episode_videos()
        videos.path(first, key)  # the file's header is local now, held by this process
        cdn.update(latency_s=5.0)  # the span's request will wait seconds on the link
        child = FORK.Process(target=_fetch_span_in_child, args=(files, second))
        child.start()
        deadline = time.monotonic() + 20
        while not list(cache_dir.rglob("*.mp4.tmp-*")) and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        partial = list(cache_dir.rglob("*.mp4.tmp-*"))
        assert partial, "the child was killed after its download finished; slow the link further"
        span_name = str(partial[0].relative_to(cache_dir)).split(".tmp-")[0]
        assert files.cache.state(span_name) is not EntryState.LOCAL  # nothing passes for complete
        assert not (cache_dir / span_name).exists()
        videos.close()
        files.close()
        # The next run takes the dead process's lock at once, removes its leftovers and succeeds.
        cdn.update(latency_s=0.0)
        start_s = time.monotonic()
        with remote_dataset(EpisodeStreamingDataset, SPANS_REPO, cache_dir=cache_dir, hub_endpoint=hub.url,
                            token=False, **options) as dataset:
            assert_same_samples(list(dataset), expected)
        assert time.monotonic() - start_s < 30
    assert cache_files(cache_dir) == []
