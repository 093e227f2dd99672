"""``collate_fn``: the collate function for ``iter_torch_batches`` over ``read_episodes``."""

from __future__ import annotations

from typing import Any

import torch

from episodestream._base.options import check_bool


def collate_fn(*, return_uint8: bool = False, device: str | torch.device | None = None) -> Any:
    """The ``collate_fn`` for ``ds.iter_torch_batches`` over ``read_episodes``: batches as
    ``EpisodeLoader`` yields them (see ``to_torch``). Calling it on a numpy batch
    (``iter_batches(batch_format="numpy")``) does the same.

    Args:
        return_uint8 (bool): keep video frames uint8. Defaults to ``False``.
        device (str | torch.device | None): where the tensors go (None: the CPU). Defaults to ``None``.

    Returns:
        ray.data.collate_fn.NumpyBatchCollateFn: the collate function (Ray's class for a function of
        numpy batches).

    Raises:
        TypeError: ``return_uint8`` is not a bool.
    """
    from episodestream.ray._torch_collate import TorchCollate  # imports Ray

    return TorchCollate(return_uint8=check_bool("return_uint8", return_uint8), device=device)
