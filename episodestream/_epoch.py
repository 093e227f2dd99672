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

_NEXT, _STARTED = 0, 1  # slots: the epoch the next iteration streams; the latest one started (-1: none)


class SharedEpoch:
    def __init__(self, epoch: int = 0) -> None:
        self._shared = sharedctypes.RawArray("q", [epoch, -1])
        self._local = [epoch, -1]

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
        self._local = [epoch, -1]

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
