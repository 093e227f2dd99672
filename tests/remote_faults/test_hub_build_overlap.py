"""A Hub source's first requests: a revision given as a commit sha is listed (``meta/``) beside its
commit request, a branch only after the answer; errors stay those of the commit request."""

from __future__ import annotations

import threading

import pytest

from episodestream._remote.source.open import _resolve_and_list_meta, open_remote_source
from episodestream.testing.downloads import DownloadFetch, HubLink
from episodestream.testing import FakeHub

from ..remote_streaming.conftest import REPO

LONG_WAIT_S = 10.0  # how long the commit request waits for the listing to start (it starts at once)


class _Watching(DownloadFetch):
    """Sends as a ``DownloadFetch`` does; the commit request waits (at most ``wait_s``) for the
    ``meta/`` listing to be sent, and says whether it was, and whether it had been answered yet."""

    def __init__(self, wait_s: float) -> None:
        super().__init__()
        self.wait_s = wait_s
        self.listing_sent = threading.Event()
        self.commit_saw_listing: list[bool] = []
        self.commit_answered = threading.Event()
        self.listing_after_answer: list[bool] = []

    def send(self, link, attempt, *, url, method="GET"):
        if "/tree/" in url and url.split("?")[0].endswith("/meta"):
            self.listing_after_answer.append(self.commit_answered.is_set())
            self.listing_sent.set()
        if "/revision/" in url:
            self.commit_saw_listing.append(self.listing_sent.wait(self.wait_s))
            try:
                return super().send(link, attempt, url=url, method=method)
            finally:
                self.commit_answered.set()
        return super().send(link, attempt, url=url, method=method)


def _resolve(hub, fetch, revision, source=REPO, token=False):
    return _resolve_and_list_meta(source, revision=revision, storage_options=None, hub_endpoint=hub.url,
                                  token=token, fetch=fetch)


def test_a_commit_sha_is_listed_beside_its_commit_request(faults_hub_root):
    with FakeHub(faults_hub_root) as hub:
        sha = hub.main_sha(REPO)
        pinned = _Watching(LONG_WAIT_S)
        resolved, fs, listing = _resolve(hub, pinned, sha)
        assert pinned.commit_saw_listing == [True] and pinned.listing_after_answer == [False]
        assert resolved.revision_sha == sha and "meta/info.json" in listing
        assert isinstance(fs, HubLink)  # never huggingface_hub's HfFileSystem
        # The same through an hf:// URL naming the commit.
        url = _Watching(LONG_WAIT_S)
        assert _resolve(hub, url, None, source=f"hf://datasets/{REPO}@{sha}")[2] == listing
        assert url.commit_saw_listing == [True]
        # A branch is listed once the Hub has named its commit: a branch that moved between two
        # requests sent together would be listed at a commit no process reads.
        branch = _Watching(0.2)
        assert _resolve(hub, branch, "main")[2] == listing
        assert branch.commit_saw_listing == [False] and branch.listing_after_answer == [True]


def test_a_branch_named_like_a_sha_is_listed_at_its_commit(faults_hub_root):
    with FakeHub(faults_hub_root) as hub:
        sha = hub.main_sha(REPO)
        lookalike = "a" * 40
        hub.revisions[lookalike] = sha
        fetch = _Watching(LONG_WAIT_S)
        resolved, _, listing = _resolve(hub, fetch, lookalike)
        assert resolved.revision_sha == sha and "meta/info.json" in listing
        assert fetch.listing_after_answer == [False, True]  # listed ahead at the name, then at the commit


def test_commit_request_errors_come_first_for_a_pinned_sha(faults_hub_root, tmp_path):
    missing = "0" * 40
    with FakeHub(faults_hub_root) as hub:
        options = dict(cache_dir=tmp_path, hub_endpoint=hub.url, token=False)
        sha = hub.main_sha(REPO)
        with pytest.raises(FileNotFoundError, match=rf"revision '{missing}' not found in Hub dataset '{REPO}'"):
            open_remote_source(REPO, revision=missing, **options)
        with pytest.raises(FileNotFoundError, match=r"Hub dataset 'lerobot/nope' at http://127\.0\.0\.1:\d+ not found"):
            open_remote_source("lerobot/nope", revision=sha, **options)
    with FakeHub(faults_hub_root, token="hf_right_token") as hub:
        with pytest.raises(PermissionError, match="refused the credentials"):
            open_remote_source(REPO, revision=sha, cache_dir=tmp_path, hub_endpoint=hub.url, token="hf_wrong_token")
