"""``EpisodeStreamingDataset``: an IterableDataset over whole episodes held in a small pool."""

from __future__ import annotations

import json
import os
import warnings
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import torch.utils.data

from episodestream._runtime.accelerate_guard import accelerate_resharding
from episodestream._runtime.core import DatasetCore, DatasetFacts
from episodestream._runtime.position import (StreamPosition, is_consumer_state, load_consumer_state,
                                             without_consumer)
from episodestream._format.files import EpisodeVideos
from episodestream._sample.builder import PendingSample, SampleBuilder
from episodestream._sample.holds import HeldEpisodes
from episodestream._format.metadata import EpisodeInfo
from episodestream._runtime.epoch import SharedEpoch, StaleWorkerCopy, raising
from episodestream._base.options import check_int
from episodestream._runtime.pipeline import stream_samples
from episodestream._runtime.stream import CheckedState, ConsumerStream, Decoders, PlannedGroup, summed_stats
from episodestream._plan.resume import (
    STATE_FORMAT,
    Resumption,
    consumer_steps,
    fingerprint_digest,
    locate,
    read_request,
)
from episodestream._plan.sampling import ADMIT, EMIT, EpochPlan, Step
from episodestream._base.world import World, current_world, resolve_rank
from episodestream._base.tracing import set_process_name, trace_instant, trace_span, tracer_enabled

if TYPE_CHECKING:
    from typing import Unpack  # Python 3.11; annotations are not evaluated at run time

    from episodestream._runtime.source_options import SourceOptions


def _jsonable(value: Any) -> Any:
    """Compare values as they survive a JSON round trip (tuples become lists, keys strings)."""
    return json.loads(json.dumps(value))


class EpisodeStreamingDataset(DatasetFacts, torch.utils.data.IterableDataset):
    """Streams frames in random order from a pool of whole episodes, decoding video only on emit.

    What to read:
        source: a LeRobot v3.0 dataset: a local (or network-mounted) folder, read in place; a URL
            (``hf://datasets/owner/name``, ``s3://bucket/path``, ``gs://...``, other fsspec URLs);
            or a Hub dataset repo id (``"lerobot/aloha_mobile_cabinet"``).

    Source options (``**options``, shared with ``EpisodeDataset``; each is documented, with its
    default, in ``episodestream.SourceOptions``):
        what to read: revision, episodes, delta_timestamps, tolerance_s;
        what a sample looks like: return_uint8, image_transforms, video_backend, decode_device;
        remote sources: cache_dir, cache_limit, storage_options, token, hub_endpoint, download_config.
        Any other keyword raises TypeError, naming the closest valid one.

    How to iterate:
        episode_pool_size: whole episodes each consumer holds in RAM (tabular rows only) and
            mixes frames from (a sliding window of episodes, see ``_sampling.ConsumerSchedule``);
            larger mixes more, costs rows and open decoders.
        shuffle: False emits episodes and frames in order.
        decode_group_size: samples built together so that frames from one video file share a
            decoder call (1 builds each sample alone).
        decode_threads: threads that decode one consumer's groups (each with its own decoders);
            the samples and their order are the same for any value. Worth more than 1 in
            DataLoader workers only when the machine has more cores than workers;
            ``EpisodeLoader`` has its own ``num_threads`` and ignores this.
        prefetch_episodes: for remote sources, how many admissions ahead of the pool's need an
            episode's video bytes start downloading.
        rank, world_size: this process's place among training processes (default: from
            torch.distributed when initialised, else 0 of 1).

    Determinism:
        seed: with the epoch, fixes the episode order and the split; each consumer's RNG derives
            from (seed, epoch, rank, worker). ``set_epoch`` reshuffles; the epoch also advances by
            itself when an iteration runs to its end.

    Every rank yields ``len(self)`` = ceil(selected frames / world_size) samples per epoch; a rank
    with one frame fewer repeats one of its own frames once (see ``_sampling``).
    """

    def __init__(self, source: str | os.PathLike, *, episode_pool_size: int = 16, shuffle: bool = True,
                 seed: int = 0, rank: int | None = None, world_size: int | None = None, decode_group_size: int = 8,
                 decode_threads: int = 1, prefetch_episodes: int = 4, buffer_size: Any = None,
                 **options: Unpack[SourceOptions]) -> None:
        super().__init__()
        if buffer_size is not None:
            warnings.warn("buffer_size is ignored: episode_pool_size replaces it (a pool of whole episodes' "
                          "rows, not a buffer of decoded frames).", DeprecationWarning, stacklevel=2)
        self.episode_pool_size = check_int("episode_pool_size", episode_pool_size, minimum=1)
        self.decode_group_size = check_int("decode_group_size", decode_group_size, minimum=1)
        self.decode_threads = check_int("decode_threads", decode_threads, minimum=1)
        self.prefetch_episodes = check_int("prefetch_episodes", prefetch_episodes, minimum=0)
        self.seed = check_int("seed", seed, minimum=0)
        self.shuffle = bool(shuffle)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self._core = DatasetCore.for_dataset(
            EpisodeStreamingDataset, source, options,
            episodes_in_flight=self.episode_pool_size + self.prefetch_episodes + 1)
        self._epoch = SharedEpoch()
        self._loads_seen = 0  # resume states loaded when this copy was made (see SharedEpoch.for_iteration)
        self._decoders: list[Decoders] | None = None  # the current iteration's, one per decode thread
        self._resumption: Resumption | None = None  # the loaded state, while its epoch is ahead
        self._position = StreamPosition()  # this process's own iteration, for state_dict (``_position``)

    @property
    def epoch(self) -> int:
        return self._epoch.get()

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration streams (reaches persistent DataLoader workers too)."""
        self._epoch.set(check_int("epoch", epoch, minimum=0))

    def __len__(self) -> int:
        """Samples this rank yields in the next iteration: ceil(selected frames / world_size), or
        what is left of a resumed epoch (assuming the saving run's num_workers)."""
        resumption = self._resumption_of(self.epoch)
        if resumption is None:
            return -(-self.num_frames // self.world_size)
        point = resumption.point(resumption.request.legs[-1].num_workers)
        return 0 if point is None else point.samples_left(self.world_size, self.rank)

    def _resumption_of(self, epoch: int) -> Resumption | None:
        resumption = self._resumption
        return resumption if resumption is not None and resumption.request.epoch == epoch else None

    def schedule(self, world: World, epoch: int) -> Iterator[Step]:
        """The (ADMIT|EMIT|EVICT, episode_index, frame) steps of one consumer: tabular-free.

        In the epoch a state was loaded for, this continues from the resume point: exact resume
        skips what was consumed without reading rows or video; elastic resume splits what is left.
        """
        return self._consumer_stream(world, epoch)[0]

    def _consumer_stream(self, world: World, epoch: int) -> tuple[Iterator[Step], int]:
        """``schedule(world, epoch)`` and how many samples it emits."""
        resumption = self._resumption_of(epoch)
        point = resumption.point(world.num_workers) if resumption is not None else None
        plan = (point.plan(self.world_size) if point is not None else
                EpochPlan(self._core.whole_episodes(), seed=self.seed, epoch=epoch, shuffle=self.shuffle,
                          world_size=self.world_size))
        if world.consumer == 0 and (message := plan.uneven_warning(world.num_workers)):
            warnings.warn(message, RuntimeWarning, stacklevel=4)
        return consumer_steps(plan, world, pool_size=self.episode_pool_size, point=point,
                              then_skip=self._position.begin(world, epoch))

    def close(self) -> None:
        """Release this process's hold on a remote source's cached metadata (no-op when local)."""
        self._core.files.close()

    def decoder_stats(self) -> dict[str, int] | None:
        """Hits, misses and evictions of this process's decoder cache (None before iterating)."""
        return None if self._decoders is None else summed_stats(self._decoders)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # Not a generator itself: the epoch is marked started when the DataLoader asks for the
        # iterator, so a checkpoint taken before the first batch already names this epoch.
        world = current_world(self.rank, self.world_size)
        if (resharded := accelerate_resharding(self.rank, self.world_size)) is not None:
            return raising(resharded)
        try:
            epoch = self._position.pending_epoch()  # a worker given its own snapshot (StatefulDataLoader)
            epoch = self._epoch.for_iteration(self._loads_seen, "dataset") if epoch is None else epoch
        except StaleWorkerCopy as error:
            return raising(error)  # from the first next(), where the trainer hears of it
        if tracer_enabled():
            set_process_name(f"episodestream rank {world.rank} worker {world.worker}")
        return self._samples(self.consumer_stream(world, epoch))

    # -- resume ---------------------------------------------------------------------------------

    def _fingerprint(self) -> dict[str, Any]:
        meta = self._core.meta
        # The digest once per dataset copy: StatefulDataLoader asks for state_dict() after every
        # batch, and hashing 92,000 episode indices costs ~18 ms.
        if (digest := self.__dict__.get("_selection_digest")) is None:
            digest = self._selection_digest = fingerprint_digest(self._core.episodes.episode_indices.tolist())
        return {"source": self._core.files.description, "revision": self._core.revision,
                "episodes": {"count": len(self._core.episodes), "digest": digest},
                "delta_timestamps": self._core.delta_timestamps,
                "dataset": {"codebase_version": meta.info.get("codebase_version"), "fps": meta.fps,
                            "total_episodes": len(meta.episodes), "total_frames": meta.total_frames}}

    def state_dict(self) -> dict[str, Any]:
        """A small JSON-serialisable state: epoch, seed, rank count, pool size and a fingerprint.

        The trainer adds ``batches_consumed`` (batches taken from this epoch's loader, counted from
        the start of the epoch, across resumes), ``batch_size`` and ``num_workers`` (see
        ``stream_state``) and passes the result to ``load_state_dict`` on restart.
        """
        started = self._epoch.started()
        epoch = self._epoch.get() if started is None else started
        resumption = self._resumption_of(epoch)
        # The legs this epoch was resumed from; load_state_dict tells from the trainer's
        # num_workers whether this run continued the last of them or started a new one.
        legs = resumption.request.legs if resumption is not None else ()
        return {"format": STATE_FORMAT, "epoch": epoch, "seed": self.seed, "shuffle": self.shuffle,
                "world_size": self.world_size, "episode_pool_size": self.episode_pool_size,
                "legs": [asdict(leg) for leg in legs], "fingerprint": self._fingerprint(),
                "consumer": self._position.state(epoch)}

    def load_state_dict(self, state: Mapping[str, Any], *, strict: bool = True) -> None:
        """Resume from ``state`` (``state_dict()`` plus ``batches_consumed``, ``batch_size``,
        ``num_workers``, optionally ``drop_last``). The next iteration continues that epoch.

        A state whose seed, shuffle or fingerprint (source, revision, episode selection, windows,
        dataset size) differ from this dataset's is refused unless ``strict=False``.
        """
        if is_consumer_state(state):  # dataset.state_dict() itself, as StatefulDataLoader saves it per consumer
            epoch, self._resumption = load_consumer_state(
                state, self._position, strict=strict, seed=self.seed, shuffle=self.shuffle,
                fingerprint=self._fingerprint(), segments=self._core.whole_episodes(), world_size=self.world_size,
                pool_size=self.episode_pool_size)
            if torch.utils.data.get_worker_info() is None:  # the main process: later workers copy the position
                self._epoch.set(epoch)
                self._loads_seen = self._epoch.state_loaded()
            return
        self.apply_state(self.check_state(state, strict=strict))

    def check_state(self, state: Mapping[str, Any], *, strict: bool = True) -> CheckedState:
        """Check ``state`` and work out where it resumes, changing nothing (``load_state_dict`` is
        this then ``apply_state``; a loader checks its own settings in between)."""
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"Not an episodestream stream state (expected format {STATE_FORMAT!r}): {state!r:.200}")
        for key in ("batches_consumed", "batch_size", "num_workers"):
            if key not in state:
                raise ValueError(f"The state lacks {key!r}: add what the trainer knows, e.g. "
                                 f"stream_state(loader, batches_consumed) or {{**state, 'batches_consumed': n, "
                                 f"'batch_size': b, 'num_workers': w}}.")
        saved_fingerprint = state.get("fingerprint", {})
        checks = [("seed", state.get("seed"), self.seed), ("shuffle", state.get("shuffle"), self.shuffle)]
        checks += [(f"fingerprint.{k}", saved_fingerprint.get(k), v) for k, v in self._fingerprint().items()]
        mismatches = [f"{name}: saved {saved!r}, this dataset {now!r}" for name, saved, now in checks
                      if _jsonable(saved) != _jsonable(now)]
        if mismatches:
            message = "The stream state does not match this dataset: " + "; ".join(mismatches) + "."
            if strict:
                raise ValueError(message + " Pass strict=False to load it anyway.")
            warnings.warn(message + " Loading anyway (strict=False).", RuntimeWarning, stacklevel=3)
        request = read_request(state, seed=self.seed, shuffle=self.shuffle)
        return CheckedState(request.epoch, locate(request, self._core.whole_episodes(), strict=strict), request)

    def apply_state(self, checked: CheckedState) -> None:
        """Make a ``check_state`` result the position the next iteration starts from."""
        request, done = checked.request, checked.finished
        self._resumption = None if done else Resumption(request, self._core.whole_episodes(),
                                                        world_size=self.world_size, pool_size=self.episode_pool_size)
        self._epoch.set(request.epoch + 1 if done else request.epoch)
        self._loads_seen = self._epoch.state_loaded()

    def consumer_stream(self, world: World, epoch: int) -> ConsumerStream:
        """Open ``world``'s pass over ``epoch`` for a loader to pull (see ``_stream``): from the
        resume point in the epoch a state was loaded for. Marks the epoch started."""
        self._epoch.start(epoch)
        steps, num_samples = self._consumer_stream(world, epoch)
        return self._stream(steps, num_samples, epoch)

    def _stream(self, steps: Iterator[Step], num_samples: int, epoch: int) -> _DatasetStream:
        """The stream of ``steps`` (a consumer's schedule, or any other, e.g. a mixture's pass)."""
        return _DatasetStream(self, steps, num_samples, epoch)

    def _planned_groups(self, steps: Iterator[Step], videos: EpisodeVideos) -> Iterator[PlannedGroup]:
        """Run the pool over ``steps``: groups of up to ``decode_group_size`` samples whose tabular
        part is built and whose video is still to decode, with the episodes to evict once they are
        decoded."""
        builder = self._core.builder
        episodes = self._core.meta.episodes
        # Prefetching sources admit video ahead of the pool (_admit_ahead), the rest on first hold.
        pool = HeldEpisodes(self._core.row_reader(), videos, admit_video=not videos.prefetches)
        pending: list[PendingSample] = []
        evicted: list[EpisodeInfo] = []
        if videos.prefetches:
            steps = _admit_ahead(steps, videos, episodes, depth=self.prefetch_episodes)
        for kind, episode_index, frame in steps:
            if kind == EMIT:
                with trace_span("plan", cat="samples", level="detailed", episode=episode_index, frame=frame):
                    pending.append(builder.plan(pool.rows(episode_index), frame, videos))
                if len(pending) >= self.decode_group_size:
                    yield PlannedGroup(pending, evicted)
                    pending, evicted = [], []
            elif kind == ADMIT:
                if episode_index not in pool:
                    trace_instant("admit", cat="pool", episode=episode_index)
                with trace_span("read_rows", cat="rows", level="detailed", episode=episode_index):
                    pool.hold(episodes[episode_index])
            elif (episode := pool.release(episode_index)) is not None:
                trace_instant("evict", cat="pool", episode=episode_index)
                # Its rows are gone now (plan() copied what it needs); its video bytes go only
                # after the pending samples are decoded.
                evicted.append(episode)
        if pending or evicted:
            yield PlannedGroup(pending, evicted)

    def _samples(self, stream: ConsumerStream) -> Iterator[dict[str, Any]]:
        self._decoders = opened = []
        position = self._position
        for sample in stream_samples(stream, decode_threads=self.decode_threads, group_size=self.decode_group_size,
                                     opened=opened):
            position.samples_yielded += 1  # before the yield: a state taken once the sample is out counts it
            yield sample


class _DatasetStream(ConsumerStream):
    """One consumer's pass over a dataset's steps (see ``_stream.ConsumerStream``)."""

    def __init__(self, dataset: EpisodeStreamingDataset, steps: Iterator[Step], num_samples: int,
                 epoch: int) -> None:
        core = dataset._core
        self.num_samples = num_samples
        self.num_cameras = len(core.meta.video_keys)
        self._dataset = dataset
        self._epoch = epoch
        self._steps = steps
        # Opened by the first groups() call, so that a stream nobody pulls holds nothing.
        self._videos: EpisodeVideos | None = None
        self._groups: Iterator[PlannedGroup] | None = None

    def groups(self) -> Iterator[PlannedGroup]:
        if self._groups is None:
            self._videos = self._dataset._core.episode_videos()
            self._groups = self._dataset._planned_groups(self._steps, self._videos)
        return self._groups

    def builder(self, source: int) -> SampleBuilder:
        return self._dataset._core.builder

    def open_decoders(self) -> Decoders:
        return Decoders([self._dataset._core.decoder_cache(self._dataset.episode_pool_size)])

    def release(self, group: PlannedGroup) -> None:
        for episode in group.evicted:
            self._videos.evict(episode)  # type: ignore[union-attr]  # a group comes from groups()

    def finished(self) -> None:
        self._dataset._epoch.finished(self._epoch)

    def close(self) -> None:
        if self._groups is not None:
            self._groups.close()  # type: ignore[attr-defined]  # a generator
            self._videos.close()  # type: ignore[union-attr]


def _admit_ahead(steps: Iterator[Step], videos: EpisodeVideos, episodes,
                 *, depth: int) -> Iterator[Step]:
    """Pass ``steps`` through, calling ``videos.admit`` for each ADMIT as soon as it is among the
    next ``depth`` admissions, so fetching runs ahead of the pool's need."""
    buffered: deque[Step] = deque()
    admits_buffered = 0
    for step in steps:
        buffered.append(step)
        if step[0] == ADMIT:
            videos.admit(episodes[step[1]])
            admits_buffered += 1
        while admits_buffered > depth:
            out = buffered.popleft()
            admits_buffered -= out[0] == ADMIT
            yield out
    yield from buffered


def stream_state(loader: torch.utils.data.DataLoader, batches_consumed: int) -> dict[str, Any]:
    """The resume state for a DataLoader over an ``EpisodeStreamingDataset``: the dataset's
    ``state_dict()`` plus the batches consumed this epoch and the loader's batching settings."""
    from episodestream.mixture import EpisodeMixture  # here: mixture imports this module

    dataset = loader.dataset
    if not isinstance(dataset, (EpisodeStreamingDataset, EpisodeMixture)):
        raise TypeError(f"stream_state needs a DataLoader over an EpisodeStreamingDataset or EpisodeMixture, "
                        f"got {type(dataset).__name__}.")
    if loader.num_workers > 1 and not getattr(loader, "in_order", True):
        # Resume replays the in-order round robin to find each worker's consumed samples; out of
        # order, batches come as workers finish them and the count no longer says whose they were.
        raise ValueError(f"stream_state needs the DataLoader's in-order delivery with num_workers="
                         f"{loader.num_workers}, got in_order=False: batches_consumed cannot be mapped to "
                         f"each worker's samples. Use in_order=True (the default), or num_workers <= 1.")
    return {**without_consumer(dataset.state_dict()),
            "batches_consumed": check_int("batches_consumed", batches_consumed, minimum=0),
            # batch_size=None hands out single samples: the same round robin as batches of one.
            "batch_size": loader.batch_size or 1, "num_workers": loader.num_workers, "drop_last": loader.drop_last}
