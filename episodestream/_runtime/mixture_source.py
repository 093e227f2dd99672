"""``MixtureSource``: an ``EpisodeMixture``'s runtime (see ``stream_source``).

It runs ``_plan.mixing`` for a consumer (counts by weight and ``stop``, each component's passes, the
interleave order), opens the components' streams through their own runtimes (``DatasetSource``)
and interleaves them (``mixture_stream.MixtureStream``); it holds the shared epoch and the loaded
resume request, and checks and applies mixture states.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from episodestream._base.options import check_bool, check_int
from episodestream._base.world import World
from episodestream._plan.mixing import (
    LegPlan,
    MixLeg,
    MixResume,
    Source,
    initial_passes,
    plan_mixture_resume,
    rank_counts,
)
from episodestream._plan.resume import BeyondEpochError, chain_legs, refuse_other_format, saved_legs
from episodestream._plan.sampling import Step
from episodestream._runtime.dataset_source import DatasetSource
from episodestream._runtime.epoch import SharedEpoch
from episodestream._runtime.mixture_schema import MixtureSchema
from episodestream._runtime.mixture_stream import MixtureStream
from episodestream._runtime.position import ConsumerPosition, StreamPosition
from episodestream._plan.saved_state import (check_consumer_epoch, identity_checks, refuse_mismatches,
                                             require_trainer_fields)
from episodestream._runtime.stream import CheckedState, ConsumerStream
from episodestream._runtime.stream_source import StreamSource

MIXTURE_STATE_FORMAT = "episodestream.mixture_state/2"



class MixtureSource(StreamSource):
    """A mixture's epoch, consumer streams and resume position, over its components' runtimes."""

    def __init__(self, components: Sequence[DatasetSource], *, weights: tuple[float, ...] | None, seed: int,
                 stop: str | int, renames: Sequence[Mapping[str, str]], schema: MixtureSchema) -> None:
        self.components = list(components)
        self.schema = schema  # the mixture's keys and each component's adapter (``keys=``)
        self.rank, self.world_size = components[0].rank, components[0].world_size
        self.weights = weights
        self.seed = seed
        self.stop = stop
        self.renames = list(renames)
        self.shared_epoch = SharedEpoch()
        self.loads_seen = 0
        self._resume_request: tuple[int, tuple[MixLeg, ...]] | None = None  # (epoch, legs)
        self._resume_points: dict[int, MixResume | None] = {}
        self._legs: dict[tuple, LegPlan] = {}
        self.position = StreamPosition()  # this copy's own iteration, for state_dict (``position``)

    def __getstate__(self) -> dict:
        # DataLoader workers rebuild leg plans (episode permutations) rather than unpickle them.
        return {**self.__dict__, "_legs": {}}

    @property
    def pool_sizes(self) -> tuple[int, ...]:
        return tuple(c.settings.episode_pool_size for c in self.components)

    def _sources(self, epoch: int) -> list[Source]:
        return [Source(tuple(c.segments(epoch)), c.settings.seed, c.settings.shuffle) for c in self.components]

    @property
    def epoch(self) -> int:
        return self.shared_epoch.get()

    def set_epoch(self, epoch: int) -> None:
        self.shared_epoch.set(epoch)

    def rank_counts(self) -> list[int]:
        """Samples each component gives every rank in a fresh epoch."""
        return rank_counts([c.num_anchors() for c in self.components], world_size=self.world_size,
                           weights=self.weights, stop=self.stop)

    def _request_of(self, epoch: int) -> tuple[int, tuple[MixLeg, ...]] | None:
        """The loaded request of ``epoch``, until a whole pass of that epoch ran to its end."""
        request = self._resume_request
        if request is None or request[0] != epoch or not self.shared_epoch.resume_point(epoch):
            return None
        return request

    def num_samples(self) -> int:
        epoch = self.epoch
        request = self._request_of(epoch)
        if request is None:
            return sum(self.rank_counts())
        workers = request[1][-1].num_workers
        point = self._resume_point(workers)
        if point is None:
            return 0
        leg = self._leg(point, epoch, workers)
        skipped = sum(point.skips[self.rank][0]) if point.skips is not None else 0
        return leg.samples_per_rank - skipped

    def _leg(self, point: MixResume | None, epoch: int, num_workers: int) -> LegPlan:
        key = (epoch, max(1, num_workers), None if point is None else point.leg_index)
        if key not in self._legs:
            sources = self._sources(epoch)
            passes = (initial_passes(sources, self.rank_counts(), self.world_size) if point is None
                      else point.passes)
            self._legs[key] = LegPlan(sources, passes, seed=self.seed, epoch=epoch,
                                      leg=0 if point is None else point.leg_index, world_size=self.world_size,
                                      num_workers=num_workers, pool_sizes=self.pool_sizes)
        return self._legs[key]

    def resumed_batches(self, epoch: int) -> tuple[int, int] | None:
        request = self._request_of(epoch)
        if request is None:
            return None
        legs = request[1]
        return legs[-1].batch_size, sum(leg.batches for leg in legs)

    def _resume_point(self, num_workers: int) -> MixResume | None:
        """Where the loaded request resumes with ``num_workers`` (called only while one is loaded)."""
        if self._resume_request is None:
            raise RuntimeError("no resume state is loaded (a bug: please report it)")
        epoch, legs = self._resume_request
        key = max(1, num_workers)
        if key not in self._resume_points:
            self._resume_points[key] = plan_mixture_resume(
                self._sources(epoch), seed=self.seed, epoch=epoch, weights=self.weights, stop=self.stop, legs=legs,
                world_size=self.world_size, num_workers=key, pool_sizes=self.pool_sizes)
        return self._resume_points[key]

    def consumer_plan(self, world: World, epoch: int, *,
                      then_skip: int = 0) -> tuple[np.ndarray, list[Iterator[Step]]]:
        """One consumer's interleave order (the component of each sample it yields) and each
        component's steps, tabular-free; in the epoch a state was loaded for, what is left.
        ``then_skip``: samples to skip as well (what a per-consumer state says this consumer
        yielded, ``_runtime.position``)."""
        request = self._request_of(epoch)
        point = self._resume_point(world.num_workers) if request else None
        if request and point is None:
            return np.zeros(0, np.int64), [iter(()) for _ in self.components]
        leg = self._leg(point, epoch, world.num_workers)
        role, skip = point.role_for(world) if point else (world, 0)
        skip += then_skip
        consumer = leg.consumer(role)
        skips = consumer.counts_before(skip)
        return consumer.order()[skip:], [consumer.steps(i, skips[i]) for i in range(len(self.components))]

    def consumer_stream(self, world: World, epoch: int) -> ConsumerStream:
        """Open ``world``'s pass over ``epoch`` for a loader to pull (see ``_runtime.stream``); marks the
        epoch started."""
        self.shared_epoch.start(epoch)
        order, steps = self.consumer_plan(world, epoch, then_skip=self.position.begin(world, epoch))
        counts = np.bincount(order, minlength=len(self.components)).tolist()
        streams = [c.stream(s, count, epoch) for c, s, count in zip(self.components, steps, counts)]
        return MixtureStream(streams, order, renames=self.renames,
                             group_size=min(c.settings.decode_group_size for c in self.components),
                             finished=lambda: self.shared_epoch.finished(epoch), adapters=self.schema.adapters,
                             frames_in_place=self.schema.frames_in_place())

    def _components_state(self) -> list[dict[str, Any]]:
        return [{"seed": c.settings.seed, "shuffle": c.settings.shuffle, "fingerprint": c.fingerprint()}
                for c in self.components]

    def state_dict(self) -> dict[str, Any]:
        """A small JSON-serialisable state; the trainer adds ``batches_consumed``, ``batch_size``,
        ``num_workers`` and ``drop_last`` (``stream_state(loader, n)`` does) and passes it to
        ``load_state_dict`` on restart."""
        started = self.shared_epoch.started()
        epoch = self.shared_epoch.get() if started is None else started
        request = self._request_of(epoch)
        legs = request[1] if request is not None else ()
        return {"format": MIXTURE_STATE_FORMAT, "epoch": epoch, "seed": self.seed,
                "weights": None if self.weights is None else list(self.weights), "stop": self.stop,
                "world_size": self.world_size, "pool_sizes": list(self.pool_sizes),
                "legs": [leg.to_state() for leg in legs], "components": self._components_state(),
                "consumer": self.position.state(epoch)}

    def check_state(self, state: Mapping[str, Any], *, strict: bool = True) -> CheckedState:
        """Check ``state`` and work out where it resumes, changing nothing (``load_state_dict`` is
        this then ``apply_state``; ``EpisodeLoader`` checks its own settings in between)."""
        refuse_other_format(state, MIXTURE_STATE_FORMAT, "mixture")
        require_trainer_fields(state)
        self._check_matches(state, strict=strict)
        epoch = check_int("state['epoch']", state.get("epoch"), minimum=0)
        legs = self._trainer_legs(state)
        current, batch_size, batches = legs[-1], legs[-1].batch_size, state["batches_consumed"]
        try:
            point = plan_mixture_resume(self._sources(epoch), seed=self.seed, epoch=epoch, weights=self.weights,
                                        stop=self.stop, legs=legs, world_size=current.world_size,
                                        num_workers=current.num_workers, pool_sizes=current.pool_sizes)
        except BeyondEpochError as beyond:
            message = (f"state['batches_consumed']={batches} is more than epoch {epoch} of the mixture has "
                       f"({batches - current.batches + beyond.available} batches of {batch_size} per rank). "
                       f"It counts the batches taken in the saved epoch, not a global step.")
            if strict or beyond.leg_index != len(legs) - 1:
                raise ValueError(message) from None
            warnings.warn(message + " Treating the epoch as finished (strict=False).", RuntimeWarning, stacklevel=3)
            point = None
        return CheckedState(epoch, point is None, (epoch, legs), sum(leg.batches for leg in legs))

    def _trainer_legs(self, state: Mapping[str, Any]) -> tuple[MixLeg, ...]:
        """A trainer's state's legs: the saved ones, then the current one holding what
        ``batches_consumed`` (from the epoch's start) leaves (``chain_legs``), every field checked."""
        current = MixLeg(check_int("state['world_size']", state.get("world_size"), minimum=1),
                         check_int("state['num_workers']", state["num_workers"], minimum=0),
                         self._saved_pool_sizes(state), check_int("state['batch_size']", state["batch_size"], minimum=1),
                         0, check_bool("state['drop_last']", state.get("drop_last", False)))
        batches = check_int("state['batches_consumed']", state["batches_consumed"], minimum=0)
        return chain_legs(state, current, batches, MixLeg.from_state)

    def _check_matches(self, state: Mapping[str, Any], *, strict: bool) -> None:
        """``state``'s seed, weights, stop and components against this mixture's (``refuse_mismatches``)."""
        saved_components = state.get("components")
        if not isinstance(saved_components, list) or len(saved_components) != len(self.components):
            raise ValueError(f"state['components'] must list {len(self.components)} components (this mixture's), "
                             f"got {saved_components!r:.200}.")
        checks = [("seed", state.get("seed"), self.seed),
                  ("weights", state.get("weights"), None if self.weights is None else list(self.weights)),
                  ("stop", state.get("stop"), self.stop)]
        for i, (saved, now) in enumerate(zip(saved_components, self._components_state())):
            if not isinstance(saved, Mapping):
                raise ValueError(f"state['components'][{i}] must be a dict, got {saved!r:.200}.")
            checks += identity_checks(saved, seed=now["seed"], shuffle=now["shuffle"], fingerprint=now["fingerprint"],
                                      prefix=f"components[{i}].")
        refuse_mismatches(checks, state="mixture", what="mixture", strict=strict)

    def _saved_pool_sizes(self, state: Mapping[str, Any]) -> tuple[int, ...]:
        pools = state.get("pool_sizes")
        if not isinstance(pools, list) or len(pools) != len(self.components):
            raise ValueError(f"state['pool_sizes'] must list {len(self.components)} ints, got {pools!r:.200}.")
        return tuple(check_int(f"state['pool_sizes'][{i}]", p, minimum=1) for i, p in enumerate(pools))

    def saved_leg_batches(self, state: Mapping[str, Any]) -> int:
        return sum(leg.batches for leg in saved_legs(state, MixLeg.from_state))

    def position_under(self, state: Mapping[str, Any], world: World) -> tuple[int, int, int] | None:
        epoch = check_int("state['epoch']", state.get("epoch"), minimum=0)
        pools = self._saved_pool_sizes(state)
        legs = self._trainer_legs(state) if "batches_consumed" in state else saved_legs(state, MixLeg.from_state)
        sources = self._sources(epoch)
        point = (plan_mixture_resume(sources, seed=self.seed, epoch=epoch, weights=self.weights, stop=self.stop,
                                     legs=legs, world_size=world.world_size, num_workers=world.num_workers,
                                     pool_sizes=pools) if legs else None)
        if legs and point is None:
            return None
        counts = rank_counts([c.num_anchors() for c in self.components], world_size=world.world_size,
                             weights=self.weights, stop=self.stop)
        passes = initial_passes(sources, counts, world.world_size) if point is None else point.passes
        leg = LegPlan(sources, passes, seed=self.seed, epoch=epoch, leg=0 if point is None else point.leg_index,
                      world_size=world.world_size, num_workers=world.num_workers, pool_sizes=pools)
        role, skip = point.role_for(world) if point is not None else (world, 0)
        return role.worker, skip, leg.consumer(role).num_samples

    def load_consumer_state(self, state: Mapping[str, Any], *, strict: bool) -> None:
        """Resume one consumer from its own ``state_dict()`` (``position``): its next iteration, in
        the saved epoch, skips the samples it yielded on top of the legs that iteration continued."""
        refuse_other_format(state, MIXTURE_STATE_FORMAT, "mixture")
        self._check_matches(state, strict=strict)
        legs = saved_legs(state, MixLeg.from_state)
        def check(loaded: ConsumerPosition) -> None:
            check_consumer_epoch(state, loaded.epoch)
            self._check_consumer_share(state, loaded)

        loaded = self.position.load(state.get("consumer"), check=check)
        self.shared_epoch.set_resume_point(loaded.epoch)
        self._resume_request = (loaded.epoch, legs) if legs else None
        self._resume_points = {}
        self._legs = {}
        self._loaded_consumer_epoch(loaded.epoch)

    def apply_state(self, checked: CheckedState) -> None:
        """Make a ``check_state`` result the position the next iteration starts from."""
        request, done = checked.request, checked.finished
        # A state that took nothing of its epoch resumes nothing: the epoch streams afresh, in any layout.
        resumes = not done and checked.consumed_batches > 0
        self.shared_epoch.set_resume_point(request[0] if resumes else -1)
        self._resume_request = request if resumes else None
        self._resume_points = {}
        self._legs = {}
        self._loaded_epoch(request[0] + 1 if done else request[0])
