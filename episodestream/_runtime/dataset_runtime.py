"""``DatasetRuntime``: an ``EpisodeStreamingDataset``'s runtime (see ``stream_runtime``).

Per consumer and epoch it makes the schedule (``_plan``), runs it through the pool of held episodes
(rows read, video admitted ahead, samples planned in groups) and hands the groups to a loader as a
``ConsumerStream``; it holds the shared block (epoch and resume record), and checks and applies
resume states. A mixture drives its components through the same object.
"""

from __future__ import annotations

import threading

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from episodestream._base.tracing import trace_instant, trace_span
from episodestream._base.turns import Turn
from episodestream._base.warn import warn_user
from episodestream._base.world import World
from episodestream._format.files import EpisodeVideos
from episodestream._format.metadata import DatasetMeta, EpisodeInfo
from episodestream._plan.resume import STATE_FORMAT, Leg, ResumePoint, consumer_steps, fingerprint_digest, plan_resume
from episodestream._plan.sampling import ADMIT, EMIT, ConsumerSchedule, EpochPlan, Segment, Step
from episodestream._runtime.core import DatasetCore
from episodestream._runtime.needed_spans import ShareEpisodes
from episodestream._runtime.resume.epoch import Claim, SharedEpoch
from episodestream._runtime.resume.position import StreamPosition
from episodestream._runtime.lookahead.stage import LookAhead
from episodestream._plan.saved_state import DATASET_IDENTITY, SavedState, StateSpec
from episodestream._runtime.resume.record import LoadedRequest
from episodestream._runtime.stream import ConsumerStream, PlannedGroup
from episodestream._runtime.stream_runtime import StreamRuntime
from episodestream._runtime.lookahead.worker_turns import WorkerTurns
from episodestream._sample.builder import PendingSample, SampleBuilder
from episodestream._sample.holds import HeldEpisodes
from episodestream._sample.video.decoder_cache import DecoderCache, DecoderShare



@dataclass(frozen=True)
class StreamSettings:
    """How a dataset streams (``EpisodeStreamingDataset``'s arguments, checked)."""

    episode_pool_size: int
    shuffle: bool
    seed: int
    decode_group_size: int
    decode_threads: int
    prefetch_episodes: int


def default_decode_group_size(meta: DatasetMeta) -> int:
    """``decode_group_size`` when none is given. A group's frames are random across the pool's
    episodes, and each video file they touch costs a decoder call: where each episode has files
    of its own (v2.x), twice the samples per group make about as many frames per call as 16 do
    where episodes share files, which brings v2.1's rate close to v3.0's (benchmarks/LOG.md,
    "v2.x decode groups of 32 by default"). Not larger: 64 measured no faster, and each thread
    holds a group's samples in flight."""
    return 16 if meta.episodes_share_video_files else 32


class DatasetRuntime(StreamRuntime):
    """A dataset's epoch, consumer streams and resume position."""

    state_what = "dataset"
    state_spec = StateSpec(format=STATE_FORMAT, kind="stream", pools_field="episode_pool_size",
                           leg_pools_key="pool_size", identity=DATASET_IDENTITY)

    def __init__(self, core: DatasetCore, settings: StreamSettings, *, rank: int, world_size: int) -> None:
        self.core = core
        self.settings = settings
        self.rank, self.world_size = rank, world_size
        self.shared_epoch = SharedEpoch()
        self.turns = WorkerTurns()  # the order DataLoader workers start downloading in (``_base.turns``)
        self.position = StreamPosition()  # this copy's own iteration, for state_dict (``position``)
        self._init_resume()

    # -- what mixtures read of a component ------------------------------------------------------

    @property
    def builder(self) -> SampleBuilder:
        return self.core.builder

    @property
    def offsets(self) -> Mapping[str, Any]:
        """Window offsets (frames) by key: what ``delta_timestamps`` became."""
        return self.core.offsets

    def segments(self, epoch: int) -> Sequence[Segment]:
        """The anchors of ``epoch`` as segments (whole episodes unless curated, ``_plan.curation``)."""
        return self.core.anchors.segments(self.settings.seed, epoch)

    def num_anchors(self) -> int:
        return self.core.num_anchors

    def fingerprint(self) -> dict[str, Any]:
        """What a saved state must match: source, revision, selection, windows, dataset size."""
        meta = self.core.meta
        # The digest once per copy: StatefulDataLoader asks for state_dict() after every batch, and
        # hashing 92,000 episode indices costs ~18 ms.
        if (digest := self.__dict__.get("_selection_digest")) is None:
            digest = self._selection_digest = fingerprint_digest(self.core.episodes.episode_indices.tolist())
        return {"source": self.core.files.description, "revision": self.core.revision,
                "episodes": {"count": len(self.core.episodes), "digest": digest},
                "delta_timestamps": self.core.delta_timestamps, "curation": self.core.curation,
                "dataset": {"codebase_version": meta.info.get("codebase_version"), "fps": meta.fps,
                            "total_episodes": len(meta.episodes), "total_frames": meta.total_frames}}

    # -- epoch and length -----------------------------------------------------------------------

    def num_samples(self) -> int:
        request = self._loaded_request(self.epoch)
        if request is None:
            return -(-self.core.num_anchors // self.world_size)
        point = self._point(request, request.legs[-1].num_workers)
        return 0 if point is None else point.samples_left(self.world_size, self.rank)

    # -- streams ----------------------------------------------------------------------------------

    def schedule(self, world: World, epoch: int) -> Iterator[Step]:
        """The (ADMIT|EMIT|EVICT, episode_index, frame) steps of one consumer: tabular-free.

        In the epoch a state was loaded for, this continues from the resume point: exact resume
        skips what was consumed without reading rows or video; elastic resume splits what is left.
        """
        return self._steps(world, Claim(epoch, request=self._loaded_request(epoch)))[0]

    def _steps(self, world: World, claim: Claim) -> tuple[Iterator[Step], int, ConsumerSchedule]:
        """The steps of ``world``'s pass over ``claim``'s epoch, from what the claim resumes, how many
        samples they emit and the schedule they come from."""
        epoch, request = claim.epoch, claim.request
        point = self._point(request, world.num_workers) if request is not None else None
        plan = (point.plan(self.world_size) if point is not None else
                EpochPlan(self.segments(epoch), seed=self.settings.seed, epoch=epoch,
                          shuffle=self.settings.shuffle, world_size=self.world_size))
        if world.consumer == 0 and (message := plan.uneven_warning(world.num_workers)):
            warn_user(message, RuntimeWarning)
        return consumer_steps(plan, world, pool_size=self.settings.episode_pool_size, point=point,
                              then_skip=self.position.begin(world, epoch, claim.consumer))

    def consumer_stream(self, world: World, claim: Claim) -> ConsumerStream:
        self.shared_epoch.start(claim.epoch)
        self._announce_resume(world, claim)
        steps, num_samples, schedule = self._steps(world, claim)
        turn = self.turns.turn(world, claim.iteration)
        return self.stream(steps, num_samples, claim.epoch, turn=turn, schedule=schedule)

    def stream(self, steps: Iterator[Step], num_samples: int, epoch: int, *,
               turn: Turn | None = None, schedule: ConsumerSchedule | None = None) -> ConsumerStream:
        """The stream of ``steps`` (a consumer's schedule, or any other, e.g. a mixture's pass),
        starting its downloads in ``turn`` (``_base.turns``; None: at once). ``schedule``: the
        consumer's schedule the steps come from, when they do (each episode's video is then fetched
        for the frames its share and fill-ins can read, ``ShareEpisodes``; None: the whole episode's)."""
        return _DatasetStream(self, steps, num_samples, epoch, turn, schedule)

    def planned_groups(self, steps: Iterator[Step], videos: EpisodeVideos, *,
                       schedule: ConsumerSchedule | None = None) -> Iterator[PlannedGroup]:
        """Run the pool over ``steps``: groups of up to ``decode_group_size`` samples whose tabular
        part is built and whose video is still to decode, with the episodes to evict once they are
        decoded."""
        builder = self.core.builder
        episodes = self.core.fetched_episodes
        if schedule is not None and videos.prefetches:
            # A consumer holding only part of an episode (its share's first and last segments are
            # cut where the epoch's frames are split between consumers) fetches that part's video:
            # the consumer holding the rest fetches the rest, not the whole episode again.
            episodes = ShareEpisodes(episodes, schedule, self.core.offsets, self.core.meta.fps)
        group_size = self.settings.decode_group_size
        # Prefetching sources start each admission's rows and video ahead of the pool (the
        # look-ahead stage); the rest admit video on first hold.
        ahead = (LookAhead(self.core.row_reader(), videos, episodes, pool_size=self.settings.episode_pool_size,
                           admissions_ahead=self.settings.prefetch_episodes) if videos.prefetches else None)
        # Rows wait for their first emit (``HeldEpisodes``): a wide pool's admissions before its first
        # batch would otherwise all wait for their rows first (prefetched rows are read ahead, in need
        # order, and an emit waiting for its episode's moves that read to the front).
        pool = HeldEpisodes(ahead or self.core.row_reader(), videos, admit_video=not videos.prefetches,
                            rows_at_first_use=True)
        pending: list[PendingSample] = []
        evicted: list[EpisodeInfo] = []
        if ahead is not None:
            steps = ahead.steps(steps)
        # A shuffled schedule emits an episode's frames 2q and 2q+1 at two of its consecutive emits
        # (``_plan.sampling``): which comes first is told here, in stream order, for the decode
        # threads that run groups out of order (``_sample.video.gop_pairs``).
        pairs = _PairRoles() if self.settings.shuffle else None
        try:
            for kind, episode_index, frame in steps:
                if kind == EMIT:
                    with trace_span("plan", cat="samples", level="detailed", episode=episode_index, frame=frame):
                        rows = pool.rows(episode_index)
                        role = 0 if pairs is None else pairs.role(episode_index, frame, rows.episode.length)
                        pending.append(builder.plan(rows, frame, videos, pair=role))
                    if len(pending) >= group_size:
                        yield PlannedGroup(pending, evicted)
                        pending, evicted = [], []
                elif kind == ADMIT:
                    if episode_index not in pool:
                        trace_instant("admit", cat="pool", episode=episode_index)
                    pool.hold(episodes[episode_index])  # its rows' read is traced where it happens
                elif (episode := pool.release(episode_index)) is not None:
                    trace_instant("evict", cat="pool", episode=episode_index)
                    # Its rows are gone now (plan() copied what it needs); its video bytes go only
                    # after the pending samples are decoded.
                    evicted.append(episode)
            if pending or evicted:
                yield PlannedGroup(pending, evicted)
        finally:
            if ahead is not None:
                ahead.close()

    # -- resume (``_runtime.resume.resumable``'s protocol) -------------------------------------------------

    @property
    def pools(self) -> tuple[int, ...]:
        return (self.settings.episode_pool_size,)

    def _identity(self) -> dict[str, Any]:
        return {"seed": self.settings.seed, "shuffle": self.settings.shuffle, "fingerprint": self.fingerprint()}

    def _request(self, saved: SavedState, legs: tuple[Leg, ...]) -> LoadedRequest:
        # The legs are replayed with the seed and shuffle they were streamed with (the same as
        # this dataset's, unless strict=False loaded another's).
        return LoadedRequest(saved.epoch, legs, saved.identity["seed"], saved.identity["shuffle"])

    def _plan_point(self, request: LoadedRequest, *, world_size: int, num_workers: int,
                    pools: tuple[int, ...]) -> ResumePoint | None:
        assert request.seed is not None and request.shuffle is not None  # _request sets both
        return plan_resume(self.segments(request.epoch), seed=request.seed, epoch=request.epoch,
                           shuffle=request.shuffle, legs=request.legs, world_size=world_size,
                           num_workers=num_workers, pool_size=pools[0])

    def _world_position(self, epoch: int, point: ResumePoint | None, world: World,
                        pools: tuple[int, ...]) -> tuple[int, int, int]:
        if point is None:
            plan = EpochPlan(self.segments(epoch), seed=self.settings.seed, epoch=epoch,
                             shuffle=self.settings.shuffle, world_size=world.world_size)
            return world.worker, 0, plan.share(world).num_samples
        plan = point.plan(world.world_size)
        role, skip = point.share_for(plan, world)
        return role.worker, skip, plan.share(role).num_samples


class _DatasetStream(ConsumerStream):
    """One consumer's pass over a dataset's steps (see ``stream.ConsumerStream``)."""

    def __init__(self, runtime: DatasetRuntime, steps: Iterator[Step], num_samples: int, epoch: int,
                 turn: Turn | None, schedule: ConsumerSchedule | None = None) -> None:
        self.num_samples = num_samples
        self.num_cameras = len(runtime.core.meta.video_keys)
        self.builder = runtime.core.builder
        self.group_size = runtime.settings.decode_group_size
        self.decoders_outlive_pass = runtime.core.files.videos_stay_in_place
        self._runtime = runtime
        self._epoch = epoch
        self._steps = steps
        self._turn = turn
        self._schedule = schedule
        # Opened by the first groups() call, so that a stream nobody pulls holds nothing.
        self._videos: EpisodeVideos | None = None
        self._groups: Iterator[PlannedGroup] | None = None
        self._decoders: DecoderCache | None = None  # opened by the first thread that decodes
        self._decoders_lock = threading.Lock()

    def groups(self) -> Iterator[PlannedGroup]:
        if self._groups is None:
            self._videos = self._runtime.core.episode_videos(turn=self._turn)
            self._groups = self._runtime.planned_groups(self._steps, self._videos, schedule=self._schedule)
        return self._groups

    def open_decoders(self, threads: int = 1) -> DecoderShare:
        with self._decoders_lock:  # the pass's threads start at once; they share one cache
            if self._decoders is None:
                settings = self._runtime.settings
                self._decoders = self._runtime.core.decoder_cache(settings.episode_pool_size, threads=threads,
                                                                  gop_pairs=settings.shuffle)
            return self._decoders.share()

    def release(self, group: PlannedGroup) -> None:
        for episode in group.evicted:
            gone = self._videos.evict(episode)  # type: ignore[union-attr]  # a group comes from groups()
            if gone and self._decoders is not None:
                self._decoders.forget(gone)

    def finished(self) -> None:
        self._runtime.shared_epoch.finished(self._epoch)

    def close(self) -> None:
        # Every loader closes its stream, whether it ended (stream_samples closes before
        # finished(), EpisodeLoader after it), failed or was dropped: passing the turn here holds
        # nobody's downloads back, even for a stream that never opened its videos.
        if self._turn is not None:
            self._turn.pass_on()
        if self._groups is not None:
            self._groups.close()  # type: ignore[attr-defined]  # a generator
            self._videos.close()  # type: ignore[union-attr]


class _PairRoles:
    """Which of its GOP pair each planned frame is, in stream order: 1 the first of frames 2q and
    2q+1 of its episode, 2 the second, 0 a frame without a mate (the last of an odd episode)."""

    def __init__(self) -> None:
        self._open: set[tuple[int, int]] = set()  # (episode, q) of pairs whose first was planned

    def role(self, episode_index: int, frame: int, length: int) -> int:
        if frame ^ 1 >= length:
            return 0
        pair = (episode_index, frame >> 1)
        if pair in self._open:
            self._open.remove(pair)
            return 2
        self._open.add(pair)
        return 1
