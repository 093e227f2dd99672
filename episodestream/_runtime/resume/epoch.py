"""The epoch counter shared by the process that built a dataset and its DataLoader workers.

DataLoader workers iterate copies of the dataset, so an epoch counter advanced inside a worker
would be lost when the workers are re-created for the next epoch; and ``set_epoch`` in the main
process would not reach persistent workers. A few bytes of shared memory fix both. The counter
also remembers which epoch the latest iteration started, which is what a checkpoint taken while
the trainer consumes batches refers to (see ``streaming.state_dict``).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any
from multiprocessing import sharedctypes
from multiprocessing.context import get_spawning_popen

# Slots: the epoch the next iteration streams; the latest one started (-1: none); the epoch of the
# DataLoader iteration whose workers are still claiming, how many of its workers have not claimed
# yet, and how many it has; how many times a resume state was loaded; how many of the claimed
# iteration's workers have not run their share to its end; how many DataLoader iterations claimed an
# epoch so far (numbering them: ``claimed_iteration``); the epoch of the live resume point (-1: none;
# see ``resume_point``).
(_NEXT, _STARTED, _CLAIM_EPOCH, _CLAIMS_LEFT, _CLAIM_WORKERS, _LOADS, _FINISHES_LEFT, _ITERATIONS,
 _RESUME) = range(9)
_INITIAL = (0, -1, -1, 0, 0, 0, 0, 0, -1)


class SharedEpoch:
    def __init__(self, epoch: int = 0) -> None:
        initial = [epoch, *_INITIAL[1:]]
        self._shared = sharedctypes.RawArray("q", initial)
        # A spawn-context lock: DataLoader workers started with "spawn" or "forkserver" (LeRobot's
        # trainer asks for spawn) receive it pickled, which a fork-context lock refuses; forked
        # workers inherit it either way.
        self._lock = multiprocessing.get_context("spawn").Lock()
        self._local = list(initial)
        self.claimed_iteration: int | None = None  # this copy's DataLoader iteration (``claim``)

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
        """Select ``epoch`` for the next iteration; selecting another epoch than a live resume
        point's ends that resume point (``resume_point``)."""
        with self._locked():
            slots = self._slots()
            slots[_NEXT], slots[_STARTED], slots[_CLAIMS_LEFT] = epoch, -1, 0
            if slots[_RESUME] != epoch:
                slots[_RESUME] = -1
            self._local = [epoch, -1, -1, 0, 0, slots[_LOADS], 0, slots[_ITERATIONS], slots[_RESUME]]

    def claim(self, num_workers: int) -> int:
        """The epoch of the DataLoader iteration this worker belongs to (the same for all its workers).

        A worker must not read the counter on its own: a worker that starts late could see it
        already advanced by a sibling that finished its whole share. Every DataLoader worker calls
        ``iter(dataset)`` exactly once per iteration (when it starts, or when a persistent worker
        is told a new iteration began), so the first claim of an iteration pins the epoch and the
        next ``num_workers - 1`` claims read it. Nothing here depends on how the DataLoader seeds
        its workers (a DataLoader built each epoch with a fixed generator repeats its seeds).
        The iteration's number (the same for all its workers, new for each iteration) is left in
        ``claimed_iteration``.
        """
        with self._locked():
            slots = self._slots()
            if slots[_CLAIMS_LEFT] <= 0 or slots[_CLAIM_WORKERS] != num_workers:
                slots[_CLAIM_EPOCH], slots[_CLAIMS_LEFT], slots[_CLAIM_WORKERS] = slots[_NEXT], num_workers, num_workers
                slots[_FINISHES_LEFT] = num_workers
                slots[_ITERATIONS] += 1
            slots[_CLAIMS_LEFT] -= 1
            self.claimed_iteration = slots[_ITERATIONS]
            return slots[_CLAIM_EPOCH]

    def for_iteration(self, loads_seen: int, what: str) -> int:
        """The epoch an ``iter()`` streams: the counter in the main process; in a DataLoader worker
        its iteration's ``claim``, unless a resume state was loaded since this copy of ``what``
        (the dataset, the mixture) was made (``loads_seen``): ``StaleWorkerCopy`` then."""
        import torch.utils.data  # only when iterating: this module loads without torch

        info = torch.utils.data.get_worker_info()
        if info is None:
            return self.get()
        if self.loads() != loads_seen:
            raise StaleWorkerCopy(
                "load_state_dict() was called after this DataLoader's worker processes were started "
                f"(persistent_workers=True keeps each worker's copy of the {what}, with the old position). "
                "Build the DataLoader after load_state_dict(), or use EpisodeLoader, which owns its position.")
        return self.claim(info.num_workers)

    def start(self, epoch: int) -> None:
        self._slots()[_STARTED] = epoch

    def finished(self, epoch: int) -> None:
        """Called by every consumer that reaches the end of ``epoch``; advances the counter once,
        and ends the pass once every consumer of it got here (a resume point of ``epoch`` is used up)."""
        import torch.utils.data  # only when iterating: this module loads without torch

        in_worker = torch.utils.data.get_worker_info() is not None
        with self._locked():
            slots = self._slots()
            # Below ``epoch`` only where a per-consumer state chose the epoch (``_runtime.resume.position``).
            if slots[_NEXT] <= epoch:
                slots[_NEXT] = epoch + 1
            if not in_worker:
                self._pass_done(slots, epoch)  # the main process is the pass's one consumer
            elif slots[_CLAIM_EPOCH] == epoch and slots[_FINISHES_LEFT] > 0:
                # One worker's end is not the pass's: a sibling that starts late must still find the
                # resume point (its share of the remainder), so only the last of them marks it.
                slots[_FINISHES_LEFT] -= 1
                if slots[_FINISHES_LEFT] == 0:
                    self._pass_done(slots, epoch)

    @staticmethod
    def _pass_done(slots: Any, epoch: int) -> None:
        if slots[_RESUME] == epoch:  # the resume point's one pass is over: it is used up for good
            slots[_RESUME] = -1

    def set_resume_point(self, epoch: int) -> None:
        """A resume point for ``epoch`` was just loaded. It lives for one pass of that epoch: it is
        gone when that pass runs to its end (every consumer of it, ``finished``) or when another
        epoch is selected (``set``), in the main process and its DataLoader workers alike."""
        with self._locked():
            self._slots()[_RESUME] = epoch

    def resume_point(self, epoch: int) -> bool:
        """Whether the resume point loaded for ``epoch`` is still to be used (``set_resume_point``)."""
        return self._slots()[_RESUME] == epoch

    def state_loaded(self) -> int:
        """Count a loaded resume state; returns the new count (see ``loads``)."""
        with self._locked():
            self._slots()[_LOADS] += 1
            return self._slots()[_LOADS]

    def loads(self) -> int:
        """How many resume states were loaded into the dataset: a worker's copy made before the
        latest load carries an outdated resume point."""
        return self._slots()[_LOADS]

    def _locked(self) -> AbstractContextManager:
        return self._lock if self._shared is not None else nullcontext()

    def __getstate__(self) -> dict:
        # Shared memory can travel only to a process being started (DataLoader workers, fork or
        # spawn); a plain pickle or deepcopy gets a private counter at the current values.
        if get_spawning_popen() is not None:
            return {"shared": self._shared, "lock": self._lock, "local": list(self._slots())}
        return {"shared": None, "lock": None, "local": list(self._slots())}

    def __setstate__(self, state: dict) -> None:
        self._shared, self._lock, self._local = state["shared"], state["lock"], state["local"]
        self.claimed_iteration = None


class StaleWorkerCopy(RuntimeError):
    """A DataLoader worker's copy of a dataset predates the latest load_state_dict."""


def raising(error: BaseException) -> Iterator[Any]:
    """An iterator whose first ``next()`` raises ``error``: a persistent worker calls ``iter()``
    where an exception kills the worker and its message is lost, but a failed fetch reaches the
    trainer."""
    raise error
    yield  # a generator: the error comes from the first next()
