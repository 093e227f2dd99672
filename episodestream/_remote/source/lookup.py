"""``look_up``: the size and version of files a remote source was not listed for, asked by name.

LeRobot v2.x names every episode's files by info.json's templates, so a v2.x source is listed for
``meta/`` only and asks about an episode's files when it is admitted (``RemoteFiles.look_up``):
the Hub answers many paths in one paths-info request (``hub_api.HUB_PATHS_PER_REQUEST``), other
stores one ``info`` (HEAD) per file, several at a time (``resolve.file_infos``). Every request goes
through the download path as reads do (``DownloadFetch.send``: a permit of the server's node-wide
budget, the one retry policy, throttles seen by the controller). A path the source does not have
comes back as None, never as an error; a request that fails for good raises naming the file.

The entries equal the listing's for the same file (``resolve.file_entry``), so cache names made
from either meet (a prewarmed cache serves a later run).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import fsspec

from episodestream._remote.source import hub_api
from episodestream._remote.source.hub_api import HUB_PATHS_PER_REQUEST
from episodestream._remote.source.resolve import FileEntry, ResolvedSource, file_entry, file_infos, hub_repo_path
from episodestream._remote.transport.download import DownloadFetch, link_name_of
from episodestream._remote.transport.failures import as_file_error, status_of


def look_up(resolved: ResolvedSource, fs: fsspec.AbstractFileSystem, relpaths: Sequence[str], *,
            sender: DownloadFetch, asked: Callable[[int], None] = lambda requests: None) -> dict[str, FileEntry | None]:
    """Each of ``relpaths`` (dataset-relative, distinct) as its ``FileEntry``, None where the source
    has no such file. ``asked(n)`` is told of every ``n`` requests sent (retries included): one
    paths-info request per ``HUB_PATHS_PER_REQUEST`` paths on the Hub, one ``info`` per file
    elsewhere. Raises ``FileNotFoundError`` / ``PermissionError`` / ``OSError`` naming the file when
    asking fails for good."""
    answers = _ask_hub(resolved, sender, list(relpaths), asked) if resolved.protocol == "hf" else \
        _ask_files(resolved, fs, sender, list(relpaths), asked)
    found: dict[str, FileEntry | None] = {}
    for relpath in relpaths:
        answer = answers[relpath]
        if isinstance(answer, BaseException):
            if isinstance(answer, FileNotFoundError) or status_of(answer) == 404:
                found[relpath] = None
                continue
            raise as_file_error(answer, where=f"{resolved.description}/{relpath}", secrets=resolved.secrets()) from None
        if answer is None or answer.get("type", "file") != "file":
            found[relpath] = None
        elif answer.get("size") is None:
            raise OSError(f"{resolved.description}/{relpath}: the server gives no size for it (no Content-Length "
                          f"on HEAD or GET, no Content-Range on a ranged GET); episodestream needs file sizes "
                          f"to read byte ranges.")
        else:
            found[relpath] = file_entry(answer)
    return found


Answer = dict[str, "dict[str, Any] | None | BaseException"]  # relpath -> info, absent, or the failure


def _ask_hub(resolved: ResolvedSource, sender: DownloadFetch, relpaths: list[str],
             asked: Callable[[int], None]) -> Answer:
    """One paths-info request per ``HUB_PATHS_PER_REQUEST`` paths, at the pinned commit."""
    repo_id, folder = hub_repo_path(resolved)
    assert resolved.endpoint is not None and resolved.revision_sha is not None  # a resolved Hub source
    link = link_name_of("hf", resolved.endpoint)
    counted = _CountedSender(sender, asked)
    answers: Answer = {}
    for start in range(0, len(relpaths), HUB_PATHS_PER_REQUEST):
        in_repo = {(f"{folder}/{p}" if folder else p): p for p in relpaths[start:start + HUB_PATHS_PER_REQUEST]}
        try:
            infos = hub_api.paths_info(counted, link, resolved.endpoint, repo_id, resolved.revision_sha,
                                       list(in_repo), resolved.token)
        except Exception as error:  # huggingface_hub's classes or a DownloadError: told apart by the caller
            answers.update(dict.fromkeys(in_repo.values(), error))
            continue
        answers.update({relpath: infos.get(path) for path, relpath in in_repo.items()})
    return answers


def _ask_files(resolved: ResolvedSource, fs: fsspec.AbstractFileSystem, sender: DownloadFetch,
               relpaths: list[str], asked: Callable[[int], None]) -> Answer:
    """``info`` of each file (HEAD on http, HeadObject on s3; ``resolve.file_infos``)."""
    return dict(zip(relpaths, file_infos(fs, resolved, relpaths, _CountedSender(sender, asked))))


class _CountedSender:
    """``sender`` that tells ``asked(1)`` of every attempt it sends."""

    def __init__(self, sender: DownloadFetch, asked: Callable[[int], None]) -> None:
        self._sender, self._asked = sender, asked

    def send(self, link: Any, attempt: Callable[[float], Any], *, url: str, method: str = "GET") -> Any:
        def counted(timeout_s: float) -> Any:
            self._asked(1)
            return attempt(timeout_s)

        return self._sender.send(link, counted, url=url, method=method)

    def hub_headers(self, token: Any) -> dict[str, str]:
        return self._sender.hub_headers(token)
