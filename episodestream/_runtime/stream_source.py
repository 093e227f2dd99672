"""The package-internal component API: what loaders and mixtures drive.

A public streaming class (``EpisodeStreamingDataset``, ``EpisodeMixture``) is a face: it checks its
arguments and holds one ``StreamSource``, its runtime. ``EpisodeLoader`` and ``EpisodeMixture`` reach
a face's runtime only through ``source_of``, never through its privates, and the faces keep their
public surface to what users call (iterate, ``len``, ``set_epoch``, ``state_dict`` /
``load_state_dict``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from episodestream._base.world import World
from episodestream._runtime.epoch import SharedEpoch
from episodestream._runtime.placement import in_dataloader_worker
from episodestream._plan.saved_state import check_consumer_share
from episodestream._runtime.position import ConsumerPosition, StreamPosition
from episodestream._runtime.stream import CheckedState, ConsumerStream


class StreamSource(ABC):
    """One streaming face's runtime: its epoch, its consumers' streams and its resume position."""

    rank: int
    world_size: int

    @property
    @abstractmethod
    def epoch(self) -> int:
        """The epoch the next iteration streams."""

    @abstractmethod
    def set_epoch(self, epoch: int) -> None: ...

    @abstractmethod
    def num_samples(self) -> int:
        """Samples this rank yields in the next iteration (what ``len(face)`` says)."""

    @abstractmethod
    def consumer_stream(self, world: World, epoch: int) -> ConsumerStream:
        """Open ``world``'s pass over ``epoch`` (from the resume point in a resumed epoch), marking
        the epoch started."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]: ...

    @abstractmethod
    def check_state(self, state: Mapping[str, Any], *, strict: bool = True) -> CheckedState:
        """Validate ``state`` and work out where it resumes, changing nothing."""

    @abstractmethod
    def apply_state(self, checked: CheckedState) -> None:
        """Make ``check_state``'s result the position the next iteration starts from."""

    loads_seen: int  # resume states loaded into this runtime (a position counted before a load is stale)
    position: StreamPosition  # this copy's own iteration, for ``state_dict()["consumer"]``
    shared_epoch: SharedEpoch  # the epoch counter this runtime's copies (main process, workers) share

    def _loaded_epoch(self, epoch: int) -> None:
        """A load is done: ``epoch`` is the one the next iteration streams, and positions counted
        before the load are stale."""
        self.shared_epoch.set(epoch)
        self.loads_seen = self.shared_epoch.state_loaded()

    def _loaded_consumer_epoch(self, epoch: int) -> None:
        """``_loaded_epoch`` after a per-consumer load, in the main process only: workers started
        later copy it, and a worker given its own snapshot reads its epoch from it (``position``)."""
        if not in_dataloader_worker():
            self._loaded_epoch(epoch)

    def _check_consumer_share(self, state: Mapping[str, Any], loaded: ConsumerPosition) -> None:
        """A per-consumer ``state``'s ``samples_yielded`` fits the share its consumer streams under the
        state's legs (``position_under``): beyond it, the state would load and stream nothing."""
        world = World(rank=loaded.rank, world_size=loaded.world_size, worker=loaded.worker,
                      num_workers=loaded.num_workers)
        where = self.position_under(state, world)
        left = 0 if where is None else where[2] - where[1]
        check_consumer_share(loaded.samples_yielded, left, epoch=loaded.epoch,
                             who=f"consumer {loaded.worker} of {loaded.num_workers} (rank {loaded.rank} of "
                                 f"{loaded.world_size})")

    @abstractmethod
    def load_consumer_state(self, state: Mapping[str, Any], *, strict: bool) -> None:
        """Resume one consumer from its own ``state_dict()`` (``position``): its next iteration."""

    @abstractmethod
    def position_under(self, state: Mapping[str, Any], world: World) -> tuple[int, int, int] | None:
        """Where ``world`` (a rank, a worker and their counts) starts its iteration under ``state``
        (a trainer's state; or a per-consumer one, of which only its legs count): the worker role
        it plays, the samples of that role's share consumed before it, and the share's size. None
        when ``state`` consumed the whole epoch. Checks a StatefulDataLoader state (``loader_state``)."""

    @abstractmethod
    def saved_leg_batches(self, state: Mapping[str, Any]) -> int:
        """The batches of ``state['legs']`` (the epoch's earlier legs), every leg checked."""

    @abstractmethod
    def resumed_batches(self, epoch: int) -> tuple[int, int] | None:
        """For a loaded state whose ``epoch`` is ahead: (its batch size, the batches it consumed of
        ``epoch``, counted from the epoch's start across legs); None otherwise."""


class StreamingFace:
    """The base of the public classes that stream: they hold their runtime here."""

    _source: StreamSource


def source_of(face: object, *, needs: str = "EpisodeLoader needs") -> StreamSource:
    """``face``'s runtime; for anything that does not stream, a ``TypeError`` that starts with ``needs``."""
    if not isinstance(face, StreamingFace):
        raise TypeError(f"{needs} an EpisodeStreamingDataset (or another stream source, such as an "
                        f"EpisodeMixture), got {type(face).__name__}.")
    return face._source
