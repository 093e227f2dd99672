"""How much cache a remote dataset needs, estimated from its listing before anything is fetched.

A source that looks its files up by name (v2.x: ``knows_every_file`` False) is asked about the
episodes an estimate covers in one look-up, and the dataset's own check covers the longest
``episodes_in_flight`` episodes only (their frames stand for their bytes), so building a dataset
asks about a bounded number of files however many episodes it has.

Used by ``RemoteFiles.check_cache_budget`` (a dataset refuses a ``cache_limit`` too small for one
consumer) and by ``_remote.source.prewarm`` (a prewarm refuses pins that cannot fit); both count the same
metadata files and the same per-episode estimate, defined here once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from episodestream._remote.cache.node_cache import CacheFullError, describe_pins, unpin_hint

if TYPE_CHECKING:
    from episodestream._format.episodes import EpisodeInfo
    from episodestream._format.files import EpisodesOf
    from episodestream._remote.source.cached_files import CachedFiles

# Downloaded whole, with meta/episodes/ (v3.0); the .jsonl files are v2.x's (``_format.v2x``, ``v2_stats``).
METADATA_FILES = ("meta/info.json", "meta/tasks.parquet", "meta/stats.json", "meta/episodes.jsonl",
                  "meta/tasks.jsonl", "meta/episodes_stats.jsonl")
EPISODES_METADATA = "meta/episodes"
DISK_SLACK_BYTES = 2 * 4096  # a sparse file's two written regions round up to filesystem blocks
_SPAN_MARGIN = 1.25  # an episode's span starts at a keyframe and ends past its last frame: more than its share
_HEADER_BASE_BYTES = 16 * 1024  # an mp4 header: a few boxes, then ~16 bytes of tables per frame
_HEADER_BYTES_PER_FRAME = 16


def metadata_files(files: CachedFiles) -> list[str]:
    """The files a dataset downloads whole into the cache: ``METADATA_FILES`` it has, and the
    episodes parquet files."""
    return ([p for p in METADATA_FILES if files.exists(p)]
            + files.list_files(EPISODES_METADATA, suffix=".parquet"))


def metadata_bytes(files: CachedFiles) -> int:
    """What the metadata files this dataset downloads whole occupy in the cache."""
    relpaths = [p for p in METADATA_FILES if files.exists(p)] + files.list_files(EPISODES_METADATA, suffix="")
    return sum(files.size_bytes(p) + DISK_SLACK_BYTES for p in relpaths)


def _file_ends_s(episodes: Iterable[EpisodeInfo]) -> dict[str, float]:
    """Each mp4's duration as far as ``episodes`` tell (the latest ``to_timestamp_s`` in it)."""
    ends: dict[str, float] = {}
    for episode in episodes:
        for span in episode.videos.values():
            ends[span.relpath] = max(ends.get(span.relpath, 0.0), span.to_timestamp_s)
    return ends


def video_share_bytes(files: CachedFiles, episodes: Iterable[EpisodeInfo]) -> int:
    """The episodes' share of their mp4s (by duration): what fetching their video costs, roughly
    (a progress bar's total)."""
    episodes = list(episodes)
    files.look_up(_video_files(episodes))
    ends = _file_ends_s(episodes)
    total = 0
    for episode in episodes:
        for span in episode.videos.values():
            share = (span.to_timestamp_s - span.from_timestamp_s) / max(ends[span.relpath], 1e-9)
            total += int(min(1.0, share) * files.size_bytes(span.relpath))
    return total


def _video_files(episodes: Iterable[EpisodeInfo]) -> list[str]:
    return [span.relpath for episode in episodes for span in episode.videos.values()]


def _header_bytes(size: int, frames: float) -> int:
    """An upper estimate of an mp4's header (``moov`` and the box headers) of ``frames`` frames."""
    return min(size, _HEADER_BASE_BYTES + _HEADER_BYTES_PER_FRAME * int(frames))


def episode_cache_bytes(files: CachedFiles, meta: EpisodesOf, episodes: Iterable[EpisodeInfo] | None = None, *,
                        ends: dict[str, float] | None = None) -> dict[int, int]:
    """An upper estimate of the cache each of ``episodes`` (default: every episode of ``meta``)
    takes for its video, by episode index: its spans (1.25x its share of its files' bytes), each
    with its own header (its sample tables cut to the span's frames, ``_format.mp4_trim``), for
    every camera. The files' header entries, one per file whatever its episodes, are not in it
    (``header_cache_bytes``). ``ends``: each mp4's duration (``_file_ends_s``), where the caller has it."""
    ends = _file_ends_s(meta.episodes.values()) if ends is None else ends
    wanted = list(meta.episodes.values() if episodes is None else episodes)
    files.look_up(_video_files(wanted))
    per_episode = {}
    for episode in wanted:
        total = 0
        for span in episode.videos.values():
            if not files.exists(span.relpath):
                continue
            size = files.size_bytes(span.relpath)
            seconds = span.to_timestamp_s - span.from_timestamp_s
            share = seconds / max(ends[span.relpath], 1e-9)
            own = _header_bytes(size, seconds * meta.fps * _SPAN_MARGIN)
            total += int(_SPAN_MARGIN * share * size) + own + 2 * DISK_SLACK_BYTES
        per_episode[episode.episode_index] = total
    return per_episode


def header_cache_bytes(files: CachedFiles, meta: EpisodesOf, episodes: Iterable[EpisodeInfo] | None = None, *,
                       ends: dict[str, float] | None = None) -> list[int]:
    """An upper estimate of each header entry the video of ``episodes`` (default: every episode of
    ``meta``) needs: one per mp4 they lie in (not per episode: a v3.0 file's thousand episodes share
    one), largest first."""
    ends = _file_ends_s(meta.episodes.values()) if ends is None else ends
    relpaths = sorted({span.relpath for episode in (meta.episodes.values() if episodes is None else episodes)
                       for span in episode.videos.values()})
    files.look_up(relpaths)
    return sorted((_header_bytes(files.size_bytes(relpath), ends[relpath] * meta.fps) + DISK_SLACK_BYTES
                   for relpath in relpaths if files.exists(relpath)), reverse=True)


def video_cache_bytes(files: CachedFiles, meta: EpisodesOf, episodes: Sequence[EpisodeInfo]) -> int:
    """An upper estimate of the cache ``episodes``' video takes: their spans and their files' headers."""
    ends = _file_ends_s(meta.episodes.values())
    return (sum(episode_cache_bytes(files, meta, episodes, ends=ends).values())
            + sum(header_cache_bytes(files, meta, episodes, ends=ends)))


def minimum_cache_bytes(files: CachedFiles, meta: EpisodesOf, episodes_in_flight: int) -> int:
    """An estimate of the cache one consumer needs: the metadata, and the ``episodes_in_flight``
    largest episodes' video (``pool_cache_bytes``; where files are looked up by name, of the
    ``episodes_in_flight`` longest episodes: ``video_cache_bytes``)."""
    if files.knows_every_file:
        return pool_cache_bytes(files, meta, 0)(episodes_in_flight)
    table = meta.episodes
    longest = [table.at(int(row)) for row in np.argsort(-table.length, kind="stable")[:episodes_in_flight]]
    return metadata_bytes(files) + video_cache_bytes(files, meta, longest)


def pool_cache_bytes(files: CachedFiles, meta: EpisodesOf, extra_episodes: int) -> Callable[[int], int]:
    """``minimum_cache_bytes`` as a function of the pool (``pool + extra_episodes`` episodes in flight),
    for a source that knows every file: the largest episodes' spans, and the largest headers of as
    many files as they may lie in (a camera each), each sorted once, so that a search over pool sizes
    costs no pass over the episodes per size."""
    ends = _file_ends_s(meta.episodes.values())
    largest = np.sort(np.fromiter(episode_cache_bytes(files, meta, ends=ends).values(), dtype=np.int64))[::-1]
    prefix = np.concatenate([[0], np.cumsum(largest)])
    headers = np.concatenate([[0], np.cumsum(np.asarray(header_cache_bytes(files, meta, ends=ends), dtype=np.int64))])
    cameras = max(1, len(next(iter(meta.episodes.values())).videos)) if len(meta.episodes) else 1
    fixed = metadata_bytes(files)

    def bytes_of(pool: int) -> int:
        held = min(len(largest), pool + extra_episodes)
        return fixed + int(prefix[held]) + int(headers[min(len(headers) - 1, held * cameras)])

    return bytes_of


def check_cache_budget(files: CachedFiles, meta: EpisodesOf | None, episodes_in_flight: int) -> None:
    """Refuse a ``cache_limit`` below ``minimum_cache_bytes`` (the metadata alone without ``meta``)
    (``ValueError``), or one that pinned entries already in the cache leave too little of
    (``CacheFullError``). ``files`` is closed before either error (the dataset will not be built)."""
    limit = files.cache.limit_bytes
    if limit is None:
        return
    if meta is None:
        need, holds = metadata_bytes(files), "the dataset's metadata files alone take"
    else:
        need = minimum_cache_bytes(files, meta, episodes_in_flight)
        holds = (f"one consumer holds the metadata and up to {episodes_in_flight} episodes' video bytes "
                 f"(episode_pool_size + prefetch_episodes + 1), about")
    if limit < need:
        files.close()  # the dataset will not be built: let go of the metadata it downloaded
        raise ValueError(
            f"cache_limit={limit} bytes ({limit / 1e6:.1f} MB) is too small for {files.description}: {holds} "
            f"{need} bytes ({need / 1e6:.1f} MB). Pass cache_limit of at least {need} bytes (plus the same "
            f"video share again for each further DataLoader worker on a node), or lower episode_pool_size.")
    try:
        check_pinned_room(files, need, f"{holds} {need} bytes ({need / 1e6:.1f} MB)")
    except CacheFullError:
        files.close()
        raise


def cache_holds(files: CachedFiles, meta: EpisodesOf, episodes_in_flight: int) -> bool:
    """Whether ``check_cache_budget`` would pass for ``episodes_in_flight``, without refusing."""
    limit = files.cache.limit_bytes
    if limit is None:
        return True
    need = minimum_cache_bytes(files, meta, episodes_in_flight)
    return need <= limit and _pinned_room_holds(files, need)


def _pinned_room_holds(files: CachedFiles, need: int) -> bool:
    """Whether pinned entries leave ``files.cache`` ``need`` bytes: other sources' pins take their
    bytes; this source's pins are entries the run reads (its metadata, prewarmed episodes), so they
    count only beyond what it needs."""
    limit = files.cache.limit_bytes
    if limit is None:
        return True
    _, own, others = files.pinned_bytes()
    return others + max(own, need) <= limit


def check_pinned_room(files: CachedFiles, need: int, needs: str) -> None:
    """Raise ``CacheFullError`` when pinned entries leave ``files.cache`` less than ``need`` bytes.

    Pins never go by themselves, so this is certain to stall and better said now
    (``_pinned_room_holds`` says what counts).
    """
    if _pinned_room_holds(files, need):
        return
    cache = files.cache
    pins, own, others = files.pinned_bytes()
    free = max(0, cache.limit_bytes - others - own)
    raise CacheFullError(
        f"cache_limit={cache.limit_bytes} bytes ({cache.limit_bytes / 1e6:.1f} MB) of the cache {cache.root} is "
        f"full of pinned (prewarmed) entries: {others + own} bytes pinned ({describe_pins(pins)}), {free} bytes "
        f"free, and {files.description} needs more: {needs}. "
        f"{unpin_hint(cache.root)}, or raise cache_limit.")
