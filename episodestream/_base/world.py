"""``World``: one consumer's position (rank, world size, DataLoader worker), as plain data. Working it out
from torch.distributed and the DataLoader is ``_runtime.placement``'s job, so that planning stays free of torch."""

from __future__ import annotations

from dataclasses import dataclass



@dataclass(frozen=True)
class World:
    """One consumer's position: ``rank`` of ``world_size`` processes, ``worker`` of ``num_workers``.

    ``num_workers`` is 1 (and ``worker`` 0) when iterating in the main process (DataLoader
    ``num_workers=0``). Consumers are numbered rank-major: ``consumer = rank * num_workers + worker``.
    """

    rank: int
    world_size: int
    worker: int = 0
    num_workers: int = 1

    @property
    def consumer(self) -> int:
        return self.rank * self.num_workers + self.worker
