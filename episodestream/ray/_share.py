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
from episodestream.streaming import EpisodeStreamingDataset


@dataclass(frozen=True)
class ShareSpec:
    """What every read task of one ``read_episodes`` needs: the dataset's arguments and the split.

    ``frames`` is the epoch's anchors (its samples without fill-ins), counted once on the driver;
    task ``t`` of ``tasks`` emits ``part_bounds(frames, tasks)[t:t + 2]``'s difference, which is its
    consumer's share before the fill-in a short rank adds (a Ray dataset has no ranks to keep in
    step, so every frame of the epoch comes exactly once across the tasks)."""

    source: Any
    dataset_options: Mapping[str, Any]
    epoch: int
    tasks: int
    frames: int
    rows_per_block: int
    threads_per_task: int

    def rows(self, task: int) -> int:
        bounds = part_bounds(self.frames, self.tasks)
        return bounds[task + 1] - bounds[task]


def read_share(spec: ShareSpec, task: int) -> Iterator[pa.Table]:
    """Task ``task``'s rows of the epoch, in its consumer's order, as blocks of up to
    ``rows_per_block`` rows."""
    left = spec.rows(task)
    if left == 0:
        return
    dataset = EpisodeStreamingDataset(spec.source, rank=task, world_size=spec.tasks, **spec.dataset_options)
    dataset.set_epoch(spec.epoch)
    loader = EpisodeLoader(dataset, batch_size=spec.rows_per_block, num_threads=spec.threads_per_task)
    try:
        for batch in loader:
            block = to_block(batch, min(left, spec.rows_per_block))
            left -= block.num_rows
            yield block
            if left == 0:
                break  # what follows is the fill-in of a short rank
    finally:
        loader.close()
        dataset.close()


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
