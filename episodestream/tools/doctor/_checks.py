"""The checks ``episodestream doctor`` reports, what each covers and what to do when it fails, and which
check a reader's error belongs to.

The checks are the readers' own: reading an episode's rows (``_format.rows.RowReader.read``) checks
its file, row count, ids, timestamps, dtypes, shapes and language columns in one call, and raises the
format's one error type. Which check failed is the reader function that raised (``check_of``), so
the report counts per check without a second copy of the checks to keep equal to the first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Scope = Literal["dataset", "episode"]


@dataclass(frozen=True)
class Check:
    name: str
    scope: Scope  # "dataset": once for the whole dataset; "episode": once per selected episode
    covers: str
    what_to_do: str


CHECKS: tuple[Check, ...] = (
    Check("metadata", "dataset", "info.json, meta/episodes (lengths, row ranges, video spans), tasks",
          "Fix the file and field the error names; nothing else can be checked until the metadata reads."),
    Check("stats", "dataset", "stats present (v3.0, v2.0: meta/stats.json; v2.1: episodes_stats.jsonl), finite",
          "LeRobot's normalizers read these stats: `episodestream stats SOURCE --out FILE` computes exact ones for "
          "the tabular features; recompute the camera ones with LeRobot, or fix the values named."),
    Check("files", "episode", "data and video files present, the data file readable parquet",
          "Restore the file named (download it again, or re-run the conversion that writes it)."),
    Check("rows", "episode", "rows match meta/episodes: row count, index, episode_index, frame_index",
          "The data file and meta/episodes disagree: fix the 'length' / dataset_from_index / dataset_to_index the "
          "error names, or rewrite the episode's rows."),
    Check("timestamps", "episode", "timestamp is frame_index / fps, within tolerance_s",
          "Fix info.json's fps if it is not the data's; for capture times that jitter, train with a larger "
          "tolerance_s (doctor --tolerance-s to check with it)."),
    Check("dtypes", "episode", "columns stored as info.json declares: dtype, shape, list lengths",
          "Fix the dtype or shape in info.json's features, or the column, as the error says."),
    Check("language", "episode", "language columns readable as LeRobot 0.6's rows",
          "Rewrite the language column with LeRobot's writer (a list of row structs per frame)."),
    Check("tasks", "episode", "every frame's task_index names a task",
          "Add the missing task to the tasks file, or fix the rows' task_index."),
    Check("images", "episode", "parquet images decode (first and last frame; --decode all: every frame)",
          "Re-encode the image bytes named (PNG, or TIFF for depth)."),
    Check("frames", "episode", "every frame's time has a video frame within tolerance_s, by the mp4's index "
                               "(no decoding)",
          "Re-encode the video named at the dataset's fps with every frame, or fix its episode's from/to_timestamp "
          "in meta/episodes if the video is right and the span is not."),
    Check("video", "episode", "each camera decodes at its frames' times, within tolerance_s (first and last "
                              "frame; --decode all: all), depth too",
          "Re-encode the video file named, or fix its episode's from/to_timestamp in meta/episodes if the video "
          "is right and the span is not."),
)
BY_NAME = {check.name: check for check in CHECKS}
# Checks made by reading an episode's rows: one reader call passes (or skips) them all.
ROW_CHECKS = ("files", "rows", "timestamps", "dtypes", "language")
# Checks that need the rows read: not checked where they could not be.
AFTER_ROWS = ("tasks", "images", "frames", "video")

# The reader functions whose errors belong to a check; the innermost one in a traceback decides.
_RAISED_IN = {
    "parquet_errors": "files",  # a data file that is not readable parquet
    "check_file_rows": "rows", "_episode_rows": "rows", "_check_ids": "rows", "wrong_length_before": "rows",
    "_check_timestamps": "timestamps",
    "_check_file": "dtypes", "sample_values": "dtypes", "_check_lengths": "dtypes",
    "language_values": "language",
}


def check_of(error: BaseException, default: str) -> str:
    """The check ``error`` belongs to: ``files`` for a missing file, else the innermost reader function
    of its traceback that ``_RAISED_IN`` names, else ``default``."""
    from episodestream._remote.transport.request import DownloadError  # loaded already where a source downloads

    if isinstance(error, (FileNotFoundError, DownloadError)):  # not there, or not readable from the source
        return "files"
    frames = []
    tb = error.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    check = next((_RAISED_IN[name] for name in reversed(frames) if name in _RAISED_IN), default)
    # A language column's stored type is refused with the other columns' (``_check_file``).
    return "language" if check == "dtypes" and "dtype 'language'" in str(error) else check
