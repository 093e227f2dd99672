"""Ray Data on episodestream: ``read_episodes`` streams a dataset's epoch through Ray read tasks.

Each read task is one consumer of the epoch (rank = task index, world size = number of tasks) and
streams its share with ``EpisodeStreamingDataset`` and ``EpisodeLoader`` (our pool, decode path and
remote cache), so decoding runs wherever Ray schedules the tasks. ``collate_fn()`` turns Ray's numpy
batches back into the tensors ``EpisodeStreamingDataset`` yields (``iter_torch_batches(collate_fn=
collate_fn())``); ``read_mixture`` is its sibling for an ``EpisodeMixture``. Ray is imported when ``read_episodes`` is called, never by ``import episodestream`` or
``import episodestream.ray``; install it with ``pip install 'episodestream[ray]'``. See
docs/usage.md, "Ray".
"""

from __future__ import annotations

from episodestream.ray._collate_fn import collate_fn
from episodestream.ray._read import read_episodes, read_mixture

__all__ = ["collate_fn", "read_episodes", "read_mixture"]
