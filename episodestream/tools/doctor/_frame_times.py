"""Every frame's time against its video's own frame times, from the mp4's index: no decoding.

The stream asks the decoder for the frame played half a frame after each query and refuses one more
than ``tolerance_s`` from it (``_sample.video.decoder_cache.decode_files``). Decoding every frame of a
dataset costs hours; the mp4's sample tables (``_format.mp4.VideoTrack``: each frame's presentation
time after the edit list, the times the decoders report) say the same in microseconds an episode, so
a video with frames dropped or added mid-episode, or at another frame rate, is found at every frame,
not only at the first and last ones decoded.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np

from episodestream._format.mp4 import VideoTrack
from episodestream._sample.video.decoder_cache import FrameQuery, VideoDecodeError

_SHOWN = 4  # frames an error lists


class FrameTimes:
    """The checks of a worker, each video's index read once (v3.0 files hold many episodes)."""

    def __init__(self, *, fps: int, tolerance_s: float, capacity: int = 32) -> None:
        self._half_frame_s, self._tolerance_s = 0.5 / fps, tolerance_s
        self._tracks: OrderedDict[str, np.ndarray] = OrderedDict()  # relpath -> its frames' times, sorted
        self._capacity = capacity

    def check(self, relpath: str, query: FrameQuery, track: Callable[[], VideoTrack]) -> None:
        """Raise ``VideoDecodeError`` when a time of ``query`` (an episode's frames, in order) has no
        frame of the video within ``tolerance_s``; ``Mp4LayoutError`` when the index cannot say.
        ``track`` reads the index of the whole file ``relpath`` (``EpisodeVideos.track``)."""
        pts = self._pts(relpath, track)
        seconds = np.asarray(query.timestamps_s, dtype=np.float64)
        played = np.searchsorted(pts, seconds + self._half_frame_s, side="right") - 1
        found = np.where(played >= 0, pts[np.maximum(played, 0)], np.nan)
        off = np.flatnonzero(~(np.abs(found - seconds) <= self._tolerance_s))
        if off.size:
            shown = [(int(f), round(float(seconds[f]), 6), None if np.isnan(found[f]) else round(float(found[f]), 6))
                     for f in off[:_SHOWN]]
            raise VideoDecodeError(
                f"{query.path}: {off.size} of the {len(seconds)} frames of {query.who} have no frame of the video "
                f"within tolerance_s={self._tolerance_s} of their time, by the video's own frame times (its mp4 "
                f"index): (frame, time s, frame played then s) {_listed(shown, off.size)}. Decoding them would fail "
                f"or give another frame's image: the video may have dropped or extra frames, or another frame rate.")

    def _pts(self, relpath: str, track: Callable[[], VideoTrack]) -> np.ndarray:
        pts = self._tracks.pop(relpath, None)
        if pts is None:
            pts = np.sort(track().pts_s)
        self._tracks[relpath] = pts
        while len(self._tracks) > self._capacity:
            self._tracks.popitem(last=False)
        return pts


def _listed(values: Sequence, total: int) -> str:
    return "[" + ", ".join(map(str, values)) + (", ...]" if total > len(values) else "]")
