"""The lifetime of "an episode's rows in RAM plus its video admitted", for the stream's pool and
the map-style dataset's few cached episodes alike.

An episode is held by a count of holds: the first reads its rows and (unless the caller prefetches
video itself) admits its video; the last release drops the rows and hands the episode back, so the
caller evicts its video once nothing pending still needs the bytes (the pool evicts after the
group's decode; map-style at once).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

from episodestream._format.files import EpisodeVideos
from episodestream._format.metadata import EpisodeInfo
from episodestream._format.rows import EpisodeRows


class RowSource(Protocol):
    """``_format.rows.RowReader`` or ``_format.columns.ColumnStore``."""

    def read(self, episode: EpisodeInfo) -> EpisodeRows: ...


class _Held:
    __slots__ = ("rows", "holds")

    def __init__(self, rows: EpisodeRows) -> None:
        self.rows, self.holds = rows, 0


class HeldEpisodes:
    """Episodes held in RAM, oldest first (the order ``oldest`` and ``hold`` keep as an LRU)."""

    def __init__(self, reader: RowSource, videos: EpisodeVideos, *, admit_video: bool = True) -> None:
        self._reader = reader
        self._videos = videos
        self._admit_video = admit_video
        self._held: OrderedDict[int, _Held] = OrderedDict()

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, episode_index: int) -> bool:
        return episode_index in self._held

    def hold(self, episode: EpisodeInfo) -> EpisodeRows:
        """One more hold on ``episode`` (reading its rows and admitting its video on the first);
        it becomes the most recently used."""
        held = self._held.get(episode.episode_index)
        if held is None:
            rows = self._reader.read(episode)
            if self._admit_video:
                self._videos.admit(episode)
            try:
                self._videos.check(episode)  # a missing mp4 is an error now, not at its first decode
            except BaseException:
                if self._admit_video:
                    self._videos.evict(episode)
                raise
            held = self._held[episode.episode_index] = _Held(rows)
        else:
            self._held.move_to_end(episode.episode_index)
        held.holds += 1
        return held.rows

    def rows(self, episode_index: int) -> EpisodeRows:
        """The rows of a held episode."""
        return self._held[episode_index].rows

    def touch(self, episode_index: int) -> EpisodeRows:
        """The rows of a held episode, which becomes the most recently used."""
        self._held.move_to_end(episode_index)
        return self._held[episode_index].rows

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
        return held.rows.episode
