"""What a remote first batch waits for, in round trips: building a dataset asks the Hub's API
for the commit once (then the listings) and downloads its metadata files together, an mp4's header is one round trip (its start and tail at once), and a
consumer's first admitted episodes download one after another, each alone (head start).
File bytes go through a slow link (the Hub's CDN behind a ``ShapingProxy`` that holds every request
``LATENCY_S`` before forwarding it): requests sent together reach the server within a moment of
each other, requests sent one after another at least ``LATENCY_S`` apart. Rows are read ahead too,
off the consumer's thread, and the samples stay the local ones."""

from __future__ import annotations

import contextlib
import gc
import threading
import time

import fsspec
import pytest

from episodestream import EpisodeStreamingDataset
from episodestream._remote.source import resolve
from episodestream.testing.source_files import open_files, open_remote_files, read_metadata, row_reader, worker_turns
from episodestream._format.mp4 import read_header
from episodestream._remote.source.videos import RAMP_ADMISSIONS
from episodestream.testing import FakeHub, S3Server, ShapingProxy

from .conftest import REPO, ROWS_REPO, SPANS_REPO, assert_same_samples, cache_files, remote_dataset

LATENCY_S = 0.3  # per request on the CDN's link
TOGETHER_S = LATENCY_S / 2  # arrivals closer than this were sent together (one after another: >= LATENCY_S)


def _hub_with_slow_files(hub_root):
    hub = FakeHub(hub_root, redirect_resolve=True).start()
    cdn = ShapingProxy(hub.cdn_url).start()
    hub.redirect_base_url = cdn.url  # file bytes come through the shaped link, the API does not
    return hub, cdn


def _fresh_budget(tmp_path) -> dict:
    """A download budget of this test's own, at its initial permits (8): earlier tests' throttles
    lower the session's, which would hold requests back that these tests expect together."""
    return {"permits_dir": str(tmp_path / "permits")}


def _until_idle(proxy: ShapingProxy, *, timeout_s: float = 10.0) -> None:
    """Wait until no request is in flight through ``proxy`` (bounded)."""
    deadline_s = time.monotonic() + timeout_s
    while proxy.stats().in_flight:
        assert time.monotonic() < deadline_s, f"requests still in flight after {timeout_s} s: {proxy.stats()}"
        time.sleep(0.002)


@contextlib.contextmanager
def _slow_files(hub_root, tmp_path, repo=SPANS_REPO):
    """``repo``'s files and metadata, with the CDN's link slowed from here on and its counters
    reset; closed and stopped after."""
    hub, cdn = _hub_with_slow_files(hub_root)
    try:
        files = open_remote_files(repo, cache_dir=tmp_path / "cache", hub_endpoint=hub.url, token=False,
                                   download_config=_fresh_budget(tmp_path))
        try:
            meta = read_metadata(files)
            # The metadata's last request leaves the proxy's flight a moment after the client has
            # read it: if the counters were reset before, its end would count as one more answer
            # before the first video request (4 == 3, once, under the whole suite's load).
            _until_idle(cdn)
            cdn.update(latency_s=LATENCY_S)
            cdn.reset_stats()
            yield files, meta, cdn
        finally:
            files.close()
    finally:
        cdn.stop()
        hub.stop()


@contextlib.contextmanager
def _slow_videos(hub_root, tmp_path):
    """``_slow_files``, and one consumer's videos of them."""
    with _slow_files(hub_root, tmp_path) as (files, meta, cdn):
        videos = files.episode_videos()
        try:
            yield videos, meta, cdn
        finally:
            videos.close()


def _arrivals(stats) -> list[float]:
    """When requests reached the server through the proxy (each rise of its in-flight count)."""
    series = stats.in_flight_series
    return [t for (t, count), (_, before) in zip(series[1:], series) if count > before]


def _finished_before_arrival(stats, arrival: int) -> int | None:
    """How many requests had been answered when request number ``arrival`` (from 1) reached the
    server, in the order the proxy saw the two (one event loop records both); None if it has not
    arrived."""
    arrived = finished = 0
    series = stats.in_flight_series
    for (_, count), (_, before) in zip(series[1:], series):
        if count > before:
            arrived += count - before
            if arrived >= arrival:
                return finished
        else:
            finished += before - count
    return None


def test_metadata_files_download_together_while_a_dataset_is_built(hub_root, dataset_root, tmp_path):
    metadata = [p for p in (dataset_root / "meta").rglob("*") if p.is_file()]
    assert len(metadata) >= 4  # info.json, the episodes parquet, tasks, stats
    hub, cdn = _hub_with_slow_files(hub_root)
    try:
        cdn.update(latency_s=LATENCY_S)
        with remote_dataset(EpisodeStreamingDataset, REPO, cache_dir=tmp_path / "cache", hub_endpoint=hub.url,
                            token=False, download_config=_fresh_budget(tmp_path)) as dataset:
            stats = cdn.stats()
            # Every metadata file once, all sent together (one after another: >= 3 x LATENCY_S).
            arrivals = _arrivals(stats)
            assert stats.requests == len(arrivals) == len(metadata)
            assert max(arrivals) - min(arrivals) < TOGETHER_S, arrivals
            # Besides them, three requests to the Hub's API: the commit, then the listings of meta/
            # and of the whole repo (a v3.0 layout: meta/ alone tells v2.x apart, which is listed no
            # further; the whole listing goes beside the metadata downloads, the next test); the
            # commit is not asked for again before the listings.
            api = {path: counts.requests for path, counts in hub.stats().by_path.items() if path.startswith("/api/")}
            assert sum(api.values()) == 3 and all(n == 1 for n in api.values()), api
            assert dataset.source_stats().cache_misses == len(metadata)
            assert len(dataset) > 0
    finally:
        cdn.stop()
        hub.stop()
    assert cache_files(tmp_path / "cache") == []


@pytest.mark.parametrize("kind", ["hub", "s3"])
def test_a_remote_clients_modules_are_imported_with_the_collector_paused(kind, hub_root, dataset_root, tmp_path,
                                                                        monkeypatch):
    # A first import's collections walk a trainer's whole heap (benchmarks/LOG.md): every lookup of a
    # client's class, where its modules are imported the first time, runs with the collector paused,
    # and the collector is back on once the dataset is built. The Hub's client is huggingface_hub's
    # HTTP stack (``hub_http.import_client``; its filesystem is our HubLink), an s3 source's s3fs.
    if kind == "s3":
        pytest.importorskip("s3fs")
    seen = []
    original_class, original_hub = fsspec.get_filesystem_class, resolve.import_hub_client

    def get_filesystem_class(protocol):
        seen.append((protocol, gc.isenabled()))
        return original_class(protocol)

    def import_hub_client():
        seen.append(("hf", gc.isenabled()))
        original_hub()

    monkeypatch.setattr(fsspec, "get_filesystem_class", get_filesystem_class)
    monkeypatch.setattr(resolve, "import_hub_client", import_hub_client)
    assert gc.isenabled()
    with contextlib.ExitStack() as stack:
        if kind == "hub":
            hub = stack.enter_context(FakeHub(hub_root))
            source, options = REPO, dict(hub_endpoint=hub.url, token=False)
        else:
            s3 = stack.enter_context(S3Server())
            s3.upload_folder(dataset_root, "robot-data", "lerobot/main")
            source, options = "s3://robot-data/lerobot/main", dict(storage_options=s3.storage_options())
        with remote_dataset(EpisodeStreamingDataset, source, cache_dir=tmp_path / "cache", **options) as dataset:
            assert len(dataset) > 0
            assert gc.isenabled()
    protocol = "hf" if kind == "hub" else "s3"
    assert seen and {p for p, _ in seen} == {protocol}, seen
    assert not any(enabled for _, enabled in seen), seen


def test_the_whole_listing_is_asked_for_beside_the_metadata_downloads(hub_root, dataset_root, tmp_path):
    # Every request through one slow link, the Hub's API too: the commit, then meta/'s listing, then
    # the whole repo's listing sent with the metadata files (all of them in meta/), not before them.
    metadata = [p for p in (dataset_root / "meta").rglob("*") if p.is_file()]
    hub = FakeHub(hub_root).start()
    link = ShapingProxy(hub.url).start()
    try:
        link.update(latency_s=LATENCY_S)
        with remote_dataset(EpisodeStreamingDataset, REPO, cache_dir=tmp_path / "cache", hub_endpoint=link.url,
                            token=False, download_config=_fresh_budget(tmp_path)) as dataset:
            arrivals = _arrivals(link.stats())
            assert len(arrivals) == 2 + 1 + len(metadata), arrivals
            gaps = [b - a for a, b in zip(arrivals, arrivals[1:3])]
            assert min(gaps) >= TOGETHER_S, arrivals  # the commit, meta/'s listing, the rest: one after another
            assert arrivals[-1] - arrivals[2] < TOGETHER_S, arrivals  # the rest together
            api = {path: counts.requests for path, counts in hub.stats().by_path.items() if path.startswith("/api/")}
            assert sum(api.values()) == 3, api
            assert len(dataset) > 0
    finally:
        link.stop()
        hub.stop()
    assert cache_files(tmp_path / "cache") == []


def test_an_mp4_header_is_its_start_and_tail_asked_for_together(hub_root, tmp_path):
    with _slow_videos(hub_root, tmp_path) as (videos, meta, cdn):
        episode = meta.episodes[0]
        videos.path(episode, next(iter(episode.videos)))
        # The header's two reads (the file's start, its tail holding moov) sent together, then the
        # episode's span: three requests, two round trips.
        arrivals = _arrivals(cdn.stats())
        assert len(arrivals) == 3
        assert arrivals[1] - arrivals[0] < TOGETHER_S <= arrivals[2] - arrivals[1], arrivals
    assert cache_files(tmp_path / "cache") == []


def test_the_first_admitted_episodes_download_one_after_another(hub_root, tmp_path):
    with _slow_videos(hub_root, tmp_path) as (videos, meta, cdn):
        episodes = [meta.episodes[i] for i in range(RAMP_ADMISSIONS + 1)]
        key = next(iter(episodes[0].videos))
        assert len({e.videos[key].relpath for e in episodes}) == 1  # one camera, one mp4, one header
        for episode in episodes:  # a consumer's first admissions, as prefetching makes them
            videos.admit(episode)
        for episode in episodes:
            videos.path(episode, key)
        stats = cdn.stats()
        # Only the first episode's bytes were asked for until they were local (the header's two
        # reads, its span): the next span was asked for after those three were answered, so the
        # others' spans did not share the link with it. (In the proxy's order of events: counting
        # requests when path() returns raced with the next download, which may rightly start first.)
        assert _finished_before_arrival(stats, arrival=4) == 3
        arrivals = _arrivals(stats)
        assert len(arrivals) == 3 + RAMP_ADMISSIONS
        gaps = [later - earlier for earlier, later in zip(arrivals, arrivals[1:])]
        # The header's reads together; then spans 0, 1, 2, 3 one after another, each alone but for
        # span 4 (past the head start), which a free fetch thread asked for with span 1.
        together = [gap < TOGETHER_S for gap in gaps]
        assert together == [True, False, False, True, False, False], arrivals
        for episode in episodes:
            videos.evict(episode)
    assert cache_files(tmp_path / "cache") == []


class _HeldPool:
    """A fetch pool whose jobs wait until ``go()``: a loaded machine, where the consumer's
    ``path()`` reaches its first episode before any fetch thread has run and fetches it itself."""

    def __init__(self, pool) -> None:
        self._pool, self._jobs = pool, []

    def submit(self, job) -> None:
        self._jobs.append(job)

    def go(self) -> None:
        for job in self._jobs:
            self._pool.submit(job)

    def close(self, timeout_s: float) -> None:
        self._pool.close(timeout_s)


def test_an_episode_after_the_head_start_waits_for_the_first_even_when_path_fetched_it(hub_root, tmp_path):
    """The first episode fetched by ``path()`` in the consumer's thread frees the pool thread queued
    for it: that thread must not take a later admission to the link beside the first episode."""
    with _slow_videos(hub_root, tmp_path) as (videos, meta, cdn):
        held = videos._pool = _HeldPool(videos._pool)
        episodes = [meta.episodes[i] for i in range(RAMP_ADMISSIONS + 1)]
        key = next(iter(episodes[0].videos))
        for episode in episodes:
            videos.admit(episode)
        first = threading.Thread(target=videos.path, args=(episodes[0], key))
        first.start()
        deadline = time.monotonic() + 30
        while cdn.stats().requests < 3 and time.monotonic() < deadline:  # the header's two reads, its span
            time.sleep(0.01)
        held.go()  # the pool's threads start now; the first episode's task is already under way
        first.join(30)
        for episode in episodes[1:]:
            videos.path(episode, key)
        stats = cdn.stats()
        arrivals = _arrivals(stats)
        for episode in episodes:
            videos.evict(episode)
    assert _finished_before_arrival(stats, arrival=4) == 3
    # The next span reached the link a latency after the first's (sent once it was answered), not
    # with it.
    assert arrivals[3] - arrivals[2] >= TOGETHER_S, arrivals


def test_a_remote_consumer_reads_rows_ahead_on_their_own_thread(hub_root, spans_root, tmp_path):
    from episodestream.testing import faults

    options = dict(episode_pool_size=3, seed=4)
    expected = list(EpisodeStreamingDataset(spans_root, **options))
    threads: list[str] = []

    def recording(reader):
        read, read_many = reader.read, reader.read_many

        def recorded(episode):
            threads.append(threading.current_thread().name)
            return read(episode)

        def recorded_many(episodes):
            threads.extend([threading.current_thread().name] * len(episodes))
            return read_many(episodes)

        reader.read, reader.read_many = recorded, recorded_many
        return reader

    with FakeHub(hub_root) as hub:
        with remote_dataset(EpisodeStreamingDataset, SPANS_REPO, cache_dir=tmp_path / "cache", hub_endpoint=hub.url,
                            token=False, **options) as dataset:
            faults.wrap_row_readers(dataset, recording)
            got = list(dataset)
    assert_same_samples(got, expected)
    # Each admission's rows were read ahead, off the consumer's thread (which decodes meanwhile).
    assert len(threads) >= len(dataset.episode_indices) and set(threads) == {"episodestream-rows"}
    assert cache_files(tmp_path / "cache") == []


def _worker_turns(turns, *, iteration: int = 1, wait_s: float = 30.0):
    return turns(iteration, wait_s=wait_s)


def test_dataloader_workers_download_their_head_starts_in_turn_and_the_rest_after(hub_root, tmp_path):
    """Worker 1's first batch is taken after worker 0's: its downloads wait until worker 0's first
    two admissions are local (its turn, ``_base.turns``), and worker 0's other downloads wait for
    worker 1's first two, so each head start crosses the link alone."""
    first_turn, second_turn = _worker_turns(worker_turns(num_workers=2))
    with _slow_files(hub_root, tmp_path) as (files, meta, cdn):
        first, second = files.episode_videos(turn=first_turn), files.episode_videos(turn=second_turn)
        try:
            mine, theirs = [meta.episodes[i] for i in (0, 1, 2)], [meta.episodes[i] for i in (3, 4)]
            key = next(iter(mine[0].videos))
            assert len({e.videos[key].relpath for e in mine + theirs}) == 1  # one mp4: one header, fetched once
            for episode in theirs:  # worker 1 starts first and wants its first episode at once
                second.admit(episode)
            asking = threading.Thread(target=second.path, args=(theirs[0], key))
            asking.start()
            time.sleep(LATENCY_S)
            assert cdn.stats().requests == 0 and asking.is_alive()  # waiting for its turn, not downloading
            for episode in mine:
                first.admit(episode)
            for episode in mine:
                first.path(episode, key)
            second.path(theirs[1], key)
            asking.join(30)
            assert not asking.is_alive()
            stats = cdn.stats()
        finally:
            second.close()
            first.close()
    # Worker 0's header (two reads at once), its first two spans, worker 1's first two spans, then
    # worker 0's third: each sent once the one before was answered.
    series = stats.in_flight_series
    assert len(_arrivals(stats)) == 7, series
    assert [_finished_before_arrival(stats, arrival=n) for n in range(3, 8)] == [2, 3, 4, 5, 6], series
    assert cache_files(tmp_path / "cache") == []


def test_a_turn_is_passed_on_after_a_lone_first_admission_and_its_wait_is_bounded(hub_root, tmp_path):
    turns = worker_turns(num_workers=2)
    first_turn, second_turn = _worker_turns(turns)
    with _slow_files(hub_root, tmp_path) as (files, meta, cdn):
        first = files.episode_videos(turn=first_turn)
        try:
            episode = meta.episodes[0]
            first.admit(episode)  # all this worker admits for now: its first batch draws from it alone
            first.path(episode, next(iter(episode.videos)))
            assert first_turn.passed
        finally:
            first.close()
        # A consumer closed before its head start is local (its stream failed or was dropped)
        # passes its turn on too, and never sent a request meanwhile.
        closing_turn, _ = _worker_turns(turns, iteration=2)
        closing = files.episode_videos(turn=closing_turn)
        requests = cdn.stats().requests
        closing.close()
        assert closing_turn.passed and cdn.stats().requests == requests
        # A worker before that never passes its turn on (died, never started) costs wait_s, once.
        _, late_turn = _worker_turns(turns, iteration=3, wait_s=0.5)
        late = files.episode_videos(turn=late_turn)
        try:
            episode = meta.episodes[1]
            late.admit(episode)
            start_s = time.monotonic()
            late.path(episode, next(iter(episode.videos)))
            assert time.monotonic() - start_s >= 0.5
        finally:
            late.close()
    assert cache_files(tmp_path / "cache") == []


def test_dataloader_workers_stream_the_same_samples_through_a_fast_and_a_slow_link(hub_root, spans_root, tmp_path):
    """Turns, the head start and the pool's ramp change when bytes arrive, never which samples come
    out: two workers through an unshaped link and through a slow, jittery one give the local
    samples both times."""
    import torch.utils.data

    options = dict(episode_pool_size=3, seed=5)
    loader = dict(batch_size=4, num_workers=2)
    expected = list(torch.utils.data.DataLoader(EpisodeStreamingDataset(spans_root, **options), **loader))
    hub, cdn = _hub_with_slow_files(hub_root)
    try:
        for name, link in (("fast", {}), ("slow", dict(latency_s=0.02, jitter_s=0.03, rate_bytes_per_s=4e6))):
            cdn.update(**link)
            with remote_dataset(EpisodeStreamingDataset, SPANS_REPO, cache_dir=tmp_path / name, hub_endpoint=hub.url,
                                token=False, download_config=_fresh_budget(tmp_path / f"{name}-budget"), **options) as dataset:
                assert_same_samples(list(torch.utils.data.DataLoader(dataset, **loader)), expected)
            assert cache_files(tmp_path / name) == []
    finally:
        cdn.stop()
        hub.stop()


def test_rows_of_one_file_read_together_cross_the_link_at_once(hub_root, rows_root, tmp_path):
    """``read_many``'s row groups are asked for together (``DatasetFiles.read_ahead``): pyarrow
    alone asks for each after the one before, a round trip each."""
    with _slow_files(hub_root, tmp_path, ROWS_REPO) as (files, meta, cdn):
        episodes = list(meta.episodes.values())
        reader = row_reader(files, meta)
        reader.read(episodes[1])  # the footer, and the middle row group, out of the count
        _until_idle(cdn)
        cdn.reset_stats()
        got = reader.read_many([episodes[0], episodes[2]])  # ~130 KB each, ~130 KB apart
        arrivals = _arrivals(cdn.stats())
    local = row_reader(open_files(rows_root), meta)
    for rows, episode in zip(got, [episodes[0], episodes[2]]):
        expected = local.read(episode)
        for name in expected.columns:
            assert (rows.columns[name] == expected.columns[name]).all()
    assert len(arrivals) == 2 and arrivals[1] - arrivals[0] < TOGETHER_S, arrivals


def _moov_offset(path) -> int:
    data = path.read_bytes()
    return read_header(lambda start, end: data[start:end], len(data)).moov_offset


def test_spans_of_one_mp4_admitted_together_come_in_one_request(hub_root, spans_root, tmp_path):
    """Episodes admitted together (a pool filling up, ``LookAhead``) past the head start: the spans
    of one mp4 are read in as few requests as their gaps allow, and each episode's sparse copy
    holds the same bytes as one fetched alone."""
    with _slow_videos(hub_root, tmp_path) as (videos, meta, cdn):
        second_file, first_file = [meta.episodes[i] for i in (5, 6, 7, 8)], [meta.episodes[i] for i in range(5)]
        key = next(iter(first_file[0].videos))
        assert len({e.videos[key].relpath for e in first_file}) == 1
        assert len({e.videos[key].relpath for e in second_file}) == 1
        videos.admit_many(second_file + first_file)  # the head start is the second file's four
        paths = [videos.local_file(episode, key) for episode in second_file + first_file]
        requests = cdn.stats().requests
        copies = []
        for episode, path in zip(second_file + first_file, paths):
            # The copy is named "<start>-<end>.<first sample>-<last sample>.mp4".
            start, end = (int(v) for v in path.rsplit("/", 1)[-1].split(".")[0].split("-"))
            # Up to the moov: the copy holds its own moov there (cut to the episode's samples,
            # tests/remote_streaming/test_mp4.py).
            end = min(end, _moov_offset(spans_root / episode.videos[key].relpath))
            with open(path, "rb") as copy, open(spans_root / episode.videos[key].relpath, "rb") as original:
                copy.seek(start)
                original.seek(start)
                copies.append(copy.read(end - start) == original.read(end - start))
        for episode in second_file + first_file:
            videos.evict(episode)
    assert all(copies)
    # Each file's header (its start and tail: 2 requests), the head start's 4 spans one by one,
    # then the first file's 5 neighbouring spans in one request: 9, where apart they are 13.
    assert requests == 2 + 4 + 2 + 1, requests
    assert cache_files(tmp_path / "cache") == []
