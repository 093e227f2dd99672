"""Missing repo, revision or file, refused credentials, a cache budget too small: errors that name
what and where, and never the secret."""

from __future__ import annotations

import gc
import importlib
import shutil
import sys
import traceback
import urllib.request

import pytest

from episodestream import EpisodeDataset, EpisodeStreamingDataset
from episodestream.remote import NodeCache
from episodestream.testing.source_files import open_remote_files
from episodestream.testing import FakeHub, S3Server

from .conftest import REPO, cache_files, remote_dataset

TOKEN = "hf_right_token_0123456789"
WRONG = "hf_wrong_token_9876543210"


def _everything_said(error: BaseException) -> str:
    """The message, repr and the whole printed traceback (chained causes included)."""
    return str(error) + repr(error) + "".join(traceback.format_exception(error))


def test_missing_repo_and_revision(hub_root, tmp_path, monkeypatch):
    with FakeHub(hub_root) as hub:
        options = dict(cache_dir=tmp_path, hub_endpoint=hub.url, token=False)
        with pytest.raises(FileNotFoundError, match=r"Hub dataset 'lerobot/nope' at http://127\.0\.0\.1:\d+ not found"
                                                    r".*'lerobot/nope' was read as a Hub repo id because there is no "
                                                    r"local folder '/.*lerobot/nope'"):
            open_remote_files("lerobot/nope", **options)
        with pytest.raises(FileNotFoundError, match=r"revision 'v9' not found in Hub dataset 'lerobot/main'"):
            open_remote_files(REPO, revision="v9", **options)
        with pytest.raises(FileNotFoundError, match=r"revision 'v9' not found") as hf_url:
            open_remote_files(f"hf://datasets/{REPO}@v9", **options)
        assert "local folder" not in str(hf_url.value)  # an hf:// URL is never a path
        with pytest.raises(ValueError, match="names revision 'v1' but revision='v2'"):
            open_remote_files(f"hf://datasets/{REPO}@v1", revision="v2", **options)
        with pytest.raises(FileNotFoundError, match=r"hf://datasets/lerobot/main@[0-9a-f]{40}/nothing holds no files"):
            open_remote_files(f"hf://datasets/{REPO}/nothing", **options)
        url = hub.url
    # A refused connection is retried with back-off first (5 attempts: ~4.5 s at the default 0.5 s
    # base); what is asserted is the message, not the waits.
    monkeypatch.setenv("EPISODESTREAM_DOWNLOAD_BASE_BACKOFF_S", "0.01")
    monkeypatch.setenv("EPISODESTREAM_DOWNLOAD_MAX_BACKOFF_S", "0.05")
    with pytest.raises(ConnectionError, match=r"Could not reach Hub dataset 'lerobot/main' at http://127.*"
                                              r"read as a Hub repo id because there is no local folder"):
        open_remote_files(REPO, cache_dir=tmp_path, hub_endpoint=url, token=False)  # the server is gone


@pytest.mark.parametrize("what", ["video", "data"])
def test_missing_file_names_the_file(what, dataset_root, tmp_path):
    root = tmp_path / "hub"
    repo = root / "datasets" / REPO
    shutil.copytree(dataset_root, repo)
    relpath = ("videos/observation.images.wrist/chunk-000/file-001.mp4" if what == "video"
               else "data/chunk-000/file-002.parquet")
    (repo / relpath).unlink()
    with FakeHub(root) as hub, remote_dataset(EpisodeStreamingDataset, REPO, cache_dir=tmp_path / "cache",
                                              hub_endpoint=hub.url, token=False, shuffle=False) as dataset:
        with pytest.raises(FileNotFoundError) as caught:
            list(dataset)
    assert f"hf://datasets/{REPO}@" in str(caught.value) and relpath in str(caught.value)
    assert cache_files(tmp_path / "cache") == []


def test_hub_token_refused_or_missing_never_shown(hub_root, tmp_path, caplog):
    with FakeHub(hub_root, token=TOKEN) as hub:
        options = dict(cache_dir=tmp_path, hub_endpoint=hub.url)
        with pytest.raises(PermissionError, match="refused the credentials") as refused:
            open_remote_files(REPO, token=WRONG, **options)
        with pytest.raises(FileNotFoundError, match="needs a token") as missing:
            open_remote_files(REPO, token=False, **options)
        files = open_remote_files(REPO, token=TOKEN, **options)
        try:
            assert files.exists("meta/info.json") and TOKEN not in repr(files.__dict__.get("_resolved"))
            assert files.read_bytes("meta/info.json").startswith(b"{")
        finally:
            files.close()
    for error in (refused.value, missing.value):
        said = _everything_said(error)
        assert WRONG not in said and TOKEN not in said
    assert WRONG not in caplog.text and TOKEN not in caplog.text


def test_s3_denied_credentials_and_missing_bucket(dataset_root, tmp_path):
    pytest.importorskip("s3fs")
    with S3Server() as s3:
        s3.upload_folder(dataset_root, "robot-data", "lerobot/main")
        options = s3.storage_options()
        options.update(key="AKIAWRONGKEY0000", secret="wrong-secret-never-shown")
        _enforce_moto_auth(s3.url, True)
        try:
            with pytest.raises(PermissionError, match=r"Listing s3://robot-data/lerobot/main was refused") as denied:
                open_remote_files("s3://robot-data/lerobot/main", cache_dir=tmp_path, storage_options=options)
        finally:
            _enforce_moto_auth(s3.url, False)
        said = _everything_said(denied.value)
        assert "wrong-secret-never-shown" not in said
        with pytest.raises(FileNotFoundError, match=r"s3://robot-data/lerobot/absent holds no files"):
            open_remote_files("s3://robot-data/lerobot/absent", cache_dir=tmp_path,
                               storage_options=s3.storage_options())
        with pytest.raises(FileNotFoundError, match=r"s3://no-such-bucket/x"):
            open_remote_files("s3://no-such-bucket/x", cache_dir=tmp_path, storage_options=s3.storage_options())


def _enforce_moto_auth(url: str, enforce: bool) -> None:
    """moto checks signatures against its IAM users only once told to (process-wide switch)."""
    body = b"0" if enforce else b"inf"
    request = urllib.request.Request(f"{url}/moto-api/reset-auth", data=body, method="POST",
                                     headers={"Content-Type": "text/plain"})  # a form body would be parsed away
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()


def _minimum(error: pytest.ExceptionInfo) -> int:
    return int(str(error.value).split("at least ")[1].split(" bytes")[0])


def test_cache_limit_too_small_says_the_minimum(hub_root, tmp_path):
    pattern = r"cache_limit=\d+ bytes .* is too small for hf://datasets/lerobot/main@[0-9a-f]{40}: "
    with FakeHub(hub_root) as hub:
        build = dict(hub_endpoint=hub.url, token=False, episode_pool_size=4)
        # Below the metadata: refused before anything is downloaded.
        with pytest.raises(ValueError, match=pattern + "the dataset's metadata files alone take .* at least \\d+ bytes") as small:
            with remote_dataset(EpisodeStreamingDataset, REPO, cache_dir=tmp_path / "a", cache_limit="20KB", **build):
                pass
        assert cache_files(tmp_path / "a") == []
        metadata_minimum = _minimum(small)
        # Enough for the metadata, not for the pool's working set: refused at construction.
        with pytest.raises(ValueError, match=pattern + "one consumer holds .* at least \\d+ bytes") as small:
            with remote_dataset(EpisodeStreamingDataset, REPO, cache_dir=tmp_path / "b",
                                cache_limit=metadata_minimum, **build):
                pass
        minimum = _minimum(small)
        # The minimum it names is enough: an epoch runs within it.
        with remote_dataset(EpisodeStreamingDataset, REPO, cache_dir=tmp_path / "c", cache_limit=minimum,
                            **build) as dataset:
            assert len(list(dataset)) == len(dataset)
            assert NodeCache(dataset.node_cache_dir).usage_bytes() <= minimum
    with pytest.raises(ValueError, match=r"cache_limit must be a positive size like '20GB'.*got 'lots'"):
        open_remote_files(REPO, cache_dir=tmp_path, cache_limit="lots")


def test_environment_variables_are_read_when_needed(hub_root, tmp_path, monkeypatch):
    monkeypatch.setenv("EPISODESTREAM_CACHE_DIR", str(tmp_path / "from-env"))
    monkeypatch.setenv("EPISODESTREAM_CACHE_LIMIT", "3GB")
    monkeypatch.setenv("EPISODESTREAM_CACHE_WAIT_S", "7.5")
    with FakeHub(hub_root) as hub:
        files = open_remote_files(REPO, hub_endpoint=hub.url, token=False)
        try:
            assert files.cache.root == tmp_path / "from-env" and files.cache.limit_bytes == 3 * 10**9
            assert files.cache.wait_s == 7.5
            files.local_path("meta/info.json")
            assert cache_files(tmp_path / "from-env")
        finally:
            files.close()
        monkeypatch.setenv("EPISODESTREAM_CACHE_LIMIT", "huge")
        with pytest.raises(ValueError, match="EPISODESTREAM_CACHE_LIMIT='huge'"):
            open_remote_files(REPO, hub_endpoint=hub.url, token=False)
        monkeypatch.delenv("EPISODESTREAM_CACHE_LIMIT")
        for bad in ("soon", "-1", "nan"):
            monkeypatch.setenv("EPISODESTREAM_CACHE_WAIT_S", bad)
            with pytest.raises(ValueError, match=f"EPISODESTREAM_CACHE_WAIT_S='{bad}' \\(for cache_wait_s\\)"):
                open_remote_files(REPO, hub_endpoint=hub.url, token=False)
        files = open_remote_files(REPO, hub_endpoint=hub.url, token=False, cache_wait_s=2)  # the argument wins
        assert files.cache.wait_s == 2
        files.close()
        monkeypatch.delenv("EPISODESTREAM_CACHE_WAIT_S")
        monkeypatch.setenv("HF_ENDPOINT", hub.url)  # read at call time, not when huggingface_hub was imported
        files = open_remote_files(REPO, token=False, cache_limit="1GB")
        files.close()


def test_unsupported_protocol_names_the_source_and_the_kinds(tmp_path, monkeypatch):
    # ftp's filesystem needs a host= that the URL alone does not give it. Refused before one is made:
    # a half-made FTPFileSystem's __del__ printed an ignored AttributeError beside our error.
    ignored = []
    monkeypatch.setattr(sys, "unraisablehook", ignored.append)
    with pytest.raises(ValueError, match=r"source 'ftp://127\.0\.0\.1:1/x': the fsspec filesystem for ftp:// "
                                         r"cannot be made .*needs host.* Sources are a local folder .*s3://.*http\(s\)://"):
        EpisodeStreamingDataset("ftp://127.0.0.1:1/x", cache_dir=tmp_path)
    gc.collect()
    assert [f"{u.exc_type.__name__}: {u.exc_value} in {u.object!r}" for u in ignored] == []
    with pytest.raises(ImportError, match=r"source 'nosuchproto://x/y' needs the fsspec filesystem .* Sources are"):
        EpisodeStreamingDataset("nosuchproto://x/y", cache_dir=tmp_path)


def test_a_filesystem_that_fails_to_start_is_named_with_its_error(tmp_path, monkeypatch):
    from fsspec import AbstractFileSystem

    class BrokenFileSystem(AbstractFileSystem):
        protocol = "broken"

        def __init__(self, *args, **storage_options):
            raise RuntimeError(f"cannot start with {sorted(storage_options)}")

    # fsspec's package attribute `registry` is a read-only view; its module holds the dict.
    monkeypatch.setitem(importlib.import_module("fsspec.registry")._registry, "broken", BrokenFileSystem)
    with pytest.raises(ValueError, match=r"source 'broken://x/y': the fsspec filesystem for broken:// cannot be made "
                                         r"from this URL and storage_options \(RuntimeError: cannot start with "
                                         r"\['verbose'\]\)\. Sources are a local folder"):
        EpisodeStreamingDataset("broken://x/y", cache_dir=tmp_path, storage_options={"verbose": True})


def test_a_huge_cache_limit_is_a_value_error_naming_it(tmp_path):
    huge = "9" * 400  # parses as float inf: int() of it raised OverflowError
    with pytest.raises(ValueError, match=f"cache_limit must be a finite size like '20GB', got '{huge}'"):
        open_remote_files(REPO, cache_dir=tmp_path, cache_limit=huge)
    with pytest.raises(ValueError, match=f"cache_limit must be a finite size .*got '{huge}GB'"):
        EpisodeStreamingDataset("ftp://x/y", cache_dir=tmp_path, cache_limit=huge + "GB")


def test_remote_options_for_a_local_folder_warn_once(dataset_root, tmp_path):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        EpisodeStreamingDataset(dataset_root)
        assert caught == []
        EpisodeStreamingDataset(dataset_root, cache_dir=tmp_path / "cache", cache_limit="1GB",
                                storage_options={"anon": True}, token=False, hub_endpoint="http://127.0.0.1:9",
                                download_config={"max_attempts": 2})
    assert len(caught) == 1 and caught[0].category is UserWarning
    message = str(caught[0].message)
    # cache_dir is not among them: a local folder's compute_stats() keeps its results there.
    assert message.startswith("cache_limit, storage_options, token, hub_endpoint, download_config only "
                              f"apply to remote sources; {str(dataset_root)!r} is a local folder")
    assert caught[0].filename == __file__  # points at the caller's line
    assert not (tmp_path / "cache").exists()


def test_cache_dir_for_a_local_map_style_dataset_is_used_not_warned_about(dataset_root, tmp_path):
    """Regression: EpisodeDataset's column cache uses cache_dir for local folders, so warning that
    it is ignored was false (it is ignored, and warned about, only with column_cache=False)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = EpisodeDataset(dataset_root, cache_dir=tmp_path / "cache")
        dataset[0]
    assert caught == [] and (tmp_path / "cache" / "columns").is_dir()
    with pytest.warns(UserWarning, match=r"^cache_dir only apply to remote sources"):
        EpisodeDataset(dataset_root, cache_dir=tmp_path / "unused", column_cache=False)
    assert not (tmp_path / "unused").exists()
