"""``LookAhead``: what a prefetching consumer reads ahead of its pool, as one stage.

A remote consumer's pool needs, for each episode it admits, the episode's rows (a ranged read of
its data file) and its video bytes (a sparse copy of each camera's span, ``RemoteVideos``). Both
cross a link with a round trip each, so both must start before the pool reaches the admission. The
schedule says exactly which episodes the pool admits and in what order (it is known from the seed),
so this stage reads the steps ahead of the pool and starts both there, for every admission it has
room for:

- **How far ahead**: the pool's free slots plus ``admissions_ahead``. A pool that is full (the
  steady state) starts each admission ``admissions_ahead`` admissions before it; a pool filling up
  (the ramp at the start of a pass, where a wide pool admits hundreds of episodes within its first
  thousand samples) starts them all at once, so their round trips overlap instead of following one
  another a few at a time. Either way the episodes held or on their way never exceed
  ``pool_size + admissions_ahead``, what the node cache's budget counts on
  (``episodes_in_flight``). A bound on the steps held back (``MAX_STEPS_AHEAD``) keeps a tail of
  emits without admissions from being read ahead whole, and one on the steps read past the last
  admission found (``STEPS_PAST_ADMISSION``, and ``STEPS_AHEAD_PER_STEP`` more per step passed on)
  keeps the first batch from waiting while a pool with no admission left in sight (a pool of the
  whole share, once full) reads that far.
- **Video**: ``videos.admit_many`` receives the admissions started together, in need order, so
  the fetcher can order them (the first episodes' bytes alone on the link, the head start; a
  DataLoader worker's turn) and ask for neighbouring byte ranges in one request. A filling pool's
  first ``FIRST_ADMISSIONS_APART`` in need order go in a call of their own: the fetcher reads a
  call's neighbouring spans of one mp4 in runs of a few MB, and the first batch would wait for
  whole runs to arrive where it needs a span of each.
- **Rows**: read on one thread of this stage's, in need order; the reads waiting for one data
  file are taken together (``read_many``, one read of their row groups) where the reader can,
  ``READ_TOGETHER`` at a file's first read and twice as many each next one (as ``HeldEpisodes``
  does): the first sample waits for a few episodes' rows, the ramp's hundreds cost a few reads.
  Only the thread uses the reader, so its open files are never shared between threads.
  ``read(episode)`` (the episode's first emit) takes the result, or moves its read to the front;
  an error of a read ahead is raised there, in the consumer's thread.

Each episode is started once however many admissions of it the steps hold at once (a curated
episode's segments), and only when nothing holds it already: what the pool holds has its rows and
video. Which samples come out never depends on this stage, only when their bytes arrive.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter, OrderedDict, deque
from collections.abc import Iterator
from typing import Protocol, cast

from episodestream._format.files import EpisodeVideos
from episodestream._format.metadata import EpisodeInfo
from episodestream._format.rows import EpisodeRows
from episodestream._plan.sampling import ADMIT, EMIT, EVICT, Step
from episodestream._sample.holds import READ_TOGETHER, READ_TOGETHER_MAX, EpisodeRowReader

# Steps held back at most (a tuple each): a schedule's tail of emits after its last admission is
# read ahead this far, not to its end.
MAX_STEPS_AHEAD = 1 << 16
# Steps read past the last admission found before one is passed on, and more for each one passed on,
# at most: a full pool of the whole share has no admission left in sight, and reading MAX_STEPS_AHEAD
# steps before its first sample (Python generating each) held the first batch back by ~0.5 s. More
# than a slot's emits (an episode's frames), the most a filling pool's ramp puts between two of its
# admissions, so all of them are found at once.
STEPS_PAST_ADMISSION = 1 << 12
STEPS_AHEAD_PER_STEP = 2
# Emits read past a filling pool's admissions to order them by need (``_by_first_emit``), at most:
# what the first batches draw from, without generating a schedule's worth of steps first.
FIRST_EMITS_PEEK = 1 << 12
# A filling pool's first admissions in need order, started apart from the rest (``_start``): the
# first batch draws from ~7 episodes (the schedule's ramp), the next ones from a few more.
FIRST_ADMISSIONS_APART = 16
_CLOSE_JOIN_S = 60.0


class EpisodesByIndex(Protocol):
    def __getitem__(self, episode_index: int) -> EpisodeInfo: ...


class _Read:
    __slots__ = ("episode", "done", "rows", "error")

    def __init__(self, episode: EpisodeInfo) -> None:
        self.episode = episode
        self.done = threading.Event()
        self.rows: EpisodeRows | None = None
        self.error: BaseException | None = None


class LookAhead:
    """One consumer's reads ahead of its pool (see the module docstring).

    ``reader``: the consumer's row reader (used by this stage's thread only). ``videos``: its
    video fetcher. ``episodes``: episode index -> ``EpisodeInfo``. ``pool_size``: the pool's
    episodes. ``admissions_ahead``: how many admissions a full pool's fetches run ahead of it
    (``prefetch_episodes``).
    """

    def __init__(self, reader: EpisodeRowReader, videos: EpisodeVideos, episodes: EpisodesByIndex, *,
                 pool_size: int, admissions_ahead: int) -> None:
        self._reader = reader
        self._videos = videos
        self._episodes = episodes
        self._pool_size = pool_size
        self._admissions_ahead = admissions_ahead
        self._cond = threading.Condition()
        self._reads: dict[int, _Read] = {}  # by episode index: started, not yet taken
        self._queue: OrderedDict[int, _Read] = OrderedDict()  # not yet started, in need order
        self._together: dict[str, int] = {}  # by data file: how many reads its next read_many takes
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- the steps -------------------------------------------------------------------------------

    def steps(self, steps: Iterator[Step]) -> Iterator[Step]:
        """Pass ``steps`` through, starting each admission's rows and video as far ahead as the
        pool's room allows (the module docstring)."""
        held_back: deque[Step] = deque()
        # Each episode's holds once every step taken from ``steps`` is passed on: an admission that
        # makes them 1 is the one to start (an eviction taken with it releases the hold before).
        holds: Counter[int] = Counter()
        admits_held_back = 0
        pool_holds = 0  # admissions passed on less evictions passed on: what the pool holds
        source = iter(steps)
        more = True
        may_read = STEPS_PAST_ADMISSION
        while True:
            batch: list[EpisodeInfo] = []
            while (more and may_read > 0 and len(held_back) < MAX_STEPS_AHEAD
                   and admits_held_back < self._admissions_ahead + max(0, self._pool_size - pool_holds)):
                step = next(source, None)
                if step is None:
                    more = False
                    break
                may_read -= 1
                held_back.append(step)
                if step[0] == ADMIT:
                    may_read = max(may_read, STEPS_PAST_ADMISSION)
                    admits_held_back += 1
                    holds[step[1]] += 1
                    if holds[step[1]] == 1:
                        batch.append(self._episodes[step[1]])
                elif step[0] == EVICT:
                    holds[step[1]] -= 1
                    if not holds[step[1]]:
                        del holds[step[1]]
            if len(batch) > max(1, self._admissions_ahead):
                source = self._by_first_emit(batch, held_back, source)
                self._start(batch[:FIRST_ADMISSIONS_APART])
                batch = batch[FIRST_ADMISSIONS_APART:]
            if batch:
                self._start(batch)
            if not held_back:
                return
            out = held_back.popleft()
            may_read += STEPS_AHEAD_PER_STEP
            if out[0] == ADMIT:
                admits_held_back -= 1
                pool_holds += 1
            elif out[0] == EVICT:
                pool_holds -= 1
            yield out

    @staticmethod
    def _by_first_emit(batch: list[EpisodeInfo], held_back: deque[Step], source: Iterator[Step]) -> Iterator[Step]:
        """Sort ``batch`` (a filling pool's admissions, started at once) by each episode's first emit
        in the steps, held back as far as ``FIRST_EMITS_PEEK`` emits after them reach: the first
        batch needs its episodes' rows and video first, not the admissions' order (a pool of a
        whole share admits every episode before its first emit). Returns the rest of ``source``."""
        wanted = {episode.episode_index for episode in batch}
        first: dict[int, int] = {}
        for at, step in enumerate(held_back):
            if step[0] == EMIT and step[1] in wanted:
                first.setdefault(step[1], at)
        peeked = 0
        while len(first) < len(wanted) and peeked < FIRST_EMITS_PEEK and len(held_back) < MAX_STEPS_AHEAD:
            step = next(source, None)
            if step is None:
                break
            if step[0] != EMIT:  # an admission or eviction: counted where the steps are read
                source = itertools.chain([step], source)
                break
            held_back.append(step)
            peeked += 1
            if step[1] in wanted:
                first.setdefault(step[1], len(held_back) - 1)
        batch.sort(key=lambda episode: first.get(episode.episode_index, MAX_STEPS_AHEAD))
        return source

    def _start(self, episodes: list[EpisodeInfo]) -> None:
        self._videos.admit_many(episodes)
        with self._cond:
            if self._closed:
                return
            for episode in episodes:
                if episode.episode_index in self._reads:  # again before the pool took the first: read at need
                    continue
                read = self._reads[episode.episode_index] = _Read(episode)
                self._queue[episode.episode_index] = read
            self._wake()

    # -- rows (``EpisodeRowReader``) ------------------------------------------------------------

    def read(self, episode: EpisodeInfo) -> EpisodeRows:
        """``episode``'s rows: the read started ahead, else one made now (on the same thread)."""
        with self._cond:
            read = self._reads.pop(episode.episode_index, None)
            if read is None:
                if self._closed:
                    raise RuntimeError("the stream's row reads are closed")
                read = _Read(episode)
                self._queue[episode.episode_index] = read
                self._wake()
            if episode.episode_index in self._queue:  # not started: wanted now
                self._queue.move_to_end(episode.episode_index, last=False)
        read.done.wait()
        if read.error is not None:
            raise read.error
        return cast(EpisodeRows, read.rows)  # done without an error: read

    def close(self) -> None:
        """Drop what was not started; wait for the read under way (its thread then exits)."""
        with self._cond:
            self._closed = True
            dropped = list(self._queue.values())
            self._queue.clear()
            self._reads.clear()
            thread = self._thread
        for read in dropped:  # a read() waiting for one (another thread) raises
            read.error = RuntimeError("the stream's row reads were closed before this episode's")
            read.done.set()
        if thread is not None:
            thread.join(_CLOSE_JOIN_S)

    # -- the rows thread -------------------------------------------------------------------------

    def _wake(self) -> None:
        # The caller holds self._cond. The thread exits once nothing is queued, so a stream nobody
        # closes leaves none behind.
        if self._thread is None and self._queue:
            self._thread = threading.Thread(target=self._run, name="episodestream-rows", daemon=True)
            self._thread.start()

    def _next_reads(self) -> list[_Read]:
        """The first queued read, with the queued reads of its data file (the caller holds the lock)."""
        _, first = self._queue.popitem(last=False)
        if not hasattr(self._reader, "read_many"):
            return [first]
        relpath = first.episode.data_relpath
        together = self._together.get(relpath, READ_TOGETHER)
        self._together[relpath] = min(2 * together, READ_TOGETHER_MAX)
        # A scan of what is queued (at most the pool's room): cheap beside the read it saves.
        mates = [index for index, read in self._queue.items() if read.episode.data_relpath == relpath]
        return [first] + [self._queue.pop(index) for index in mates[:together - 1]]

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._queue:
                    self._thread = None  # the next _wake starts another
                    return
                reads = self._next_reads()
            if len(reads) > 1:
                try:
                    many = self._reader.read_many([read.episode for read in reads])  # type: ignore[attr-defined]
                    for read, rows in zip(reads, many):
                        read.rows = rows
                        read.done.set()
                    continue
                except Exception:  # a damaged file-mate: each is read alone, so an error names its own
                    pass
            for read in reads:
                try:
                    read.rows = self._reader.read(read.episode)
                except BaseException as error:  # raised by read() in the consumer's thread
                    read.error = error
                read.done.set()
