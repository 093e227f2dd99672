"""``NeededEpisodes``: the episodes table as a curated dataset's consumers ask for it, each video
span narrowed to what its kept frames and their windows can read.

With ``keep_frames``, a kept range much shorter than its episode needs only part of the episode's
video: the frames from the first kept frame plus the earliest window offset to the last kept frame
plus the latest one (clamped to the episode). ``VideoSpan.needed_from_s`` / ``needed_to_s`` say
which; a remote source fetches the byte span of those frames from the keyframe before them
(``_format.mp4``), a local one ignores them. Rows are still read whole (a row group is the
episode's), so windows of other keys see the whole episode as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from episodestream._format.episodes import EpisodeInfo, EpisodeTable
from episodestream._plan.curation import Anchors


class NeededEpisodes:
    """``episodes[episode_index]`` -> ``EpisodeInfo`` with narrowed video spans (made on demand)."""

    def __init__(self, table: EpisodeTable, anchors: Anchors, offsets: Mapping[str, np.ndarray], fps: int) -> None:
        self._table, self._anchors, self._fps = table, anchors, fps
        self._reach = {key: (int(np.min(off)), int(np.max(off))) for key, off in offsets.items() if len(off)}

    def __getitem__(self, episode_index: int) -> EpisodeInfo:
        episode = self._table[episode_index]
        if not episode.videos:
            return episode
        k = int(np.searchsorted(self._anchors.episode_index, episode_index))
        if k == len(self._anchors.episode_index) or self._anchors.episode_index[k] != episode_index:
            return episode  # not selected: whole (a caller asking for it reads it whole)
        kept = self._anchors.kept(k)
        first, last = int(kept[0]), int(kept[-1])
        videos = {}
        for key, span in episode.videos.items():
            before, after = self._reach.get(key, (0, 0))
            lo = max(0, first + min(before, 0))
            hi = min(episode.length - 1, last + max(after, 0))
            videos[key] = dataclasses.replace(span, needed_from_s=span.from_timestamp_s + lo / self._fps,
                                              needed_to_s=min(span.to_timestamp_s,
                                                              span.from_timestamp_s + (hi + 1) / self._fps))
        return dataclasses.replace(episode, videos=videos)
