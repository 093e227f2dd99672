"""Refuse to stream when Accelerate re-shards a dataset that already splits the epoch by rank.

``accelerator.prepare(DataLoader(dataset))`` on N > 1 processes shards an IterableDataset itself:
by default (``dispatch_batches`` unset) a ``DataLoaderDispatcher`` iterates the dataset on process 0
only and hands slices of its batches to every process; with ``dispatch_batches=False`` an
``IterableDatasetShard`` keeps every N-th batch of each process's stream. An
``EpisodeStreamingDataset`` already streams only its own rank's share of the epoch, so either way the
epoch shrinks to 1/N of its frames without any error. We cannot see the wrapping from the dataset's
own arguments, so the first iteration looks for it: the DataLoader's dataset as a worker sees it, and
the caller's frames (a worker forked by the DataLoader keeps the stack that started it; a worker
started with "spawn" or "forkserver" under a dispatcher is not seen).

Nothing here imports Accelerate: when the program has not imported ``accelerate.data_loader``,
nothing can have wrapped the dataset.
"""

from __future__ import annotations

import sys

import torch.utils.data

_WHAT_TO_DO = (
    "An EpisodeStreamingDataset already streams only this rank's share of the epoch (rank {rank} of "
    "{world_size}), so every frame of the epoch would not be seen. Do not pass its DataLoader to "
    "accelerator.prepare: prepare the model and optimizer only and move each batch with "
    "accelerate.utils.send_to_device(batch, accelerator.device), or wrap the loader for device placement "
    "alone with accelerate.data_loader.prepare_data_loader(loader, accelerator.device, num_processes=1, "
    "process_index=0, dispatch_batches=False). (DataLoaderConfiguration(dispatch_batches=False) does not "
    "help: Accelerate then keeps every {world_size}th batch of each rank's stream.) For LeRobot's trainer, "
    "'episodestream lerobot-train' does this itself."
)


def accelerate_resharding(rank: int, world_size: int) -> RuntimeError | None:
    """The error to raise when Accelerate has wrapped this rank's dataset to shard it again, else None.

    Called at the start of ``EpisodeStreamingDataset.__iter__`` (from the process that iterates)."""
    if world_size == 1:
        return None  # Accelerate shards only across several processes
    module = sys.modules.get("accelerate.data_loader")
    if module is None:
        return None
    descriptions = {
        "DataLoaderDispatcher": "a DataLoaderDispatcher (Accelerate's default for an IterableDataset: only process 0 "
                                "iterates it and slices each of its batches out to every process)",
        "IterableDatasetShard": "an IterableDatasetShard (dispatch_batches=False: each process keeps one batch in "
                                f"{world_size} of its own stream)"}
    wrappers: dict[type, str] = {kind: text for name, text in descriptions.items()
                                 if isinstance(kind := getattr(module, name, None), type)}
    kinds = tuple(wrappers)
    worker = torch.utils.data.get_worker_info()
    found = worker.dataset if worker is not None and isinstance(worker.dataset, kinds) else None
    frame = sys._getframe(1)
    while found is None and frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, kinds):
            found = owner
        frame = frame.f_back
    if found is None:
        return None
    wrapper = next(description for kind, description in wrappers.items() if isinstance(found, kind))
    return RuntimeError(f"accelerator.prepare wrapped this DataLoader in {wrapper}. "
                        + _WHAT_TO_DO.format(rank=rank, world_size=world_size))
