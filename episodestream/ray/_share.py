"""One read task's share of an epoch: streamed with ``EpisodeLoader``, handed to Ray as Arrow blocks.

Imports no Ray at module level except the tensor extension, which ``_block`` imports when it runs
(in a Ray worker, where Ray is loaded anyway).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from episodestream._plan.sampling import part_bounds
from episodestream.loader import EpisodeLoader
from episodestream.mixture import EpisodeMixture
from episodestream.streaming import EpisodeStreamingDataset


@dataclass(frozen=True)
class DatasetStream:
    """Builds a read task's ``EpisodeStreamingDataset``: ``source`` with ``options`` at ``rank`` of
    ``world_size``."""

    source: Any
    options: Mapping[str, Any]

    def __call__(self, rank: int, world_size: int) -> EpisodeStreamingDataset:
        return EpisodeStreamingDataset(self.source, rank=rank, world_size=world_size, **self.options)


@dataclass(frozen=True)
class MixtureStream:
    """Builds a read task's ``EpisodeMixture``: its components (``EpisodeStreamingDataset``'s keywords
    each, ``source`` among them) at ``rank`` of ``world_size``, mixed with ``options``."""

    components: tuple[Mapping[str, Any], ...]
    options: Mapping[str, Any]

    def __call__(self, rank: int, world_size: int) -> EpisodeMixture:
        datasets = [EpisodeStreamingDataset(rank=rank, world_size=world_size, **component)
                    for component in self.components]
        return EpisodeMixture(datasets, **self.options)


@dataclass(frozen=True)
class ShareSpec:
    """What every read task of one read needs: how to build its stream, the epoch and the split.

    ``rows`` holds each task's rows: for a dataset its consumer's share without the fill-in a short
    rank adds (``part_bounds`` of the epoch's anchors: a Ray dataset has no ranks to keep in step, so
    every frame of the epoch comes exactly once across the tasks); for a mixture the rank's count."""

    build: DatasetStream | MixtureStream
    epoch: int
    rows: tuple[int, ...]
    rows_per_block: int
    threads_per_task: int

    @property
    def tasks(self) -> int:
        return len(self.rows)

    @property
    def frames(self) -> int:
        return sum(self.rows)


def dataset_rows(frames: int, tasks: int) -> tuple[int, ...]:
    """Each task's frames of an epoch of ``frames`` anchors split across ``tasks`` consumers."""
    bounds = part_bounds(frames, tasks)
    return tuple(bounds[task + 1] - bounds[task] for task in range(tasks))


def read_share(spec: ShareSpec, task: int) -> Iterator[pa.Table]:
    """Task ``task``'s rows of the epoch, in its consumer's order, as blocks of up to
    ``rows_per_block`` rows."""
    left = spec.rows[task]
    if left == 0:
        return
    stream = spec.build(task, spec.tasks)
    stream.set_epoch(spec.epoch)
    loader = EpisodeLoader(stream, batch_size=spec.rows_per_block, num_threads=spec.threads_per_task)
    try:
        for batch in loader:
            block = to_block(batch, min(left, spec.rows_per_block))
            left -= block.num_rows
            yield block
            if left == 0:
                break  # what follows is the fill-in of a short rank
    finally:
        loader.close()
        stream.close()


def to_block(batch: Mapping[str, Any], rows: int) -> pa.Table:
    """The first ``rows`` samples of an ``EpisodeLoader`` batch as an Arrow table: a number per row
    as a plain column, anything with more dimensions as Ray's tensor column, strings as strings.
    Copied: the loader reuses its batch memory once the tensors are let go."""
    from ray.data.extensions import ArrowTensorArray

    columns: dict[str, Any] = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            array = np.array(value[:rows].numpy(), copy=True)
            columns[key] = pa.array(array) if array.ndim == 1 else ArrowTensorArray.from_numpy(array)
        elif isinstance(value, list) and all(isinstance(item, str) for item in value):
            columns[key] = pa.array(value[:rows], pa.string())
        else:
            raise TypeError(f"read_episodes cannot put {key!r} ({type(value).__name__}) in a Ray block: "
                            f"only tensors and strings travel.")
    return pa.table(columns)
