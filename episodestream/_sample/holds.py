"""The lifetime of "an episode's rows in RAM plus its video admitted", for the stream's pool and
the map-style dataset's few cached episodes alike.

An episode is held by a count of holds: the first reads its rows (or, with ``rows_at_first_use``,
leaves that to the first ``rows`` call) and (unless the caller prefetches video itself) admits its
video; the last release drops the rows and hands the episode back, so the caller evicts its video
once nothing pending still needs the bytes (the pool evicts after the group's decode; map-style at
once).

Why rows may wait for their first use: a pool admits its episodes before it emits from them, and a
wide pool admits many at once (a resumed pool all of it; a cold one a ramp of them before its first
batch), where each read costs a data file's footer when the files hold more row groups than the
reader keeps open. Read at first use, a first batch waits only for the episodes it draws from, and an
episode evicted before it emits anything (at a resume point) is never read.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from typing import Protocol

from episodestream._base.tracing import trace_span
from episodestream._format.files import EpisodeVideos
from episodestream._format.metadata import EpisodeInfo
from episodestream._format.rows import EpisodeRows


class EpisodeRowReader(Protocol):
    """``_format.rows.RowReader`` or ``_format.columns.ColumnStore``."""

    def read(self, episode: EpisodeInfo) -> EpisodeRows: ...


class FileRowReader(EpisodeRowReader, Protocol):
    """An ``EpisodeRowReader`` that reads several episodes of one data file at once (``RowReader``)."""

    def read_many(self, episodes: list[EpisodeInfo]) -> list[EpisodeRows]: ...


# Held episodes of one data file read together (``HeldEpisodes.rows``): this many at a file's first
# read, twice as many at each next one, up to ``READ_TOGETHER_MAX``. A file's footer is then parsed
# a few times (log2 of its pooled episodes) rather than once per episode, and a pool's first sample
# still waits for only a few episodes per file it draws from.
READ_TOGETHER = 4
READ_TOGETHER_MAX = 256


class _Held:
    __slots__ = ("episode", "rows", "holds")

    def __init__(self, episode: EpisodeInfo, rows: EpisodeRows | None) -> None:
        self.episode, self.rows, self.holds = episode, rows, 0



class HeldEpisodes:
    """Episodes held in RAM, oldest first (the order ``oldest`` and ``hold`` keep as an LRU)."""

    def __init__(self, reader: EpisodeRowReader, videos: EpisodeVideos, *, admit_video: bool = True,
                 rows_at_first_use: bool = False) -> None:
        self._reader = reader
        self._videos = videos
        self._admit_video = admit_video
        self._rows_at_first_use = rows_at_first_use
        self._held: OrderedDict[int, _Held] = OrderedDict()
        # Per data file: its held episodes whose rows wait for their first use (what ``rows`` reads
        # together; a scan of every held episode per read cost ~10^4 checks a read in a pool of a whole
        # share), and how many of them its next read takes.
        self._waiting: dict[str, dict[int, _Held]] = {}
        self._together: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, episode_index: int) -> bool:
        return episode_index in self._held

    def hold(self, episode: EpisodeInfo) -> None:
        """One more hold on ``episode`` (admitting its video on the first, and reading its rows then
        unless they wait for their first use); it becomes the most recently used."""
        held = self._held.get(episode.episode_index)
        if held is None:
            rows = None if self._rows_at_first_use else self._read(episode)
            if self._admit_video:
                self._videos.admit(episode)
            try:
                self._videos.check(episode)  # a missing mp4 is an error now, not at its first decode
            except BaseException:
                if self._admit_video:
                    self._videos.evict(episode)
                raise
            held = self._held[episode.episode_index] = _Held(episode, rows)
            if rows is None:
                self._waiting.setdefault(episode.data_relpath, {})[episode.episode_index] = held
        else:
            self._held.move_to_end(episode.episode_index)
        held.holds += 1

    def rows(self, episode_index: int) -> EpisodeRows:
        """The rows of a held episode (read now if they waited for their first use, with some held
        episodes of its data file that wait too, ``READ_TOGETHER`` at first and twice as many each
        time, where the reader reads several at once: a pool of a whole share holds every episode of
        its share and soon emits from all of them, and reading them one by one reopened a file per
        episode)."""
        held = self._held[episode_index]
        if held.rows is None:
            relpath = held.episode.data_relpath
            waiting = self._waiting[relpath]
            many = getattr(self._reader, "read_many", None)
            if many is not None and len(waiting) > 1:
                together = self._together.get(relpath, READ_TOGETHER)
                self._together[relpath] = min(2 * together, READ_TOGETHER_MAX)
                mates = [held] + [h for h in itertools.islice(waiting.values(), together) if h is not held][:together - 1]
                try:
                    with trace_span("read_rows", cat="rows", level="detailed", episode=episode_index,
                                    episodes=len(mates)):
                        for mate, rows in zip(mates, many([h.episode for h in mates])):
                            mate.rows = rows
                            del waiting[mate.episode.episode_index]
                except Exception:  # a damaged file-mate: each is read alone, so an error names its own
                    pass
            if held.rows is None:
                held.rows = self._read(held.episode)
                del waiting[episode_index]
            if not waiting:
                del self._waiting[relpath]
        return held.rows

    def _read(self, episode: EpisodeInfo) -> EpisodeRows:
        with trace_span("read_rows", cat="rows", level="detailed", episode=episode.episode_index):
            return self._reader.read(episode)

    def touch(self, episode_index: int) -> EpisodeRows:
        """The rows of a held episode, which becomes the most recently used."""
        self._held.move_to_end(episode_index)
        return self.rows(episode_index)

    def oldest(self) -> int:
        return next(iter(self._held))

    def release(self, episode_index: int) -> EpisodeInfo | None:
        """Undo one hold. After the last, the rows are dropped and the episode is returned: the
        caller evicts its video when nothing pending needs it (None while holds remain)."""
        held = self._held[episode_index]
        held.holds -= 1
        if held.holds:
            return None
        del self._held[episode_index]
        if held.rows is None:  # never read: no longer waiting
            waiting = self._waiting[held.episode.data_relpath]
            del waiting[episode_index]
            if not waiting:
                del self._waiting[held.episode.data_relpath]
        return held.episode
