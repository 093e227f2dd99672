"""``EpisodeDatasource``: the ``ray.data.Datasource`` behind ``read_episodes`` (imports Ray)."""

from __future__ import annotations

import functools

from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from episodestream.ray._share import ShareSpec, read_share


class EpisodeDatasource(Datasource):
    """One read task per consumer of the epoch; ``spec.tasks`` of them whatever ``parallelism`` Ray
    asks for, because the split (and with it each task's order) is fixed by the task count."""

    def __init__(self, spec: ShareSpec, *, bytes_per_row: int | None) -> None:
        super().__init__()
        self._spec = spec
        self._bytes_per_row = bytes_per_row

    def get_name(self) -> str:
        return "ReadEpisodes"

    def estimate_inmemory_data_size(self) -> int | None:
        return None if self._bytes_per_row is None else self._bytes_per_row * self._spec.frames

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: object = None) -> list[ReadTask]:
        spec = self._spec
        tasks = []
        for task, rows in enumerate(spec.rows):
            size = None if self._bytes_per_row is None else self._bytes_per_row * rows
            tasks.append(ReadTask(functools.partial(read_share, spec, task),
                                  BlockMetadata(num_rows=rows, size_bytes=size, input_files=None, exec_stats=None),
                                  per_task_row_limit=per_task_row_limit))
        return tasks
