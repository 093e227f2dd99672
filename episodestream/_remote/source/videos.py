"""``RemoteVideos``: one consumer's video bytes of a remote dataset (the ``EpisodeVideos`` seam).

Admitting an episode fetches, on a few background threads (``DaemonPool``), a sparse copy of each
camera's mp4 holding the header and the episode's byte span (found from the mp4's sample tables,
``_format.mp4``), which the decoder reads like the whole file. Entries live in the node cache
(``NodeCache``), referenced once per consumer however many of its episodes share one.

A source that looks its files up by name (v2.x, ``CachedFiles.knows_every_file`` False) asks about
all of an episode's files (its parquet and every camera's mp4) in one look-up, from whichever of
its tasks runs first; ``check`` raises for a missing mp4 when the pool holds the episode.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import logging
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from episodestream._base.byte_ranges import coalesce
from episodestream._base.turns import Turn
from episodestream._format.files import EpisodeVideos
from episodestream._remote.source.budget import DISK_SLACK_BYTES
from episodestream._remote.transport.daemon_pool import DaemonPool
from episodestream._format.mp4 import Mp4Header, Mp4LayoutError, VideoTrack, read_header
from episodestream._format.mp4_trim import SpanTables, with_moov
from episodestream._remote.cache.node_cache import release_all
from episodestream._remote.source.file_view import FileView
from episodestream._remote.transport.reader import CACHED_PIECE_MAX_BYTES, LARGE_READ_BYTES

if TYPE_CHECKING:
    from episodestream._format.metadata import EpisodeInfo
    from episodestream._remote.source.cached_files import CachedFiles

logger = logging.getLogger("episodestream.remote")

HEADER_BLOCK_BYTES = 4096
# The tail read with the start of an mp4: a LeRobot mp4's moov takes ~6-12 bytes per frame of
# several KB (0.1-0.2% of the file), so 1/256 of the file holds it; a larger moov costs the walk
# its usual reads, no more. At least a block (a small file's moov), at most the reader's largest
# kept piece (the walk must find it there).
_TAIL_FRACTION = 256
# The start of the file, read with its tail: ftyp and the box headers after it (LeRobot's mp4s open
# with ftyp, free and mdat's header in 48 bytes). A whole block here cost 4 KiB per file and node
# of which the walk needed a few dozen bytes; a layout reaching further costs the walk its usual
# block reads.
_HEAD_BYTES = 512
RAMP_ADMISSIONS = 4  # the pool's first slots draw from 1, 2 and 4 episodes
# The head start passed on to the next DataLoader worker (``turn``): a first batch of two decode
# groups draws from the pool's first two slots, one episode then two.
TURN_ADMISSIONS = 2
# One read of neighbouring spans (``admit_many``) at most: a few of them are in memory at once,
# one per fetch thread.
NEIGHBOURS_READ_MAX_BYTES = 8 * 1024 * 1024
# The gap between two neighbours' spans read rather than split at: bytes nobody asked for, for a
# round trip less (docs/remote.md has the trade measured).
NEIGHBOURS_HOLE_BYTES = 16 * 1024
_CLOSE_JOIN_S = 60.0


@dataclass(frozen=True)
class _Mp4:
    """An mp4's header, its video track's sample tables, and those tables ready to cut to a span
    (None: a layout ``SpanTables`` does not cut, whose spans keep the whole tables)."""

    header: Mp4Header
    track: VideoTrack
    tables: SpanTables | None

    def span_header(self, first: int, last: int) -> Mp4Header:
        """The header a sparse copy of samples ``first..last`` holds: its moov cut to them (its
        decoder indexes those samples, not the file's), or the whole header where it cannot be cut."""
        if self.tables is not None:
            try:
                return with_moov(self.header, self.tables.moov_for(first, last)) or self.header
            except Mp4LayoutError:
                pass
        return self.header


def _tail_bytes(size: int) -> int:
    return min(size, CACHED_PIECE_MAX_BYTES, max(HEADER_BLOCK_BYTES, size // _TAIL_FRACTION))


def _read_both(first: Callable[[], object], second: Callable[[], object]) -> None:
    """Run ``first`` here and ``second`` on a daemon thread at the same time; raise the first
    error. A daemon thread, not an executor's: a read stalled past its timeouts must not hold the
    interpreter's exit (the reason ``DaemonPool`` exists)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            second()
        except BaseException as error:  # raised in the caller below
            errors.append(error)

    thread = threading.Thread(target=run, name="episodestream-mp4-tail", daemon=True)
    thread.start()
    try:
        first()
    finally:
        thread.join()
    if errors:
        raise errors[0]


@dataclass(frozen=True)
class VideoStats:
    """One consumer's video fetching: spans and whole files it acquired, and how often ``path``
    had to wait for bytes that were not local yet."""

    spans: int = 0
    whole_files: int = 0
    waits: int = 0
    wait_s: float = 0.0


class _Task:
    """Getting one camera's bytes of one admitted episode local."""

    def __init__(self, episode: EpisodeInfo, key: str) -> None:
        self.episode, self.key = episode, key
        self.done = threading.Event()
        self.started = False
        self.cancelled = False  # evicted (or closed) before or while running
        self.path: str | None = None
        self.span: tuple[int, int] | None = None  # the bytes its span file holds (None: a whole file)
        self.entry: str | None = None
        self.error: BaseException | None = None
        self.admission: _Admission | None = None  # one of the head start's, if it is
        self.neighbours: _Neighbours | None = None  # the spans of its file admitted with it


class _Admission:
    """One of a consumer's first admissions (the head start): its tasks, and whether all are done."""

    def __init__(self, tasks: list[_Task], place: int) -> None:
        self.tasks = tasks
        self.place = place  # in the head start's order
        self.done = threading.Event()


class _Run:
    """One read of neighbouring spans: its bytes, fetched by the first member that needs them."""

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end
        self.lock = threading.Lock()
        self.data: bytes | None = None
        self.members = 0  # tasks whose span it holds
        self.pending = 0  # of those, not yet run: its bytes go with the last


class _Neighbours:
    """The tasks of one mp4 admitted together (``admit_many``), whose spans are read in as few
    requests as their gaps allow (``_base.byte_ranges.coalesce``): the first task of a run that
    needs its bytes fetches the whole run, the others copy their span from it. The runs are
    planned once the file's header is known (by the first task to run); a run's bytes are dropped
    when its last member has run."""

    def __init__(self, tasks: list[_Task]) -> None:
        self._tasks = tasks
        self._lock = threading.Lock()
        self._runs: dict[int, _Run] | None = None  # by id(task)

    def plan(self, spans: Callable[[_Task], tuple[int, int] | None]) -> None:
        with self._lock:
            if self._runs is not None:
                return
            ranges = {id(task): span for task in self._tasks if (span := spans(task)) is not None}
            runs = [_Run(start, end) for start, end in coalesce(
                ranges.values(), hole_bytes=NEIGHBOURS_HOLE_BYTES, max_bytes=NEIGHBOURS_READ_MAX_BYTES)]
            starts = [run.start for run in runs]  # sorted, the runs apart
            self._runs = {}
            for key, (start, end) in ranges.items():
                run = runs[bisect.bisect_right(starts, start) - 1]
                if end <= run.end:  # else a span cut by an overlap too long to join: read alone
                    run.members += 1
                    run.pending += 1
                    self._runs[key] = run

    def read(self, task: _Task, start: int, end: int, fetch: Callable[[int, int], bytes]) -> bytes:
        """Bytes ``[start, end)`` of ``task``'s span: from its run's one read where it has one."""
        with self._lock:
            run = None if self._runs is None else self._runs.get(id(task))
        if run is None or not (run.start <= start and end <= run.end) or run.members < 2:
            return fetch(start, end)
        with run.lock:
            if run.data is None:
                run.data = fetch(run.start, run.end)
            return run.data[start - run.start:end - run.start]

    def ran(self, task: _Task) -> None:
        """``task`` has run (or was cancelled): its run's bytes go with its last member."""
        with self._lock:
            run = None if self._runs is None else self._runs.pop(id(task), None)
            if run is not None:
                run.pending -= 1
                if not run.pending:
                    run.data = None


class RemoteVideos(EpisodeVideos):
    """One consumer's prefetch-on-admit video cache (``EpisodeVideos``).

    ``admit`` queues a task per camera; ``path`` waits for it (running it in the caller when no
    thread has started it yet); ``evict`` releases the episode's cache entries once its
    admissions are all evicted. mp4 headers stay referenced until ``close``, so each file's header
    is fetched once while the consumer runs.

    Head start: the first ``RAMP_ADMISSIONS`` admitted episodes download one after another, each
    alone (its cameras together): an episode's tasks wait until the one admitted before it is
    local (or failed, or the consumer closed); later admissions wait for the first one to be
    local, then queue as usual. A consumer's first
    draws need its first episode only, the next ones a second, then two more (the pool's ramp,
    ``_plan.sampling``), and prefetching admits several episodes at once: sharing the link, the
    first episode's bytes would arrive when all of theirs do. In turn, each arrives as soon as the
    link allows. Only the order of downloads depends on this, never which samples come out.

    Across DataLoader workers, ``turn`` (``_base.turns``) does the same: the first
    ``TURN_ADMISSIONS`` admissions' downloads (and a ``path`` asking for them) wait for the
    consumer before to pass its turn on, every other download for the last consumer to pass its
    own on, and this one passes its turn on once those first admissions are local (its first one,
    if no second was admitted by then; or at ``close``).
    """

    prefetches = True

    def __init__(self, files: CachedFiles, *, threads: int = 4, turn: Turn | None = None) -> None:
        self._files = files
        self._turn = turn
        self._cache = files.cache
        self._holder = secrets.token_hex(6)
        self._lock = threading.Lock()
        self._admitted: dict[int, int] = {}
        self._tasks: dict[tuple[int, str], _Task] = {}
        self._counts: dict[str, int] = {}  # this consumer's references per cache entry
        self._entry_locks: dict[str, threading.Lock] = {}
        self._headers: dict[str, _Mp4 | None] = {}
        # Each mp4's pooled spans, served to one decoder per file (``FileView``); by relpath.
        self._views: dict[str, FileView] = {}
        self._view_serials = itertools.count()
        self._header_locks: dict[str, threading.Lock] = {}
        self._header_entries: set[str] = set()
        self._pool = DaemonPool(threads)
        self._ramp: list[_Admission] = []  # the first admissions with video, in order
        self._counts_by_kind = {"spans": 0, "whole_files": 0, "waits": 0}
        self._wait_s = 0.0
        # A task waits for a lock (timeout_s) and twice for space (the header, the span): path()
        # waits longer, so the task's own error (a CacheFullError naming the pins) is what surfaces.
        self._timeout_s = self._cache.timeout_s + 2 * self._cache.wait_s
        # A consumer dropped without close() (a map-style dataset's, at exit) still lets go.
        weakref.finalize(self, release_all, self._cache, self._holder, self._counts)

    # -- EpisodeVideos ---------------------------------------------------------------------------

    def admit(self, episode: EpisodeInfo) -> None:
        self._submit(self._admit(episode))

    def admit_many(self, episodes: Sequence[EpisodeInfo]) -> None:
        """``admit`` each; the spans of one mp4 among them (past the head start, which crosses
        the link one episode at a time) are read in as few requests as their gaps allow. Their
        tasks know their neighbours before any is submitted, so no thread fetches one alone."""
        jobs = [job for episode in episodes for job in self._admit(episode)]
        by_file: dict[str, list[_Task]] = {}
        for task, _ in jobs:
            video = task.episode.videos[task.key]
            if task.admission is None and not video.whole_file:
                by_file.setdefault(video.relpath, []).append(task)
        for tasks in by_file.values():
            if len(tasks) > 1:
                neighbours = _Neighbours(tasks)
                for task in tasks:
                    task.neighbours = neighbours
        self._submit(jobs)

    def _admit(self, episode: EpisodeInfo) -> list[tuple[_Task, _Admission | None]]:
        """Count one admission of ``episode``; on its first, its tasks and the head-start
        admission each must wait for (None: none), to be submitted."""
        tasks = []
        with self._lock:
            count = self._admitted.get(episode.episode_index, 0)
            self._admitted[episode.episode_index] = count + 1
            if count:
                return []
            for key in episode.videos:
                task = self._tasks[(episode.episode_index, key)] = _Task(episode, key)
                tasks.append(task)
            after = None  # the admission these tasks wait for (the head start)
            if tasks and len(self._ramp) < RAMP_ADMISSIONS:
                after = self._ramp[-1] if self._ramp else None
                admission = _Admission(tasks, len(self._ramp))
                self._ramp.append(admission)
                for task in tasks:
                    task.admission = admission
            elif tasks and not self._ramp[0].done.is_set():
                # Not beside the first episode's bytes either. Queued behind the waiting head-start
                # tasks it usually starts after them anyway, but a thread whose task a path() ran
                # itself is free at once and would take this one to the link with the first.
                after = self._ramp[0]
        return [(task, after) for task in tasks]

    def _submit(self, jobs: list[tuple[_Task, _Admission | None]]) -> None:
        for task, after in jobs:
            job = self._run if after is None else functools.partial(self._run_after, after)
            self._pool.submit(functools.partial(job, task))

    def path(self, episode: EpisodeInfo, key: str) -> str:
        """The episode's mp4 as its decoders read it: a span's file served with the other pooled
        spans of its mp4 (``FileView``: one decoder per mp4, not per episode), or the whole file."""
        task = self._local(episode, key)
        if task.span is None:
            return task.path
        with self._lock:
            view = self._views[episode.videos[key].relpath]
        return view.served()

    def local_file(self, episode: EpisodeInfo, key: str) -> str:
        """The node-cache file holding the episode's bytes of camera ``key`` (its span's sparse
        copy, or the whole mp4), once local (admitted first where it was not)."""
        return self._local(episode, key).path

    def _local(self, episode: EpisodeInfo, key: str) -> _Task:
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
                self._counts_by_kind["waits"] += 1
                self._wait_s += time.monotonic() - start_s
            if not finished:
                relpath = episode.videos[key].relpath
                raise TimeoutError(f"The video bytes of episode {episode.episode_index} ({key}) from "
                                   f"{self._files.description}/{relpath} were not local after "
                                   f"{self._timeout_s:.0f} s.")
        if task.error is not None:
            raise task.error
        return task

    def evict(self, episode: EpisodeInfo) -> list[str]:
        releases, paths = [], []
        with self._lock:
            count = self._admitted.get(episode.episode_index, 0) - 1
            if count > 0:
                self._admitted[episode.episode_index] = count
                return []
            self._admitted.pop(episode.episode_index, None)
            for key in episode.videos:
                task = self._tasks.pop((episode.episode_index, key), None)
                if task is None:
                    continue
                task.cancelled = True
                if task.done.is_set() and task.entry is not None:
                    releases.append(task.entry)
                    task.entry = None
                    if task.span is not None:
                        paths.extend(self._unview(episode.videos[key].relpath, task))
                    elif task.path is not None:
                        paths.append(task.path)
        for name in releases:
            self._unhold(name)
        return paths

    def _unview(self, relpath: str, task: _Task) -> list[str]:
        """Stop serving ``task``'s span (under the lock); the names of its view's decoders to close
        where it served the view's last span (a later span of the mp4 starts a new view)."""
        view = self._views[relpath]
        view.remove(*task.span, task.path)
        if not view.empty:
            return view.superseded()
        del self._views[relpath]
        return view.names()

    def close(self) -> None:
        """Stop fetching; release every entry this consumer holds (the last user deletes it)."""
        with self._lock:
            tasks = list(self._tasks.values())
            self._tasks.clear()
            self._admitted.clear()
            for task in tasks:
                task.cancelled = True
        for admission in self._ramp:  # threads waiting for one find their tasks cancelled
            admission.done.set()
        if self._turn is not None:
            self._turn.pass_on()
        self._pool.close(_CLOSE_JOIN_S)
        releases = []
        with self._lock:
            for task in tasks:
                if task.done.is_set() and task.entry is not None:
                    releases.append(task.entry)
                    task.entry = None
            headers, self._header_entries = sorted(self._header_entries), set()
            self._headers.clear()
            self._views.clear()
        for name in releases:
            self._unhold(name)
        for name in headers:
            self._unhold(name)

    def track(self, episode: EpisodeInfo, key: str) -> VideoTrack:
        """The whole mp4's sample index, from its header (a span's copy lists its own samples only)."""
        video = episode.videos[key]
        parsed = None if video.whole_file else self._header(video.relpath, lambda: False)
        return parsed.track if parsed is not None else super().track(episode, key)

    def check(self, episode: EpisodeInfo) -> None:
        files = self._files
        if files.knows_every_file:
            return  # listed: a missing file was an error when the dataset was built, or is one at path()
        files.look_up(_episode_files(episode))  # usually answered already, by the episode's first task
        for key, video in episode.videos.items():
            if not files.exists(video.relpath):
                raise _missing_video(files.description, video.relpath, episode.episode_index, key)

    def stats(self) -> VideoStats:
        with self._lock:
            return VideoStats(**self._counts_by_kind, wait_s=self._wait_s)

    # -- fetching --------------------------------------------------------------------------------

    def _run_after(self, before: _Admission, task: _Task) -> None:
        # No timeout: the tasks waited for end (their reads time out), and close() sets the event;
        # a path() that wants this task meanwhile runs it itself.
        before.done.wait()
        self._run(task)

    def _note_done(self, task: _Task) -> None:
        admission = task.admission
        if admission is None:
            return
        with self._lock:
            over = all(t.done.is_set() for t in admission.tasks)
            place = admission.place
            last = place == len(self._ramp) - 1
        if over:
            admission.done.set()
            if self._turn is not None and (place == TURN_ADMISSIONS - 1 or (place < TURN_ADMISSIONS and last)):
                self._turn.pass_on()

    def _run(self, task: _Task) -> None:
        if self._turn is not None:  # bounded waits, returning at once after the first
            if task.admission is not None and task.admission.place < TURN_ADMISSIONS:
                self._turn.wait()
            else:
                self._turn.wait_for_all()
        with self._lock:
            if task.started:
                return
            task.started = True
            skip = task.cancelled
        if skip:
            if task.neighbours is not None:
                task.neighbours.ran(task)
            task.done.set()
            self._note_done(task)
            return
        entry = path = error = None
        try:
            entry, path = self._fetch(task, stop=lambda: task.cancelled)
        except BaseException as caught:  # handed to path(); this thread must keep serving
            error = caught
        finally:
            if task.neighbours is not None:
                task.neighbours.ran(task)
        with self._lock:
            task.error, task.path = error, path
            orphan = entry if task.cancelled else None
            if not task.cancelled:
                task.entry = entry
                if error is None and task.span is not None:
                    self._view(task.episode.videos[task.key].relpath).add(*task.span, path)
            task.done.set()
        self._note_done(task)
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

    def _view(self, relpath: str) -> FileView:
        """``relpath``'s view (under the lock; its header is parsed: a span of it was fetched)."""
        view = self._views.get(relpath)
        if view is None:
            parsed = self._headers[relpath]
            assert parsed is not None  # a span was cut from it
            name = f"{self._files.description}/{relpath}#{next(self._view_serials)}"
            view = self._views[relpath] = FileView(name, parsed.header, parsed.track)
        return view

    def _header(self, relpath: str, stop: Callable[[], bool]) -> _Mp4 | None:
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

    def _load_header(self, relpath: str, stop: Callable[[], bool]) -> _Mp4 | None:
        files = self._files
        name = files.cache_name("headers", relpath, ".hdr")
        size = files.size_bytes(relpath)
        found: dict[str, Mp4Header] = {}
        tail: list[tuple[int, bytes]] = []  # the file's tail, once read

        def read(start: int, end: int) -> bytes:
            if tail:
                # A moov longer than the tail read starts before it: only the part before the tail
                # crosses the link again (asked whole, it cost the tail's bytes twice per file).
                tail_start, data = tail[0]
                if start >= tail_start:
                    return data[start - tail_start:end - tail_start]
                if end > tail_start:
                    return files.read_range(relpath, start, tail_start, exact=True) + data[:end - tail_start]
                if start >= _HEAD_BYTES:
                    # A box header between the head and the tail (moov's, before a moov longer than
                    # the tail): its bytes only, since a block here is fetched again with that moov.
                    return files.read_range(relpath, start, end, exact=True)
            # Small blocks: box headers sit just before megabytes of mdat that are not wanted here.
            return files.read_range(relpath, start, end, block_bytes=HEADER_BLOCK_BYTES)

        def download(tmp: Path) -> int:
            # Walking the boxes costs a round trip per box (ftyp and mdat's header, then moov's
            # header, then moov); LeRobot's encoder writes moov last, so the file's tail is asked
            # for together with its start, and the walk then finds both in the reader's pieces.
            tail_start = max(HEADER_BLOCK_BYTES, size - _tail_bytes(size))
            if tail_start < size:
                def read_tail() -> None:
                    tail.append((tail_start, read(tail_start, size)))

                _read_both(lambda: files.read_range(relpath, 0, _HEAD_BYTES, block_bytes=_HEAD_BYTES), read_tail)
            header = read_header(read, size)
            stored = tmp.write_bytes(header.to_bytes())
            found["header"] = header
            return stored  # a header entry's bytes: what it stores

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
            track = VideoTrack.parse(header.moov)
            parsed = _Mp4(header, track, SpanTables.of(header.moov, offsets=track.offsets, sizes=track.sizes))
            if parsed.tables is None:
                logger.info("%s/%s: its sample tables are not in a layout cut to a span's samples: each "
                            "episode's span file holds all of them (%d frames).", files.description, relpath,
                            len(track.sizes))
        except Mp4LayoutError as error:
            logger.warning("%s/%s: %s; fetching the whole file for its episodes instead of their spans.",
                           files.description, relpath, error)
            self._unhold(name)
            return None
        with self._lock:
            self._header_entries.add(name)
        return parsed

    def _fetch(self, task: _Task, stop: Callable[[], bool]) -> tuple[str, str]:
        files = self._files
        episode, key = task.episode, task.key
        video = episode.videos[key]
        relpath = video.relpath
        if not files.knows_every_file:
            files.look_up(_episode_files(episode))  # one request for the episode's files, not one per file
        if not files.exists(relpath):
            raise _missing_video(files.description, relpath, episode.episode_index, key)
        # A file of this episode alone (v2.x) is fetched whole: one read, where header then span is two or more.
        parsed = None if video.whole_file else self._header(relpath, stop)
        span = None
        if parsed is not None:
            header, track = parsed.header, parsed.track
            try:
                samples = track.samples(*video.needed_s)
                span = track.byte_span(*samples)
            except Mp4LayoutError as error:
                logger.warning("%s/%s (episode %d): %s; fetching the whole file.", files.description, relpath,
                               episode.episode_index, error)
        if span is None:
            name = files.cache_name("files", relpath)
            path = self._hold(name, lambda: files.fetch_whole(relpath, holder=self._holder, stop=stop))
            with self._lock:
                self._counts_by_kind["whole_files"] += 1
            return name, str(path)
        start, end = span.start, span.end
        neighbours = task.neighbours
        if neighbours is not None:
            neighbours.plan(lambda mate: _span(mate, track))
        # The samples in the name too: the copy's moov lists them (``_Mp4.span_header``).
        name = files.cache_name("spans", relpath, f"/{start}-{end}.{samples[0]}-{samples[1]}.mp4")
        own_header = parsed.span_header(*samples)

        def build(tmp: Path) -> int:
            # A sparse file of the original size: the header regions (moov cut to the span's
            # samples) and this span at their offsets, holes elsewhere. The decoder indexes it
            # from moov and reads only our span.
            with open(tmp, "wb") as out:
                out.truncate(header.file_size)
                out.seek(start)
                for piece in range(start, end, LARGE_READ_BYTES):
                    piece_end = min(end, piece + LARGE_READ_BYTES)
                    if neighbours is None:
                        out.write(files.read_range(relpath, piece, piece_end, exact=True))
                    else:
                        out.write(neighbours.read(task, piece, piece_end, lambda a, b: files.read_range(
                            relpath, a, b, exact=True)))
                # The header last: where a span's bytes and the moov's overlap, the cut moov wins.
                for offset, data in own_header.regions:
                    out.seek(offset)
                    out.write(data)
            return end - start  # the span's byte range (the header regions are counted with the header)

        path = self._hold(name, lambda: self._cache.acquire(
            name, self._holder, build, size_bytes=own_header.size_bytes + (end - start) + DISK_SLACK_BYTES,
            what=f"{files.description}/{relpath} bytes {start}..{end} (episode {episode.episode_index})",
            stop=stop))
        task.span = (start, end)
        with self._lock:
            self._counts_by_kind["spans"] += 1
        return name, str(path)


def _span(task: _Task, track: VideoTrack) -> tuple[int, int] | None:
    """``task``'s byte range as ``_fetch`` computes it (None where its span cannot be mapped)."""
    try:
        span = track.span(*task.episode.videos[task.key].needed_s)
    except Mp4LayoutError:
        return None
    return span.start, span.end


def _episode_files(episode: EpisodeInfo) -> list[str]:
    return [episode.data_relpath, *(video.relpath for video in episode.videos.values())]


def _missing_video(description: str, relpath: str, episode_index: int, key: str) -> FileNotFoundError:
    return FileNotFoundError(f"Video file {description}/{relpath} (episode {episode_index}, {key}) is missing.")
