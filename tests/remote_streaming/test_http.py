"""Plain HTTP servers (``python -m http.server`` and alike) as sources: sizes come from HEAD (an
HTML folder listing has none), reads are ranged (or cut from whole bodies when the server ignores
Range), and a ``user:password@`` in the URL appears in no message, log line, repr or cache folder."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import traceback

import pytest

from episodestream import EpisodeStreamingDataset
from episodestream.testing.source_files import open_remote_files
from episodestream.testing import HttpServer, faults

from .conftest import assert_same_samples, cache_files, remote_dataset

USER, PASSWORD = "robot", "pw-s3cret-9f2e"
WRONG = "wrong-password-1"  # tracebacks show source lines: the tests name it, never spell it
STREAM = dict(episode_pool_size=2, prefetch_episodes=1, seed=3, decode_group_size=4)


def _everything_said(error: BaseException) -> str:
    return str(error) + repr(error) + "".join(traceback.format_exception(error))


@pytest.fixture(scope="module")
def served(dataset_root, tmp_path_factory):
    """A folder holding the session dataset as ``main``, as an HTTP server's document root."""
    root = tmp_path_factory.mktemp("http")
    shutil.copytree(dataset_root, root / "main")
    return root


@pytest.mark.parametrize("ranges", [True, False], ids=["range-server", "plain-http.server"])
def test_http_samples_equal_local_with_credentials_nowhere(ranges, served, dataset_root, tmp_path, caplog):
    expected = list(EpisodeStreamingDataset(dataset_root, **STREAM))
    caplog.set_level(logging.DEBUG, logger="episodestream")
    caplog.set_level(logging.DEBUG, logger="fsspec")  # it logs each URL it requests
    with HttpServer(served, ranges=ranges, credentials=(USER, PASSWORD)) as server:
        source = server.url_for("main", user=USER, password=PASSWORD)
        with remote_dataset(EpisodeStreamingDataset, source, cache_dir=tmp_path / "cache", **STREAM) as dataset:
            files = faults.source_files(dataset)
            assert dataset.resolved_source == f"{server.url}/main"  # no credentials, no doubled scheme
            assert files.size_bytes("meta/info.json") == (dataset_root / "meta/info.json").stat().st_size
            assert_same_samples(list(dataset), expected)
            names = cache_files(tmp_path / "cache")
            assert names and not any(PASSWORD in name or USER in name for name in names), names
            shown = repr(files) + repr(files._resolved) + repr(vars(files._resolved)["description"])
            assert PASSWORD not in shown
        stats, url = server.stats(), server.url
    assert (stats.ranged > 0) == ranges
    assert stats.requests.get("HEAD", 0) > 0  # sizes: the folder listings have none
    assert PASSWORD not in caplog.text and f"{url}/main" in caplog.text
    if not ranges:
        assert "ignores HTTP Range requests" in caplog.text


def test_http_errors_name_the_file_and_never_the_password(served, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="episodestream")
    root = tmp_path / "served"
    shutil.copytree(served / "main", root / "main")
    missing = "videos/observation.images.wrist/chunk-000/file-001.mp4"
    with HttpServer(root, credentials=(USER, PASSWORD)) as server:
        source = server.url_for("main", user=USER, password=PASSWORD)
        files = open_remote_files(source, cache_dir=tmp_path / "cache")
        try:
            os.remove(root / "main" / missing)  # listed, then gone: the read fails
            with pytest.raises(FileNotFoundError) as caught:
                files.fetch_whole(missing, holder="test")
        finally:
            files.close()
        said = _everything_said(caught.value)
        assert f"{server.url}/main/{missing}" in said and PASSWORD not in said and "http://http" not in said
        with pytest.raises(PermissionError) as refused:
            open_remote_files(server.url_for("main", user=USER, password=WRONG),
                               cache_dir=tmp_path / "cache")
        said = _everything_said(refused.value)
        assert f"{server.url}/main" in said and WRONG not in said and "401" in said
        with pytest.raises(FileNotFoundError, match="holds no files|not found") as nothing:
            open_remote_files(server.url_for("nothing", user=USER, password=PASSWORD), cache_dir=tmp_path / "cache")
        assert PASSWORD not in _everything_said(nothing.value)
    assert PASSWORD not in caplog.text and WRONG not in caplog.text
    assert not any(PASSWORD in name for name in cache_files(tmp_path / "cache"))


def _closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on: bound by us, then closed."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_unreachable_server_is_said_with_the_underlying_error(served, tmp_path):
    # Both used to read "holds no files: check the path": fsspec's listing omits folders it
    # cannot list, so a refused connection looked like an empty folder.
    with HttpServer(served) as server:
        https_to_plain_http = server.url_for("main").replace("http://", "https://", 1)
        cases = {"connection refused": (f"http://{USER}:{PASSWORD}@127.0.0.1:{_closed_port()}/main",
                                        r"Connect call failed"),
                 "https to a plain http server": (https_to_plain_http, r"SSL")}
        for case, (source, underlying) in cases.items():
            with pytest.raises(ConnectionError, match=r"Could not reach the server of https?://127\.0\.0\.1:\d+/main: "
                                                      r"\w+: .*" + underlying) as caught:
                open_remote_files(source, cache_dir=tmp_path / "cache")
            said = _everything_said(caught.value)
            assert "holds no files" not in said and PASSWORD not in said, case
            assert "scheme (http or https), host and port" in said, case
        with pytest.raises(FileNotFoundError, match="holds no files"):  # reached, and nothing there: as before
            open_remote_files(server.url_for("nothing"), cache_dir=tmp_path / "cache")


def test_the_password_of_a_source_url_is_shown_nowhere_in_meta(served, dataset_root, tmp_path):
    # meta.repo_id was the source as given, password included, and so were repr(meta), a mixture's
    # meta.sources[i].repo_id and the errors of meta's path helpers.
    from episodestream import EpisodeMixture

    with HttpServer(served, credentials=(USER, PASSWORD)) as server:
        source = server.url_for("main", user=USER, password=PASSWORD)
        with remote_dataset(EpisodeStreamingDataset, source, cache_dir=tmp_path / "cache", **STREAM) as dataset:
            meta = dataset.meta
            assert meta.repo_id == f"{server.url}/main" and meta.root == f"{server.url}/main"
            mixture = EpisodeMixture([dataset, EpisodeStreamingDataset(dataset_root, **STREAM)], seed=0)
            shown = [meta.repo_id, repr(meta), mixture.meta.sources[0].repo_id, repr(mixture.meta)]
            for call in (lambda: meta.get_video_file_path(0, "no.such.camera"),
                         lambda: meta.get_data_file_path(10**6)):
                with pytest.raises((KeyError, IndexError)) as caught:
                    call()
                assert f"{server.url}/main" in str(caught.value)
                shown.append(_everything_said(caught.value))
            leaked = [text for text in shown if PASSWORD in text or f"{USER}:" in text]
            assert not leaked, leaked
