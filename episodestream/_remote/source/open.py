"""``open_remote_source``: the factory that turns a remote ``source`` into a ``RemoteFiles``.

Validates the options once (errors name the argument), resolves the source (a Hub revision to a
commit), lists its files once, prunes what killed processes left in the cache, checks the cache
budget can hold the metadata and, for a dataset being built, downloads its metadata files together
(``_remote.source.metadata``), all in the process that builds the dataset.

What is listed: ``meta/`` first. LeRobot v2.x names every episode's files by info.json's
templates, so for a v2.x layout nothing more is listed (a 100k-episode repo would list 300k files;
``RemoteFiles`` looks an episode's files up when it is admitted); anything else (v3.0, or a layout
the metadata reader will refuse) lists the whole source too, beside the metadata downloads (which
need ``meta/`` only): one round trip less before a dataset is built. The layout is told from
the ``meta/`` listing, not from info.json, so that nothing is downloaded before the metadata
reader asks for it (and the reader still checks ``codebase_version``). A Hub revision given as a
commit sha is listed beside its commit request (``_resolve_and_list_meta``): another round trip less.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from episodestream._format.metadata import EPISODES_DIR
from episodestream._format.v2x import EPISODES_JSONL
from episodestream._remote.transport.config import ControllerConfig
from episodestream._remote.transport.download import DownloadFetch, default_fetch
from episodestream._remote.cache.node_cache import DEFAULT_WAIT_S, NodeCache
from episodestream._remote.source.files import RemoteFiles
from episodestream._remote.source.metadata import fetch_metadata as _fetch_metadata
from episodestream._remote.source.resolve import (
    CACHE_LIMIT_ENV,
    CACHE_WAIT_ENV,
    FileEntry,
    ResolvedSource,
    default_cache_dir,
    list_source,
    pinned_hub_source,
    resolve_source,
)

if TYPE_CHECKING:
    import fsspec


def open_remote_source(source: str, *, revision: str | None = None, cache_dir: str | os.PathLike | None = None,
                       cache_limit: int | str | None = None, storage_options: Mapping[str, Any] | None = None,
                       hub_endpoint: str | None = None, token: Any = None, fetch_threads: int = 4,
                       fetch_timeout_s: float = 600.0, cache_wait_s: float | None = None,
                       download_config: ControllerConfig | Mapping[str, Any] | None = None,
                       fetch_metadata: bool = False) -> RemoteFiles:
    """Open a remote dataset: resolve ``source`` (Hub revisions to a commit), list its files once,
    and return a ``RemoteFiles`` reading through the node cache.

    What to read:
        source: ``owner/name`` (Hub dataset), ``hf://datasets/owner/name[@revision][/folder]``,
            ``s3://bucket/prefix``, ``gs://...``, ``file:///path`` or any fsspec URL.
        revision: Hub branch, tag or commit (default ``main``), resolved here to a commit sha.
    Credentials:
        token: Hub token (default: huggingface_hub's lookup, ``HF_TOKEN`` or the stored login;
            ``False`` sends none). hub_endpoint: default ``$HF_ENDPOINT``, else huggingface.co.
        storage_options: passed to the fsspec filesystem (s3fs, gcsfs, ...), whose own lookup of
            environment and config files applies too.
    Caching:
        cache_dir: default ``$EPISODESTREAM_CACHE_DIR``, else the user's cache folder.
        cache_limit: disk budget for the whole ``cache_dir``, e.g. "20GB" (default
            ``$EPISODESTREAM_CACHE_LIMIT``, else unlimited; entries are deleted when released anyway).
        fetch_threads: background downloads per consumer. fetch_timeout_s: how long a consumer waits
            for a lock on an entry another process downloads.
        cache_wait_s: how long a download waits for other users to release cache space before a
            ``CacheFullError`` (default ``$EPISODESTREAM_CACHE_WAIT_S``, else 300); no wait when
            pinned entries alone leave no room.
    Downloading:
        download_config: the download controller's knobs (node-wide permits, retries, timeouts): a
            ``ControllerConfig``, a dict of its knobs (the rest from ``EPISODESTREAM_DOWNLOAD_*``) or
            None (all from the environment, else defaults). See docs/download-controller.md.
        fetch_metadata: download the metadata files a dataset reads while it is built, all at
            once, before returning (``_remote.source.metadata``); a dataset's construction asks for
            it, other users (the CLI, prewarm) read what they need themselves.
    """
    from episodestream._base.options import check_int, check_positive_float, env_override, parse_size_bytes

    if cache_limit is None:
        cache_limit = env_override("cache_limit", None, CACHE_LIMIT_ENV, lambda raw: parse_size_bytes("cache_limit", raw))
    limit_bytes = None if cache_limit is None else parse_size_bytes("cache_limit", cache_limit)
    check_int("fetch_threads", fetch_threads, minimum=1)
    timeout_s = check_positive_float("fetch_timeout_s", fetch_timeout_s)
    wait_s = env_override("cache_wait_s", cache_wait_s, CACHE_WAIT_ENV,
                          lambda raw: check_positive_float("cache_wait_s", float(raw)))
    wait_s = DEFAULT_WAIT_S if wait_s is None else check_positive_float("cache_wait_s", wait_s)
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise TypeError(f"storage_options must be a dict of fsspec options, got {type(storage_options).__name__}.")
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    fetch = default_fetch(download_config)  # validates the knobs (and reads the environment) up front
    resolved, fs, listing = _resolve_and_list_meta(source, revision=revision, storage_options=storage_options,
                                                   hub_endpoint=hub_endpoint, token=token, fetch=fetch)
    cache = NodeCache(root, limit_bytes=limit_bytes, timeout_s=timeout_s, wait_s=wait_s)
    cache.prune()  # leftovers of processes killed in earlier runs
    files = RemoteFiles(resolved, listing, listed_folder=META_FOLDER, cache=cache, fetch_threads=fetch_threads,
                        fetch=fetch)
    if _named_by_templates(listing):
        _check_and_fetch_metadata(files, fetch_metadata)
        return files
    # The whole listing is needed only once the dataset admits episodes, while the metadata is in
    # meta/, already listed: list beside the metadata downloads, not before them (a round trip
    # less). A thread of an executor, joined here (on an error too), so none outlives this call
    # or meets a fork.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="episodestream-listing") as pool:
        everything = pool.submit(list_source, resolved, fs=fs, sender=fetch)
        _check_and_fetch_metadata(files, fetch_metadata)
        files.list_everything(everything.result())  # a listing's error, as when it ran first
    return files


def _resolve_and_list_meta(source: str, *, revision: str | None, storage_options: Mapping[str, Any] | None,
                           hub_endpoint: str | None, token: Any,
                           fetch: DownloadFetch) -> tuple[ResolvedSource, fsspec.AbstractFileSystem,
                                                           dict[str, FileEntry]]:
    """The source resolved (a Hub revision pinned to a commit), a client of it (one for both
    listings) and its ``meta/`` listing.

    A Hub revision given as a commit sha names the listing's commit already: ``meta/`` is listed
    beside the commit request (``resolve.pinned_hub_source``), a round trip sooner. The commit
    request's error (a missing repo or revision, a refused token) is raised first, as when the
    listing came after it; an answer naming another commit (a branch whose name looks like a sha)
    is listed again at that commit. A thread of an executor, joined here, so none outlives this call.
    """
    options = dict(storage_options=storage_options, hub_endpoint=hub_endpoint, token=token)
    pinned = pinned_hub_source(source, revision=revision, **options)
    if pinned is None:
        resolved = resolve_source(source, revision=revision, sender=fetch, **options)
        fs = resolved.filesystem()
        return resolved, fs, list_source(resolved, folder=META_FOLDER, fs=fs, sender=fetch)
    fs = pinned.filesystem()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="episodestream-listing") as pool:
        meta = pool.submit(list_source, pinned, folder=META_FOLDER, fs=fs, sender=fetch)
        resolved = resolve_source(source, revision=revision, sender=fetch, **options)
        if resolved != pinned:
            return resolved, fs, list_source(resolved, folder=META_FOLDER, fs=fs, sender=fetch)
        return resolved, fs, meta.result()


def _check_and_fetch_metadata(files: RemoteFiles, fetch_metadata: bool) -> None:
    files.check_cache_budget()  # before downloading metadata that would not fit (all of it is in meta/)
    if fetch_metadata:
        _fetch_metadata(files)


META_FOLDER = "meta"


def _named_by_templates(meta_listing: Mapping[str, object]) -> bool:
    """Whether ``meta/`` is laid out as LeRobot v2.x's (``meta/episodes.jsonl``, no
    ``meta/episodes/`` parquet files, which v3.0 keeps instead), whose templates name every file
    outside ``meta/``."""
    prefix = EPISODES_DIR.rstrip("/") + "/"
    return EPISODES_JSONL in meta_listing and not any(path.startswith(prefix) for path in meta_listing)
