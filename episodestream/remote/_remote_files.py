"""``RemoteFiles``: a remote dataset behind the ``DatasetFiles`` seam, through the node cache.

Metadata files are downloaded whole into the cache (``local_path``); data parquet files are read in
place by ranged reads (``open_input``), so admitting an episode fetches its footer once and then its
row group(s) only. ``episode_videos()`` gives each consumer a ``RemoteVideos``: admitting an episode
fetches, in background threads, a sparse copy of each camera's mp4 holding the header and the
episode's byte span, which the decoder reads like the whole file.

Process model: a ``RemoteFiles`` is built (and lists the source) once, in the process that builds the
dataset, and pickles into DataLoader workers without its clients; each process makes its own
filesystem client, reader and cache holder on first use (nothing is opened before that).
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from .._dataset_files import check_relpath
from ._node_cache import DEFAULT_WAIT_S, CacheFullError, NodeCache, describe_pins, unpin_hint
from ._config import ControllerConfig
from ._download import default_fetch
from ._mp4 import Mp4Header, Mp4LayoutError, VideoTrack, read_header
from ._process import process_state
from ._reader import LARGE_READ_BYTES, ChunkedReader, FetchFn, RangedFile, ReadStats, fetch_range
from ._resolve import (CACHE_LIMIT_ENV, CACHE_WAIT_ENV, FileEntry, ResolvedSource, default_cache_dir, error_line,
                       list_source, response_status, resolve_source)
from ._retry import DownloadError

if TYPE_CHECKING:
    from .._metadata import DatasetMeta, EpisodeInfo

logger = logging.getLogger("episodestream.remote")

SPAN_PAD_MAX_BYTES = 64 * 1024
HEADER_BLOCK_BYTES = 4096
_METADATA_FILES = ("meta/info.json", "meta/tasks.parquet", "meta/stats.json")  # downloaded whole, with meta/episodes/
_EPISODES_METADATA = "meta/episodes/"
_SPAN_PAD_FRACTION = 64  # pad each side by 1/64 of the span, at most SPAN_PAD_MAX_BYTES
_DISK_SLACK_BYTES = 2 * 4096  # a sparse file's two written regions round up to filesystem blocks
_CLOSE_JOIN_S = 60.0


@dataclass(frozen=True)
class VideoStats:
    """One consumer's video fetching: spans and whole files it acquired, and how often ``path``
    had to wait for bytes that were not local yet."""

    spans: int = 0
    whole_files: int = 0
    waits: int = 0
    wait_s: float = 0.0


def _versioned(relpath: str, entry: FileEntry) -> str:
    """A cache name for ``relpath`` that changes when the remote file does (keeps the extension)."""
    version = hashlib.sha256(f"{entry.version}\0{entry.size}".encode()).hexdigest()[:8]
    path = PurePosixPath(relpath)
    return str(path.with_name(f"{path.stem}@{version}{path.suffix}"))


class _ProcessState:
    """What one process needs to read: its own client, reader and cache holder."""

    def __init__(self, files: RemoteFiles) -> None:
        self.pid = os.getpid()
        self.fs = files._resolved.filesystem()
        self.reader = ChunkedReader(self.fs, files._remote_size, fetch=files._fetch)
        self.holder = secrets.token_hex(6)
        self.held: set[str] = set()
        self.lock = threading.Lock()
        # Metadata entries stay referenced while this process may read them; released at close
        # or exit (a killed process's reference is recognised as stale by the next user).
        self.finalizer = weakref.finalize(self, _release_all, files.cache, self.holder, self.held)


def _release_all(cache: NodeCache, holder: str, names) -> None:
    for name in sorted(names):
        try:
            cache.release(name, holder)
        except OSError:
            pass
    names.clear()


class RemoteFiles:
    """A remote LeRobot v3.0 dataset (see the module docstring). Built by ``open_remote_source``."""

    def __init__(self, resolved: ResolvedSource, listing: Mapping[str, FileEntry], *, cache: NodeCache,
                 fetch_threads: int = 4, fetch: FetchFn = fetch_range) -> None:
        self._resolved = resolved
        self._listing = dict(listing)
        self.description = resolved.description
        self.cache = cache
        self.fetch_threads = fetch_threads
        self._fetch = fetch
        self._process: _ProcessState | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_process"] = None  # clients, threads and cache holders never cross a process boundary
        return state

    # -- per process -----------------------------------------------------------------------------

    def _state(self) -> _ProcessState:
        return process_state(self, _ProcessState)

    @property
    def reader(self) -> ChunkedReader:
        return self._state().reader

    def stats(self) -> ReadStats:
        """Requests and bytes this process fetched for the dataset (metadata, parquet, video)."""
        return self._state().reader.stats()

    def close(self) -> None:
        """Release this process's metadata entries (the last user on the node deletes them)."""
        if self._process is not None and self._process.pid == os.getpid():
            self._process.finalizer()

    # -- naming ----------------------------------------------------------------------------------

    def _entry(self, relpath: str) -> tuple[str, FileEntry]:
        relpath = check_relpath(relpath, what="Path")
        entry = self._listing.get(relpath)
        if entry is None:
            raise FileNotFoundError(f"{self.description}/{relpath} does not exist (the dataset lists "
                                    f"{len(self._listing)} files; none has this path).")
        return relpath, entry

    def _remote_path(self, relpath: str) -> str:
        return self._resolved.path(relpath)

    def _remote_size(self, remote_path: str) -> int:
        root = self._resolved.root
        return self._listing[remote_path[len(root) + 1:] if root else remote_path].size

    def cache_name(self, kind: str, relpath: str, suffix: str = "") -> str:
        relpath, entry = self._entry(relpath)
        return f"{self._resolved.cache_key}/{kind}/{_versioned(relpath, entry)}{suffix}"

    def secrets(self) -> list[str]:
        return self._resolved.secrets()

    def pinned_bytes(self) -> tuple[dict[str, tuple[int, int]], int, int]:
        """The cache's pins by source (``NodeCache.pinned``), and the bytes pinned for this source
        and for all others."""
        pins = self.cache.pinned()
        own = pins.get(self._resolved.cache_key, (0, 0))[1]
        return pins, own, sum(total for _, total in pins.values()) - own

    # -- DatasetFiles ----------------------------------------------------------------------------

    def exists(self, relpath: str) -> bool:
        return check_relpath(relpath, what="Path") in self._listing

    def size(self, relpath: str) -> int:
        return self._entry(relpath)[1].size

    def read_bytes(self, relpath: str) -> bytes:
        return Path(self.local_path(relpath)).read_bytes()

    def list_files(self, reldir: str, *, suffix: str) -> list[str]:
        prefix = check_relpath(reldir, what="Folder").rstrip("/") + "/"
        return sorted(p for p in self._listing if p.startswith(prefix) and p.endswith(suffix))

    def local_path(self, relpath: str) -> str:
        """Download ``relpath`` whole into the cache once per node; this process holds it until
        ``close()`` or exit."""
        relpath, _ = self._entry(relpath)
        name = self.cache_name("files", relpath)
        state = self._state()
        with state.lock:
            if name in state.held:  # one marker per holder: acquiring again would not add a reference
                return str(self.cache.path(name))
            path = self.fetch_whole(relpath, holder=state.holder)
            state.held.add(name)
        return str(path)

    def fetch_whole(self, relpath: str, *, holder: str, stop: Callable[[], bool] | None = None) -> Path:
        """Acquire the whole-file cache entry of ``relpath`` for ``holder`` (downloading it if absent)."""
        relpath, entry = self._entry(relpath)
        name = self.cache_name("files", relpath)
        remote, reader = self._remote_path(relpath), self.reader

        def download(tmp: Path) -> None:
            with open(tmp, "wb") as out:
                for start in range(0, entry.size, LARGE_READ_BYTES):
                    end = min(entry.size, start + LARGE_READ_BYTES)
                    out.write(self._guarded(lambda s=start, e=end: reader.read(remote, s, e, exact=True), relpath))

        return self.cache.acquire(name, holder, download, size_bytes=entry.size + _DISK_SLACK_BYTES,
                                  what=f"{self.description}/{relpath}", stop=stop)

    def open_input(self, relpath: str) -> RangedFile:
        relpath, _ = self._entry(relpath)
        return self.reader.open(self._remote_path(relpath))

    def episode_videos(self) -> RemoteVideos:
        return RemoteVideos(self, threads=self.fetch_threads)

    def _guarded(self, call: Callable[[], Any], relpath: str) -> Any:
        """Run a client call; its errors come back naming the file, with secrets redacted."""
        try:
            return call()
        except (Mp4LayoutError, DownloadError):
            raise  # a DownloadError already names the URL (no credentials), the status and the attempts
        except Exception as error:  # each client has its own hierarchy (OSError, httpx, botocore)
            status = response_status(error)
            message = error_line(error, self.secrets(), default="")
            kind = (FileNotFoundError if isinstance(error, FileNotFoundError) or status == 404
                    or "NotFound" in type(error).__name__ else
                    PermissionError if isinstance(error, PermissionError) or status in (401, 403) else OSError)
            raise kind(f"Reading {self.description}/{relpath} failed: {type(error).__name__}"
                       + (f" (HTTP {status})" if status else "") + f": {message}") from None

    # -- budget ----------------------------------------------------------------------------------

    def metadata_bytes(self) -> int:
        """What the metadata files this dataset downloads whole occupy in the cache."""
        return sum(entry.size + _DISK_SLACK_BYTES for relpath, entry in self._listing.items()
                   if relpath in _METADATA_FILES or relpath.startswith(_EPISODES_METADATA))

    def episode_cache_bytes(self, meta: DatasetMeta) -> dict[int, int]:
        """An upper estimate of the cache each episode's video takes, by episode index: its spans
        (1.25x its share of its files' bytes) with their files' headers (twice: the header entry and
        its copy in the sparse file), for every camera."""
        durations: dict[str, float] = {}
        for episode in meta.episodes.values():
            for span in episode.videos.values():
                durations[span.relpath] = max(durations.get(span.relpath, 0.0), span.to_timestamp_s)
        per_episode = {}
        for episode in meta.episodes.values():
            total = 0
            for span in episode.videos.values():
                entry = self._listing.get(span.relpath)
                if entry is None:
                    continue
                share = (span.to_timestamp_s - span.from_timestamp_s) / max(durations[span.relpath], 1e-9)
                header = min(entry.size, 16 * 1024 + 16 * int(durations[span.relpath] * meta.fps))
                total += int(1.25 * share * entry.size) + 2 * header + 2 * _DISK_SLACK_BYTES
            per_episode[episode.episode_index] = total
        return per_episode

    def minimum_cache_bytes(self, meta: DatasetMeta, episodes_in_flight: int) -> int:
        """An estimate of the cache one consumer needs: the metadata, and the ``episodes_in_flight``
        largest episodes' video (``episode_cache_bytes``)."""
        largest = sorted(self.episode_cache_bytes(meta).values(), reverse=True)
        return self.metadata_bytes() + sum(largest[:episodes_in_flight])

    def check_cache_budget(self, meta: DatasetMeta | None = None, *, episodes_in_flight: int = 0) -> None:
        """Refuse a ``cache_limit`` below ``minimum_cache_bytes`` (the metadata alone without ``meta``)
        (``ValueError``), or one that pinned entries already in the cache leave too little of
        (``CacheFullError``)."""
        limit = self.cache.limit_bytes
        if limit is None:
            return
        if meta is None:
            need, holds = self.metadata_bytes(), "the dataset's metadata files alone take"
        else:
            need = self.minimum_cache_bytes(meta, episodes_in_flight)
            holds = (f"one consumer holds the metadata and up to {episodes_in_flight} episodes' video bytes "
                     f"(episode_pool_size + prefetch_episodes + 1), about")
        if limit < need:
            self.close()  # the dataset will not be built: let go of the metadata it downloaded
            raise ValueError(
                f"cache_limit={limit} bytes ({limit / 1e6:.1f} MB) is too small for {self.description}: {holds} "
                f"{need} bytes ({need / 1e6:.1f} MB). Pass cache_limit of at least {need} bytes (plus the same "
                f"video share again for each further DataLoader worker on a node), or lower episode_pool_size.")
        try:
            check_pinned_room(self, need, f"{holds} {need} bytes ({need / 1e6:.1f} MB)")
        except CacheFullError:
            self.close()
            raise


def check_pinned_room(files: RemoteFiles, need: int, needs: str) -> None:
    """Raise ``CacheFullError`` when pinned entries leave ``files.cache`` less than ``need`` bytes.

    Pins never go by themselves, so this is certain to stall and better said now. Other sources'
    pins take their bytes; this source's pins are entries the run reads (its metadata, prewarmed
    episodes), so they count only beyond what it needs.
    """
    cache = files.cache
    if cache.limit_bytes is None:
        return
    pins, own, others = files.pinned_bytes()
    if others + max(own, need) <= cache.limit_bytes:
        return
    free = max(0, cache.limit_bytes - others - own)
    raise CacheFullError(
        f"cache_limit={cache.limit_bytes} bytes ({cache.limit_bytes / 1e6:.1f} MB) of the cache {cache.root} is "
        f"full of pinned (prewarmed) entries: {others + own} bytes pinned ({describe_pins(pins)}), {free} bytes "
        f"free, and {files.description} needs more: {needs}. "
        f"{unpin_hint(cache.root)}, or raise cache_limit.")


class _Task:
    """Getting one camera's bytes of one admitted episode local."""

    def __init__(self, episode: EpisodeInfo, key: str) -> None:
        self.episode, self.key = episode, key
        self.done = threading.Event()
        self.started = False
        self.cancelled = False  # evicted (or closed) before or while running
        self.path: str | None = None
        self.entry: str | None = None
        self.error: BaseException | None = None


class _DaemonPool:
    """A few daemon threads running callables in order; made lazily, stopped by ``close``."""

    def __init__(self, threads: int) -> None:
        self._size = threads
        self._queue: list[Callable[[], None]] = []
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def submit(self, job: Callable[[], None]) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("the fetch pool is closed")
            self._queue.append(job)
            if len(self._threads) < self._size:
                thread = threading.Thread(target=self._run, name=f"episodestream-fetch-{len(self._threads)}",
                                          daemon=True)
                self._threads.append(thread)
                thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                job = self._queue.pop(0)
            job()

    def close(self, timeout_s: float) -> None:
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout_s)


class RemoteVideos:
    """One consumer's prefetch-on-admit video cache (``EpisodeVideos``).

    ``admit`` queues a task per camera; ``path`` waits for it (running it in the caller when no
    thread has started it yet); ``evict`` releases the episode's cache entries once its
    admissions are all evicted. mp4 headers stay referenced until ``close``, so each file's header
    is fetched once while the consumer runs.
    """

    prefetches = True

    def __init__(self, files: RemoteFiles, *, threads: int = 4) -> None:
        self._files = files
        self._cache = files.cache
        self._holder = secrets.token_hex(6)
        self._lock = threading.Lock()
        self._admitted: dict[int, int] = {}
        self._tasks: dict[tuple[int, str], _Task] = {}
        self._counts: dict[str, int] = {}  # this consumer's references per cache entry
        self._entry_locks: dict[str, threading.Lock] = {}
        self._headers: dict[str, tuple[Mp4Header, VideoTrack] | None] = {}
        self._header_locks: dict[str, threading.Lock] = {}
        self._header_entries: set[str] = set()
        self._pool = _DaemonPool(threads)
        self._stats = {"spans": 0, "whole_files": 0, "waits": 0, "wait_s": 0.0}
        # A task waits for a lock (timeout_s) and twice for space (the header, the span): path()
        # waits longer, so the task's own error (a CacheFullError naming the pins) is what surfaces.
        self._timeout_s = self._cache.timeout_s + 2 * self._cache.wait_s
        # A consumer dropped without close() (a map-style dataset's, at exit) still lets go.
        weakref.finalize(self, _release_all, self._cache, self._holder, self._counts)

    # -- EpisodeVideos ---------------------------------------------------------------------------

    def admit(self, episode: EpisodeInfo) -> None:
        tasks = []
        with self._lock:
            count = self._admitted.get(episode.episode_index, 0)
            self._admitted[episode.episode_index] = count + 1
            if count:
                return
            for key in episode.videos:
                task = self._tasks[(episode.episode_index, key)] = _Task(episode, key)
                tasks.append(task)
        for task in tasks:
            self._pool.submit(lambda task=task: self._run(task))

    def path(self, episode: EpisodeInfo, key: str) -> str:
        with self._lock:
            task = self._tasks.get((episode.episode_index, key))
        if task is None:  # not admitted (or evicted meanwhile): admit now, the caller evicts later
            self.admit(episode)
            with self._lock:
                task = self._tasks.get((episode.episode_index, key))
            if task is None:
                raise KeyError(f"episode {episode.episode_index} has no video key {key!r} "
                               f"(keys: {sorted(episode.videos)}).")
        if not task.done.is_set():
            self._run(task)  # no-op when a thread has started it
            start_s = time.monotonic()
            finished = task.done.wait(self._timeout_s)
            with self._lock:
                self._stats["waits"] += 1
                self._stats["wait_s"] += time.monotonic() - start_s
            if not finished:
                relpath = episode.videos[key].relpath
                raise TimeoutError(f"The video bytes of episode {episode.episode_index} ({key}) from "
                                   f"{self._files.description}/{relpath} were not local after "
                                   f"{self._timeout_s:.0f} s.")
        if task.error is not None:
            raise task.error
        return task.path

    def evict(self, episode: EpisodeInfo) -> None:
        releases = []
        with self._lock:
            count = self._admitted.get(episode.episode_index, 0) - 1
            if count > 0:
                self._admitted[episode.episode_index] = count
                return
            self._admitted.pop(episode.episode_index, None)
            for key in episode.videos:
                task = self._tasks.pop((episode.episode_index, key), None)
                if task is None:
                    continue
                task.cancelled = True
                if task.done.is_set() and task.entry is not None:
                    releases.append(task.entry)
                    task.entry = None
        for name in releases:
            self._unhold(name)

    def close(self) -> None:
        """Stop fetching; release every entry this consumer holds (the last user deletes it)."""
        with self._lock:
            tasks = list(self._tasks.values())
            self._tasks.clear()
            self._admitted.clear()
            for task in tasks:
                task.cancelled = True
        self._pool.close(_CLOSE_JOIN_S)
        releases = []
        with self._lock:
            for task in tasks:
                if task.done.is_set() and task.entry is not None:
                    releases.append(task.entry)
                    task.entry = None
            headers, self._header_entries = sorted(self._header_entries), set()
            self._headers.clear()
        for name in releases:
            self._unhold(name)
        for name in headers:
            self._unhold(name)

    def stats(self) -> VideoStats:
        with self._lock:
            return VideoStats(**self._stats)

    # -- fetching --------------------------------------------------------------------------------

    def _run(self, task: _Task) -> None:
        with self._lock:
            if task.started:
                return
            task.started = True
            skip = task.cancelled
        if skip:
            task.done.set()
            return
        entry = path = error = None
        try:
            entry, path = self._fetch(task.episode, task.key, stop=lambda: task.cancelled)
        except BaseException as caught:  # handed to path(); this thread must keep serving
            error = caught
        with self._lock:
            task.error, task.path = error, path
            orphan = entry if task.cancelled else None
            if not task.cancelled:
                task.entry = entry
            task.done.set()
        if orphan is not None:
            self._unhold(orphan)

    def _hold(self, name: str, acquire: Callable[[], Path]) -> Path:
        """One node-wide reference per entry for this consumer, however many episodes share it."""
        with self._lock:
            entry_lock = self._entry_locks.setdefault(name, threading.Lock())
        with entry_lock:
            if self._counts.get(name, 0) == 0:
                path = acquire()
            else:
                path = self._cache.path(name)
            with self._lock:
                self._counts[name] = self._counts.get(name, 0) + 1
            return path

    def _unhold(self, name: str) -> None:
        with self._lock:
            entry_lock = self._entry_locks.setdefault(name, threading.Lock())
        with entry_lock:
            with self._lock:
                count = self._counts.get(name, 0) - 1
                if count > 0:
                    self._counts[name] = count
                    return
                self._counts.pop(name, None)
            self._cache.release(name, self._holder)

    def _header(self, relpath: str, stop: Callable[[], bool]) -> tuple[Mp4Header, VideoTrack] | None:
        """The mp4's header and sample tables (None: a layout we do not map; fetch it whole)."""
        with self._lock:
            lock = self._header_locks.setdefault(relpath, threading.Lock())
        with lock:
            with self._lock:
                if relpath in self._headers:
                    return self._headers[relpath]
            parsed = self._load_header(relpath, stop)
            with self._lock:
                self._headers[relpath] = parsed
            return parsed

    def _load_header(self, relpath: str, stop: Callable[[], bool]) -> tuple[Mp4Header, VideoTrack] | None:
        files = self._files
        name = files.cache_name("headers", relpath, ".hdr")
        remote, size = files._remote_path(relpath), files.size(relpath)
        found: dict[str, Mp4Header] = {}

        def download(tmp: Path) -> None:
            # Small blocks: box headers sit just before megabytes of mdat that are not wanted here.
            header = files._guarded(lambda: read_header(
                lambda s, e: files.reader.read(remote, s, e, block_bytes=HEADER_BLOCK_BYTES), size), relpath)
            tmp.write_bytes(header.to_bytes())
            found["header"] = header

        try:
            # Reserved before the header is known; moov is well under 1% of a LeRobot mp4.
            path = self._hold(name, lambda: self._cache.acquire(
                name, self._holder, download, size_bytes=min(size, 1024 * 1024),
                what=f"the header of {files.description}/{relpath}", stop=stop))
        except Mp4LayoutError as error:
            logger.warning("%s/%s: %s; fetching the whole file for its episodes instead of their spans.",
                           files.description, relpath, error)
            return None
        header = found.get("header") or Mp4Header.from_bytes(path.read_bytes())
        try:
            parsed = (header, VideoTrack.parse(header.moov))
        except Mp4LayoutError as error:
            logger.warning("%s/%s: %s; fetching the whole file for its episodes instead of their spans.",
                           files.description, relpath, error)
            self._unhold(name)
            return None
        with self._lock:
            self._header_entries.add(name)
        return parsed

    def _fetch(self, episode: EpisodeInfo, key: str, stop: Callable[[], bool]) -> tuple[str, str]:
        files = self._files
        video = episode.videos[key]
        relpath = video.relpath
        if not files.exists(relpath):
            raise FileNotFoundError(f"Video file {files.description}/{relpath} (episode {episode.episode_index}, "
                                    f"{key}) is missing.")
        parsed = self._header(relpath, stop)
        span = None
        if parsed is not None:
            header, track = parsed
            try:
                span = track.span(video.from_timestamp_s, video.to_timestamp_s)
            except Mp4LayoutError as error:
                logger.warning("%s/%s (episode %d): %s; fetching the whole file.", files.description, relpath,
                               episode.episode_index, error)
        if span is None:
            name = files.cache_name("files", relpath)
            path = self._hold(name, lambda: files.fetch_whole(relpath, holder=self._holder, stop=stop))
            with self._lock:
                self._stats["whole_files"] += 1
            return name, str(path)
        pad = min(SPAN_PAD_MAX_BYTES, span.size_bytes // _SPAN_PAD_FRACTION)
        start, end = max(0, span.start - pad), min(header.file_size, span.end + pad)
        name = files.cache_name("spans", relpath, f"/{start}-{end}.mp4")
        remote = files._remote_path(relpath)

        def build(tmp: Path) -> None:
            # A sparse file of the original size: the header regions and this span at their
            # offsets, holes elsewhere. The decoder indexes it from moov and reads only our span.
            with open(tmp, "wb") as out:
                out.truncate(header.file_size)
                for offset, data in header.regions:
                    out.seek(offset)
                    out.write(data)
                out.seek(start)
                for piece in range(start, end, LARGE_READ_BYTES):
                    piece_end = min(end, piece + LARGE_READ_BYTES)
                    out.write(files._guarded(
                        lambda s=piece, e=piece_end: files.reader.read(remote, s, e, exact=True), relpath))

        path = self._hold(name, lambda: self._cache.acquire(
            name, self._holder, build, size_bytes=header.size_bytes + (end - start) + _DISK_SLACK_BYTES,
            what=f"{files.description}/{relpath} bytes {start}..{end} (episode {episode.episode_index})",
            stop=stop))
        with self._lock:
            self._stats["spans"] += 1
        return name, str(path)


def open_remote_source(source: str, *, revision: str | None = None, cache_dir: str | os.PathLike | None = None,
                       cache_limit: int | str | None = None, storage_options: Mapping[str, Any] | None = None,
                       hub_endpoint: str | None = None, token: Any = None, fetch_threads: int = 4,
                       fetch_timeout_s: float = 600.0, cache_wait_s: float | None = None,
                       download_config: ControllerConfig | Mapping[str, Any] | None = None) -> RemoteFiles:
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
    """
    from .._options import check_int, check_positive_float, env_override, parse_size_bytes

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
    resolved = resolve_source(source, revision=revision, storage_options=storage_options,
                              hub_endpoint=hub_endpoint, token=token)
    listing = list_source(resolved)
    cache = NodeCache(root, limit_bytes=limit_bytes, timeout_s=timeout_s, wait_s=wait_s)
    cache.prune()  # leftovers of processes killed in earlier runs
    files = RemoteFiles(resolved, listing, cache=cache, fetch_threads=fetch_threads, fetch=fetch)
    files.check_cache_budget()  # before downloading metadata that would not fit
    return files
