"""The Hub API calls a remote source makes: a revision's commit, a tree listing, paths-info.

Each is one request (a listing: one per page) sent through the download path
(``DownloadFetch.send``: a permit of the Hub's node-wide budget, one retry policy, failures seen by
the controller), not through ``HfApi`` / ``HfFileSystem``, whose listings page through
``http_backoff`` (retries the controller never sees) and whose headers come from
``build_hf_headers`` (an agent-harness registry request on a process's first call;
``_remote.transport.hub_http``). Errors are huggingface_hub's own
(``RepositoryNotFoundError``, ``RevisionNotFoundError``, ``EntryNotFoundError``, ``HfHubHTTPError``)
after one attempt, or a ``DownloadError`` when the link failed for good.

Entries are given as HfFileSystem's listing gives them (``type``, ``size``, ``blob_id``), so
``resolve.file_entry`` makes the same ``FileEntry`` (and cache names) either way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

from episodestream._remote.transport.hub_http import hub_send

T = TypeVar("T")
HUB_PATHS_PER_REQUEST = 500  # paths asked in one paths-info request
_NEXT_LINK = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?')


class Sender(Protocol):
    """``DownloadFetch.send``'s shape: one request through the download path."""

    def send(self, link: Any, attempt: Callable[[float], T], *, url: str, method: str = ...) -> T: ...

    def hub_headers(self, token: Any) -> dict[str, str]: ...


def _api(endpoint: str, repo_id: str) -> str:
    return f"{endpoint.rstrip('/')}/api/datasets/{repo_id}"


def _call(sender: Sender, link: str, method: str, url: str, token: Any, *,
          data: dict[str, Any] | None = None) -> tuple[bytes, Any]:
    headers = sender.hub_headers(token)
    found: list[Any] = []

    def attempt(timeout_s: float) -> bytes:
        body, response_headers = hub_send(method, url, headers, timeout_s, data=data)
        found[:] = [response_headers]
        return body  # bytes: the controller takes it as a transfer sample

    body = sender.send(link, attempt, url=url, method=method)
    return body, found[0]


def commit_sha(sender: Sender, link: str, endpoint: str, repo_id: str, revision: str | None, token: Any) -> Any:
    """The commit ``revision`` (default ``main``) of dataset ``repo_id`` names (the answer's ``sha``)."""
    url = f"{_api(endpoint, repo_id)}/revision/{quote(revision or 'main', safe='')}"
    body, _ = _call(sender, link, "GET", url, token)
    return json.loads(body).get("sha")


def list_tree(sender: Sender, link: str, endpoint: str, repo_id: str, sha: str, path_in_repo: str,
              token: Any) -> dict[str, dict[str, Any]]:
    """Every file below ``path_in_repo`` (recursive, all pages) by its path in the repo."""
    encoded = "/" + quote(path_in_repo, safe="") if path_in_repo else ""
    url: str | None = f"{_api(endpoint, repo_id)}/tree/{quote(sha, safe='')}{encoded}?recursive=true&expand=false"
    files: dict[str, dict[str, Any]] = {}
    while url is not None:
        body, headers = _call(sender, link, "GET", url, token)
        for item in json.loads(body):
            if item.get("type") == "file":
                files[item["path"]] = _info(item)
        match = _NEXT_LINK.search(headers.get("Link", "") or "")
        url = match.group(1) if match else None
    return files


def paths_info(sender: Sender, link: str, endpoint: str, repo_id: str, sha: str, paths: Sequence[str],
               token: Any) -> dict[str, dict[str, Any]]:
    """The entries of those of ``paths`` (at most ``HUB_PATHS_PER_REQUEST``) that exist, by path:
    one request. The Hub leaves missing paths out."""
    url = f"{_api(endpoint, repo_id)}/paths-info/{quote(sha, safe='')}"
    body, _ = _call(sender, link, "POST", url, token, data={"paths": list(paths), "expand": False})
    return {item["path"]: _info(item) for item in json.loads(body)}


def _info(item: dict[str, Any]) -> dict[str, Any]:
    if item.get("type") != "file":
        return {"type": item.get("type", "directory")}
    return {"type": "file", "size": item.get("size"), "blob_id": item.get("oid")}
