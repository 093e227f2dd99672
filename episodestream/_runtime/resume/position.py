"""Where this process's own iteration of a streaming dataset stands, for ``state_dict()`` to carry.

torchdata's ``StatefulDataLoader`` snapshots ``dataset.state_dict()`` inside each consumer (the
main process with ``num_workers=0``, else every worker after each batch it makes) and, on resume,
hands each consumer its own snapshot: ``dataset.load_state_dict(snapshot)`` in that process, then
``iter(dataset)``. So a state must say, per consumer, how many samples its iteration has yielded:
``state["consumer"]`` = ``{"epoch", "rank", "world_size", "worker", "num_workers", "samples_yielded"}``.

Loading such a state (one without the trainer's ``batches_consumed``; ``dataset.state_dict()``
itself is one) writes its position into the shared resume record (``resume.record``); the next
iteration of the same consumer, in the same epoch, reads it at its claim and skips those samples,
tabular-free, on top of whatever resume that iteration itself continued (the state's ``legs``). It
resumes the same consumer only: a DataLoader worker cannot know what its siblings yielded, so another
worker count (or rank count) is refused with what to use instead: ``load_loader_state``, which reads
every worker's snapshot before the workers start (``_runtime.resume.loader_state``), or ``stream_state``,
which counts batches; both resume elastically.

Inside a DataLoader worker the loaded state is that worker's own entry of the record and names the
epoch (a new process's shared counter still reads 0): the worker claims no epoch from the counter
(``SharedEpoch.claim``), and the counter moves past the epoch when the workers finish it.
"""

from __future__ import annotations

from episodestream._base.world import World
from episodestream._plan.saved_state import ConsumerPosition
from episodestream._runtime.resume.record import Loaded


class StreamPosition:
    """One dataset copy's position: the consumer its current iteration is, the epoch and what it yielded."""

    def __init__(self) -> None:
        self._world: World | None = None
        self._epoch = -1
        self.samples_yielded = 0

    def state(self, epoch: int, loaded: Loaded | None = None) -> ConsumerPosition:
        """This process's consumer in ``epoch`` (the one a checkpoint names) and what it yielded; before it
        iterates ``epoch``, the position ``loaded`` (the record's entry for ``epoch``) holds, if any."""
        if self._world is not None and self._epoch == epoch:
            world, count = self._world, self.samples_yielded
        elif loaded is not None and loaded.consumer is not None and loaded.consumer.epoch == epoch:
            return loaded.consumer  # loaded, not iterated yet: the same position again
        else:
            world, count = World(rank=0, world_size=1), 0
        return ConsumerPosition(epoch, world.rank, world.world_size, world.worker, world.num_workers, count)

    def begin(self, world: World, epoch: int, loaded: ConsumerPosition | None) -> int:
        """An iteration of ``world`` over ``epoch`` starts, continuing ``loaded`` (its claim's position, if
        any): how many of its samples to skip."""
        self._world, self._epoch, self.samples_yielded = world, epoch, 0
        if loaded is None or loaded.epoch != epoch:
            return 0
        if not loaded.same_consumer(world):
            raise ValueError(
                f"The loaded state is consumer {loaded.worker} of {loaded.num_workers} (rank {loaded.rank} of "
                f"{loaded.world_size}) in epoch {epoch}, but this iteration is consumer {world.worker} of "
                f"{world.num_workers} (rank {world.rank} of {world.world_size}). A per-consumer state (what "
                f"dataset.state_dict() and StatefulDataLoader save) resumes the same num_workers and world size "
                f"only; to change them, load a StatefulDataLoader's state with episodestream.load_loader_state("
                f"loader, state), or save stream_state(loader, batches_consumed): both resume elastically.")
        self.samples_yielded = loaded.samples_yielded
        return loaded.samples_yielded
