"""Each camera's per-episode spans in meta/episodes, checked against the episodes, at load.

A frame of episode ``e`` plays at ``from_timestamp(e) + frame_index / fps`` in its video file, so a
span one frame off gives the neighbouring frames, silently (each is still within ``tolerance_s``
of the time asked for). What metadata alone can tell, vectorised over all episodes at once:

- a span lasts the episode: ``to - from == length / fps`` within half a frame;
- no span starts before the file does (``from >= 0``, within half a frame);
- the episodes of one file are back to back: in time order each starts where the previous one
  ends, within half a frame (LeRobot appends episodes to a file, and ``aggregate_datasets``
  appends whole files, each shifted by what the file already held).

A file's first episode may start after 0: files that LeRobot's merges wrote can, so that is not
refused. Hence a file holding a single episode, shifted as a whole, passes here; the decoder's own
check (every frame within ``tolerance_s`` of its query) remains for it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from episodestream._base.errors import DatasetFormatError
from episodestream._format.episodes import VideoColumns


def check_video_spans(key: str, spans: VideoColumns, length: np.ndarray, fps: int, episode: np.ndarray,
                      where: Callable[[int], str], files: str, fps_where: str) -> None:
    """Raise ``DatasetFormatError`` for the first span that breaks a rule above. Rows are the rows
    of the episodes tables; ``where(row)`` names the file and episode of a row; ``files`` is the
    dataset's description, which video relpaths are below."""
    start, end = spans.from_timestamp_s, spans.to_timestamp_s
    half_frame_s = 0.5 / fps
    columns = f"videos/{key}/from_timestamp and to_timestamp"

    def video(row: int) -> str:
        return f"{files}/{spans.relpaths[spans.file_id[row]]}"

    unreadable = np.flatnonzero(~(np.isfinite(start) & np.isfinite(end)))
    if unreadable.size:
        k = unreadable[0]
        raise DatasetFormatError(f"{where(k)}: {columns} are {float(start[k])!r} and {float(end[k])!r}, not finite times "
                                 f"(video {video(k)}).")
    duration_s = length / fps
    wrong = np.flatnonzero(~(np.abs((end - start) - duration_s) <= half_frame_s))
    if wrong.size:
        k = wrong[0]
        raise DatasetFormatError(
            f"{where(k)}: {columns} are {float(start[k])!r} and {float(end[k])!r}, a span of {end[k] - start[k]:.6g} s, but the "
            f"episode's {length[k]} frames at {fps} fps ({fps_where}) last {duration_s[k]:.6g} s; more than half "
            f"a frame apart, so the span cannot hold this episode's frames of {video(k)} "
            f"({wrong.size} episode(s) of {key!r} so).")
    early = np.flatnonzero(start < -half_frame_s)
    if early.size:
        k = early[0]
        raise DatasetFormatError(f"{where(k)}: videos/{key}/from_timestamp is {float(start[k])!r}, before the start of "
                                 f"{video(k)}.")
    order = np.lexsort((start, spans.file_id))  # by file, then by time in the file
    same_file = spans.file_id[order][1:] == spans.file_id[order][:-1]
    step_s = start[order][1:] - end[order][:-1]
    apart = np.flatnonzero(same_file & ~(np.abs(step_s) <= half_frame_s))
    if apart.size:
        prev, k = order[apart[0]], order[apart[0] + 1]
        gap_s = float(step_s[apart[0]])
        raise DatasetFormatError(
            f"{where(k)}: videos/{key}/from_timestamp is {float(start[k])!r}, but in {video(k)} the episode before it "
            f"(episode_index {episode[prev]}) ends at to_timestamp {float(end[prev])!r}: the spans "
            f"{'overlap' if gap_s < 0 else 'leave a gap'} by {abs(gap_s):.6g} s ({abs(gap_s) * fps:.3g} frames). "
            f"LeRobot writes a file's episodes back to back, so one of these spans is off and would give another "
            f"episode's frames.")
