"""How a streaming runtime (a dataset's, a mixture's) saves, checks and applies resume states: written
once here for both, over a small protocol each implements.

Where things happen (docs/resume.md):
- a state is parsed where it enters (``parse``: ``_plan.saved_state.parse_state`` with the
  runtime's ``state_spec``), into the one ``SavedState`` type, every field checked; what follows
  reads only that. ``state_dict()`` writes one (``saved_state().to_state``);
- a parsed state is checked against this runtime (identity, the epoch's batches, a consumer's share)
  by ``check_state`` (a trainer's) or ``load_consumer_state`` (a per-consumer one), and
  ``position_under`` says where any layout stands under it (for ``_runtime.resume.loader_state``'s torchdata
  conversion); the legs' arithmetic is ``_plan.resume``'s and ``_plan.mixing``'s;
- a checked state is applied by ``apply_state`` / ``load_consumer_state``: it is written into the
  dataset's shared block as the loaded request (``resume.record``: the epoch, its legs, a consumer's
  position), which every consumer's ``iter()`` reads once when it claims its epoch (``claim``:
  ``resume.epoch.SharedEpoch.claim``) and the pass then plans from; the record's lifecycle (until that
  pass ran to its end or another epoch was selected) is ``resume.epoch.TRANSITIONS``, the same for the
  main process and every DataLoader worker (forked, spawned or persistent).

The protocol (what differs between a dataset and a mixture): what its states look like
(``state_spec``) and what identifies its stream now (``_identity``), its pool sizes (``pools``),
where an epoch restarts after some legs (``_plan_point``: ``_plan.resume`` or ``_plan.mixing``), and
where a consumer stands from there (``_world_position``).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from episodestream._base.warn import warn_user
from episodestream._base.world import World
from episodestream._plan.resume import BeyondEpochError, Leg
from episodestream._plan.saved_state import (TRAINER_FIELDS, SavedState, StateSpec, check_consumer_share,
                                             identity_differences, lacks_trainer_field, parse_state,
                                             refuse_mismatches)
from episodestream._runtime.placement import current_world, in_dataloader_worker
from episodestream._runtime.resume.epoch import LOADED, OWN, Claim, SharedEpoch
from episodestream._runtime.resume.record import Loaded, LoadedRequest
from episodestream._runtime.private_apis import TORCHDATA_KEYS
from episodestream._runtime.resume.position import StreamPosition
from episodestream._runtime.stream import CheckedState

logger = logging.getLogger("episodestream")

_POINTS_KEPT = 16  # resume points (``_plan_point``) memoised per copy, by request and consumer count


class Resumable(ABC):
    """The resume half of a streaming runtime (``StreamRuntime``)."""

    state_what: ClassVar[str]  # "dataset", "mixture": what errors call the runtime

    rank: int
    world_size: int
    shared_epoch: SharedEpoch  # the shared block this runtime's copies (main process, workers) share
    position: StreamPosition  # this copy's own iteration, for ``state_dict()["consumer"]``

    # -- the protocol -----------------------------------------------------------------------------

    @property
    @abstractmethod
    def state_spec(self) -> StateSpec:
        """What this runtime's states look like (``_plan.saved_state``)."""

    @property
    @abstractmethod
    def pools(self) -> tuple[int, ...]:
        """This runtime's episode pool size per component (a dataset: one)."""

    @abstractmethod
    def _identity(self) -> dict[str, Any]:
        """What identifies this stream, as ``state_dict()`` saves it (``state_spec.identity``'s fields)."""

    @abstractmethod
    def _request(self, saved: SavedState, legs: tuple[Leg, ...]) -> LoadedRequest:
        """``saved``'s epoch and ``legs`` as the request this runtime replays (its saved seed, shuffle)."""

    @abstractmethod
    def _plan_point(self, request: LoadedRequest, *, world_size: int, num_workers: int,
                    pools: tuple[int, ...]) -> Any:
        """Where ``request``'s epoch restarts for that layout; None when its legs consumed it all.
        Raises ``BeyondEpochError`` when a leg claims more batches than it had."""

    @abstractmethod
    def _world_position(self, epoch: int, point: Any, world: World, pools: tuple[int, ...]) -> tuple[int, int, int]:
        """For ``world`` in ``epoch`` from ``point`` (None: the epoch's start): the worker role it
        plays, the samples of that role's share consumed before it, and the share's size."""

    # -- the loaded request, as the shared record holds it ------------------------------------------

    def _init_resume(self) -> None:
        # A memo of ``_plan_point`` by (request, consumers): what it holds follows from the key alone.
        self._points: dict[tuple[LoadedRequest, int], Any] = {}

    def _this_worker(self) -> int | None:
        """This process's DataLoader worker number (None: the main process), whose entry lookups read."""
        return current_world(self.rank, self.world_size).worker if in_dataloader_worker() else None

    def _loaded(self, epoch: int) -> Loaded | None:
        """The record's entry that this process's lookups of ``epoch`` read (``SharedEpoch.loaded``)."""
        return self.shared_epoch.loaded(epoch, self._this_worker())

    def _loaded_request(self, epoch: int) -> LoadedRequest | None:
        """The loaded request of ``epoch`` while the record holds it (see the module docstring)."""
        loaded = self._loaded(epoch)
        return None if loaded is None else loaded.request

    def loads(self) -> int:
        """How many states were loaded into this runtime (``resume.record.Record.loads``)."""
        return self.shared_epoch.loads()

    def claim(self, world: World) -> Claim:
        """``world``'s iteration: its epoch and what it resumes, read once from the record."""
        return self.shared_epoch.claim(world.worker if in_dataloader_worker() else None, world.num_workers)

    def _point(self, request: LoadedRequest, num_workers: int) -> Any:
        """Where ``request`` resumes with ``num_workers``."""
        key = (request, max(1, num_workers))
        if key not in self._points:
            if len(self._points) >= _POINTS_KEPT:
                self._points.clear()
            self._points[key] = self._plan_point(request, world_size=self.world_size, num_workers=key[1],
                                                 pools=self.pools)
        return self._points[key]

    def resumed_batches(self, epoch: int) -> tuple[int, int] | None:
        """For a loaded state of ``epoch`` still to resume: (its batch size, the batches it consumed
        of ``epoch``, counted from the epoch's start across legs); None otherwise."""
        request = self._loaded_request(epoch)
        if request is None:
            return None
        return request.legs[-1].batch_size, sum(leg.batches for leg in request.legs)

    # -- saving and parsing ------------------------------------------------------------------------

    def saved_state(self) -> SavedState:
        """Where this copy stands, as the state ``state_dict()`` saves (per consumer)."""
        started = self.shared_epoch.started()
        epoch = self.shared_epoch.get() if started is None else started
        request = self._loaded_request(epoch)
        # The legs this epoch was resumed from; a load tells from the trainer's num_workers whether
        # the saving run continued the last of them or started a new one.
        return SavedState(format=self.state_spec.format, epoch=epoch, identity=self._identity(),
                          world_size=self.world_size, pools=self.pools,
                          legs=request.legs if request is not None else (),
                          consumer=self.position.state(epoch, self._loaded(epoch)))

    def state_dict(self) -> dict[str, Any]:
        return self.saved_state().to_state(self.state_spec)

    def parse(self, state: Any) -> SavedState:
        """``state`` (a trainer's or a per-consumer state, as saved) parsed, every field checked: the
        one place the three formats are told apart (a StatefulDataLoader's whole state is refused,
        saying how to load it: ``_runtime.resume.loader_state`` converts it)."""
        if is_loader_state(state):
            raise ValueError(f"This is a StatefulDataLoader's state (loader.state_dict()), not the "
                             f"{self.state_what}'s: load it with loader.load_state_dict(state), or with "
                             f"episodestream.load_loader_state(loader, state), which also resumes another "
                             f"num_workers.")
        return parse_state(state, self.state_spec)

    def _refuse_other_stream(self, saved: SavedState, strict: bool) -> None:
        refuse_mismatches(identity_differences(saved.identity, self._identity()), state=self.state_spec.kind,
                          what=self.state_what, strict=strict)

    def position_under(self, saved: SavedState, world: World) -> tuple[int, int, int] | None:
        """Where ``world`` (a rank, a worker and their counts) starts its iteration under ``saved``
        (a trainer's state; or a per-consumer one, of which only its legs count): the worker role
        it plays, the samples of that role's share consumed before it, and the share's size. None
        when ``saved`` consumed the whole epoch."""
        legs = saved.trainer_legs() if saved.trainer is not None else saved.legs
        request = self._request(saved, legs) if legs else None
        point = (self._plan_point(request, world_size=world.world_size, num_workers=world.num_workers,
                                  pools=saved.pools) if request is not None else None)
        if request is not None and point is None:
            return None
        return self._world_position(saved.epoch, point, world, saved.pools)

    # -- a trainer's state ------------------------------------------------------------------------

    def check_state(self, saved: SavedState, *, strict: bool = True) -> CheckedState:
        """Check a trainer's state against this runtime and work out where it resumes, changing nothing."""
        if saved.trainer is None:  # a per-consumer state: no batches_consumed
            raise lacks_trainer_field(TRAINER_FIELDS[0])
        self._refuse_other_stream(saved, strict)
        request = self._request(saved, saved.trainer_legs())
        current, batches = request.legs[-1], saved.trainer.batches_consumed
        try:
            point = self._plan_point(request, world_size=current.world_size, num_workers=current.num_workers,
                                     pools=current.pools)
        except BeyondEpochError as beyond:
            earlier = batches - current.batches
            message = (f"state['batches_consumed']={batches} is more than epoch {saved.epoch} has: "
                       f"{earlier + beyond.available} batches of {current.batch_size} per rank"
                       + (f" ({earlier} in earlier legs)" if earlier else "")
                       + ". It counts the batches taken in the saved epoch, not a global step.")
            if strict or beyond.leg_index != len(request.legs) - 1:
                raise ValueError(message) from None
            warn_user(message + " Treating the epoch as finished (strict=False).", RuntimeWarning)
            point = None
        return CheckedState(saved.epoch, point is None, request, batches)

    def apply_state(self, checked: CheckedState, *, num_workers: int | None = None) -> None:
        """Make ``check_state``'s result the position the next iteration starts from, and log what it
        resumes once that is known. Whether a mid-epoch state resumes exactly or elastically depends on
        the consumers that iterate, so the line is logged by the first of them (``_announce_resume``),
        unless the caller says who they will be (``num_workers``: a trainer that builds its DataLoader
        itself); a finished epoch or one that took nothing resumes the same for any consumers."""
        request: LoadedRequest = checked.request
        logged_now = checked.finished or not checked.consumed_batches or num_workers is not None
        if checked.finished:
            self.shared_epoch.load(None, request.epoch + 1)
        elif not checked.consumed_batches:
            # A state that took nothing of its epoch resumes nothing: the epoch streams afresh, in any layout.
            self.shared_epoch.load(None, request.epoch)
        else:
            self.shared_epoch.load(Loaded(LOADED, request.epoch, request,
                                          announce=None if logged_now else checked.consumed_batches), request.epoch)
        if logged_now:
            if logger.isEnabledFor(logging.INFO):  # an elastic count replays the legs: not when nobody reads it
                logger.info("%s", self._resumed(checked, num_workers))
        else:
            logger.debug("loaded a state of epoch %d after batch %d: the first iteration logs whether it resumes "
                         "exactly", request.epoch, checked.consumed_batches)

    def _announce_resume(self, world: World, claim: Claim) -> None:
        """Log what the loaded trainer's state resumes, now that its consumers are known: called as
        ``world`` opens a pass over ``claim``'s epoch, at each pass that claims the loaded request (a pass
        stopped early leaves it in place). The main process's pass (EpisodeLoader, a DataLoader without workers)
        logs it; under a DataLoader with workers, worker 0 of each rank does, in its own process (seen
        where the workers inherit the trainer's logging set-up, as forked workers do)."""
        if claim.announce is None or claim.request is None or world.worker != 0:
            return
        checked = CheckedState(claim.epoch, False, claim.request, claim.announce)
        if logger.isEnabledFor(logging.INFO):
            logger.info("%s", self._resumed(checked, world.num_workers))

    def _resumed(self, checked: CheckedState, num_workers: int | None) -> str:
        """What the loaded state resumes, in a line: "resumed epoch E at batch B (exact; ...)", or
        elastic with the samples left to this rank, for ``num_workers`` consumers per rank (0 or 1: one;
        None only for a finished epoch or one that took nothing, which any consumers resume alike)."""
        request: LoadedRequest = checked.request
        epoch, saved = request.epoch, request.legs[-1]
        if checked.finished:
            return f"resumed after epoch {epoch}, which the state had finished: epoch {epoch + 1} streams next"
        if not checked.consumed_batches:
            return f"resumed epoch {epoch} at batch 0: the epoch streams from its start"
        workers = saved.num_workers if num_workers is None else num_workers
        layout = f"{self.world_size} rank(s) x {max(1, workers)} consumer(s)"
        if saved.same_stream(Leg(self.world_size, workers, self.pools, saved.batch_size, 0)):
            return f"resumed epoch {epoch} at batch {checked.consumed_batches} (exact; {layout})"
        point = self._point(request, workers)
        left = 0 if point is None else sum(
            size - skip for _, skip, size in (
                self._world_position(epoch, point, World(self.rank, self.world_size, worker, max(1, workers)), self.pools)
                for worker in range(max(1, workers))))
        return (f"resumed epoch {epoch} after batch {checked.consumed_batches}, elastic: {left} samples left for "
                f"rank {self.rank} ({layout} now; saved with {saved.world_size} rank(s) x {saved.workers} "
                f"consumer(s), pools {list(saved.pools)})")

    # -- a per-consumer state ---------------------------------------------------------------------

    def load_consumer_state(self, saved: SavedState, *, strict: bool) -> None:
        """Resume one consumer from its own ``state_dict()`` (``position``): its next iteration, in the
        saved epoch, skips the samples it yielded on top of the legs that iteration continued."""
        loaded = saved.consumer
        if loaded is None:
            raise ValueError("a trainer's state is not a per-consumer one (a bug: please report it)")
        self._refuse_other_stream(saved, strict)
        # Within its share under the state's legs: beyond it, the state would load and stream nothing.
        world = World(rank=loaded.rank, world_size=loaded.world_size, worker=loaded.worker,
                      num_workers=loaded.num_workers)
        where = self.position_under(saved, world)
        left = 0 if where is None else where[2] - where[1]
        check_consumer_share(loaded.samples_yielded, left, epoch=loaded.epoch,
                             who=f"consumer {loaded.worker} of {loaded.num_workers} (rank {loaded.rank} of "
                                 f"{loaded.world_size})")
        request = self._request(saved, saved.legs) if saved.legs else None
        # Its own line below: a trainer's state loaded before (and its line) is replaced. Inside a DataLoader
        # worker (torchdata hands each its own snapshot) the entry is that worker's, and the shared counter
        # stays the main process's to move.
        if in_dataloader_worker():
            self.shared_epoch.load_own(current_world(self.rank, self.world_size).worker,
                                       Loaded(OWN, loaded.epoch, request, consumer=loaded))
        else:
            self.shared_epoch.load(Loaded(LOADED, loaded.epoch, request, consumer=loaded), loaded.epoch)
        # In each DataLoader worker torchdata hands its snapshot to: one line per consumer.
        logger.info("resumed epoch %d for consumer %d of %d (rank %d of %d) after %d sample(s) it yielded (exact: its "
                    "own state, as StatefulDataLoader saved it)", loaded.epoch, loaded.worker, loaded.num_workers,
                    loaded.rank, loaded.world_size, loaded.samples_yielded)


def is_loader_state(state: Any) -> bool:
    """A StatefulDataLoader's ``state_dict()`` (multi-process or single-process layout)."""
    # Told by the verified layout's keys: no torchdata import just to see what a state is.
    return isinstance(state, Mapping) and (TORCHDATA_KEYS["snapshot"] in state or TORCHDATA_KEYS["single_yielded"] in state)
