"""A faulty link never changes an epoch: through a ShapingProxy in front of the fake Hub (and S3),
with 429s beyond N in flight, a 503 rate, connections reset mid-body and a slow link with a short
per-request timeout, the epoch's samples (indices and values) equal the clean-link epoch exactly,
and the download controller saw every throttle the proxy sent (its history shows the cuts), which
the clients' internal retries would have hidden."""

from __future__ import annotations

import pytest
import torch.utils.data

from episodestream import EpisodeStreamingDataset
from episodestream.testing import FakeHub, LinkSettings, S3Server, ShapingProxy
from episodestream.testing.faults import download_fetch

from ..conftest import CAMERAS
from ..remote_streaming.conftest import REPO, remote_dataset
from .conftest import FAST_KNOBS, assert_same_epoch, cuts

FRONT = CAMERAS[0]
STREAM = dict(episode_pool_size=3, prefetch_episodes=2, seed=7, decode_group_size=4,
              delta_timestamps={FRONT: [-2 / 30, 0.0], "observation.state": [-1 / 30, 0.0]})
# Bodies take a while and requests overlap, so "in flight" means something on loopback.
BUSY_LINK = dict(per_connection_rate_bytes_per_s=2e6, latency_s=0.01, seed=3)


@pytest.fixture(scope="module")
def clean_epoch(dataset_root):
    """The epoch on a clean link (tests/remote_streaming shows remote epochs equal local ones)."""
    return list(EpisodeStreamingDataset(dataset_root, **STREAM))


def _faulty_epoch(hub_root, tmp_path, faults: dict, **stream):
    """The epoch through a proxy whose faults start once the dataset is built (listing and
    metadata on a clean link); returns the samples, the fetch and the proxy's stats."""
    with FakeHub(hub_root) as hub, ShapingProxy(hub.url, settings=LinkSettings(**BUSY_LINK)) as proxy:
        with remote_dataset(EpisodeStreamingDataset, REPO, cache_dir=tmp_path / "cache", hub_endpoint=proxy.url,
                            token=False, **{**STREAM, **stream}) as dataset:
            proxy.update(**faults)
            proxy.reset_stats()
            samples = list(dataset)
            fetch = download_fetch(dataset)
            return samples, fetch, proxy.stats()


def test_429_beyond_n_in_flight_cuts_the_budget_and_loses_nothing(faults_hub_root, tmp_path, download_knobs,
                                                                  clean_epoch):
    download_knobs(**FAST_KNOBS, initial_permits=8)
    samples, fetch, proxy = _faulty_epoch(faults_hub_root, tmp_path, dict(max_in_flight=1, retry_after_s=1))
    assert_same_epoch(samples, clean_epoch)
    stats = fetch.stats()
    assert proxy.throttled_429 > 0
    # Every 429 the proxy sent reached our policy: none was retried unseen inside the client.
    assert stats.throttles == proxy.throttled_429 and stats.failed == 0
    throttled = cuts(fetch, "HTTP 429, Retry-After 1 s")
    assert throttled and min(change.new_budget for change in throttled) < 8


def test_503_rate_is_retried_and_seen(faults_hub_root, tmp_path, download_knobs, clean_epoch):
    download_knobs(**FAST_KNOBS)
    samples, fetch, proxy = _faulty_epoch(faults_hub_root, tmp_path, dict(error_503_rate=0.3))
    assert_same_epoch(samples, clean_epoch)
    stats = fetch.stats()
    assert proxy.injected_503 > 0 and stats.throttles == proxy.injected_503 and stats.failed == 0
    assert cuts(fetch, "HTTP 503")


def test_connections_reset_mid_body_are_retried_whole(faults_hub_root, tmp_path, download_knobs, clean_epoch):
    download_knobs(**FAST_KNOBS)
    samples, fetch, proxy = _faulty_epoch(faults_hub_root, tmp_path, dict(reset_rate=0.3))
    assert_same_epoch(samples, clean_epoch)
    stats = fetch.stats()
    assert proxy.resets > 0 and stats.transient == proxy.resets and stats.failed == 0
    # A broken connection is not congestion: it does not cut the budget.
    assert not cuts(fetch, "HTTP") and not cuts(fetch, "timeout")


def test_slow_link_with_short_timeout(faults_hub_root, tmp_path, download_knobs, clean_epoch):
    # A third of the requests wait 0.2..0.3 s for their first byte: past the 0.2 s timeout.
    download_knobs(**{**FAST_KNOBS, "request_timeout_s": 0.2, "max_attempts": 12})
    samples, fetch, proxy = _faulty_epoch(faults_hub_root, tmp_path,
                                          dict(per_connection_rate_bytes_per_s=300e3, jitter_s=0.3))
    assert_same_epoch(samples, clean_epoch)
    stats = fetch.stats()
    assert stats.timeouts > 0 and stats.failed == 0
    assert cuts(fetch, "timeout")


def test_s3_mixed_faults(dataset_root, tmp_path, download_knobs, clean_epoch):
    pytest.importorskip("s3fs")
    download_knobs(**FAST_KNOBS)
    with S3Server() as s3:
        s3.upload_folder(dataset_root, "robot-data", "lerobot/main")
        with ShapingProxy(s3.url, settings=LinkSettings(**BUSY_LINK)) as proxy:
            options = s3.storage_options()
            options["client_kwargs"]["endpoint_url"] = proxy.url
            with remote_dataset(EpisodeStreamingDataset, "s3://robot-data/lerobot/main", cache_dir=tmp_path / "cache",
                                storage_options=options, **STREAM) as dataset:
                proxy.update(max_in_flight=2, retry_after_s=1, error_503_rate=0.15, reset_rate=0.15)
                proxy.reset_stats()
                fetch = download_fetch(dataset)
                before = fetch.stats()  # the metadata, read while the dataset was built
                samples = list(dataset)
                stats, seen = fetch.stats(), proxy.stats()
    assert_same_epoch(samples, clean_epoch)
    # botocore and s3fs would have retried these silently; with their retries off, each one is ours.
    assert seen.throttled_429 + seen.injected_503 > 0 and seen.resets > 0
    assert stats.throttles - before.throttles == seen.throttled_429 + seen.injected_503
    assert stats.transient - before.transient == seen.resets and stats.failed == 0
    assert stats.attempts - before.attempts == seen.requests
    assert cuts(fetch, "HTTP")


def test_dataloader_workers_share_one_budget_on_a_faulty_link(faults_hub_root, tmp_path, download_knobs,
                                                              dataset_root):
    download_knobs(**FAST_KNOBS)
    loader = dict(batch_size=4, num_workers=2)
    expected = list(torch.utils.data.DataLoader(EpisodeStreamingDataset(dataset_root, **STREAM), **loader))
    with FakeHub(faults_hub_root) as hub, ShapingProxy(hub.url, settings=LinkSettings(**BUSY_LINK)) as proxy:
        with remote_dataset(EpisodeStreamingDataset, REPO, cache_dir=tmp_path / "cache", hub_endpoint=proxy.url,
                            token=False, **STREAM) as dataset:
            proxy.update(max_in_flight=1, retry_after_s=1, reset_rate=0.2, per_connection_rate_bytes_per_s=1e6)
            got = list(torch.utils.data.DataLoader(dataset, **loader))
            seen = proxy.stats()
            budget = next(iter(download_fetch(dataset).controllers().values())).budget()
    assert seen.throttled_429 > 0 and seen.resets > 0
    assert len(got) == len(expected)
    for batch, want in zip(got, expected):
        assert torch.equal(batch["index"], want["index"])
        assert torch.equal(batch[FRONT], want[FRONT])
    # The workers' throttles cut the node-wide budget the main process reads.
    assert budget < 8
