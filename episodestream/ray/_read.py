"""``read_episodes``: a LeRobot dataset's epoch as a ``ray.data.Dataset`` of our samples."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from episodestream._base.options import check_int
from episodestream.ray._share import DatasetStream, MixtureStream, ShareSpec, dataset_rows
from episodestream.streaming import EpisodeStreamingDataset

if TYPE_CHECKING:
    import ray.data

# EpisodeStreamingDataset's keywords that a read task sets itself, and what to use instead.
_SET_PER_TASK = {
    "rank": "each read task is a rank of its own (num_tasks sets the count)",
    "world_size": "num_tasks is the world size of the read",
    "decode_threads": "threads_per_task sets each task's decode threads",
    "return_uint8": "blocks carry video frames as uint8 already; collate_fn(return_uint8=True) keeps them so",
    "buffer_size": "it is deprecated and ignored; episode_pool_size replaces it",
}


def read_episodes(source: str | os.PathLike, *, epoch: int = 0, num_tasks: int | None = None,
                  rows_per_block: int = 64, threads_per_task: int = 1,
                  ray_read_args: Mapping[str, Any] | None = None, **options: Any) -> ray.data.Dataset:
    """One epoch of ``source`` as a Ray dataset of ``EpisodeStreamingDataset``'s samples.

    Each of ``num_tasks`` Ray read tasks streams one consumer's share of the epoch (rank = task
    index, world size = ``num_tasks``) through ``EpisodeStreamingDataset`` and ``EpisodeLoader``:
    its pool of whole episodes, decode path and, for remote sources, the node cache and download
    controller. Every frame of the epoch (every anchor, with curation and weights) comes exactly
    once across the tasks: the fill-in a short rank adds for lockstep training is left out. Rows
    have the dataset's keys and values (windows with their ``_is_pad`` masks, ``task``); video
    frames travel as uint8 and ``episodestream.ray.collate_fn()`` makes them float32 exactly as
    the dataset does: ``ds.iter_torch_batches(batch_size=32, collate_fn=collate_fn())``. LeRobot 0.6's
    language columns are left out, as ``EpisodeLoader`` leaves them by default.

    The arguments, by purpose: what to read (``source``, ``**options``), which epoch and order
    (``epoch``, ``seed`` and ``shuffle`` in ``options``), how Ray runs it (``num_tasks``,
    ``rows_per_block``, ``threads_per_task``, ``ray_read_args``).

    Order: each task's rows, and which rows each task has, follow from (seed, epoch, num_tasks),
    as ``EpisodeStreamingDataset(rank=task, world_size=num_tasks)``'s do. How Ray interleaves the
    tasks' blocks depends on scheduling; with ``DataContext.get_current().execution_options.
    preserve_order = True`` the dataset is the tasks' rows in task order, the same on every run.
    Resume: Ray Data does not checkpoint a running read; iterating again (or after a restart)
    streams the epoch from its start. For exact mid-epoch resume train with ``EpisodeLoader`` in
    each Ray Train worker and save its ``state_dict()`` in the checkpoint (examples/ray/train_ray.py).

    Args:
        source (str | os.PathLike): what ``EpisodeStreamingDataset`` reads.
        epoch (int): the epoch whose order the tasks stream; build one dataset per epoch for a new
            order each epoch. Defaults to ``0``.
        num_tasks (int | None): read tasks, i.e. consumers the epoch is split across (None: the
            Ray cluster's CPUs divided by ``threads_per_task``, starting Ray as ``ray.data`` would
            where it is not running). Defaults to ``None``.
        rows_per_block (int): samples per block a task yields; the blocks reach the consumer as
            yielded: the returned dataset's ``context.target_max_block_size`` is set a little below
            a block's bytes (unless it is smaller already), so Ray does not merge a task's blocks up
            to its 128 MiB default before passing them on (operations on the dataset inherit it;
            set ``ds.context.target_max_block_size`` for other block sizes downstream).
            Defaults to ``64``.
        threads_per_task (int): decode threads in each task (``EpisodeLoader``'s ``num_threads``),
            and the CPUs each task asks Ray for unless ``ray_read_args`` says otherwise.
            Defaults to ``1``.
        ray_read_args (Mapping[str, Any] | None): keywords for ``ray.data.read_datasource`` (e.g.
            ``{"num_cpus": 2}``, ``{"concurrency": 4}``, ``label_selector``); ``num_cpus``
            defaults to ``threads_per_task``, ``override_num_blocks`` is ``num_tasks``.
            Defaults to ``None``.
        **options: ``EpisodeStreamingDataset``'s keywords (``seed``, ``shuffle``, ``episodes``,
            ``delta_timestamps``, ``keep_frames``, ``episode_weights``, ``episode_pool_size``,
            ``image_transforms``, the remote source options, ...) but those a task sets itself
            (``rank``, ``world_size``, ``decode_threads``, ``return_uint8``).

    Returns:
        ray.data.Dataset: the epoch's samples, one row each.

    Raises:
        ImportError: Ray is not installed.
        TypeError: a keyword ``EpisodeStreamingDataset`` does not take, or one a task sets itself.
        ValueError: an argument out of range.
    """
    _refuse_task_keywords("read_episodes", options)
    epoch, rows_per_block, threads_per_task = _check_read("read_episodes", epoch, rows_per_block, threads_per_task)
    options = _in_task(options)
    # Opened once here: the options are checked before any task runs, and the epoch's frame count
    # (which decides each task's rows) is counted once.
    probe = EpisodeStreamingDataset(source, rank=0, world_size=1, **options)
    try:
        probe.set_epoch(epoch)
        frames = len(probe)
        bytes_per_row = _bytes_per_row(probe, options)
    finally:
        probe.close()
    num_tasks = _num_tasks(num_tasks, threads_per_task)
    spec = ShareSpec(build=DatasetStream(source, options), epoch=epoch, rows=dataset_rows(frames, num_tasks),
                     rows_per_block=rows_per_block, threads_per_task=threads_per_task)
    return _read(spec, bytes_per_row, ray_read_args)


def read_mixture(components: Sequence[Mapping[str, Any]], *, epoch: int = 0, num_tasks: int | None = None,
                 rows_per_block: int = 64, threads_per_task: int = 1,
                 ray_read_args: Mapping[str, Any] | None = None, **options: Any) -> ray.data.Dataset:
    """One epoch of an ``EpisodeMixture`` as a Ray dataset: ``read_episodes``'s sibling for mixtures.

    Each of ``num_tasks`` read tasks builds the mixture at rank = task index, world size =
    ``num_tasks`` (every component an ``EpisodeStreamingDataset`` of that rank) and streams it through
    ``EpisodeLoader``: every task yields the rank's ``len(mixture)`` samples, so the dataset holds what
    ``num_tasks`` ranks of a mixture would train on, with ``dataset_index`` and ``robot_type``.
    Frames, ``collate_fn``, order and resume are as for ``read_episodes``.

    Args:
        components (Sequence[Mapping[str, Any]]): one mapping per component: ``source`` and that
            component's ``EpisodeStreamingDataset`` keywords (windows, episodes, pool, seed, ...), but
            those a task sets itself (``rank``, ``world_size``, ``decode_threads``, ``return_uint8``).
        epoch (int): the epoch whose order the tasks stream. Defaults to ``0``.
        num_tasks (int | None): read tasks, i.e. ranks of the mixture (None: the Ray cluster's CPUs
            divided by ``threads_per_task``). Defaults to ``None``.
        rows_per_block (int): samples per block a task yields. Defaults to ``64``.
        threads_per_task (int): decode threads in each task, and the CPUs each asks Ray for.
            Defaults to ``1``.
        ray_read_args (Mapping[str, Any] | None): keywords for ``ray.data.read_datasource``.
            Defaults to ``None``.
        **options: ``EpisodeMixture``'s keywords (``weights``, ``seed``, ``stop``, ``rename``,
            ``keys``, ``resize``).

    Returns:
        ray.data.Dataset: the epoch's samples of every rank, one row each.

    Raises:
        ImportError: Ray is not installed.
        TypeError: ``components`` is not a list of mappings with a ``source``, or a keyword the
            datasets or the mixture do not take, or one a task sets itself.
        ValueError: an argument out of range, or components the mixture refuses.
    """
    if isinstance(components, Mapping) or not isinstance(components, Sequence) or not components or not all(
            isinstance(c, Mapping) and "source" in c for c in components):
        raise TypeError(f"read_mixture needs a non-empty list of mappings, each with a 'source', got {components!r:.200}.")
    for component in components:
        _refuse_task_keywords("read_mixture", component)
    epoch, rows_per_block, threads_per_task = _check_read("read_mixture", epoch, rows_per_block, threads_per_task)
    num_tasks = _num_tasks(num_tasks, threads_per_task)
    build = MixtureStream(tuple(_in_task(c) for c in components), dict(options))
    probe = build(0, num_tasks)  # every rank of a mixture yields len(mixture) samples
    try:
        probe.set_epoch(epoch)
        rows = len(probe)
    finally:
        probe.close()
    spec = ShareSpec(build=build, epoch=epoch, rows=(rows,) * num_tasks, rows_per_block=rows_per_block,
                     threads_per_task=threads_per_task)
    return _read(spec, None, ray_read_args)


def _refuse_task_keywords(owner: str, options: Mapping[str, Any]) -> None:
    for name, instead in _SET_PER_TASK.items():
        if name in options:
            raise TypeError(f"{owner} sets {name} itself: {instead}.")


def _check_read(owner: str, epoch: int, rows_per_block: int, threads_per_task: int) -> tuple[int, int, int]:
    try:
        import ray.data  # noqa: F401
    except ImportError as error:
        raise ImportError(f"episodestream.ray.{owner} needs Ray: pip install 'episodestream[ray]'.") from error
    return (check_int("epoch", epoch, minimum=0), check_int("rows_per_block", rows_per_block, minimum=1),
            check_int("threads_per_task", threads_per_task, minimum=1))


def _in_task(options: Mapping[str, Any]) -> dict[str, Any]:
    """A dataset's keywords as its read task uses them: frames stay uint8 in blocks, unless
    ``image_transforms`` runs in the task (it expects what the dataset would give it: float32)."""
    return {**options, "return_uint8": options.get("image_transforms") is None}


def _num_tasks(num_tasks: int | None, threads_per_task: int) -> int:
    if num_tasks is None:
        import ray

        if not ray.is_initialized():
            ray.init()  # what ray.data does on a first read
        num_tasks = max(1, int(ray.cluster_resources().get("CPU", 1)) // threads_per_task)
    return check_int("num_tasks", num_tasks, minimum=1)


def _read(spec: ShareSpec, bytes_per_row: int | None, ray_read_args: Mapping[str, Any] | None) -> ray.data.Dataset:
    import ray.data

    from episodestream.ray._block_size import pass_through_block_bytes
    from episodestream.ray._datasource import EpisodeDatasource

    read_args = {"num_cpus": spec.threads_per_task, **(ray_read_args or {}), "override_num_blocks": spec.tasks}
    dataset = ray.data.read_datasource(EpisodeDatasource(spec, bytes_per_row=bytes_per_row), **read_args)
    # The dataset's own copy of the DataContext (read_datasource copies the current one), so the
    # process's context and other datasets keep theirs; never raised above what the user set.
    target = pass_through_block_bytes(rows_per_block=spec.rows_per_block, bytes_per_row=bytes_per_row)
    current = dataset.context.target_max_block_size
    if target is not None and (current is None or target < current):
        dataset.context.target_max_block_size = target
    return dataset


def _bytes_per_row(dataset: EpisodeStreamingDataset, options: Mapping[str, Any]) -> int | None:
    """A row's bytes in a block, roughly: its video frames (uint8) and parquet images (float32); None
    where ``image_transforms`` runs in the task (it may change the frames' size and type)."""
    if options.get("image_transforms") is not None:
        return None
    delta_timestamps = options.get("delta_timestamps")
    features = dataset.meta.features
    total = 0
    for key in dataset.meta.camera_keys:
        shape = features.get(key, {}).get("shape")
        if not shape:
            return None
        steps = len((delta_timestamps or {}).get(key, [0]))
        itemsize = 1 if key in dataset.meta.video_keys else 4
        total += math.prod(shape) * steps * itemsize
    return total + 1024  # the numbers and strings
