"""What a DataLoader over an ``EpisodeStreamingDataset`` hands out, worked out from the schedule
alone (no rows read, nothing decoded), for tests that need the expected stream.

``tests/test_stream_properties.py::test_the_simulated_loader_is_the_real_one`` checks this model
against real DataLoaders with worker processes.
"""

from __future__ import annotations

import functools

from episodestream.testing import faults


def worker_streams(dataset, *, num_workers: int, epoch: int | None = None) -> list[list[tuple[int, int]]]:
    """Each DataLoader worker's emitted pairs (one stream with ``num_workers=0``), for ``epoch``
    (default: the dataset's next one), from this dataset's rank."""
    epoch = dataset.epoch if epoch is None else epoch
    workers = max(1, num_workers)
    return [faults.planned_samples(dataset, epoch=epoch, worker=worker, num_workers=workers)
            for worker in range(workers)]


def loader_batches(streams: list[list], *, batch_size: int, drop_last: bool = False) -> list[tuple[int, list]]:
    """What a DataLoader over an IterableDataset hands out, in order, as (worker, batch): each
    worker batches its own stream (dropping its own partial batch with drop_last), and the loader
    takes one batch from each worker in turn, skipping workers that are exhausted (in_order=True)."""
    queues = []
    for stream in streams:
        stop = len(stream) - len(stream) % batch_size if drop_last else len(stream)
        queues.append([stream[i:i + batch_size] for i in range(0, stop, batch_size)])
    out, turn = [], 0
    while any(queues):
        if queues[turn]:
            out.append((turn, queues[turn].pop(0)))
        turn = (turn + 1) % len(queues)
    return out


def expected_samples(dataset, *, num_workers: int, epoch: int | None = None) -> list[tuple[int, int]]:
    """The (episode_index, frame_index) pairs a ``DataLoader(dataset, batch_size=None,
    num_workers=num_workers)`` yields for ``epoch``, in order."""
    streams = worker_streams(dataset, num_workers=num_workers, epoch=epoch)
    return [batch[0] for _, batch in loader_batches(streams, batch_size=1)]


def pair(sample) -> tuple[int, int]:
    """(episode_index, frame_index) of a real sample. As a DataLoader's ``collate_fn`` with
    ``batch_size=None`` it runs in the worker, which then sends two ints rather than every tensor
    of the sample through shared memory (~4 ms a sample here, most of a small test's time)."""
    return int(sample["episode_index"]), int(sample["frame_index"])


def unbatch(batch) -> list[dict]:
    """A collated batch's samples (tensors become their rows; lists, their items)."""
    return [{key: value[i] for key, value in batch.items()} for i in range(len(batch["index"]))]


def key_collate(*keys: str):
    """A DataLoader ``collate_fn`` for tests that compare only which samples came and in what
    order: each batch as ``{key: [int, ...]}`` for ``keys``. A worker then sends a few ints per
    batch rather than each feature's tensor through shared memory (a file per tensor and batch:
    about two thirds of a 2-worker epoch's CPU on the camera-less test dataset). That tensors
    arrive intact is checked bit for bit elsewhere (test_resume's decoded exact resume and
    test_worker_start_methods, through both sharing strategies)."""
    return functools.partial(_collate_keys, keys)  # a partial, not a closure: spawned workers unpickle it


def _collate_keys(keys: tuple[str, ...], samples: list) -> dict[str, list[int]]:
    return {key: [int(sample[key]) for sample in samples] for key in keys}


def pairs(samples) -> list[tuple[int, int]]:
    """(episode_index, frame_index) of real samples."""
    return [pair(sample) for sample in samples]


def sweep(check, configs) -> None:
    """``check(config)`` for each config, a failure naming its config.

    Property sweeps run a few dozen configurations per test rather than one: under pytest-xdist
    each test costs ~5 ms of CPU in reporting alone, more than most of these configurations.
    """
    for config in configs:
        try:
            check(config)
        except AssertionError as error:
            raise AssertionError(f"config {config}: {error}") from error


def chunks(count: int, size: int) -> list:
    """``range(count)`` in consecutive ranges of ``size`` (the last may be shorter), as pytest
    parameters named by their first and last config."""
    import pytest

    return [pytest.param(range(start, stop), id=f"{start}-{stop - 1}")
            for start, stop in ((s, min(count, s + size)) for s in range(0, count, size))]


def shut_down_workers(loader) -> None:
    """Stop a DataLoader's (persistent) workers now, through its iterator.

    After a worker's error the loader's iterator is held in a reference cycle by the traceback.
    Freed later by the garbage collector, its index queues can be finalized before it: the workers
    never get the stop message, and the shutdown waits out the DataLoader's 5 s join timeout in
    whichever test happens to run then (measured: 5.1 s). PyTorch has no public way to do this.
    """
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None:
        iterator._shutdown_workers()
