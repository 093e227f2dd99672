"""The epoch counter shared by the process that built a dataset and its DataLoader workers.

DataLoader workers iterate copies of the dataset, so an epoch counter advanced inside a worker
would be lost when the workers are re-created for the next epoch; and ``set_epoch`` in the main
process would not reach persistent workers. A few bytes of shared memory fix both. The counter
also remembers which epoch the latest iteration started, which is what a checkpoint taken while
the trainer consumes batches refers to (see ``streaming.state_dict``).
"""

from __future__ import annotations

from multiprocessing import sharedctypes
from multiprocessing.context import get_spawning_popen

# Slots: the epoch the next iteration streams; the latest one started (-1: none); the key of the
# DataLoader iteration that last claimed an epoch, and that epoch.
_NEXT, _STARTED, _ITERATION_KEY, _ITERATION_EPOCH = 0, 1, 2, 3


class SharedEpoch:
    def __init__(self, epoch: int = 0) -> None:
        self._shared = sharedctypes.RawArray("q", [epoch, -1, -1, -1])
        self._local = [epoch, -1, -1, -1]

    def _slots(self):
        return self._shared if self._shared is not None else self._local

    def get(self) -> int:
        """The epoch the next iteration streams."""
        return self._slots()[_NEXT]

    def started(self) -> int | None:
        """The epoch of the latest iteration that started, if any."""
        value = self._slots()[_STARTED]
        return None if value < 0 else value

    def set(self, epoch: int) -> None:
        self._slots()[_NEXT] = epoch
        self._slots()[_STARTED] = -1
        self._local = [epoch, -1, -1, -1]

    def claim(self, iteration_key: int) -> int:
        """The epoch of the DataLoader iteration ``iteration_key`` (the same for all its workers).

        A worker must not read the counter on its own: a worker that starts late could see it
        already advanced by a sibling that finished its whole share. The first worker of an
        iteration pins the epoch under the iteration's key; the others find it there. Workers of
        one iteration read the same counter value before any of them can finish, so a race
        between two first claims writes the same epoch twice.
        """
        slots = self._slots()
        if slots[_ITERATION_KEY] != iteration_key:
            slots[_ITERATION_EPOCH] = slots[_NEXT]
            slots[_ITERATION_KEY] = iteration_key
        return slots[_ITERATION_EPOCH]

    def start(self, epoch: int) -> None:
        self._slots()[_STARTED] = epoch

    def finished(self, epoch: int) -> None:
        """Called by every consumer that reaches the end of ``epoch``; advances the counter once.

        Every worker of the epoch writes the same value, so concurrent calls need no lock.
        """
        if self.get() == epoch:
            self._slots()[_NEXT] = epoch + 1

    def __getstate__(self) -> dict:
        # Shared memory can travel only to a process being started (DataLoader workers, fork or
        # spawn); a plain pickle or deepcopy gets a private counter at the current values.
        if get_spawning_popen() is not None:
            return {"shared": self._shared, "local": list(self._slots())}
        return {"shared": None, "local": list(self._slots())}

    def __setstate__(self, state: dict) -> None:
        self._shared, self._local = state["shared"], state["local"]
