"""Keeping a remote dataset warm in the node cache across runs: pins, prewarming, listing, clearing.

The node cache deletes an entry when its last live user releases it (``docs/remote.md``), so by
itself every epoch and every run fetches again. A *pin* is one more user of an entry that never
dies (``NodeCache.pin``), so a pinned entry survives releases, ``prune()`` and the disk budget
(which never deletes an entry with a live user) until ``NodeCache.unpin`` (``episodestream cache
unpin`` or ``cache clear``) removes it. This module knows nothing of the cache's on-disk layout: it
pins, lists and releases through ``NodeCache``. Pinned entries
count against ``cache_limit`` like any other, so ``prewarm`` first checks that what it would pin fits
beside the pins already there.

``prewarm`` acquires exactly the entries a streaming run acquires (metadata files, each mp4's header,
each episode's sparse span), through the same ``RemoteFiles``/``RemoteVideos`` code, and pins them; a
later run over the same source and ``cache_dir`` finds them LOCAL and downloads no video. Data
parquet rows are not cached by the library (read in place by ranged reads), so a warm run still
fetches each admitted episode's row group (a parquet footer and one or two requests per episode).
"""

from __future__ import annotations

import fnmatch
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from episodestream._remote.source.budget import metadata_bytes, metadata_files, video_cache_bytes, video_share_bytes
from episodestream._remote.cache.node_cache import CacheFullError, EntryState, NodeCache, describe_pins, unpin_hint

if TYPE_CHECKING:
    from episodestream._format.episodes import EpisodeInfo
    from episodestream._format.files import EpisodesOf
    from episodestream._remote.source.cached_files import CachedFiles

PREWARM_BATCH = 32  # episodes admitted together: their neighbouring spans share requests
_CLEAR_LOCK_TIMEOUT_S = 5.0  # an entry whose lock is held longer is being downloaded: skipped


# -- prewarming ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrewarmReport:
    """What ``prewarm`` did: episodes warmed, entries pinned (and their bytes on disk), bytes fetched
    from the remote by this process (metadata included), wall time."""

    description: str
    cache_dir: str
    episodes: int
    entries_pinned: int
    bytes_pinned: int
    bytes_fetched: int
    seconds: float


def _check_room(files: CachedFiles, episodes: Sequence[EpisodeInfo], meta: EpisodesOf | None) -> None:
    """Refuse, before fetching, a prewarm whose pins cannot fit in ``cache_limit`` beside the other
    sources' pins: everything prewarm fetches stays, so it would fill the cache and then stall.

    With ``meta``, the episodes' video is estimated from above (``_remote.source.budget.video_cache_bytes``,
    as the datasets' own budget check does), so a prewarm let through fits; without it, from their
    share of their files only.
    """
    cache = files.cache
    if cache.limit_bytes is None:
        return
    if meta is None:
        video = video_share_bytes(files, episodes)
    else:
        video = video_cache_bytes(files, meta, episodes)
    need = metadata_bytes(files) + video
    pins, own, others = files.pinned_bytes()
    if others + max(own, need) <= cache.limit_bytes:
        return
    raise CacheFullError(
        f"Prewarming {len(episodes)} episodes of {files.description} pins about {need} bytes ({need / 1e6:.1f} MB: "
        f"the metadata and their video), more than cache_limit={cache.limit_bytes} bytes of {cache.root} holds"
        + (f" beside the {others} bytes other sources have pinned ({describe_pins(pins)})" if others else "")
        + ". Prewarm fewer episodes (--episodes), raise --cache-limit"
        + (f", or unpin the others. {unpin_hint(cache.root)}." if others else "."))


def prewarm(files: CachedFiles, episodes: Sequence[EpisodeInfo], *, progress: bool = True,
            meta: EpisodesOf | None = None) -> PrewarmReport:
    """Fetch and pin the metadata and the video bytes (headers, spans) of ``episodes``.

    Episodes are admitted ``PREWARM_BATCH`` at a time, a batch ahead, so that the fetch threads stay
    busy and neighbouring spans of one mp4 come in one request. Entries already pinned cost nothing. ``progress`` shows a tqdm bar in bytes
    (the total is an estimate from the episodes' share of their files). Close ``files`` afterwards:
    its own references go, the pins stay. Under a ``cache_limit``, what would be pinned is checked
    first (``CacheFullError`` if it cannot fit; pass the dataset's ``meta`` for an upper estimate).
    """
    cache = files.cache
    _check_room(files, episodes, meta)
    start_s, fetched_before = time.perf_counter(), files.stats().bytes_fetched
    pinned: set[str] = set()

    def pin_new(names: Sequence[str]) -> None:
        for name in names:
            if name not in pinned:
                if not cache.is_pinned(name):
                    cache.pin(name)
                pinned.add(name)

    for relpath in metadata_files(files):
        files.local_path(relpath)  # held by this process until files.close(), so safe to pin
        pin_new([files.cache_name("files", relpath)])
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=video_share_bytes(files, episodes), unit="B", unit_scale=True, unit_divisor=1000,
                   desc="prewarm", dynamic_ncols=True)
    videos = files.episode_videos()
    # Admitted a batch ahead, a batch at a time: the spans of one mp4 in a batch (neighbours, since
    # episodes come in order) are read in as few requests as their gaps allow (``admit_many``).
    batch = max(PREWARM_BATCH, files.fetch_threads)
    counted = files.stats().bytes_fetched
    try:
        videos.admit_many(episodes[:2 * batch])
        for i, episode in enumerate(episodes):
            if i and i % batch == 0:  # batch k starts: admit batch k + 1
                videos.admit_many(episodes[i + batch:i + 2 * batch])
            names = []
            for key, span in episode.videos.items():
                # Both are held (the span until evict, the header until close): safe to pin.
                names.append(cache.name_of(videos.local_file(episode, key)))
                header = files.cache_name("headers", span.relpath, ".hdr")
                if cache.state(header) is EntryState.LOCAL:  # absent when the mp4 is fetched whole
                    names.append(header)
            pin_new(names)
            videos.evict(episode)
            if bar is not None:
                now = files.stats().bytes_fetched
                bar.update(now - counted)
                counted = now
    finally:
        videos.close()
        if bar is not None:
            bar.total = bar.n  # the estimate, replaced by what was fetched
            bar.refresh()
            bar.close()
    pinned_bytes = sum(e.size_bytes for e in cache.list_entries() if e.name in pinned)
    return PrewarmReport(files.description, str(cache.root), len(episodes), len(pinned), pinned_bytes,
                         files.stats().bytes_fetched - fetched_before, time.perf_counter() - start_s)


# -- listing and clearing -------------------------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._]+", "_", text).strip("_")


def source_matches(key: str, pattern: str | None) -> bool:
    """Whether a cache folder ``key`` is selected by ``pattern``: a key, a glob over keys, or text the
    key contains once non-alphanumerics become '_' (so 'lerobot/pusht' or 's3://bucket/prefix' work)."""
    if pattern is None:
        return True
    return fnmatch.fnmatchcase(key, pattern) or (bool(_slug(pattern)) and _slug(pattern) in key)


@dataclass(frozen=True)
class ClearReport:
    removed: int
    removed_bytes: int
    skipped_in_use: int
    skipped_names: tuple[str, ...]


@dataclass(frozen=True)
class UnpinReport:
    """What ``unpin_all`` did: pins removed (and their bytes), and how many of those entries were
    deleted at once (no live user) rather than left to their users' release."""

    unpinned: int
    unpinned_bytes: int
    deleted: int


def unpin_all(cache: NodeCache, *, source: str | None = None) -> UnpinReport:
    """Remove the pin of every pinned entry (of the sources ``source`` selects), in use or not.

    An entry no live process uses is deleted now; one in use goes when its last user releases it,
    as if it had never been pinned. Unlike ``clear``, entries in use lose their pin too.
    """
    quick = NodeCache(cache.root, limit_bytes=cache.limit_bytes, timeout_s=_CLEAR_LOCK_TIMEOUT_S)
    unpinned = unpinned_bytes = deleted = 0
    for entry in quick.list_entries():
        if not entry.pinned or not source_matches(entry.source, source):
            continue
        if quick.unpin(entry.name):
            unpinned, unpinned_bytes = unpinned + 1, unpinned_bytes + entry.size_bytes
        try:
            deleted += quick.release(entry.name, "unpin")  # deletes when no live user is left
        except TimeoutError:
            pass  # being downloaded again right now: its users release it
    return UnpinReport(unpinned, unpinned_bytes, deleted)


def clear(cache: NodeCache, *, source: str | None = None) -> ClearReport:
    """Unpin and delete every entry no live process uses (of the sources ``source`` selects).

    Entries with live users (a running training's, a download in progress) are left alone and
    counted as skipped; deleting happens under each entry's lock through ``NodeCache.release``, so a
    process acquiring an entry at the same moment keeps it.
    """
    quick = NodeCache(cache.root, limit_bytes=cache.limit_bytes, timeout_s=_CLEAR_LOCK_TIMEOUT_S)
    removed = removed_bytes = 0
    skipped: list[str] = []
    for entry in quick.list_entries():
        if not source_matches(entry.source, source):
            continue
        if entry.users:
            skipped.append(entry.name)
            continue
        quick.unpin(entry.name)
        try:
            deleted = quick.release(entry.name, "clear")  # deletes when no live user is left
        except TimeoutError:
            deleted = False
        if deleted:
            removed, removed_bytes = removed + 1, removed_bytes + entry.size_bytes
        else:
            skipped.append(entry.name)
    return ClearReport(removed, removed_bytes, len(skipped), tuple(skipped))
