"""A decoded frame written into batch memory as (C, H, W): uint8, or float32 divided by 255.

Decoders give frames as (H, W, C), FFmpeg's layout; samples hold them as (C, H, W), as LeRobot's.
The de-interleave costs more than the float conversion: the compiled ``_chw_kernel`` (built with the
package where a C compiler is present; see its source for why and the numbers) does both in one
vectorised pass. Where it is missing, or for a frame it does not take (not 3 channels, memory not
laid out as it needs), numpy gives the same values, bit for bit.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import torch

_kernel: ModuleType | None
try:
    from episodestream._sample import _chw_kernel as _kernel
except ImportError:  # installed without a C compiler: numpy below does the same, slower
    _kernel = None

_UINT8_MAX = np.float32(255)  # a float32 divisor keeps numpy's division in float32, as torch's


def compiled() -> bool:
    """Whether the compiled kernel is available (it is built when the package is installed with a C compiler)."""
    return _kernel is not None


def write_chw(out: np.ndarray, frame_chw: np.ndarray, *, to_float32: bool) -> None:
    """Write ``frame_chw`` (a (C, H, W) uint8 view of decoded (H, W, C) memory) into ``out``, as
    float32 ``frame / 255`` when ``to_float32`` (LeRobot's conversion, bit for bit), else as uint8."""
    if _kernel is not None and frame_chw.ndim == 3:
        rgb = frame_chw.transpose(1, 2, 0)  # the decoder's own (H, W, C) layout
        if (frame_chw.shape[0] == 3 and frame_chw.dtype == np.uint8 and rgb.flags.c_contiguous
                and out.shape == frame_chw.shape and out.dtype == (np.float32 if to_float32 else np.uint8)
                # The kernel reads and writes plain contiguous memory (an unaligned float32 array
                # exports another format, which it refuses) and assumes the two do not overlap.
                and out.flags.c_contiguous and out.flags.aligned and out.flags.writeable
                and not np.may_share_memory(out, frame_chw)):
            _kernel.hwc_to_chw(rgb, out)
            return
    if not to_float32:
        np.copyto(out, frame_chw)
    else:
        # Two numpy passes over ``out``: the strided cast, then the in-place (vectorised) division.
        # numpy's one-pass ``divide`` of the strided uint8 frame goes through a cast buffer: 0.16
        # ms per 240x320 frame against 0.13 ms, the same values.
        np.copyto(out, frame_chw)
        np.divide(out, _UINT8_MAX, out=out)


def divide_by_255_(frames_float32: torch.Tensor) -> torch.Tensor:
    """``frames_float32 / 255`` in place, as IEEE float32 division (LeRobot's CPU ``frames / 255.0``)
    on any device. PyTorch's CUDA kernel turns division by a Python number into multiplication by
    its reciprocal, one bit off for 126 of the 256 byte values; dividing by a 0-dim tensor on the
    frames' own device keeps it a division there."""
    if frames_float32.device.type == "cpu":
        return frames_float32.div_(255)
    return frames_float32.div_(torch.full((), 255.0, dtype=torch.float32, device=frames_float32.device))
