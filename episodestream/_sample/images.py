"""A camera stored as images in parquet (PNG, or TIFF for depth) as LeRobot 0.6's reader gives it.

LeRobot decodes the bytes with PIL (``datasets.Image``, no mode conversion) and makes a CHW tensor with
``io_utils.pil_to_chw_tensor``: 16-bit images (depth in mm) as float32 values, everything else through
torchvision's ``ToTensor``: 8-bit modes as float32 / 255 with as many channels as the mode has (one
for greyscale, four for RGBA), "F" (depth in metres) and "I" as they are. Always float: its
``return_uint8`` is for video frames only. torchvision is not a dependency here, so its rule is
written out below.
"""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image

_UINT16_MODES = ("I;16", "I;16B", "I;16L")


def decode_image(data: bytes, where: str) -> torch.Tensor:
    """An image's bytes as LeRobot's sample holds them: (C, H, W), float32 (int32 for mode "I")."""
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
        if image.mode in _UINT16_MODES:
            return torch.from_numpy(np.array(image, dtype=np.float32))[None]
        dtype = {"I": np.int32, "F": np.float32}.get(image.mode, np.uint8)
        array = np.array(image, dtype=dtype)
        channels = len(image.getbands())
    except Exception as error:
        raise ValueError(f"{where}: image bytes cannot be decoded ({error})") from error
    if image.mode == "1":
        array = np.multiply(array, 255, dtype=np.uint8)
    chw = torch.from_numpy(np.ascontiguousarray(array.reshape(image.size[1], image.size[0], channels).transpose(2, 0, 1)))
    if chw.dtype != torch.uint8:
        return chw
    return chw.to(torch.float32).div_(255)
