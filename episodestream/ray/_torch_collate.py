"""``TorchCollate``: ``to_torch`` as Ray's collate class (imports Ray; ``collate_fn`` loads it)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from ray.data.collate_fn import NumpyBatchCollateFn

from episodestream.ray._collate import to_torch


class TorchCollate(NumpyBatchCollateFn):
    """``iter_torch_batches(collate_fn=...)`` over ``read_episodes``: see ``to_torch``."""

    def __init__(self, *, return_uint8: bool, device: str | torch.device | None) -> None:
        self.return_uint8, self.device = return_uint8, device

    def __call__(self, batch: dict[str, np.ndarray]) -> Any:
        return to_torch(batch, return_uint8=self.return_uint8, device=self.device)
