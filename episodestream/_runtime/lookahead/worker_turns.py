"""``WorkerTurns``: the turns (``_base.turns``) of one dataset's DataLoader workers, in shared memory.

One slot per worker holds the number of the latest DataLoader iteration in which that worker
passed its turn on (``SharedEpoch.claim`` numbers them, ``Claim.iteration``, the same for all workers of
one iteration); worker ``w``'s head start waits for slot ``w - 1`` to reach its own iteration, its
other downloads for the last worker's slot. Each slot has one
writer (its worker) and a reader polling it, so no lock: an aligned 64-bit store is seen whole.
Only the main process's iteration has no turn (nothing shares its link with it in need order),
and workers past ``MAX_TURN_WORKERS`` download as they would without one.

Made where the dataset is built and handed to DataLoader workers as ``SharedEpoch`` is: shared
memory travels only to a process being started; any other pickle (a deepcopy) gets slots of its
own, which only change the order of its downloads.
"""

from __future__ import annotations

from multiprocessing import sharedctypes
from multiprocessing.context import get_spawning_popen

from episodestream._base.turns import TURN_WAIT_S, Turn
from episodestream._base.world import World

MAX_TURN_WORKERS = 256  # 2 KB of shared memory; more workers than this per rank is unheard of


class WorkerTurns:
    def __init__(self) -> None:
        self._slots = sharedctypes.RawArray("q", [0] * MAX_TURN_WORKERS)

    def turn(self, world: World, iteration: int | None, *, wait_s: float = TURN_WAIT_S) -> Turn | None:
        """``world``'s turn in DataLoader iteration number ``iteration`` (None: not in one, no turn)."""
        if iteration is None or world.num_workers < 2 or world.worker >= MAX_TURN_WORKERS:
            return None
        slots, worker = self._slots, world.worker
        last = min(world.num_workers, MAX_TURN_WORKERS) - 1

        def ready() -> bool:
            return slots[worker - 1] >= iteration

        def all_ready() -> bool:
            return slots[last] >= iteration

        def pass_on() -> None:
            slots[worker] = max(slots[worker], iteration)

        return Turn(ready=ready if worker > 0 else None, all_ready=all_ready, pass_on=pass_on, wait_s=wait_s)

    def __getstate__(self) -> dict:
        if get_spawning_popen() is not None:
            return {"slots": self._slots}
        return {"slots": None}

    def __setstate__(self, state: dict) -> None:
        slots = state["slots"]
        self._slots = slots if slots is not None else sharedctypes.RawArray("q", [0] * MAX_TURN_WORKERS)
