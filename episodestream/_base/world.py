"""Where this process stands: rank, world size and DataLoader worker, worked out in one place."""

from __future__ import annotations

from dataclasses import dataclass

import torch.utils.data

from episodestream._base.options import check_int


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


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit values win; otherwise torch.distributed when initialised, else a single process."""
    if (rank is None) != (world_size is None):
        raise ValueError(f"Pass both rank and world_size or neither, got rank={rank!r}, world_size={world_size!r}.")
    if rank is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1
    check_int("world_size", world_size, minimum=1)
    check_int("rank", rank, minimum=0, maximum=world_size - 1)
    return rank, world_size


def current_world(rank: int, world_size: int) -> World:
    """The consumer this process is right now (call inside ``__iter__``, where the worker is known)."""
    info = torch.utils.data.get_worker_info()
    if info is None:
        return World(rank=rank, world_size=world_size)
    return World(rank=rank, world_size=world_size, worker=info.id, num_workers=info.num_workers)
