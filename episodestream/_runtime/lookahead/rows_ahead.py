"""``RowsAhead``: a remote consumer's row reads, started when its video is admitted ahead.

A remote episode's rows are a ranged read of its data file (``_format.rows.RowReader``: one round
trip once the footer is known), made when the pool admits the episode, in the consumer's own
thread, which decodes nothing meanwhile: at the start of a pass the pool admits its second episode
within the first batch, and that batch waits for the round trip. Prefetching already admits each
episode's video a few admissions ahead (``dataset_runtime._admit_ahead``); ``ahead(episode)`` starts
its rows' read then, and ``read(episode)`` at the admission takes the result.

Every read, ahead or not, runs on one thread of this object's, in the order asked for, so the
``RowReader`` (open parquet files, their positions) is only ever used by one thread at a time. The
thread exits as soon as nothing is queued (a stream nobody closes leaves none behind), ``close()``
waits for a read under way. Which rows a sample has never depends on this, only when they are read;
an error of a read ahead is raised by the ``read`` that wants those rows, in the consumer's thread.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from typing import cast

from episodestream._format.metadata import EpisodeInfo
from episodestream._format.rows import EpisodeRows
from episodestream._sample.holds import EpisodeRowReader

_CLOSE_JOIN_S = 60.0


class _Read:
    __slots__ = ("episode", "done", "rows", "error")

    def __init__(self, episode: EpisodeInfo) -> None:
        self.episode = episode
        self.done = threading.Event()
        self.rows: EpisodeRows | None = None
        self.error: BaseException | None = None


class RowsAhead:
    """``read`` as ``reader.read``, with reads started ahead by ``ahead`` (see the module docstring).

    ``keep``: how many reads ahead are kept, oldest dropped first (an episode admitted ahead while
    the pool still holds it is never read from here; its rows are the pool's).
    """

    def __init__(self, reader: EpisodeRowReader, *, keep: int) -> None:
        self._reader = reader
        self._keep = max(1, keep)
        self._cond = threading.Condition()
        self._ahead: OrderedDict[int, _Read] = OrderedDict()  # by episode index, not yet taken
        self._queue: deque[_Read] = deque()
        self._thread: threading.Thread | None = None
        self._closed = False

    def ahead(self, episode: EpisodeInfo) -> None:
        """Start reading ``episode``'s rows (a no-op when a read of them waits to be taken)."""
        with self._cond:
            if self._closed or episode.episode_index in self._ahead:
                return
            read = self._ahead[episode.episode_index] = _Read(episode)
            while len(self._ahead) > self._keep:
                _, dropped = self._ahead.popitem(last=False)
                if dropped in self._queue:  # not started: nobody will wait for it
                    self._queue.remove(dropped)
            self._submit(read)

    def read(self, episode: EpisodeInfo) -> EpisodeRows:
        """``episode``'s rows: the read started ahead, else one made now (on the same thread)."""
        with self._cond:
            read = self._ahead.pop(episode.episode_index, None)
            if read is None:
                if self._closed:
                    raise RuntimeError("the stream's row reads are closed")
                read = _Read(episode)
                self._submit(read)
        read.done.wait()
        if read.error is not None:
            raise read.error
        return cast(EpisodeRows, read.rows)  # done without an error: read

    def close(self) -> None:
        """Drop what was not started; wait for the read under way (its thread then exits)."""
        with self._cond:
            self._closed = True
            dropped, self._queue = list(self._queue), deque()
            self._ahead.clear()
            thread = self._thread
        for read in dropped:  # a read() waiting for one (another thread) raises
            read.error = RuntimeError("the stream's row reads were closed before this episode's")
            read.done.set()
        if thread is not None:
            thread.join(_CLOSE_JOIN_S)

    # -- the thread ------------------------------------------------------------------------------

    def _submit(self, read: _Read) -> None:
        # The caller holds self._cond.
        self._queue.append(read)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="episodestream-rows", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._queue:
                    self._thread = None  # the next _submit starts another
                    return
                read = self._queue.popleft()
            try:
                read.rows = self._reader.read(read.episode)
            except BaseException as error:  # raised by read() in the consumer's thread
                read.error = error
            read.done.set()
