"""``to_torch``: Ray Data's numpy batches of ``read_episodes`` rows back to our tensors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from episodestream._sample.chw import divide_by_255_


def to_torch(batch: Mapping[str, np.ndarray], *, return_uint8: bool = False,
             device: str | torch.device | None = None) -> dict[str, Any]:
    """A batch of ``read_episodes`` rows as ``EpisodeLoader`` (or a DataLoader with
    ``episodestream.collate``) yields it: a tensor per numeric key, a list per string key.

    Read tasks put video frames in blocks as uint8 (a quarter of float32's bytes through Ray's
    object store); here they become float32 in [0, 1] by the same float32 division the datasets
    use, so the values are bit-equal to ``EpisodeStreamingDataset``'s. Every uint8 column is a video
    camera (the datasets give every integer feature as int64); float32 columns (parquet images,
    depth, frames already transformed in the task by ``image_transforms``) pass through as they are.

    Args:
        batch (Mapping[str, np.ndarray]): a numpy batch, as ``iter_batches(batch_format="numpy")``
            gives it.
        return_uint8 (bool): keep video frames uint8 (convert them on the device yourself, e.g. with
            ``.float().div_(torch.tensor(255.0, device=...))``). Defaults to ``False``.
        device (str | torch.device | None): move the tensors there (None: stay on the CPU).
            Defaults to ``None``.

    Returns:
        dict[str, Any]: tensors (numbers, frames, ``_is_pad`` masks) and lists of str (``task``).

    Raises:
        TypeError: a column holds something other than numbers or strings.
    """
    out: dict[str, Any] = {}
    for key, column in batch.items():
        array = np.asarray(column)
        if array.dtype == object or array.dtype.kind in "US":
            out[key] = [str(value) for value in array.tolist()]
            continue
        if array.dtype.kind not in "biuf":
            raise TypeError(f"collate: column {key!r} holds {array.dtype}, not numbers or strings.")
        # Arrow hands read-only views; torch wants writable memory (and the float conversion writes).
        tensor = torch.from_numpy(array if array.flags.writeable else array.copy())
        if device is not None:  # before the conversion: uint8 is a quarter of the bytes to move
            tensor = tensor.to(device, non_blocking=True)
        if array.dtype == np.uint8 and not return_uint8:
            tensor = divide_by_255_(tensor.to(torch.float32))
        out[key] = tensor
    return out

