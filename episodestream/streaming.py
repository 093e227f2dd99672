"""``EpisodeStreamingDataset``: an IterableDataset over whole episodes held in a small pool."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch.utils.data

from ._core import DatasetCore
from ._epoch import SharedEpoch
from ._options import check_int
from ._sampling import _CONSUMER, ADMIT, EMIT, EpochPlan, Segment, consumer_schedule, make_rng
from ._world import World, current_world, resolve_rank
from .video import DecoderCache


class EpisodeStreamingDataset(torch.utils.data.IterableDataset):
    """Streams uniformly random frames from a pool of whole episodes, decoding video only on emit.

    What to read:
        source: a LeRobot v3.0 dataset folder.
        revision: a Hub revision (for remote sources; must be None for a local folder).
        episodes: episode indices to use (default: all). Honoured by the split, ``len`` and resume.
        delta_timestamps: ``{feature_key: [seconds, ...]}`` windows, each a multiple of 1/fps.
        tolerance_s: how far a decoded frame's time, or a delta's rounding, may be from the query.

    What a sample looks like:
        return_uint8: camera frames as uint8 CHW instead of float32 in [0, 1].
        image_transforms: a callable applied to every camera frame (or window) after decoding.
        video_backend: "torchcodec" (default when it loads) or "pyav"; also
            ``EPISODESTREAM_VIDEO_BACKEND``.

    How to iterate:
        episode_pool_size: whole episodes each consumer holds in RAM (tabular rows only) and
            draws frames from uniformly; larger mixes more, costs rows and open decoders.
        shuffle: False emits episodes and frames in order.
        decode_group_size: samples built together so that frames from one video file share a
            decoder call (1 builds each sample alone).
        rank, world_size: this process's place among training processes (default: from
            torch.distributed when initialised, else 0 of 1).

    Determinism:
        seed: with the epoch, fixes the episode order and the split; each consumer's RNG derives
            from (seed, epoch, rank, worker). ``set_epoch`` reshuffles; the epoch also advances by
            itself when an iteration runs to its end.

    Every rank yields ``len(self)`` = ceil(selected frames / world_size) samples per epoch; a rank
    with one frame fewer repeats one of its own frames once (see ``_sampling``).
    """

    def __init__(self, source: str | os.PathLike, *, revision: str | None = None,
                 episodes: Sequence[int] | None = None,
                 delta_timestamps: Mapping[str, Sequence[float]] | None = None, tolerance_s: float = 1e-4,
                 episode_pool_size: int = 16, shuffle: bool = True, seed: int = 0, return_uint8: bool = False,
                 image_transforms: Callable | None = None, video_backend: str | None = None,
                 rank: int | None = None, world_size: int | None = None, decode_group_size: int = 8,
                 buffer_size: Any = None) -> None:
        super().__init__()
        if buffer_size is not None:
            warnings.warn("buffer_size is ignored: episode_pool_size replaces it (a pool of whole episodes' "
                          "rows, not a buffer of decoded frames).", DeprecationWarning, stacklevel=2)
        self.episode_pool_size = check_int("episode_pool_size", episode_pool_size, minimum=1)
        self.decode_group_size = check_int("decode_group_size", decode_group_size, minimum=1)
        self.seed = check_int("seed", seed, minimum=0)
        self.shuffle = bool(shuffle)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self._core = DatasetCore(source, revision=revision, episodes=episodes,
                                 delta_timestamps=delta_timestamps, tolerance_s=tolerance_s,
                                 return_uint8=return_uint8, image_transforms=image_transforms,
                                 video_backend=video_backend)
        self._epoch = SharedEpoch()
        self._decoder_cache: DecoderCache | None = None

    @property
    def meta(self):
        """The dataset's validated metadata (fps, features, episodes, tasks)."""
        return self._core.meta

    @property
    def epoch(self) -> int:
        return self._epoch.get()

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration streams (reaches persistent DataLoader workers too)."""
        self._epoch.set(check_int("epoch", epoch, minimum=0))

    def __len__(self) -> int:
        return -(-self._core.num_frames // self.world_size)

    def epoch_plan(self, epoch: int | None = None) -> EpochPlan:
        """The split of ``epoch`` (default: the current one) across ranks."""
        segments = [Segment(ep.episode_index, range(ep.length)) for ep in self._core.episodes]
        return EpochPlan(segments, seed=self.seed, epoch=self.epoch if epoch is None else epoch,
                         shuffle=self.shuffle, world_size=self.world_size)

    def schedule(self, world: World, epoch: int) -> Iterator[tuple[int, int, int]]:
        """The (ADMIT|EMIT|EVICT, episode_index, frame) steps of one consumer: tabular-free."""
        plan = self.epoch_plan(epoch)
        if world.consumer == 0 and (message := plan.uneven_warning(world.num_workers)):
            warnings.warn(message, RuntimeWarning, stacklevel=3)
        rng = make_rng(self.seed, epoch, _CONSUMER, world.rank, world.worker)
        return consumer_schedule(plan.share(world), pool_size=self.episode_pool_size, shuffle=self.shuffle,
                                 rng=rng)

    def decoder_stats(self) -> dict[str, int] | None:
        """Hits, misses and evictions of this process's decoder cache (None before iterating)."""
        return None if self._decoder_cache is None else self._decoder_cache.stats()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        world = current_world(self.rank, self.world_size)
        epoch = self.epoch
        yield from self._samples(self.schedule(world, epoch))
        self._epoch.finished(epoch)

    def _samples(self, steps: Iterator[tuple[int, int, int]]) -> Iterator[dict[str, Any]]:
        core = self._core
        builder = core.builder
        reader = core.row_reader()
        cache = self._decoder_cache = core.decoder_cache(self.episode_pool_size)
        pool: dict[int, list] = {}  # episode_index -> [rows, admissions]
        pending = []
        try:
            for kind, episode_index, frame in steps:
                if kind == EMIT:
                    # plan() copies what the sample needs, so eviction need not wait for the decode.
                    pending.append(builder.plan(pool[episode_index][0], frame))
                    if len(pending) >= self.decode_group_size:
                        yield from builder.build(cache, pending)
                        pending = []
                elif kind == ADMIT:
                    entry = pool.setdefault(episode_index, [None, 0])
                    if entry[0] is None:
                        entry[0] = reader.read(core.meta.episodes[episode_index])
                    entry[1] += 1
                else:
                    entry = pool[episode_index]
                    entry[1] -= 1
                    if entry[1] == 0:
                        del pool[episode_index]
            if pending:
                yield from builder.build(cache, pending)
        finally:
            cache.close()
