"""An epoch counter shared by the process that built a dataset and its DataLoader workers.

DataLoader workers iterate copies of the dataset, so an epoch counter advanced inside a worker
would be lost when the workers are re-created for the next epoch; and ``set_epoch`` in the main
process would not reach persistent workers. A few bytes of shared memory fix both.
"""

from __future__ import annotations

from multiprocessing import sharedctypes
from multiprocessing.context import get_spawning_popen


class SharedEpoch:
    def __init__(self, epoch: int = 0) -> None:
        self._shared = sharedctypes.RawValue("q", epoch)
        self._local = epoch

    def get(self) -> int:
        return self._shared.value if self._shared is not None else self._local

    def set(self, epoch: int) -> None:
        if self._shared is not None:
            self._shared.value = epoch
        self._local = epoch

    def finished(self, epoch: int) -> None:
        """Called by every consumer that reaches the end of ``epoch``; advances the counter once.

        Every worker of the epoch writes the same value, so concurrent calls need no lock.
        """
        if self.get() == epoch:
            self.set(epoch + 1)

    def __getstate__(self) -> dict:
        # Shared memory can travel only to a process being started (DataLoader workers, fork or
        # spawn); a plain pickle or deepcopy gets a private counter at the current value.
        if get_spawning_popen() is not None:
            return {"shared": self._shared, "local": self._local}
        return {"shared": None, "local": self.get()}

    def __setstate__(self, state: dict) -> None:
        self._shared, self._local = state["shared"], state["local"]

