"""A depth camera's decoded 12-bit codes turned into depth, as LeRobot 0.6 dequantises them.

LeRobot maps each code through ``depth_utils.dequantize_depth`` (float32 torch arithmetic: scale and
offset, ``exp`` and shift for log quantisation, clamp, then for millimetres x1000, rounded, clamped to
uint16's range). The result depends on the code alone, so the map is computed once per camera for
every possible code, with those same torch operations, and a frame is one table look-up: the same
values, at a fraction of the per-pixel ``exp`` cost.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from episodestream._format.depth import MM_PER_METRE, DepthCoding, DepthUnit

_CODES = 1 << 16  # every uint16 a decoder can hand over (12-bit codes use the first 4096)
# Table rows computed per torch call: under ATen's parallel grain, so each call is one vectorised
# loop on one thread, as LeRobot's per-frame call is in a DataLoader worker.
_ROWS_PER_CALL = 4096
_UINT16_MAX = 65535


def _dequantised(codes: torch.Tensor, coding: DepthCoding, unit: DepthUnit) -> torch.Tensor:
    """LeRobot 0.6.1's ``dequantize_depth`` tensor path, operation for operation."""
    if coding.use_log:
        log_min = math.log(coding.depth_min_m + coding.shift_m)
        log_max = math.log(coding.depth_max_m + coding.shift_m)
        scale, offset = (log_max - log_min) / 4095, log_min
    else:
        scale, offset = (coding.depth_max_m - coding.depth_min_m) / 4095, coding.depth_min_m
    buf = codes.to(dtype=torch.float32, copy=True)
    buf.mul_(scale).add_(offset)
    if coding.use_log:
        buf.exp_().sub_(coding.shift_m)
    buf.clamp_(coding.depth_min_m, coding.depth_max_m)
    if unit == "m":
        return buf
    return buf.mul_(MM_PER_METRE).round_().clamp_(0.0, _UINT16_MAX)


class DepthDecoding:
    """Depth codes to float32 depth in ``unit`` for one camera's ``coding``."""

    def __init__(self, coding: DepthCoding, unit: DepthUnit) -> None:
        self.coding, self.unit = coding, unit
        codes = torch.arange(_CODES, dtype=torch.int32)
        self._table = torch.cat([_dequantised(codes[i:i + _ROWS_PER_CALL], coding, unit)
                                 for i in range(0, _CODES, _ROWS_PER_CALL)]).numpy()

    def values(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes`` (any shape, uint16 on the CPU) as float32 depth of the same shape."""
        return torch.from_numpy(np.take(self._table, codes.numpy()))

    def __reduce__(self):  # a table of 256 KB need not travel to DataLoader workers: rebuilt there
        return DepthDecoding, (self.coding, self.unit)
