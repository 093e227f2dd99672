"""``EpisodeStreamingDataset``: an IterableDataset over whole episodes held in a small pool.

This is the face: it checks its arguments and holds its runtime (``_runtime.dataset_runtime``), which
plans, streams and resumes; ``EpisodeLoader`` and ``EpisodeMixture`` drive that runtime through
``_runtime.stream_runtime.runtime_of``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch.utils.data

from episodestream._base.options import check_bool, check_int
from episodestream._base.warn import warn_user
from episodestream._runtime.placement import resolve_rank
from episodestream._runtime.pool_size import AUTO, choose_pool_size
from episodestream._runtime.accelerate_guard import accelerate_resharding
from episodestream._runtime.core import DatasetCore, DatasetFacts
from episodestream._runtime.dataset_runtime import DatasetRuntime, StreamSettings, default_decode_group_size
from episodestream._runtime.resume.loader_state import read_loader_state, trainer_state
from episodestream._runtime.resume.resumable import is_loader_state
from episodestream._plan.saved_state import TrainerCount
from episodestream._runtime.source_options import SourceOptions, takes_source_options
from episodestream._runtime.stream import DecoderSet, summed_stats
from episodestream._runtime.face import StreamingFace, runtime_of

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

log = logging.getLogger(__name__)



class EpisodeStreamingDataset(DatasetFacts, StreamingFace):
    """Streams frames in random order from a pool of whole episodes, decoding video only on emit.

    Every rank yields ``len(self)`` = ceil(anchors / world_size) samples per epoch (anchors: the
    selected, kept frames, times their weights); a rank with one frame fewer repeats one of its own
    frames once. The arguments, by purpose (each in ``Args`` below):

    - what to read: ``source`` and the source options ``revision``, ``episodes``, ``keep_frames``,
      ``delta_timestamps``, ``tolerance_s``;
    - what a sample looks like: the source options ``return_uint8``, ``image_transforms``,
      ``depth_output_unit``, ``video_backend``, ``decode_device``;
    - remote sources: the source options ``cache_dir``, ``cache_limit``, ``storage_options``,
      ``token``, ``hub_endpoint``, ``download_config``;
    - how to iterate: ``episode_pool_size``, ``shuffle``, ``decode_group_size``, ``decode_threads``,
      ``prefetch_episodes``, ``rank``, ``world_size``;
    - curation (beside ``episodes`` and ``keep_frames``): ``episode_weights``;
    - determinism: ``seed``.

    Args:
        source (str | os.PathLike): a LeRobot v3.0 (or v2.0 / v2.1) dataset: a local (or
            network-mounted) folder, read in place; a URL (``hf://datasets/owner/name``,
            ``s3://bucket/path``, ``gs://...``, other fsspec URLs); or a Hub dataset repo id
            (``"lerobot/aloha_mobile_cabinet"``).
        **options: the source options, shared with ``EpisodeDataset`` and each documented, with its
            default, in ``episodestream.SourceOptions`` (the groups above name them). Any other
            keyword raises TypeError, naming the closest valid one.
        episode_pool_size (int | str): whole episodes each consumer holds in RAM (tabular rows
            only) and mixes frames from (a sliding window of episodes); a batch, and a run of steps,
            draws from little more than this many episodes, so larger mixes more, and costs rows and
            open decoders. A pool at least as wide as a consumer's share shuffles the whole share,
            like a global shuffle. ``"auto"``: as wide as costs nothing on this source, i.e. the
            selection's episodes + 1 (at most 256 MiB of rows) where its video files are no more
            than the spread pool may keep open, else the spread pool (v2.x, datasets in many video
            files, remote sources): 96 for one camera, 64 for two, 42 for three, at most 64 on a
            remote source. ``episode_pool_size`` then reads the number chosen; docs/usage.md.
            Defaults to ``"auto"``.
        shuffle (bool): False emits episodes and frames in order. Defaults to ``True``.
        decode_group_size (int | None): samples built together so that frames from one video file
            share a decoder call (1 builds each sample alone). Samples and their order are the same
            for any value; larger groups make fewer, longer decoder calls and less work per frame,
            and keep more samples in flight (``EpisodeLoader``: a group per thread). None: 16 where
            episodes share video files (v3.0), 32 where each episode has files of its own
            (v2.0/v2.1), whose groups otherwise spread over more files; benchmarks/LOG.md
            compares 8, 16, 32 and 64. Defaults to ``None``.
        decode_threads (int): threads that decode one consumer's groups (each with its own
            decoders); the samples and their order are the same for any value. Worth more than 1
            in DataLoader workers only when the machine has more cores than workers;
            ``EpisodeLoader`` has its own ``num_threads`` and ignores this. Defaults to ``1``.
        prefetch_episodes (int): for remote sources, how many admissions ahead of the pool's need
            an episode's video bytes start downloading. Defaults to ``4``.
        rank (int | None): this process's rank among training processes (None: from
            torch.distributed when initialised, else 0). Defaults to ``None``.
        world_size (int | None): the number of training processes (None: from torch.distributed
            when initialised, else 1). Defaults to ``None``.
        buffer_size (Any): deprecated and ignored, with a DeprecationWarning: ``episode_pool_size``
            replaces it. Defaults to ``None``.
        episode_weights (Mapping[int, float] | str | None): ``{episode_index: weight}`` (episodes
            not named weigh 1) or the name of a numeric column of ``meta/episodes``. Per epoch an
            episode of integer weight ``w`` has each of its kept frames sampled ``w`` times (each
            copy in its own place of the epoch's order); fractional weights scale its count to
            ``w * kept frames``, rounded by one largest-remainder split over the selection (the
            partial copy's frames are drawn afresh each epoch); 0 leaves the episode out. Negative,
            NaN or inf is an error. Defaults to ``None``.
        seed (int): with the epoch, fixes the episode order and the split; each consumer's RNG
            derives from (seed, epoch, rank, worker). ``set_epoch`` reshuffles; the epoch also
            advances by itself when an iteration runs to its end. Defaults to ``0``.

    Yields:
        dict[str, Any]: one sample per kept frame, as LeRobot's ``dataset[i]`` gives it (tensors,
        windows with their ``_is_pad`` masks, ``task``), in this consumer's order of the epoch.

    Raises:
        TypeError: an argument of the wrong type, or a keyword neither dataset takes.
        ValueError: an argument out of range (a pool size, an episode not in the dataset, a
            ``cache_limit`` too small for one consumer's episodes in flight).
        FileNotFoundError: a ``file://`` source that does not exist.
        NotADirectoryError: a local source that is a file, not the dataset's folder.
        DatasetFormatError: the dataset's files do not follow the LeRobot format.
        CacheFullError: pinned (prewarmed) entries leave the node cache too little room.
    """

    _runtime: DatasetRuntime

    @takes_source_options
    def __init__(self, source: str | os.PathLike, *, episode_pool_size: int | str = AUTO, shuffle: bool = True,
                 seed: int = 0, rank: int | None = None, world_size: int | None = None, decode_group_size: int | None = None,
                 decode_threads: int = 1, prefetch_episodes: int = 4, buffer_size: Any = None,
                 episode_weights: Mapping[int, float] | str | None = None,
                 **options: Unpack[SourceOptions]) -> None:
        super().__init__()
        if buffer_size is not None:
            warn_user("buffer_size is ignored: episode_pool_size replaces it (a pool of whole episodes' "
                      "rows, not a buffer of decoded frames).", DeprecationWarning)
        # Checked before the source is opened; the group size's default depends on its layout.
        given_pool: int | None = None  # None: "auto", chosen once the source is open
        if episode_pool_size != AUTO:
            if isinstance(episode_pool_size, str):
                raise ValueError(f"episode_pool_size must be an int >= 1 or {AUTO!r}, got {episode_pool_size!r}.")
            given_pool = check_int("episode_pool_size", episode_pool_size, minimum=1)
        shuffle, seed = check_bool("shuffle", shuffle), check_int("seed", seed, minimum=0)
        decode_threads = check_int("decode_threads", decode_threads, minimum=1)
        prefetch_episodes = check_int("prefetch_episodes", prefetch_episodes, minimum=0)
        if decode_group_size is not None:
            decode_group_size = check_int("decode_group_size", decode_group_size, minimum=1)
        rank, world_size = resolve_rank(rank, world_size)
        # local_cache_dir: a local folder's cache_dir is where compute_stats() keeps its results.
        # "auto" is chosen within a remote cache_limit, then checked against it like a given pool.
        self._core = core = DatasetCore(source, **options, local_cache_dir=True, episode_weights=episode_weights,
                                        episodes_in_flight=None if given_pool is None else
                                        given_pool + prefetch_episodes + 1)
        if given_pool is None:
            # The widest pool is asked about first: the longest episodes' files it looks up cover
            # every narrower pool's, so a source whose files are looked up by name is asked once.
            choice = choose_pool_size(
                core.meta, core.episodes, remote=not core.files.videos_stay_in_place, world_size=world_size,
                cache_holds=lambda pool: core.files.cache_holds(core.meta, episodes_in_flight=pool + prefetch_episodes + 1),
                pool_bytes=lambda: core.files.pool_cache_bytes(core.meta, extra_episodes=prefetch_episodes + 1))
            given_pool = choice.size
            log.info("episode_pool_size 'auto' for %s: %d (%s)", core.files.description, choice.size, choice.reason)
            core.files.check_cache_budget(core.meta, episodes_in_flight=given_pool + prefetch_episodes + 1)
        settings = StreamSettings(
            episode_pool_size=given_pool, shuffle=shuffle, seed=seed,
            decode_group_size=decode_group_size or default_decode_group_size(self._core.meta),
            decode_threads=decode_threads, prefetch_episodes=prefetch_episodes)
        self._runtime = DatasetRuntime(self._core, settings, rank=rank, world_size=world_size)
        self._decoders: list[DecoderSet] | None = None  # the current iteration's, one per decode thread

    # How it streams, as constructed (read-only: the runtime holds them).
    episode_pool_size = property(lambda self: self._runtime.settings.episode_pool_size)
    shuffle = property(lambda self: self._runtime.settings.shuffle)
    seed = property(lambda self: self._runtime.settings.seed)
    decode_group_size = property(lambda self: self._runtime.settings.decode_group_size)
    decode_threads = property(lambda self: self._runtime.settings.decode_threads)
    prefetch_episodes = property(lambda self: self._runtime.settings.prefetch_episodes)
    rank = property(lambda self: self._runtime.rank)
    world_size = property(lambda self: self._runtime.world_size)

    def close(self) -> None:
        """Release this process's hold on a remote source's cached metadata (no-op when local)."""
        self._core.files.close()

    def decoder_stats(self) -> dict[str, int] | None:
        """This process's decoder cache counts, summed over the current iteration's decode threads.

        Returns:
            dict[str, int] | None: hits, misses and evictions (and ``pair_frames_kept`` /
            ``pair_frames_served``: frames decoded beside their GOP mate and kept for their turn, then
            served without a decoder); None before iterating.
        """
        return None if self._decoders is None else summed_stats(self._decoders)

    _face = "dataset"
    _by_index = ("For samples by index, EpisodeDataset(source, ...)[i] is its map-style twin: the same source "
                 "options, the same samples.")

    def _refusal(self) -> BaseException | None:
        return accelerate_resharding(self._runtime.rank, self._runtime.world_size)

    def _decode_settings(self) -> dict[str, Any]:
        settings = self._runtime.settings
        self._decoders = opened = []  # this iteration's decoder caches, for decoder_stats()
        return {"decode_threads": settings.decode_threads, "group_size": settings.decode_group_size,
                "opened": opened}


def stream_state(loader: torch.utils.data.DataLoader, batches_consumed: int) -> dict[str, Any]:
    """The resume state for a DataLoader over an ``EpisodeStreamingDataset`` (or an ``EpisodeMixture``).

    Args:
        loader (torch.utils.data.DataLoader): the DataLoader, in-order when it has several workers.
        batches_consumed (int): batches the trainer took from this epoch's loader, counted from the
            start of the epoch, across resumes.

    Returns:
        dict[str, Any]: the dataset's ``state_dict()`` plus the batches consumed this epoch and the
        loader's batching settings, for the dataset's (or an ``EpisodeLoader``'s) ``load_state_dict``.

    Raises:
        TypeError: the loader's dataset does not stream.
        ValueError: ``batches_consumed`` is negative, or the loader delivers out of order.
    """
    runtime = runtime_of(loader.dataset, needs="stream_state needs a DataLoader over")
    if loader.num_workers > 1 and not getattr(loader, "in_order", True):
        # Resume replays the in-order round robin to find each worker's consumed samples; out of
        # order, batches come as workers finish them and the count no longer says whose they were.
        raise ValueError(f"stream_state needs the DataLoader's in-order delivery with num_workers="
                         f"{loader.num_workers}, got in_order=False: batches_consumed cannot be mapped to "
                         f"each worker's samples. Use in_order=True (the default), or num_workers <= 1.")
    count = TrainerCount(batches_consumed=check_int("batches_consumed", batches_consumed, minimum=0),
                         # batch_size=None hands out single samples: the same round robin as batches of one.
                         batch_size=loader.batch_size or 1, num_workers=loader.num_workers, drop_last=loader.drop_last)
    return runtime.saved_state().with_trainer(count).to_state(runtime.state_spec)


def load_loader_state(loader: torch.utils.data.DataLoader, state: Mapping[str, Any], *, strict: bool = True) -> None:
    """Resume ``loader``, a torchdata ``StatefulDataLoader`` over an ``EpisodeStreamingDataset`` (or an
    ``EpisodeMixture``), from ``state``: the ``state_dict()`` of such a loader over the same dataset,
    with any ``num_workers``.

    With the saving loader's ``num_workers`` and world size this is ``loader.load_state_dict(state)``:
    exact, batch for batch. With another ``num_workers`` (or world size: each rank loads its own
    rank's state), torchdata would refuse the state, so the batches its loader yielded are read from
    its workers' snapshots and loaded into the dataset as a trainer's state (``stream_state``'s): the
    new workers split the rest of the epoch afresh, every frame not yet yielded once, none again.
    ``loader``'s ``batch_size`` and ``drop_last`` must be the saving loader's; a state they do not fit
    is refused.

    Args:
        loader (torch.utils.data.DataLoader): the torchdata ``StatefulDataLoader`` to resume.
        state (Mapping[str, Any]): such a loader's ``state_dict()``.
        strict (bool): as for ``load_state_dict``. Defaults to ``True``.

    Raises:
        TypeError: ``loader`` is not a StatefulDataLoader over a stream, or ``strict`` is not a bool.
        ValueError: ``state`` is not a StatefulDataLoader's, or does not fit this loader.
    """
    strict = check_bool("strict", strict)
    runtime = runtime_of(loader.dataset, needs="load_loader_state needs a StatefulDataLoader over")
    if not callable(getattr(loader, "load_state_dict", None)):
        raise TypeError(f"load_loader_state needs a torchdata StatefulDataLoader, got a {type(loader).__name__}; for "
                        f"a plain DataLoader save stream_state(loader, batches_consumed) and load it into the dataset.")
    if not is_loader_state(state):
        raise ValueError(f"load_loader_state needs a StatefulDataLoader's state_dict(), got {state!r:.200}.")
    saved = read_loader_state(state, runtime)
    if saved.num_workers == loader.num_workers and saved.consumers[0].world_size == runtime.world_size:
        loader.load_state_dict(state)  # type: ignore[attr-defined]
        return
    if loader.num_workers > 1 and not getattr(loader, "in_order", True):
        raise ValueError(f"load_loader_state resumes another worker count only with in-order delivery, got "
                         f"num_workers={loader.num_workers}, in_order=False.")
    resumed = trainer_state(runtime, saved, batch_size=loader.batch_size or 1, drop_last=loader.drop_last)
    runtime.apply_state(runtime.check_state(resumed, strict=strict))

