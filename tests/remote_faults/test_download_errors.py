"""Bounded attempts, then a ``DownloadError`` naming the URL, the status and the attempts, with
credentials redacted; no client library retries behind our back; ``Retry-After`` honoured; errors
that are not about the link keep their meaning."""

from __future__ import annotations

import pickle
import shutil
import threading
import time
import traceback

import pytest

from episodestream import EpisodeStreamingDataset
from episodestream.remote import DownloadError
from episodestream.testing.source_files import open_remote_files
from episodestream.testing import FakeHub, S3Server, ShapingProxy

from ..remote_streaming.conftest import REPO, remote_dataset
from .conftest import FAST_KNOBS, cuts

TOKEN = "hf_secret_token_0123456789abcdef"
INFO = "meta/info.json"


def _everything_said(error: BaseException) -> str:
    """The message, repr and the whole printed traceback (chained causes included)."""
    return str(error) + repr(error) + "".join(traceback.format_exception(error))


@pytest.mark.parametrize("fault, settings, status", [
    ("503", dict(error_503_rate=1.0), 503),
    ("reset", dict(reset_rate=1.0), None),
    ("timeout", dict(latency_s=0.5), None),
])
def test_attempts_run_out_then_download_error_names_url_status_attempts(
        fault, settings, status, faults_hub_root, tmp_path, download_knobs):
    download_knobs(**{**FAST_KNOBS, "max_attempts": 3, "request_timeout_s": 0.2})
    with FakeHub(faults_hub_root, token=TOKEN) as hub, ShapingProxy(hub.url) as proxy:
        files = open_remote_files(REPO, cache_dir=tmp_path / "cache", hub_endpoint=proxy.url, token=TOKEN)
        try:
            proxy.update(**settings)
            proxy.reset_stats()
            with pytest.raises(DownloadError) as caught:
                files.read_bytes(INFO)
            requests = proxy.stats().requests
            fetch_stats = files.download.stats()
            url = f"{proxy.url}/datasets/{REPO}/resolve/{hub.main_sha(REPO)}/{INFO}"
        finally:
            files.close()
    error = caught.value
    assert error.url == url
    assert error.status == status and error.attempts == 3
    assert f"GET {error.url} failed after 3 attempts (last HTTP status: {status or 'none'})" in str(error)
    # Three attempts are three requests: huggingface_hub's own backoff (6 per call) is not in the way.
    assert requests == 3 and fetch_stats.attempts == 3 and fetch_stats.failed == 1
    assert TOKEN not in _everything_said(error)
    clone = pickle.loads(pickle.dumps(error))  # DataLoader workers send errors to the main process
    assert (clone.url, clone.status, clone.attempts) == (error.url, error.status, error.attempts)
    assert TOKEN not in _everything_said(clone)


def test_s3_download_error_and_no_botocore_retries(dataset_root, tmp_path, download_knobs):
    pytest.importorskip("s3fs")
    download_knobs(**{**FAST_KNOBS, "max_attempts": 2})
    with S3Server() as s3:
        s3.upload_folder(dataset_root, "robot-data", "lerobot/main")
        with ShapingProxy(s3.url) as proxy:
            options = s3.storage_options()
            options["client_kwargs"]["endpoint_url"] = proxy.url
            options.update(secret="s3-secret-never-shown")
            files = open_remote_files("s3://robot-data/lerobot/main", cache_dir=tmp_path / "cache",
                                       storage_options=options)
            try:
                proxy.update(error_503_rate=1.0)
                proxy.reset_stats()
                with pytest.raises(DownloadError) as caught:
                    files.read_bytes(INFO)
                requests = proxy.stats().requests
            finally:
                files.close()
    error = caught.value
    assert error.url == f"s3://robot-data/lerobot/main/{INFO}" and error.status == 503 and error.attempts == 2
    assert requests == 2  # botocore (3 or 5 attempts) and s3fs (5) would have retried unseen
    assert "s3-secret-never-shown" not in _everything_said(error)


def test_epoch_raises_download_error_unwrapped(faults_hub_root, tmp_path, download_knobs):
    download_knobs(**{**FAST_KNOBS, "max_attempts": 2})
    with FakeHub(faults_hub_root) as hub, ShapingProxy(hub.url) as proxy:
        with remote_dataset(EpisodeStreamingDataset, REPO, cache_dir=tmp_path / "cache", hub_endpoint=proxy.url,
                            token=False, episode_pool_size=2) as dataset:
            proxy.update(error_503_rate=1.0)
            with pytest.raises(DownloadError, match=r"failed after 2 attempts \(last HTTP status: 503\)") as caught:
                list(dataset)
    assert f"/datasets/{REPO}/resolve/" in caught.value.url


def test_missing_file_is_file_not_found_after_one_attempt(faults_hub_root, tmp_path, download_knobs):
    download_knobs(**FAST_KNOBS)
    root = tmp_path / "hub"
    shutil.copytree(faults_hub_root, root)
    with FakeHub(root) as hub, ShapingProxy(hub.url) as proxy:
        files = open_remote_files(REPO, cache_dir=tmp_path / "cache", hub_endpoint=proxy.url, token=False)
        try:
            (root / "datasets" / REPO / INFO).unlink()  # gone after the listing
            proxy.reset_stats()
            with pytest.raises(FileNotFoundError, match=rf"hf://datasets/{REPO}@[0-9a-f]{{40}}/{INFO}"):
                files.read_bytes(INFO)
            assert proxy.stats().requests == 1 and files.download.stats().fatal == 1
        finally:
            files.close()


def test_retry_after_is_honoured(faults_hub_root, tmp_path, download_knobs):
    # One slow read (~0.5 s) holds the only slot the server allows; a second read meanwhile gets
    # 429 with Retry-After: 1 and must wait that second before trying again, node-wide.
    download_knobs(**{**FAST_KNOBS, "max_retry_after_s": 120})
    root = tmp_path / "hub"
    shutil.copytree(faults_hub_root, root)
    big = root / "datasets" / REPO / "big.bin"
    big.write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    with FakeHub(root) as hub, ShapingProxy(hub.url) as proxy:
        files = open_remote_files(REPO, cache_dir=tmp_path / "cache", hub_endpoint=proxy.url, token=False)
        try:
            size = files.size_bytes("big.bin")
            files.read_bytes(INFO)  # clients and controller made before the race starts
            proxy.update(per_connection_rate_bytes_per_s=size / 0.5, burst_bytes=0, max_in_flight=1, retry_after_s=1)
            proxy.reset_stats()
            # The info.json read leaves flight a moment after it returns (ProxyStats): seen in flight
            # below, it let the small read race the slow one (and the slow one get the 429) under load.
            deadline = time.monotonic() + 5
            while proxy.stats().in_flight and time.monotonic() < deadline:
                time.sleep(0.005)
            slow = threading.Thread(target=files.read_range, args=("big.bin", 0, size), kwargs={"exact": True})
            slow.start()
            deadline = time.monotonic() + 5
            while proxy.stats().in_flight == 0 and time.monotonic() < deadline:
                time.sleep(0.005)
            start_s = time.monotonic()
            data = files.read_range("big.bin", 0, 1000, exact=True)
            waited_s = time.monotonic() - start_s
            slow.join()
            stats = files.download.stats()
        finally:
            files.close()
    assert data == big.read_bytes()[:1000]
    assert proxy.stats().throttled_429 == 1 and stats.throttles == 1
    assert waited_s >= 1.0
    assert cuts(files.download, "HTTP 429, Retry-After 1 s")


def test_a_listing_retries_under_the_one_policy_and_the_controller_sees_it(faults_hub_root, tmp_path, download_knobs):
    # The listing was huggingface_hub's (HfFileSystem.find: http_backoff, 6 requests, 1-8 s sleeps,
    # no throttle seen by the controller); now it is our request path's: max_attempts, cuts.
    from episodestream._remote.source.resolve import list_source, resolve_source
    from episodestream.remote import ControllerConfig
    from episodestream.testing.downloads import DownloadController

    download_knobs(**{**FAST_KNOBS, "max_attempts": 3})
    with FakeHub(faults_hub_root) as hub, ShapingProxy(hub.url) as proxy:
        resolved = resolve_source(REPO, revision=None, storage_options=None, hub_endpoint=proxy.url, token=False)
        node_budget = DownloadController(config=ControllerConfig.from_env(), name="hf-127.0.0.1")
        before = node_budget.budget()
        proxy.update(error_503_rate=1.0)
        proxy.reset_stats()
        with pytest.raises(DownloadError, match=r"GET .*/tree/.* failed after 3 attempts \(last HTTP status: 503\)"):
            list_source(resolved)
        assert proxy.stats().requests == proxy.stats().injected_503 == 3
    assert node_budget.budget() < before  # node-wide: the listing's throttles reached the shared budget
