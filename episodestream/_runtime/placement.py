"""Where this process stands, worked out in one place: its rank and world size (explicit, else
torch.distributed) and, inside ``__iter__``, its DataLoader worker."""

from __future__ import annotations

import torch.utils.data

from episodestream._base.options import check_int
from episodestream._base.world import World


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit values win; otherwise torch.distributed when initialised, else a single process."""
    if (rank is None) != (world_size is None):
        raise ValueError(f"Pass both rank and world_size or neither, got rank={rank!r}, world_size={world_size!r}.")
    if rank is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1
    world_size = check_int("world_size", world_size, minimum=1)
    return check_int("rank", rank, minimum=0, maximum=world_size - 1), world_size


def current_world(rank: int, world_size: int) -> World:
    """The consumer this process is right now (call inside ``__iter__``, where the worker is known)."""
    info = torch.utils.data.get_worker_info()
    if info is None:
        return World(rank=rank, world_size=world_size)
    return World(rank=rank, world_size=world_size, worker=info.id, num_workers=info.num_workers)


def in_dataloader_worker() -> bool:
    """Whether this process is a DataLoader worker (the main process otherwise)."""
    return torch.utils.data.get_worker_info() is not None
