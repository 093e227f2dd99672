"""``MixtureRuntime``: an ``EpisodeMixture``'s runtime (see ``stream_runtime``).

It runs ``_plan.mixing`` for a consumer (counts by weight and ``stop``, each component's passes, the
interleave order), opens the components' streams through their own runtimes (``DatasetRuntime``)
and interleaves them (``mixture.stream.MixtureStream``); it holds the shared epoch and the loaded
resume request, and checks and applies mixture states.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from episodestream._base.world import World
from episodestream._plan.mixing import LegPlan, MixResume, ComponentEpoch, initial_passes, plan_mixture_resume, rank_counts
from episodestream._plan.resume import Leg
from episodestream._plan.sampling import Step
from episodestream._runtime.dataset_runtime import DatasetRuntime
from episodestream._runtime.resume.epoch import Claim, SharedEpoch
from episodestream._runtime.mixture.schema import MixtureSchema
from episodestream._runtime.mixture.stream import MixtureStream
from episodestream._runtime.resume.position import StreamPosition
from episodestream._plan.saved_state import SavedState, StateSpec, mixture_identity
from episodestream._runtime.resume.record import LoadedRequest
from episodestream._runtime.stream import ConsumerStream
from episodestream._runtime.stream_runtime import StreamRuntime

# /3: its components' schedules draw stratified keys (``_plan.resume.STATE_FORMAT`` /4); /4: systematic
# ones (/5); /5: counter-based keys, a pool of the whole share (/6); /6: that pool on a ramp (/7).
MIXTURE_STATE_FORMAT = "episodestream.mixture_state/7"



class MixtureRuntime(StreamRuntime):
    """A mixture's epoch, consumer streams and resume position, over its components' runtimes."""

    state_what = "mixture"

    def __init__(self, components: Sequence[DatasetRuntime], *, weights: tuple[float, ...] | None, seed: int,
                 stop: str | int, renames: Sequence[Mapping[str, str]], schema: MixtureSchema) -> None:
        self.components = list(components)
        self.schema = schema  # the mixture's keys and each component's adapter (``keys=``)
        self.rank, self.world_size = components[0].rank, components[0].world_size
        self.weights = weights
        self.seed = seed
        self.stop = stop
        self.renames = list(renames)
        self.shared_epoch = SharedEpoch()
        self._legs: dict[tuple, LegPlan] = {}  # a memo by (epoch, consumers, request, leg)
        self.position = StreamPosition()  # this copy's own iteration, for state_dict (``position``)
        self._init_resume()

    def __getstate__(self) -> dict:
        # DataLoader workers rebuild leg plans (episode permutations) rather than unpickle them.
        return {**self.__dict__, "_legs": {}}

    @property
    def pool_sizes(self) -> tuple[int, ...]:
        return tuple(c.settings.episode_pool_size for c in self.components)

    pools = pool_sizes

    def _component_epochs(self, epoch: int) -> list[ComponentEpoch]:
        return [ComponentEpoch(tuple(c.segments(epoch)), c.settings.seed, c.settings.shuffle) for c in self.components]

    def rank_counts(self) -> list[int]:
        """Samples each component gives every rank in a fresh epoch."""
        return rank_counts([c.num_anchors() for c in self.components], world_size=self.world_size,
                           weights=self.weights, stop=self.stop)

    def num_samples(self) -> int:
        epoch = self.epoch
        request = self._loaded_request(epoch)
        if request is None:
            return sum(self.rank_counts())
        workers = request.legs[-1].num_workers
        point = self._point(request, workers)
        if point is None:
            return 0
        leg = self._leg(point, epoch, workers, request)
        skipped = sum(point.skips[self.rank][0]) if point.skips is not None else 0
        return leg.samples_per_rank - skipped

    def _leg(self, point: MixResume | None, epoch: int, num_workers: int, request: LoadedRequest | None) -> LegPlan:
        key = (epoch, max(1, num_workers), None if point is None else (request, point.leg_index))
        if key not in self._legs:
            if len(self._legs) >= 16:
                self._legs.clear()
            components = self._component_epochs(epoch)
            passes = (initial_passes(components, self.rank_counts(), self.world_size) if point is None
                      else point.passes)
            self._legs[key] = LegPlan(components, passes, seed=self.seed, epoch=epoch,
                                      leg=0 if point is None else point.leg_index, world_size=self.world_size,
                                      num_workers=num_workers, pool_sizes=self.pool_sizes)
        return self._legs[key]

    def consumer_plan(self, world: World, epoch: int, request: LoadedRequest | None, *,
                      then_skip: int = 0) -> tuple[np.ndarray, list[Iterator[Step]]]:
        """One consumer's interleave order (the component of each sample it yields) and each
        component's steps, tabular-free; resuming ``request`` (its claim's), what is left.
        ``then_skip``: samples to skip as well (what a per-consumer state says this consumer
        yielded, ``_runtime.resume.position``)."""
        point = self._point(request, world.num_workers) if request else None
        if request and point is None:
            return np.zeros(0, np.int64), [iter(()) for _ in self.components]
        leg = self._leg(point, epoch, world.num_workers, request)
        role, skip = point.role_for(world) if point else (world, 0)
        skip += then_skip
        consumer = leg.consumer(role)
        skips = consumer.counts_before(skip)
        return consumer.order()[skip:], [consumer.steps(i, skips[i]) for i in range(len(self.components))]

    def consumer_stream(self, world: World, claim: Claim) -> ConsumerStream:
        """Open ``world``'s pass over ``claim``'s epoch for a loader to pull (see ``_runtime.stream``); marks
        the epoch started."""
        epoch = claim.epoch
        self.shared_epoch.start(epoch)
        self._announce_resume(world, claim)
        order, steps = self.consumer_plan(world, epoch, claim.request,
                                          then_skip=self.position.begin(world, epoch, claim.consumer))
        counts = np.bincount(order, minlength=len(self.components)).tolist()
        streams = [c.stream(s, count, epoch) for c, s, count in zip(self.components, steps, counts)]
        return MixtureStream(streams, order, renames=self.renames,
                             group_size=min(c.settings.decode_group_size for c in self.components),
                             finished=lambda: self.shared_epoch.finished(epoch), adapters=self.schema.adapters,
                             frames_in_place=self.schema.frames_in_place())

    # -- resume (``_runtime.resume.resumable``'s protocol) -------------------------------------------------

    @property
    def state_spec(self) -> StateSpec:
        return StateSpec(format=MIXTURE_STATE_FORMAT, kind="mixture", pools_field="pool_sizes",
                         leg_pools_key="pool_sizes", identity=mixture_identity(len(self.components)),
                         components=len(self.components))

    def _identity(self) -> dict[str, Any]:
        return {"seed": self.seed, "weights": None if self.weights is None else list(self.weights), "stop": self.stop,
                "components": [c._identity() for c in self.components]}

    def _request(self, saved: SavedState, legs: tuple[Leg, ...]) -> LoadedRequest:
        return LoadedRequest(saved.epoch, legs)

    def _plan_point(self, request: LoadedRequest, *, world_size: int, num_workers: int,
                    pools: tuple[int, ...]) -> MixResume | None:
        return plan_mixture_resume(self._component_epochs(request.epoch), seed=self.seed, epoch=request.epoch,
                                   weights=self.weights, stop=self.stop, legs=request.legs, world_size=world_size,
                                   num_workers=num_workers, pool_sizes=pools)

    def _world_position(self, epoch: int, point: MixResume | None, world: World,
                        pools: tuple[int, ...]) -> tuple[int, int, int]:
        components = self._component_epochs(epoch)
        counts = rank_counts([c.num_anchors() for c in self.components], world_size=world.world_size,
                             weights=self.weights, stop=self.stop)
        passes = initial_passes(components, counts, world.world_size) if point is None else point.passes
        leg = LegPlan(components, passes, seed=self.seed, epoch=epoch, leg=0 if point is None else point.leg_index,
                      world_size=world.world_size, num_workers=world.num_workers, pool_sizes=pools)
        role, skip = point.role_for(world) if point is not None else (world, 0)
        return role.worker, skip, leg.consumer(role).num_samples
