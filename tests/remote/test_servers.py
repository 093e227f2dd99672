"""The loopback stand-ins for remote storage: FakeHub against huggingface_hub's real client,
ShapingProxy's rate caps and faults, S3Server with s3fs. Everything runs on 127.0.0.1."""

from __future__ import annotations

import http.client
import os
import pathlib
import random
import sys
import threading
import time
import urllib.parse

import pytest

# huggingface_hub reads these when it is imported; set them before the import below.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")

from episodestream.testing import FakeHub, LinkSettings, S3Server, ShapingProxy  # noqa: E402

REPO = "lerobot/tiny"
OTHER_SHA = "0123456789abcdef0123456789abcdef01234567"


def _pattern(n_bytes: int, *, seed: int) -> bytes:
    return random.Random(seed).randbytes(n_bytes)


FILES = {
    "meta/info.json": b'{"codebase_version": "v3.0", "fps": 30}',
    "meta/tâches.jsonl": b'{"task_index": 0, "task": "pick"}\n',
    "data/chunk-000/file-000.parquet": _pattern(300_000, seed=1),
    "data/chunk-000/file-001.parquet": _pattern(5_000, seed=2),
    "videos/observation.images.front/chunk-000/file 000.mp4": _pattern(200_000, seed=3),
}


@pytest.fixture
def hub_root(tmp_path):
    repo = tmp_path / "hub" / "datasets" / REPO
    for relpath, data in FILES.items():
        (repo / relpath).parent.mkdir(parents=True, exist_ok=True)
        (repo / relpath).write_bytes(data)
    big = tmp_path / "hub" / "datasets" / "lerobot" / "big"
    big.mkdir(parents=True)
    (big / "blob.bin").write_bytes(_pattern(3_000_000, seed=4))
    return tmp_path / "hub"


def _request(url: str, path: str, *, method: str = "GET", headers: dict | None = None,
             conn: http.client.HTTPConnection | None = None) -> tuple[int, dict, bytes]:
    split = urllib.parse.urlsplit(url)
    own = conn is None
    conn = conn or http.client.HTTPConnection(split.hostname, split.port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        if own:
            conn.close()


def _parallel_ranged_gets(url: str, path: str, *, connections: int, gets_per_connection: int,
                          bytes_per_get: int) -> tuple[float, int]:
    """Each connection does sequential ranged GETs; returns (elapsed seconds, bytes received)."""
    split = urllib.parse.urlsplit(url)
    barrier = threading.Barrier(connections + 1, timeout=10)
    received = [0] * connections

    def worker(index: int) -> None:
        conn = http.client.HTTPConnection(split.hostname, split.port, timeout=30)
        barrier.wait()
        for get in range(gets_per_connection):
            start = (index * gets_per_connection + get) * bytes_per_get
            status, _, body = _request(url, path, conn=conn,
                                       headers={"Range": f"bytes={start}-{start + bytes_per_get - 1}"})
            assert status == 206
            received[index] += len(body)
        conn.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(connections)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start_s = time.perf_counter()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start_s, sum(received)


def _assert_rate(measure, *, rate_bytes_per_s: float, tolerance: float = 0.15, attempts: int = 3) -> float:
    """A cap must never be beaten; a busy machine (2 shared cores) can only make a transfer slower,
    so the first of a few attempts that reaches the cap within ``tolerance`` passes."""
    rates = []
    for _ in range(attempts):
        elapsed_s, received = measure()
        rates.append(received / elapsed_s)
        assert rates[-1] <= rate_bytes_per_s * (1 + tolerance), f"cap exceeded: {rates[-1] / 1e6:.2f} MB/s"
        if rates[-1] >= rate_bytes_per_s * (1 - tolerance):
            return rates[-1]
    pytest.fail(f"rates {[round(r / 1e6, 2) for r in rates]} MB/s stayed below {rate_bytes_per_s / 1e6} MB/s")


# --- FakeHub with huggingface_hub --------------------------------------------------------------------

@pytest.fixture
def hf():
    return pytest.importorskip("huggingface_hub")


@pytest.mark.parametrize("redirect_resolve", [False, True], ids=["direct", "redirect"])
def test_hf_file_system_ls_glob_info_and_ranged_read(hf, hub_root, redirect_resolve):
    with FakeHub(hub_root, redirect_resolve=redirect_resolve) as hub:
        fs = hf.HfFileSystem(endpoint=hub.url, token=False, skip_instance_cache=True)
        base = f"datasets/{REPO}"
        assert fs.ls(base, detail=False) == [f"{base}/data", f"{base}/meta", f"{base}/videos"]
        assert fs.glob(f"{base}/data/**/*.parquet") == [
            f"{base}/data/chunk-000/file-000.parquet", f"{base}/data/chunk-000/file-001.parquet"]
        assert sorted(fs.find(base)) == sorted(f"{base}/{p}" for p in FILES)
        info = fs.info(f"{base}/data/chunk-000/file-000.parquet")
        assert (info["type"], info["size"]) == ("file", 300_000)
        assert fs.info(f"{base}/videos")["type"] == "directory"
        hub.reset_stats()
        data = FILES["data/chunk-000/file-000.parquet"]
        # No read-ahead: a small read must move only the bytes asked for.
        with fs.open(f"{base}/data/chunk-000/file-000.parquet", "rb", cache_type="none") as file:
            file.seek(123_456)
            assert file.read(1000) == data[123_456:124_456]
        assert hub.stats().by_file[f"{REPO}/data/chunk-000/file-000.parquet"].bytes_sent == 1000
        video = "videos/observation.images.front/chunk-000/file 000.mp4"
        assert fs.cat_file(f"{base}/{video}", start=10, end=20) == FILES[video][10:20]
        assert fs.cat_file(f"{base}/meta/info.json") == FILES["meta/info.json"]


@pytest.mark.parametrize("redirect_resolve", [False, True], ids=["direct", "redirect"])
def test_hf_hub_download_and_snapshot_fetch_each_file_once(hf, hub_root, tmp_path, redirect_resolve):
    with FakeHub(hub_root, redirect_resolve=redirect_resolve) as hub:
        cache_dir = tmp_path / "hf-cache"
        video = "videos/observation.images.front/chunk-000/file 000.mp4"
        path = hf.hf_hub_download(REPO, video, repo_type="dataset", endpoint=hub.url, cache_dir=cache_dir,
                                  token=False)
        with open(path, "rb") as file:
            assert file.read() == FILES[video]
        assert hub.main_sha(REPO) in path  # the snapshot folder is named by X-Repo-Commit
        folder = hf.snapshot_download(REPO, repo_type="dataset", endpoint=hub.url, cache_dir=cache_dir,
                                      token=False)
        for relpath, data in FILES.items():
            with open(os.path.join(folder, relpath), "rb") as file:
                assert file.read() == data
        stats = hub.stats()
        assert {key: s.requests for key, s in stats.by_file.items()} == {f"{REPO}/{p}": 1 for p in FILES}
        assert {key: s.bytes_sent for key, s in stats.by_file.items()} == {
            f"{REPO}/{p}": len(d) for p, d in FILES.items()}
        if redirect_resolve:
            cdn_port = urllib.parse.urlsplit(hub.cdn_url).port
            assert cdn_port != urllib.parse.urlsplit(hub.url).port


def test_tree_listing_pages_through_link_header(hf, hub_root):
    with FakeHub(hub_root, tree_page_size=2) as hub:
        api = hf.HfApi(endpoint=hub.url, token=False)
        entries = list(api.list_repo_tree(REPO, repo_type="dataset", recursive=True))
        files = sorted(e.path for e in entries if isinstance(e, hf.hf_api.RepoFile))
        assert files == sorted(FILES)
        assert {e.path for e in entries if isinstance(e, hf.hf_api.RepoFolder)} >= {"data", "videos"}
        pages = hub.stats().by_path[f"/api/datasets/{REPO}/tree/main"].requests
        assert pages == -(-len(entries) // 2)
        infos = api.get_paths_info(REPO, ["meta/info.json", "data", "missing.txt"], repo_type="dataset")
        assert [(type(i).__name__, i.path) for i in infos] == [("RepoFile", "meta/info.json"), ("RepoFolder", "data")]


def test_revisions_and_error_codes(hf, hub_root, tmp_path):
    from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    with FakeHub(hub_root, revisions={"v3.0": OTHER_SHA}) as hub:
        api = hf.HfApi(endpoint=hub.url, token=False)
        assert api.dataset_info(REPO).sha == hub.main_sha(REPO)
        assert api.dataset_info(REPO, revision="v3.0").sha == OTHER_SHA
        fs = hf.HfFileSystem(endpoint=hub.url, token=False, skip_instance_cache=True)
        assert fs.cat_file(f"datasets/{REPO}@v3.0/meta/info.json") == FILES["meta/info.json"]
        download = dict(repo_type="dataset", endpoint=hub.url, cache_dir=tmp_path / "c", token=False)
        with pytest.raises(RepositoryNotFoundError):
            api.dataset_info("lerobot/missing")
        with pytest.raises(RepositoryNotFoundError):
            hf.hf_hub_download("lerobot/missing", "meta/info.json", **download)
        with pytest.raises(RevisionNotFoundError):
            api.dataset_info(REPO, revision="v9")
        with pytest.raises(RevisionNotFoundError):
            hf.hf_hub_download(REPO, "meta/info.json", revision="v9", **download)
        with pytest.raises(EntryNotFoundError):
            hf.hf_hub_download(REPO, "meta/missing.json", **download)
        with pytest.raises(FileNotFoundError):
            fs.info(f"datasets/{REPO}/meta/missing.json")
        with pytest.raises(FileNotFoundError):
            fs.ls("datasets/lerobot/missing")


def test_token_is_required_when_set(hf, hub_root, tmp_path):
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    with FakeHub(hub_root, token="hf_right") as hub:
        assert hf.HfApi(endpoint=hub.url, token="hf_right").dataset_info(REPO).sha == hub.main_sha(REPO)
        path = hf.hf_hub_download(REPO, "meta/info.json", repo_type="dataset", endpoint=hub.url,
                                  cache_dir=tmp_path, token="hf_right")
        assert pathlib.Path(path).read_bytes() == FILES["meta/info.json"]
        with pytest.raises(RepositoryNotFoundError) as missing:  # as the Hub answers for a private repo
            hf.HfApi(endpoint=hub.url, token=False).dataset_info(REPO)
        assert missing.value.response.status_code == 401
        with pytest.raises(HfHubHTTPError) as wrong:
            hf.HfApi(endpoint=hub.url, token="hf_wrong").dataset_info(REPO)
        assert wrong.value.response.status_code == 401
        assert not isinstance(wrong.value, RepositoryNotFoundError)


def test_ranges_head_and_416(hub_root):
    with FakeHub(hub_root) as hub:
        path = f"/datasets/{REPO}/resolve/main/data/chunk-000/file-001.parquet"
        data = FILES["data/chunk-000/file-001.parquet"]
        status, headers, body = _request(hub.url, path, method="HEAD")
        assert (status, body, headers["Content-Length"]) == (200, b"", str(len(data)))
        assert headers["X-Repo-Commit"] == hub.main_sha(REPO) and headers["ETag"].startswith('"')
        status, headers, body = _request(hub.url, path, headers={"Range": "bytes=100-199"})
        assert (status, body, headers["Content-Range"]) == (206, data[100:200], f"bytes 100-199/{len(data)}")
        assert _request(hub.url, path, headers={"Range": "bytes=-10"})[2] == data[-10:]
        assert _request(hub.url, path, headers={"Range": "bytes=4990-"})[2] == data[4990:]
        status, headers, _ = _request(hub.url, path, headers={"Range": f"bytes={len(data)}-"})
        assert (status, headers["Content-Range"]) == (416, f"bytes */{len(data)}")
        status, headers, _ = _request(hub.url, f"/datasets/{REPO}/resolve/main/nope.bin")
        assert (status, headers["X-Error-Code"]) == (404, "EntryNotFound")


def test_stop_closes_idle_keep_alive_connections(hub_root):
    before = set(threading.enumerate())
    hub = FakeHub(hub_root).start()
    split = urllib.parse.urlsplit(hub.url)
    conn = http.client.HTTPConnection(split.hostname, split.port, timeout=5)
    assert _request(hub.url, f"/api/datasets/{REPO}", conn=conn)[0] == 200  # the connection stays open
    before_s = time.perf_counter()
    hub.stop()
    assert time.perf_counter() - before_s < 2
    assert not [t for t in threading.enumerate() if t not in before]  # handler threads are daemons: check
    conn.close()


# --- ShapingProxy ----------------------------------------------------------------------------------

BIG = "/datasets/lerobot/big/resolve/main/blob.bin"


def test_global_rate_cap_is_shared_by_connections(hub_root):
    rate = 10_000_000
    with FakeHub(hub_root) as hub, ShapingProxy(hub.url, settings=LinkSettings(rate_bytes_per_s=rate)) as proxy:
        def measure():  # 4 connections x 3 ranged GETs x 250 kB = 3 MB, about 0.3 s
            proxy.reset_stats()
            elapsed_s, received = _parallel_ranged_gets(proxy.url, BIG, connections=4, gets_per_connection=3,
                                                        bytes_per_get=250_000)
            assert received == 3_000_000 and proxy.stats().bytes_sent == received
            assert proxy.stats().responses_by_status == {206: 12} and proxy.stats().peak_in_flight == 4
            return elapsed_s, received

        _assert_rate(measure, rate_bytes_per_s=rate)


def test_per_connection_cap_limits_each_connection(hub_root):
    per_connection = 4_000_000
    settings = LinkSettings(per_connection_rate_bytes_per_s=per_connection)
    with FakeHub(hub_root) as hub, ShapingProxy(hub.url, settings=settings) as proxy:
        def measure(connections: int):
            return lambda: _parallel_ranged_gets(proxy.url, BIG, connections=connections,
                                                 gets_per_connection=4 // connections, bytes_per_get=250_000)

        _assert_rate(measure(1), rate_bytes_per_s=per_connection)
        # Two connections get twice the bandwidth, until a global cap below that (set while running) wins.
        _assert_rate(measure(2), rate_bytes_per_s=2 * per_connection)
        proxy.update(rate_bytes_per_s=5_000_000)
        _assert_rate(measure(2), rate_bytes_per_s=5_000_000)


def _wait_for(condition, *, timeout_s: float = 5.0) -> None:
    deadline_s = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline_s, "condition not reached in time"
        time.sleep(0.002)


def test_429_beyond_max_in_flight_with_retry_after(hub_root):
    # Slow bodies (300 kB at 500 kB/s) hold the first two requests in flight for 0.6 s.
    settings = LinkSettings(per_connection_rate_bytes_per_s=500_000, burst_bytes=0, max_in_flight=2,
                            retry_after_s=1.5)
    with FakeHub(hub_root) as hub, ShapingProxy(hub.url, settings=settings) as proxy:
        slow_range = {"headers": {"Range": "bytes=0-299999"}}
        slow = [threading.Thread(target=_request, args=(proxy.url, BIG), kwargs=slow_range) for _ in range(2)]
        for thread in slow:
            thread.start()
        _wait_for(lambda: proxy.stats().in_flight == 2)
        rejected = [_request(proxy.url, BIG, headers={"Range": "bytes=0-9"}) for _ in range(2)]
        for thread in slow:
            thread.join()
        assert [status for status, _, _ in rejected] == [429, 429]
        assert [headers["Retry-After"] for _, headers, _ in rejected] == ["2", "2"]  # whole seconds, rounded up
        # A response leaves flight after its last byte is handed over, which can trail the client.
        _wait_for(lambda: proxy.stats().in_flight == 0)
        assert _request(proxy.url, BIG, headers={"Range": "bytes=0-9"})[0] == 206  # slots free again
        _wait_for(lambda: proxy.stats().in_flight == 0)
        stats = proxy.stats()
        assert (stats.throttled_429, stats.peak_in_flight, stats.in_flight) == (2, 2, 0)
        assert stats.responses_by_status == {206: 3, 429: 2}
        assert max(n for _, n in stats.in_flight_series) == 2
        times = [t for t, _ in stats.in_flight_series]
        assert times == sorted(times)


def test_429_beyond_requests_per_second_and_bytes_by_path(hub_root):
    # The Hub's rate limit: requests started in the last second, 429s not counted.
    settings = LinkSettings(max_requests_per_s=3, retry_after_s=1)
    with FakeHub(hub_root) as hub, ShapingProxy(hub.url, settings=settings) as proxy:
        start_s = time.monotonic()
        answers = [_request(proxy.url, BIG, headers={"Range": "bytes=0-9"}) for _ in range(5)]
        if time.monotonic() - start_s < 1.0:  # all inside one second: the window held
            assert [status for status, _, _ in answers] == [206, 206, 206, 429, 429]
            assert [headers.get("Retry-After") for _, headers, _ in answers[3:]] == ["1", "1"]
        time.sleep(1.05)
        assert _request(proxy.url, BIG, headers={"Range": "bytes=0-9"})[0] == 206  # the window moved on
        stats = proxy.stats()
        assert stats.bytes_by_path[urllib.parse.urlsplit(proxy.url + BIG).path] == 10 * stats.responses_by_status[206]


def test_503_rate_is_seeded_and_repeatable(hub_root):
    path = f"/datasets/{REPO}/resolve/main/meta/info.json"
    outcomes = []
    with FakeHub(hub_root) as hub:
        for _ in range(2):
            with ShapingProxy(hub.url, settings=LinkSettings(error_503_rate=0.3, seed=7)) as proxy:
                split = urllib.parse.urlsplit(proxy.url)
                conn = http.client.HTTPConnection(split.hostname, split.port, timeout=5)
                outcomes.append([_request(proxy.url, path, conn=conn)[0] for _ in range(40)])
                conn.close()
                assert proxy.stats().injected_503 == outcomes[-1].count(503)
    assert outcomes[0] == outcomes[1]
    assert 4 <= outcomes[0].count(503) <= 20 and set(outcomes[0]) == {200, 503}


def test_reset_part_way_through_a_body(hub_root):
    with FakeHub(hub_root) as hub, ShapingProxy(hub.url, settings=LinkSettings(reset_rate=1.0)) as proxy:
        split = urllib.parse.urlsplit(proxy.url)
        conn = http.client.HTTPConnection(split.hostname, split.port, timeout=5)
        conn.request("GET", f"/datasets/{REPO}/resolve/main/data/chunk-000/file-000.parquet")
        response = conn.getresponse()
        assert response.status == 200
        with pytest.raises((ConnectionResetError, http.client.IncompleteRead)):
            response.read()
        conn.close()
        assert proxy.stats().resets == 1
        assert 0 < proxy.stats().bytes_sent < 300_000
        proxy.update(reset_rate=0.0)
        status, _, body = _request(proxy.url, f"/datasets/{REPO}/resolve/main/data/chunk-000/file-000.parquet")
        assert (status, body) == (200, FILES["data/chunk-000/file-000.parquet"])


def test_settings_change_mid_stream_and_latency(hub_root):
    settings = LinkSettings(rate_bytes_per_s=500_000, burst_bytes=0)
    with FakeHub(hub_root) as hub, ShapingProxy(hub.url, settings=settings) as proxy:
        split = urllib.parse.urlsplit(proxy.url)
        conn = http.client.HTTPConnection(split.hostname, split.port, timeout=10)
        start_s = time.perf_counter()
        conn.request("GET", BIG, headers={"Range": "bytes=0-1499999"})
        response = conn.getresponse()
        head = response.read(50_000)  # 0.1 s at 500 kB/s; the whole 1.5 MB would take 3 s
        proxy.update(rate_bytes_per_s=None)  # the link gets fast mid-body
        body = head + response.read()
        elapsed_s = time.perf_counter() - start_s
        conn.close()
        assert (response.status, len(body)) == (206, 1_500_000)
        assert elapsed_s < 1.5, elapsed_s
        proxy.update(latency_s=0.2)
        start_s = time.perf_counter()
        assert _request(proxy.url, f"/api/datasets/{REPO}")[0] == 200
        assert 0.2 <= time.perf_counter() - start_s < 1.5
        assert proxy.settings == LinkSettings(rate_bytes_per_s=None, burst_bytes=0, latency_s=0.2)


def test_hf_client_through_proxies_including_the_redirect_origin(hf, hub_root):
    settings = LinkSettings(latency_s=0.005)
    with FakeHub(hub_root, redirect_resolve=True, tree_page_size=2) as hub, \
            ShapingProxy(hub.url, settings=settings) as front, ShapingProxy(hub.cdn_url, settings=settings) as cdn:
        hub.redirect_base_url = cdn.url  # redirects now point at the CDN's proxy
        fs = hf.HfFileSystem(endpoint=front.url, token=False, skip_instance_cache=True)
        assert sorted(fs.find(f"datasets/{REPO}")) == sorted(f"datasets/{REPO}/{p}" for p in FILES)
        video = "videos/observation.images.front/chunk-000/file 000.mp4"
        with fs.open(f"datasets/{REPO}/{video}", "rb", cache_type="none") as file:
            file.seek(1000)
            assert file.read(2000) == FILES[video][1000:3000]
        # Tree pages were followed through the proxy (the Link header names it), bytes came via the CDN.
        assert front.stats().requests == hub.stats().requests - cdn.stats().requests
        assert front.stats().responses_by_status.get(302) == 1
        assert cdn.stats().bytes_sent == 2000


def test_link_settings_are_validated():
    with pytest.raises(ValueError, match=r"Invalid error_503_rate \(1.5\): expected a fraction in \[0, 1\]"):
        LinkSettings(error_503_rate=1.5)
    with pytest.raises(ValueError, match="Invalid max_in_flight"):
        LinkSettings(max_in_flight=0)
    with pytest.raises(ValueError, match="Invalid upstream_url"):
        ShapingProxy("127.0.0.1:80")


# --- S3Server -------------------------------------------------------------------------------------

def test_s3_upload_and_s3fs_ranged_read(hub_root):
    pytest.importorskip("moto")
    s3fs = pytest.importorskip("s3fs")
    with S3Server() as s3:
        keys = s3.upload_folder(hub_root / "datasets" / REPO, "robot-data", "lerobot/tiny")
        assert keys == sorted(f"lerobot/tiny/{p}" for p in FILES)
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3.storage_options())
        parquet = "robot-data/lerobot/tiny/data/chunk-000/file-000.parquet"
        assert fs.info(parquet)["size"] == 300_000
        assert fs.cat_file(parquet, start=1000, end=1100) == FILES["data/chunk-000/file-000.parquet"][1000:1100]
        with fs.open(parquet, "rb", cache_type="none") as file:
            file.seek(250_000)
            assert file.read(64) == FILES["data/chunk-000/file-000.parquet"][250_000:250_064]
        # The same bucket through a shaped link: s3fs signs for the proxy's host, moto does not check.
        with ShapingProxy(s3.url, settings=LinkSettings(latency_s=0.01)) as proxy:
            options = s3.storage_options()
            options["client_kwargs"]["endpoint_url"] = proxy.url
            shaped = s3fs.S3FileSystem(skip_instance_cache=True, **options)
            assert shaped.cat_file(parquet, start=0, end=10) == FILES["data/chunk-000/file-000.parquet"][:10]
            assert proxy.stats().bytes_sent >= 10
        assert s3.env()["AWS_ENDPOINT_URL"] == s3.url


def test_s3_server_names_missing_packages(monkeypatch):
    monkeypatch.setitem(sys.modules, "moto.server", None)
    with pytest.raises(ImportError, match=r"pip install 'moto\[s3\]>=5' flask flask-cors"):
        S3Server().start()


def test_a_client_that_resets_its_connection_is_no_server_error(hub_root, capfd):
    """A client resetting a connection (ShapingProxy's reset closes its upstream with the body unread)
    printed socketserver's "Exception occurred during processing of request ... ConnectionResetError"
    traceback amid pytest's dots (issue 64 item 9): a client leaving is not the server's error."""
    import socket
    import struct

    from episodestream.testing import HttpServer

    def handler_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if "process_request_thread" in t.name]

    with FakeHub(hub_root) as hub, HttpServer(hub_root) as files:
        for url, path in ((hub.url, f"/datasets/{REPO}/resolve/main/data/chunk-000/file-000.parquet"),
                          (files.url, f"/datasets/{REPO}/data/chunk-000/file-000.parquet")):
            split = urllib.parse.urlsplit(url)
            for read_first in (0, 65_536):  # reset before reading the body, then part-way through it
                sock = socket.create_connection((split.hostname, split.port), timeout=10)
                sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {split.netloc}\r\n\r\n".encode())
                received = 0
                while received < read_first:
                    received += len(sock.recv(65_536))
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()  # SO_LINGER 0: a RST, "connection reset by peer" on the server's side
        deadline = time.monotonic() + 10
        while handler_threads() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not handler_threads()
    captured = capfd.readouterr()
    assert "Exception occurred" not in captured.err and "Traceback" not in captured.err, captured.err
