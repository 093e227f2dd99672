"""Episodes as a consumer fetches them: each video span narrowed to what its frames can read.

``NeededEpisodes``: the episodes table as a curated dataset's consumers ask for it. With
``keep_frames``, a kept range much shorter than its episode needs only part of the episode's
video: the frames from the first kept frame plus the earliest window offset to the last kept frame
plus the latest one (clamped to the episode).

``ShareEpisodes``: the same narrowing for one consumer's share of an epoch. The epoch's frames are
cut into equal parts, one per rank and then per DataLoader worker, so the first and last episodes
of a share are usually parts of episodes whose other parts other consumers stream (on this node or
on another). Fetched whole by each, every cut episode's video crossed the link twice (12 ranks of
a 96-episode epoch: 11 of 96 episodes, +11% video bytes); narrowed, the two consumers' spans
overlap by a keyframe and two frames.

``VideoSpan.needed_from_s`` / ``needed_to_s`` say which part; a remote source fetches the byte span
of those frames from the keyframe before them (``_format.mp4``), a local one ignores them. Rows are
still read whole (a row group is the episode's), so windows of other keys see the whole episode as
before.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping

import numpy as np

from episodestream._format.episodes import EpisodeInfo, EpisodeTable
from episodestream._plan.curation import Anchors
from episodestream._plan.sampling import ConsumerSchedule, as_array


def _reach(offsets: Mapping[str, np.ndarray]) -> dict[str, tuple[int, int]]:
    """Each key's earliest and latest window offset (frames)."""
    return {key: (int(np.min(off)), int(np.max(off))) for key, off in offsets.items() if len(off)}


def _narrowed(episode: EpisodeInfo, first: int, last: int, reach: Mapping[str, tuple[int, int]],
              fps: int) -> EpisodeInfo:
    """``episode`` with each camera's needed span cut to frames ``first..last`` plus the camera's
    window reach (clamped to the episode), within what it needed already."""
    videos = {}
    for key, span in episode.videos.items():
        before, after = reach.get(key, (0, 0))
        lo = max(0, first + min(before, 0))
        hi = min(episode.length - 1, last + max(after, 0))
        needed_from, needed_to = span.needed_s
        videos[key] = dataclasses.replace(
            span, needed_from_s=max(needed_from, span.from_timestamp_s + lo / fps),
            needed_to_s=min(needed_to, span.from_timestamp_s + (hi + 1) / fps))
    return dataclasses.replace(episode, videos=videos)


class NeededEpisodes:
    """``episodes[episode_index]`` -> ``EpisodeInfo`` with narrowed video spans (made on demand)."""

    def __init__(self, table: EpisodeTable, anchors: Anchors, offsets: Mapping[str, np.ndarray], fps: int) -> None:
        self._table, self._anchors, self._fps = table, anchors, fps
        self._reach = _reach(offsets)

    def __getitem__(self, episode_index: int) -> EpisodeInfo:
        episode = self._table[episode_index]
        if not episode.videos:
            return episode
        k = int(np.searchsorted(self._anchors.episode_index, episode_index))
        if k == len(self._anchors.episode_index) or self._anchors.episode_index[k] != episode_index:
            return episode  # not selected: whole (a caller asking for it reads it whole)
        kept = self._anchors.kept(k)
        return _narrowed(episode, int(kept[0]), int(kept[-1]), self._reach, self._fps)


class ShareEpisodes:
    """``episodes[episode_index]`` as one consumer fetches it: video spans narrowed to the frames
    its schedule (``ConsumerSchedule``: its share's segments, and its fill-ins) can emit, for the
    episodes it holds only part of; other episodes as ``episodes`` gives them."""

    def __init__(self, episodes: EpisodeTable | NeededEpisodes, schedule: ConsumerSchedule,
                 offsets: Mapping[str, np.ndarray], fps: int) -> None:
        self._episodes, self._fps = episodes, fps
        self._reach = _reach(offsets)
        self._frames = _schedule_frames(schedule)

    def __getitem__(self, episode_index: int) -> EpisodeInfo:
        episode = self._episodes[episode_index]
        frames = self._frames.get(episode_index)
        if frames is None or not episode.videos or (frames[0] <= 0 and frames[1] >= episode.length - 1):
            return episode
        return _narrowed(episode, frames[0], frames[1], self._reach, self._fps)


def _schedule_frames(schedule: ConsumerSchedule) -> dict[int, tuple[int, int]]:
    """Each episode's first and last frame that ``schedule`` can emit (a weighted episode's copies
    may emit any of its frames: the whole episode). A fill-in (one frame, repeated from the
    rank's part so that every rank emits as many samples) needs that frame only; an episode is
    fetched for one span per consumer, so a fill-in from one of the consumer's own segments
    widens nothing and one from another's part of the rank adds its frame."""
    frames: dict[int, tuple[int, int]] = {}

    def add(episode_index: int, lo: int, hi: int) -> None:
        known = frames.get(episode_index)
        frames[episode_index] = (lo, hi) if known is None else (min(known[0], lo), max(known[1], hi))

    for episode_index, frame in schedule.fill_frames():
        add(episode_index, frame, frame)
    for segment in schedule.share.segments:
        if not segment.length:
            continue
        if segment.period:
            lo, hi = 0, sys.maxsize
        elif isinstance(segment.frames, range) and segment.frames.step == 1:
            lo, hi = segment.frames.start, segment.frames.stop - 1
        else:
            array = as_array(segment.frames)
            lo, hi = int(array.min()), int(array.max())
        add(segment.episode_index, lo, hi)
    return frames
