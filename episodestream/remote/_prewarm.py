"""Keeping a remote dataset warm in the node cache across runs: pins, prewarming, listing, clearing.

The node cache deletes an entry when its last live user releases it (``docs/remote.md``), so by
itself every epoch and every run fetches again. A *pin* is one more user of an entry that never
dies: the marker ``PIN_MARKER`` in ``NAME.refs/``, which ``NodeCache`` always counts as a live user,
so a pinned entry survives releases, ``prune()`` and the disk budget (which never deletes an entry
with a live user)
until ``unpin`` (``episodestream cache unpin`` or ``cache clear``) removes the marker. Pinned entries
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
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ._node_cache import PIN_MARKER, CacheFullError, EntryState, NodeCache, describe_pins, unpin_hint

if TYPE_CHECKING:
    from .._metadata import DatasetMeta, EpisodeInfo
    from ._remote_files import RemoteFiles

_METADATA = ("meta/info.json", "meta/tasks.parquet", "meta/stats.json")
_EPISODES_METADATA = "meta/episodes"
_CLEAR_LOCK_TIMEOUT_S = 5.0  # an entry whose lock is held longer is being downloaded: skipped


def _refs(cache: NodeCache, name: str) -> Path:
    return cache.path(name + ".refs")


def is_pinned(cache: NodeCache, name: str) -> bool:
    return (_refs(cache, name) / PIN_MARKER).exists()


def pin(cache: NodeCache, name: str) -> None:
    """Pin a LOCAL entry. The caller must hold it (acquired, not released), so no other process can
    delete it between the check and the marker; release it afterwards as usual."""
    if cache.state(name) is not EntryState.LOCAL:
        raise FileNotFoundError(f"Cannot pin {name!r} in {cache.root}: it is not in the cache.")
    (_refs(cache, name) / PIN_MARKER).touch()


def unpin(cache: NodeCache, name: str) -> bool:
    """Remove the pin; the entry stays while live users hold it. True when it was pinned."""
    try:
        (_refs(cache, name) / PIN_MARKER).unlink()
        return True
    except FileNotFoundError:
        return False


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


def _metadata_files(files: RemoteFiles) -> list[str]:
    return [p for p in _METADATA if files.exists(p)] + files.list_files(_EPISODES_METADATA, suffix=".parquet")


def _estimate_bytes(files: RemoteFiles, episodes: Sequence[EpisodeInfo]) -> int:
    """The episodes' share of their mp4s (by duration), for a progress bar's total."""
    ends: dict[str, float] = {}
    for episode in episodes:
        for span in episode.videos.values():
            ends[span.relpath] = max(ends.get(span.relpath, 0.0), span.to_timestamp_s)
    total = 0
    for episode in episodes:
        for span in episode.videos.values():
            share = (span.to_timestamp_s - span.from_timestamp_s) / max(ends[span.relpath], 1e-9)
            total += int(min(1.0, share) * files.size(span.relpath))
    return total


def _check_room(files: RemoteFiles, episodes: Sequence[EpisodeInfo], meta: DatasetMeta | None) -> None:
    """Refuse, before fetching, a prewarm whose pins cannot fit in ``cache_limit`` beside the other
    sources' pins: everything prewarm fetches stays, so it would fill the cache and then stall.

    With ``meta``, the episodes' video is estimated from above (``RemoteFiles.episode_cache_bytes``,
    as the datasets' own budget check does), so a prewarm let through fits; without it, from their
    share of their files only.
    """
    cache = files.cache
    if cache.limit_bytes is None:
        return
    if meta is None:
        video = _estimate_bytes(files, episodes)
    else:
        per_episode = files.episode_cache_bytes(meta)
        video = sum(per_episode[episode.episode_index] for episode in episodes)
    need = files.metadata_bytes() + video
    pins, own, others = files.pinned_bytes()
    if others + max(own, need) <= cache.limit_bytes:
        return
    raise CacheFullError(
        f"Prewarming {len(episodes)} episodes of {files.description} pins about {need} bytes ({need / 1e6:.1f} MB: "
        f"the metadata and their video), more than cache_limit={cache.limit_bytes} bytes of {cache.root} holds"
        + (f" beside the {others} bytes other sources have pinned ({describe_pins(pins)})" if others else "")
        + ". Prewarm fewer episodes (--episodes), raise --cache-limit"
        + (f", or unpin the others. {unpin_hint(cache.root)}." if others else "."))


def prewarm(files: RemoteFiles, episodes: Sequence[EpisodeInfo], *, progress: bool = True,
            meta: DatasetMeta | None = None) -> PrewarmReport:
    """Fetch and pin the metadata and the video bytes (headers, spans) of ``episodes``.

    Episodes are admitted ``files.fetch_threads`` ahead, so as many downloads run at once as in a
    streaming consumer. Entries already pinned cost nothing. ``progress`` shows a tqdm bar in bytes
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
                if not is_pinned(cache, name):
                    pin(cache, name)
                pinned.add(name)

    for relpath in _metadata_files(files):
        files.local_path(relpath)  # held by this process until files.close(), so safe to pin
        pin_new([files.cache_name("files", relpath)])
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=_estimate_bytes(files, episodes), unit="B", unit_scale=True, unit_divisor=1000,
                   desc="prewarm", dynamic_ncols=True)
    videos = files.episode_videos()
    ahead = max(1, files.fetch_threads)
    counted = files.stats().bytes_fetched
    try:
        for upcoming in episodes[:ahead]:
            videos.admit(upcoming)
        for i, episode in enumerate(episodes):
            if i + ahead < len(episodes):
                videos.admit(episodes[i + ahead])
            names = []
            for key, span in episode.videos.items():
                # Both are held (the span until evict, the header until close): safe to pin.
                names.append(Path(videos.path(episode, key)).relative_to(cache.root).as_posix())
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
    pinned_bytes = sum(e.size_bytes for e in list_entries(cache) if e.name in pinned)
    return PrewarmReport(files.description, str(cache.root), len(episodes), len(pinned), pinned_bytes,
                         files.stats().bytes_fetched - fetched_before, time.perf_counter() - start_s)


# -- listing and clearing -------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheEntry:
    """One entry of a cache directory, as ``episodestream cache ls`` shows it."""

    name: str  # relative to the cache root: "<source key>/<kind>/<path>"
    state: EntryState
    size_bytes: int  # on disk (what the budget counts)
    users: int  # live processes holding it (the pin not counted)
    pinned: bool

    @property
    def source(self) -> str:
        return self.name.split("/", 1)[0]

    @property
    def file(self) -> str:
        return self.name.split("/", 1)[1] if "/" in self.name else ""


def list_entries(cache: NodeCache) -> list[CacheEntry]:
    """Every LOCAL or FETCHING entry under the cache root (each has its ``NAME.bytes``), sorted."""
    found = []
    if not cache.root.is_dir():
        return found
    for folder, _, names in os.walk(cache.root):
        for file in names:
            if not file.endswith(".bytes"):
                continue
            full = os.path.join(folder, file)
            try:
                size_bytes = int(Path(full).read_text() or 0)
            except (OSError, ValueError):
                continue  # deleted while we walked
            name = os.path.relpath(full, cache.root)[:-len(".bytes")].replace(os.sep, "/")
            pinned = is_pinned(cache, name)
            found.append(CacheEntry(name, cache.state(name), size_bytes, cache.refcount(name) - pinned, pinned))
    return sorted(found, key=lambda e: e.name)


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
    for entry in list_entries(quick):
        if not entry.pinned or not source_matches(entry.source, source):
            continue
        if unpin(quick, entry.name):
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
    for entry in list_entries(quick):
        if not source_matches(entry.source, source):
            continue
        if entry.users:
            skipped.append(entry.name)
            continue
        unpin(quick, entry.name)
        try:
            deleted = quick.release(entry.name, "clear")  # deletes when no live user is left
        except TimeoutError:
            deleted = False
        if deleted:
            removed, removed_bytes = removed + 1, removed_bytes + entry.size_bytes
        else:
            skipped.append(entry.name)
    return ClearReport(removed, removed_bytes, len(skipped), tuple(skipped))
