"""Where this process's own iteration of a streaming dataset stands, for ``state_dict()`` to carry.

torchdata's ``StatefulDataLoader`` snapshots ``dataset.state_dict()`` inside each consumer (the
main process with ``num_workers=0``, else every worker after each batch it makes) and, on resume,
hands each consumer its own snapshot: ``dataset.load_state_dict(snapshot)`` in that process, then
``iter(dataset)``. So a state must say, per consumer, how many samples its iteration has yielded:
``state["consumer"]`` = ``{"epoch", "rank", "world_size", "worker", "num_workers", "samples_yielded"}``.

Loading such a state (one without the trainer's ``batches_consumed``; ``dataset.state_dict()``
itself is one) makes the next iteration of the same consumer, in the same epoch, skip those samples,
tabular-free, on top of whatever resume that iteration itself continued (the state's ``legs``). It
resumes the same consumer only: a DataLoader worker cannot know what its siblings yielded, so another
worker count (or rank count) is refused with what to use instead: ``load_loader_state``, which reads
every worker's snapshot before the workers start (``_runtime.resume.loader_state``), or ``stream_state``,
which counts batches; both resume elastically.

In a DataLoader worker the loaded state also names the epoch (a new process's shared counter still
reads 0); all of that iteration's workers get their snapshot, so none of them claims an epoch from
the counter (``SharedEpoch.claim``), and the counter moves past the epoch when they finish it.

States: NONE (nothing loaded) -> PENDING (``load``) -> NONE (the matching iteration starts and
takes the skip, or another epoch starts: the state no longer applies).
"""

from __future__ import annotations

from episodestream._base.world import World
from episodestream._plan.saved_state import ConsumerPosition
from episodestream._runtime.placement import in_dataloader_worker


class StreamPosition:
    """One dataset copy's position: its current iteration's count, and a loaded one still to apply."""

    def __init__(self) -> None:
        self._world: World | None = None
        self._epoch = -1
        self.samples_yielded = 0
        self._pending: ConsumerPosition | None = None

    def state(self, epoch: int) -> ConsumerPosition:
        """This process's consumer in ``epoch`` (the one a checkpoint names) and what it yielded."""
        if self._world is not None and self._epoch == epoch:
            world, count = self._world, self.samples_yielded
        elif self._pending is not None and self._pending.epoch == epoch:
            return self._pending  # loaded, not iterated yet: the same position again
        else:
            world, count = World(rank=0, world_size=1), 0
        return ConsumerPosition(epoch, world.rank, world.world_size, world.worker, world.num_workers, count)

    def load(self, loaded: ConsumerPosition) -> None:
        """Make ``loaded`` (a checked state's consumer) the pending position."""
        self._pending = loaded

    def pending_epoch(self) -> int | None:
        """In a DataLoader worker, the epoch a loaded state resumes (see the module docstring)."""
        if self._pending is None or not in_dataloader_worker():
            return None
        return self._pending.epoch

    def begin(self, world: World, epoch: int) -> int:
        """An iteration of ``world`` over ``epoch`` starts: how many of its samples to skip."""
        self._world, self._epoch, self.samples_yielded = world, epoch, 0
        pending, self._pending = self._pending, None
        if pending is None or pending.epoch != epoch:
            return 0
        if not pending.same_consumer(world):
            raise ValueError(
                f"The loaded state is consumer {pending.worker} of {pending.num_workers} (rank {pending.rank} of "
                f"{pending.world_size}) in epoch {epoch}, but this iteration is consumer {world.worker} of "
                f"{world.num_workers} (rank {world.rank} of {world.world_size}). A per-consumer state (what "
                f"dataset.state_dict() and StatefulDataLoader save) resumes the same num_workers and world size "
                f"only; to change them, load a StatefulDataLoader's state with episodestream.load_loader_state("
                f"loader, state), or save stream_state(loader, batches_consumed): both resume elastically.")
        self.samples_yielded = pending.samples_yielded
        return pending.samples_yielded
