"""How remote reads reach the controller: the default fetch of remote sources, its configuration
(arguments over ``EPISODESTREAM_DOWNLOAD_*``), pickling into workers, one budget per server, and
local filesystems left alone."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest

from episodestream.remote import ControllerConfig
from episodestream.testing.downloads import DownloadFetch, default_fetch, link_name
from episodestream.testing.source_files import open_remote_files
from episodestream.testing import FakeHub

from ..remote_streaming.conftest import REPO

ROOT = str(Path(__file__).resolve().parents[2])  # the checkout under test


def test_default_fetch_reads_knobs_when_called(monkeypatch, tmp_path):
    monkeypatch.setenv("EPISODESTREAM_DOWNLOAD_MAX_ATTEMPTS", "3")
    monkeypatch.setenv("EPISODESTREAM_DOWNLOAD_PERMITS_DIR", str(tmp_path))
    assert default_fetch().config.max_attempts == 3
    assert default_fetch({"max_attempts": 7}).config.max_attempts == 7  # arguments win
    assert default_fetch({"request_timeout_s": 2}).config.max_attempts == 3  # the rest from the environment
    given = ControllerConfig(max_attempts=2)
    assert default_fetch(given).config is given
    monkeypatch.setenv("EPISODESTREAM_DOWNLOAD_MAX_ATTEMPTS", "many")
    with pytest.raises(ValueError, match="EPISODESTREAM_DOWNLOAD_MAX_ATTEMPTS='many'"):
        default_fetch()
    with pytest.raises(TypeError, match="download_config must be a ControllerConfig, a dict of its knobs or None"):
        default_fetch(3)
    with pytest.raises(TypeError, match="Unknown ControllerConfig option"):
        default_fetch({"retries": 3})


def test_remote_sources_read_through_the_controller(faults_hub_root, tmp_path, download_knobs):
    download_knobs(max_attempts=4)
    with FakeHub(faults_hub_root) as hub:
        files = open_remote_files(REPO, cache_dir=tmp_path / "cache", hub_endpoint=hub.url, token=False,
                                   download_config={"request_timeout_s": 5})
        try:
            fetch = files.download
            assert isinstance(fetch, DownloadFetch)
            assert (fetch.config.max_attempts, fetch.config.request_timeout_s) == (4, 5.0)
            files.read_bytes("meta/info.json")
            name = link_name(files.filesystem())
            assert name == "hf-127.0.0.1"
            controller = fetch.controllers()[name]
            assert controller.permits.directory == tmp_path / "permits" / name
            assert fetch.stats().reads == fetch.stats().attempts == 1
            # Workers receive the configuration only, and make their own controllers.
            clone = pickle.loads(pickle.dumps(files))
            assert clone.download.config == fetch.config and clone.download.controllers() == {}
            assert clone.read_bytes("meta/info.json") == files.read_bytes("meta/info.json")
            clone.close()
        finally:
            files.close()
    with pytest.raises(ValueError, match="Invalid request_timeout_s"):
        open_remote_files(REPO, cache_dir=tmp_path, download_config={"request_timeout_s": -1})


def test_budget_names_and_local_reads(tmp_path):
    hub = fsspec.filesystem("hf", endpoint="https://huggingface.co", skip_instance_cache=True)
    assert link_name(hub) == "hf-huggingface.co"
    pytest.importorskip("s3fs")
    s3 = fsspec.filesystem("s3", client_kwargs={"endpoint_url": "http://user:pw@10.0.0.5:9000"},
                           skip_instance_cache=True)
    assert link_name(s3) == "s3-10.0.0.5"
    assert link_name(fsspec.filesystem("s3", skip_instance_cache=True)) == "s3-default"
    # A local disk is no link: read directly, no permit, no retry.
    path = tmp_path / "f.bin"
    path.write_bytes(b"0123456789")
    fetch = DownloadFetch(config=ControllerConfig(permits_dir=str(tmp_path / "permits")))
    assert fetch(fsspec.filesystem("file"), str(path), 2, 5) == b"234"
    assert fetch.controllers() == {} and fetch.stats().reads == 0
    with pytest.raises(ValueError, match="Invalid name"):
        DownloadFetch(name="a/b")


def _cold_build(hub_root, tmp_path, revision: str | None) -> tuple[dict[str, int], list[str]]:
    """Build a Hub source's files with its metadata in a fresh process (huggingface_hub's telemetry
    on, as a user has it): the requests the Hub saw other than file reads, and which of
    huggingface_hub's API and filesystem modules the process imported."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    code = ("import json, sys; from episodestream.testing.source_files import open_remote_files; "
            "open_remote_files(sys.argv[1], revision=sys.argv[4] or None, cache_dir=sys.argv[2], "
            "hub_endpoint=sys.argv[3], token=False, fetch_metadata=True).close(); "
            "print(json.dumps(sorted(m for m in ('huggingface_hub.hf_api', 'huggingface_hub.hf_file_system') "
            "if m in sys.modules)))")
    with FakeHub(hub_root) as hub:
        env = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "EPISODESTREAM_"))}
        env.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_XET="1",
                   EPISODESTREAM_DOWNLOAD_PERMITS_DIR=str(tmp_path / "permits"),
                   PYTHONPATH=os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p))
        done = subprocess.run([sys.executable, "-c", code, REPO, str(tmp_path / "cache"), hub.url, revision or ""],
                              env=env, cwd=tmp_path, check=True, timeout=120, capture_output=True, text=True)
        asked = {path: stats.requests for path, stats in hub.stats().by_path.items() if "/resolve/" not in path}
    return asked, json.loads(done.stdout.strip().splitlines()[-1])


def test_a_cold_hub_build_sends_only_its_own_requests(faults_hub_root, tmp_path):
    # HfApi's headers would ask the Hub for its agent-harness registry first (one more round trip
    # before the first byte). Our Hub requests are the commit, the meta/ listing, the whole listing
    # and the metadata files (reads). HfFileSystem, which sent none of them, is neither made nor
    # imported: its module imports huggingface_hub.hf_api (0.13 s more than the HTTP stack alone).
    with FakeHub(faults_hub_root) as hub:
        sha = hub.main_sha(REPO)
    for revision in (None, sha):  # a commit sha is listed beside its commit request, not after: the same requests
        asked, api_modules = _cold_build(faults_hub_root, tmp_path / (revision or "main"), revision)
        assert asked == {f"/api/datasets/{REPO}/revision/{revision or 'main'}": 1,
                         f"/api/datasets/{REPO}/tree/{sha}/meta": 1, f"/api/datasets/{REPO}/tree/{sha}": 1}, asked
        assert api_modules == [], api_modules
