"""Per-episode metadata held as columns (numpy arrays), handed out as ``EpisodeInfo`` on demand.

DROID has 92,000 episodes: one frozen dataclass per episode, with its own path strings, tuples
and dicts, cost ~270 MB and ~1 s to build in every consumer. Here an episode is a row number into
a few arrays (ints and floats; file paths are ids into a short list of distinct paths), and an
``EpisodeInfo`` is made only when something asks for that episode. ``EpisodeTable`` is the
``Mapping[int, EpisodeInfo]`` that ``DatasetMeta.episodes`` always was; ``EpisodeSelection`` the
sequence of selected episodes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class VideoSpan:
    """Where one episode's frames of one camera live: a file and the episode's start time in it."""

    relpath: str
    from_timestamp_s: float
    to_timestamp_s: float
    # The part of the episode a consumer can read (file times), when it is less than the whole:
    # with ``keep_frames``, the kept frames and the windows' reach (``_runtime.core``). Remote
    # sources fetch only the bytes of this part; decoding still places frames by ``from_timestamp_s``.
    needed_from_s: float | None = None
    needed_to_s: float | None = None
    # The file holds this episode's frames only (v2.x: one mp4 per episode), so a remote source
    # fetches it whole in one read instead of its header first and then the span.
    whole_file: bool = False

    @property
    def needed_s(self) -> tuple[float, float]:
        """``[from, to)`` file seconds that may be read: ``needed_*`` when set, else the episode's."""
        return (self.from_timestamp_s if self.needed_from_s is None else self.needed_from_s,
                self.to_timestamp_s if self.needed_to_s is None else self.needed_to_s)


@dataclass(frozen=True)
class EpisodeInfo:
    episode_index: int
    length: int
    from_index: int  # global ``index`` of the episode's first frame
    to_index: int  # end exclusive
    data_relpath: str
    tasks: tuple[str, ...]
    videos: Mapping[str, VideoSpan]


@dataclass(frozen=True)
class VideoColumns:
    """One camera's spans for every episode: file ids into ``relpaths``, start and end times."""

    file_id: np.ndarray
    relpaths: tuple[str, ...]
    from_timestamp_s: np.ndarray
    to_timestamp_s: np.ndarray
    whole_files: bool = False  # every file holds one episode's frames only (``VideoSpan.whole_file``)


class EpisodeTable(Mapping):
    """Episodes by ``episode_index`` (ascending), built from columns aligned row by row."""

    def __init__(self, *, episode_index: np.ndarray, length: np.ndarray, from_index: np.ndarray,
                 to_index: np.ndarray, data_file_id: np.ndarray, data_relpaths: Sequence[str],
                 tasks: Sequence[tuple[str, ...]], task_id: np.ndarray, videos: Mapping[str, VideoColumns]) -> None:
        order = np.argsort(episode_index, kind="stable")
        self.episode_index = episode_index[order]
        self.length = length[order]
        self.from_index, self.to_index = from_index[order], to_index[order]
        self.data_file_id, self.data_relpaths = data_file_id[order], tuple(data_relpaths)
        self._tasks, self._task_id = tuple(tasks), task_id[order]  # distinct task tuples, and each row's
        self._videos = {key: VideoColumns(v.file_id[order], v.relpaths, v.from_timestamp_s[order],
                                          v.to_timestamp_s[order], v.whole_files) for key, v in videos.items()}

    @property
    def videos(self) -> Mapping[str, VideoColumns]:
        """Each camera's spans, by video key."""
        return self._videos

    def position(self, episode_index: int) -> int:
        """The row of ``episode_index``; KeyError when the dataset has no such episode."""
        row = int(np.searchsorted(self.episode_index, episode_index))
        if row == len(self.episode_index) or self.episode_index[row] != episode_index:
            raise KeyError(episode_index)
        return row

    def tasks_at(self, row: int) -> tuple[str, ...]:
        """The tasks of the episode at ``row``, without making its ``EpisodeInfo``."""
        return self._tasks[self._task_id[row]]

    def at(self, row: int) -> EpisodeInfo:
        videos = {key: VideoSpan(v.relpaths[v.file_id[row]], float(v.from_timestamp_s[row]),
                                 float(v.to_timestamp_s[row]), whole_file=v.whole_files) for key, v in self._videos.items()}
        return EpisodeInfo(int(self.episode_index[row]), int(self.length[row]), int(self.from_index[row]),
                           int(self.to_index[row]), self.data_relpaths[self.data_file_id[row]],
                           self._tasks[self._task_id[row]], videos)

    def __getitem__(self, episode_index: int) -> EpisodeInfo:
        if isinstance(episode_index, (bool, np.bool_)) or not isinstance(episode_index, (int, np.integer)):
            raise KeyError(episode_index)
        return self.at(self.position(episode_index))

    def __contains__(self, episode_index: object) -> bool:
        try:
            self[episode_index]  # type: ignore[index]
        except KeyError:
            return False
        return True

    def __iter__(self) -> Iterator[int]:
        return iter(self.episode_index.tolist())

    def __len__(self) -> int:
        return len(self.episode_index)

    def values(self):  # an iterable of EpisodeInfo, made one at a time
        return _Values(self)

    @property
    def total_frames(self) -> int:
        return int(self.length.sum())


class _Values:
    def __init__(self, table: EpisodeTable) -> None:
        self._table = table

    def __iter__(self) -> Iterator[EpisodeInfo]:
        return (self._table.at(row) for row in range(len(self._table)))

    def __len__(self) -> int:
        return len(self._table)


class EpisodeSelection(Sequence):
    """The selected episodes in ascending order, as rows of an ``EpisodeTable``."""

    def __init__(self, table: EpisodeTable, rows: np.ndarray) -> None:
        self._table, self.rows = table, rows

    @property
    def episode_indices(self) -> np.ndarray:
        return self._table.episode_index[self.rows]

    @property
    def lengths(self) -> np.ndarray:
        return self._table.length[self.rows]

    @property
    def from_indices(self) -> np.ndarray:
        """Each selected episode's first global ``index`` (``dataset_from_index``)."""
        return self._table.from_index[self.rows]

    def video_files(self) -> int:
        """The video files the selection's frames are in, every camera's counted (a file per
        episode and camera in v2.x; shared by many episodes in v3.0)."""
        return sum(len(np.unique(v.file_id[self.rows])) for v in self._table.videos.values())

    def __getitem__(self, k):
        if isinstance(k, slice):
            return EpisodeSelection(self._table, self.rows[k])
        return self._table.at(int(self.rows[k]))

    def __iter__(self) -> Iterator[EpisodeInfo]:
        return (self._table.at(row) for row in self.rows.tolist())

    def __len__(self) -> int:
        return len(self.rows)
