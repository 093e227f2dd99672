"""``RemoteFiles``: a remote dataset behind the ``DatasetFiles`` seam, through the node cache.

Metadata files are downloaded whole into the cache (``local_path``); data parquet files are read in
place by ranged reads (``open_input``), so admitting an episode fetches its footer once and then its
row group(s) only. ``episode_videos()`` gives each consumer a ``RemoteVideos`` (``_remote.source.videos``).
How much cache that takes is estimated in ``_remote.source.budget``; client errors are translated in
``_remote.transport.failures``; ``open_remote_source`` (``_open``) builds one.

Which files it knows: a LeRobot v3.0 source is listed whole once (a few files per chunk of
episodes). A v2.x source keeps one parquet and one mp4 per camera per episode, which its info.json
templates name, so it is listed for ``meta/`` only (``listed_folder``) and every other file is
looked up by name (``look_up``, ``_remote.source.lookup``) when first needed: an episode's files
when it is admitted, in one request on the Hub. A path looked up is asked once per process (the
main process's answers travel to workers in the pickle), however many threads want it at once.

Process model: a ``RemoteFiles`` is built (and lists the source) once, in the process that builds the
dataset, and pickles into DataLoader workers without its clients; each process makes its own
filesystem client, reader and cache holder on first use (nothing is opened before that).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, TypeVar

from episodestream._base.byte_ranges import coalesce
from episodestream._base.turns import Turn
from episodestream._format.files import DatasetFiles, SourceStats, check_relpath
from episodestream._remote.source import budget as _budget
from episodestream._remote.transport.failures import as_file_error
from episodestream._remote.source.lookup import look_up
from episodestream._format.mp4 import Mp4LayoutError
from episodestream._remote.cache.node_cache import NodeCache, release_all
from episodestream._remote.transport.process import process_state
from episodestream._remote.transport.reader import (BLOCK_BYTES, CACHED_PIECE_MAX_BYTES, LARGE_READ_BYTES, ChunkedReader,
                                                    FetchFn, RangedFile)
from episodestream._remote.source.videos import RemoteVideos
from episodestream._remote.source.resolve import FileEntry, ResolvedSource
from episodestream._remote.transport.download import DownloadFetch
from episodestream._remote.transport.request import DownloadError

if TYPE_CHECKING:
    import fsspec

    from episodestream._format.files import EpisodesOf

T = TypeVar("T")


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
        # Per process, so that a fork while another thread looks up leaves no lock held in the child.
        self.lookup_lock = threading.Lock()
        self.in_flight: dict[str, threading.Event] = {}  # paths one thread is asking about right now
        self.lookup_requests = 0  # look-up requests sent (``look_up``), under lookup_lock
        self.lock = threading.Lock()
        # Metadata entries stay referenced while this process may read them; released at close
        # or exit (a killed process's reference is recognised as stale by the next user).
        self.finalizer = weakref.finalize(self, release_all, files.cache, self.holder, self.held)
        self.fetching: dict[str, threading.Lock] = {}  # local_path: one download per entry at a time


class RemoteFiles(DatasetFiles):
    """A remote LeRobot dataset (see the module docstring). Built by ``open_remote_source``.

    ``listing`` holds every file of the source, or with ``listed_folder`` every file below that
    folder (dataset-relative): paths elsewhere are looked up by name when first needed. ``fetch``:
    what reads go through (default a ``DownloadFetch``; a Hub source's filesystem, ``HubLink``, sends
    nothing itself, so a custom one must be or call a ``DownloadFetch`` for Hub sources).
    """

    def __init__(self, resolved: ResolvedSource, listing: Mapping[str, FileEntry], *, cache: NodeCache,
                 listed_folder: str | None = None, fetch_threads: int = 4, fetch: FetchFn | None = None) -> None:
        self._resolved = resolved
        self._listing = dict(listing)
        self._listed_prefix = None if listed_folder is None else check_relpath(listed_folder, what="Folder") + "/"
        self._looked_up: dict[str, FileEntry | None] = {}  # None: asked, and the source has no such file
        self.description = resolved.description
        self.cache = cache
        self.fetch_threads = fetch_threads
        self._fetch: FetchFn = fetch if fetch is not None else DownloadFetch()
        # Look-ups are sent as reads are (permits, retries), by the fetch where it can send.
        self._sender = self._fetch if isinstance(self._fetch, DownloadFetch) else DownloadFetch()
        self._process: _ProcessState | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_process"] = None  # clients, threads and cache holders never cross a process boundary
        state["_looked_up"] = dict(self._looked_up)  # what this process learned travels (a copy: threads add to it)
        return state

    # -- per process -----------------------------------------------------------------------------

    def _state(self) -> _ProcessState:
        return process_state(self, _ProcessState)

    @property
    def reader(self) -> ChunkedReader:
        return self._state().reader

    @property
    def download(self) -> FetchFn:
        """The ``fetch(fs, path, start, end)`` every read goes through: by default a
        ``DownloadFetch``, whose ``stats()`` (``FetchStats``: attempts, throttles, retries, bytes)
        and ``controllers()`` describe this process's downloads."""
        return self._fetch

    def filesystem(self) -> fsspec.AbstractFileSystem:
        """This process's fsspec client for the source (made on first use)."""
        return self._state().fs

    def stats(self) -> SourceStats:
        """What this process's reads cost: requests and bytes fetched for the dataset (metadata,
        parquet, video; from its reader), its node-cache hits and misses (from ``cache``) and the
        look-ups it sent for files the listing did not cover (v2.x episodes' files)."""
        state = self._state()
        read, cached = state.reader.stats(), self.cache.stats()
        return SourceStats(requests=read.requests, bytes_fetched=read.bytes_fetched, cache_hits=cached.hits,
                           cache_misses=cached.misses, cache_miss_bytes=cached.miss_bytes,
                           lookup_requests=state.lookup_requests)

    @property
    def node_cache_dir(self) -> Path:
        return self.cache.root

    def close(self) -> None:
        """Release this process's metadata entries (the last user on the node deletes them)."""
        if self._process is not None and self._process.pid == os.getpid():
            self._process.finalizer()

    # -- naming ----------------------------------------------------------------------------------

    @property
    def knows_every_file(self) -> bool:
        """Whether the listing holds every file (v3.0), so that asking about one costs no request."""
        return self._listed_prefix is None

    def list_everything(self, listing: Mapping[str, FileEntry]) -> None:
        """Replace the listing by one of every file of the source (``open_remote_source``, v3.0)."""
        self._listing, self._listed_prefix = dict(listing), None

    def _listed(self, relpath: str) -> bool:
        """Whether the listing answers for ``relpath`` (it is absent if the listing lacks it)."""
        return self._listed_prefix is None or relpath.startswith(self._listed_prefix)

    def look_up(self, relpaths: Iterable[str]) -> None:
        """Make sure this process knows whether each of ``relpaths`` exists, and its size: the
        unknown ones are asked together (``_remote.source.lookup``); paths another thread is asking
        about right now are waited for, not asked again. A no-op where the listing answers."""
        wanted = [p for p in dict.fromkeys(check_relpath(p, what="Path") for p in relpaths)
                  if not (p in self._listing or self._listed(p) or p in self._looked_up)]
        if not wanted:
            return
        state = self._state()
        mine, theirs = [], []
        with state.lookup_lock:
            for relpath in wanted:
                if relpath in self._looked_up:
                    continue
                event = state.in_flight.get(relpath)
                if event is None:
                    state.in_flight[relpath] = threading.Event()
                    mine.append(relpath)
                else:
                    theirs.append(event)
        if mine:
            found: dict[str, FileEntry | None] = {}
            try:
                found = look_up(self._resolved, state.fs, mine, sender=self._sender,
                                asked=lambda requests: self._count_lookups(state, requests))
            finally:  # on an error, waiters wake to find the paths unknown and ask again themselves
                with state.lookup_lock:
                    self._looked_up.update(found)
                    for relpath in mine:
                        state.in_flight.pop(relpath).set()
        for event in theirs:
            event.wait()

    @staticmethod
    def _count_lookups(state: _ProcessState, requests: int) -> None:
        with state.lookup_lock:
            state.lookup_requests += requests

    def _known(self, relpath: str) -> FileEntry | None:
        """The entry of a normalised ``relpath`` (None: no such file), looking it up if needed."""
        entry = self._listing.get(relpath)
        if entry is not None or self._listed(relpath):
            return entry
        if relpath not in self._looked_up:
            self.look_up([relpath])
        return self._looked_up.get(relpath)

    def _entry(self, relpath: str) -> tuple[str, FileEntry]:
        relpath = check_relpath(relpath, what="Path")
        entry = self._known(relpath)
        if entry is None:
            if self._listed(relpath):
                raise FileNotFoundError(f"{self.description}/{relpath} does not exist (the dataset lists "
                                        f"{len(self._listing)} files; none has this path).")
            raise FileNotFoundError(f"{self.description}/{relpath} does not exist (asked for by name, the source "
                                    f"has no file at this path).")
        return relpath, entry

    def _remote_path(self, relpath: str) -> str:
        return self._resolved.path(relpath)

    def _remote_size(self, remote_path: str) -> int:
        root = self._resolved.root
        return self._entry(remote_path[len(root) + 1:] if root else remote_path)[1].size

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
        return self._known(check_relpath(relpath, what="Path")) is not None

    def size_bytes(self, relpath: str) -> int:
        return self._entry(relpath)[1].size

    def read_bytes(self, relpath: str) -> bytes:
        return Path(self.local_path(relpath)).read_bytes()

    def list_files(self, reldir: str, *, suffix: str) -> list[str]:
        prefix = check_relpath(reldir, what="Folder").rstrip("/") + "/"
        if not self._listed(prefix):
            raise ValueError(f"{self.description} is listed for {self._listed_prefix} only (its other files are "
                             f"named by meta/info.json's templates and looked up by name); cannot list {reldir!r}.")
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
            # Per entry, so that several files download at once (``_remote.source.metadata``).
            fetching = state.fetching.setdefault(name, threading.Lock())
        with fetching:
            with state.lock:
                if name in state.held:
                    return str(self.cache.path(name))
            path = self.fetch_whole(relpath, holder=state.holder)
            with state.lock:
                state.held.add(name)
        return str(path)

    def fetch_whole(self, relpath: str, *, holder: str, stop: Callable[[], bool] | None = None) -> Path:
        """Acquire the whole-file cache entry of ``relpath`` for ``holder`` (downloading it if absent)."""
        relpath, entry = self._entry(relpath)
        name = self.cache_name("files", relpath)

        def download(tmp: Path) -> int:
            with open(tmp, "wb") as out:
                for start in range(0, entry.size, LARGE_READ_BYTES):
                    end = min(entry.size, start + LARGE_READ_BYTES)
                    out.write(self.read_range(relpath, start, end, exact=True))
            return entry.size

        return self.cache.acquire(name, holder, download, size_bytes=entry.size + _budget.DISK_SLACK_BYTES,
                                  what=f"{self.description}/{relpath}", stop=stop)

    def open_input(self, relpath: str) -> RangedFile:
        relpath, _ = self._entry(relpath)
        return self.reader.open(self._remote_path(relpath))

    def read_ahead(self, relpath: str, ranges: Callable[[], Sequence[tuple[int, int]]]) -> None:
        reads = coalesce(ranges(), hole_bytes=BLOCK_BYTES, max_bytes=CACHED_PIECE_MAX_BYTES)
        if len(reads) > 1:  # one range is one read anyway
            remote = self._remote_path(relpath)
            self._translate_errors(lambda: self.reader.keep(remote, reads), relpath)

    def episode_videos(self, *, turn: Turn | None = None) -> RemoteVideos:
        return RemoteVideos(self, threads=self.fetch_threads, turn=turn)

    def read_range(self, relpath: str, start: int, end: int, *, exact: bool = False,
                   block_bytes: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of ``relpath`` through this process's reader (``ChunkedReader.read``);
        client errors come back naming the file, with secrets redacted (``_remote.transport.failures.as_file_error``);
        a ``DownloadError`` (it names the URL, the status and the attempts) as it is."""
        remote = self._remote_path(relpath)
        return self._translate_errors(
            lambda: self.reader.read(remote, start, end, exact=exact, block_bytes=block_bytes), relpath)

    def _translate_errors(self, call: Callable[[], T], relpath: str) -> T:
        try:
            return call()
        except (Mp4LayoutError, DownloadError):
            raise  # a DownloadError already names the URL (no credentials), the status and the attempts
        except Exception as error:  # each client has its own hierarchy (OSError, httpx, botocore)
            raise as_file_error(error, where=f"{self.description}/{relpath}", secrets=self.secrets()) from None

    # -- budget ----------------------------------------------------------------------------------

    def metadata_bytes(self) -> int:
        """What the metadata files this dataset downloads whole occupy in the cache (``_remote.source.budget``)."""
        return _budget.metadata_bytes(self)

    def video_cache_bytes(self, meta: EpisodesOf) -> int:
        """An upper estimate of the cache every episode's video takes: spans and their files'
        headers (``_remote.source.budget``)."""
        return _budget.video_cache_bytes(self, meta, list(meta.episodes.values()))

    def minimum_cache_bytes(self, meta: EpisodesOf, episodes_in_flight: int) -> int:
        """An estimate of the cache one consumer needs: the metadata and the ``episodes_in_flight``
        largest episodes' video (``_remote.source.budget``)."""
        return _budget.minimum_cache_bytes(self, meta, episodes_in_flight)

    def cache_holds(self, meta: EpisodesOf, *, episodes_in_flight: int) -> bool:
        return _budget.cache_holds(self, meta, episodes_in_flight)

    def pool_cache_bytes(self, meta: EpisodesOf, *, extra_episodes: int) -> Callable[[int], int] | None:
        """The node cache one consumer keeps for a pool, by pool size (``_remote.source.budget``); None
        where files are looked up by name (sizing every episode would ask about every file)."""
        return _budget.pool_cache_bytes(self, meta, extra_episodes) if self.knows_every_file else None

    def check_cache_budget(self, meta: EpisodesOf | None = None, *, episodes_in_flight: int = 0) -> None:
        """Refuse a ``cache_limit`` below ``minimum_cache_bytes`` (the metadata alone without ``meta``)
        (``ValueError``), or one that pinned entries already in the cache leave too little of
        (``CacheFullError``); see ``_remote.source.budget.check_cache_budget``."""
        _budget.check_cache_budget(self, meta, episodes_in_flight)
