"""``look_up``: the size and version of files a remote source was not listed for, asked by name.

LeRobot v2.x names every episode's files by info.json's templates, so a v2.x source is listed for
``meta/`` only and asks about an episode's files when it is admitted (``RemoteFiles.look_up``):
the Hub answers many paths in one paths-info request (``HUB_PATHS_PER_REQUEST``), other stores one
``info`` (HEAD) per file, several at a time on async filesystems (``resolve.file_infos``). A path the
source does not have comes back as None, never as an error; other failures are retried as
downloads are (``RetryPolicy``: throttles, timeouts, 5xx), then raised naming the file.

The entries equal the listing's for the same file (``resolve.file_entry``), so cache names made
from either meet (a prewarmed cache serves a later run).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import fsspec

from episodestream._remote.source.resolve import FileEntry, ResolvedSource, file_entry, file_infos, hub_repo_path
from episodestream._remote.transport.failures import as_file_error, classify, status_of
from episodestream._remote.transport.retry import RetryPolicy

HUB_PATHS_PER_REQUEST = 500

Answer = dict[str, "dict[str, Any] | None | BaseException"]  # relpath -> info, absent, or the failure


def look_up(resolved: ResolvedSource, fs: fsspec.AbstractFileSystem, relpaths: Sequence[str], *,
            policy: RetryPolicy, asked: Callable[[int], None] = lambda requests: None) -> dict[str, FileEntry | None]:
    """Each of ``relpaths`` (dataset-relative, distinct) as its ``FileEntry``, None where the source
    has no such file. ``asked(n)`` is told of every ``n`` requests sent (retries included): one
    paths-info request per ``HUB_PATHS_PER_REQUEST`` paths on the Hub, one ``info`` per file
    elsewhere. Raises ``FileNotFoundError`` / ``PermissionError`` / ``OSError`` naming the file when
    asking fails for good."""
    found: dict[str, FileEntry | None] = {}
    pending, attempt, hub = list(relpaths), 0, resolved.protocol == "hf"
    while pending:
        attempt += 1
        asked(math.ceil(len(pending) / HUB_PATHS_PER_REQUEST) if hub else len(pending))
        answers = _ask_hub(resolved, pending) if hub else _ask_files(resolved, fs, pending)
        retry, retry_after_s = [], None
        for relpath in pending:
            answer = answers[relpath]
            if isinstance(answer, BaseException):
                if isinstance(answer, FileNotFoundError) or status_of(answer) == 404:
                    found[relpath] = None
                    continue
                failure = classify(answer)
                if failure.kind == "fatal" or attempt >= policy.config.max_attempts:
                    raise as_file_error(answer, where=f"{resolved.description}/{relpath}",
                                        secrets=resolved.secrets()) from None
                retry.append(relpath)
                retry_after_s = failure.retry_after_s if retry_after_s is None else retry_after_s
            elif answer is None or answer.get("type", "file") != "file":
                found[relpath] = None
            elif answer.get("size") is None:
                raise OSError(f"{resolved.description}/{relpath}: the server gives no size for it (no Content-Length "
                              f"on HEAD or GET, no Content-Range on a ranged GET); episodestream needs file sizes "
                              f"to read byte ranges.")
            else:
                found[relpath] = file_entry(answer)
        if retry:
            time.sleep(policy.delay_s(attempt, retry_after_s=retry_after_s))
        pending = retry
    return found


def _ask_hub(resolved: ResolvedSource, relpaths: list[str]) -> Answer:
    """One paths-info request per ``HUB_PATHS_PER_REQUEST`` paths, at the pinned commit."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=resolved.endpoint, token=resolved.token, library_name="episodestream")
    repo_id, folder = hub_repo_path(resolved)
    answers: Answer = {}
    for start in range(0, len(relpaths), HUB_PATHS_PER_REQUEST):
        in_repo = {(f"{folder}/{p}" if folder else p): p for p in relpaths[start:start + HUB_PATHS_PER_REQUEST]}
        try:
            infos = api.get_paths_info(repo_id, list(in_repo), revision=resolved.revision_sha, repo_type="dataset")
        except Exception as error:  # httpx's and huggingface_hub's classes: classified by the caller
            answers.update(dict.fromkeys(in_repo.values(), error))
            continue
        answers.update(dict.fromkeys(in_repo.values()))  # the Hub leaves missing paths out
        for info in infos:
            if isinstance(info, RepoFile) and info.path in in_repo:
                # The keys HfFileSystem's listing gives, so ``file_entry`` makes the listing's entry.
                answers[in_repo[info.path]] = {"type": "file", "size": info.size, "blob_id": info.blob_id}
    return answers


def _ask_files(resolved: ResolvedSource, fs: fsspec.AbstractFileSystem, relpaths: list[str]) -> Answer:
    """``info`` of each file (HEAD on http, HeadObject on s3; ``resolve.file_infos``)."""
    return dict(zip(relpaths, file_infos(fs, resolved, relpaths)))
