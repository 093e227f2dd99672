"""A decoded frame written into batch memory as (C, H, W): uint8, or float32 divided by 255.

Decoders give frames as (H, W, C), FFmpeg's layout; samples hold them as (C, H, W), as LeRobot's.
The de-interleave costs more than the float conversion: the compiled ``_chw_kernel`` (built with the
package where a C compiler is present; see its source for why and the numbers) does both in one
vectorised pass. Where it is missing, or for a frame it does not take (not 3 channels, memory not
laid out as it needs), numpy gives the same values, bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType
from typing import cast

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


def write_chw(out: np.ndarray | torch.Tensor, frame_hwc: np.ndarray | torch.Tensor, *, to_float32: bool) -> None:
    """Write one decoded ``frame_hwc`` ((H, W, C) uint8, the decoder's layout) into ``out`` ((C, H, W)
    batch memory) as float32 ``frame / 255`` when ``to_float32`` (LeRobot's conversion, bit for bit),
    else as uint8. CPU memory comes as numpy arrays, accelerator memory as tensors."""
    if isinstance(out, torch.Tensor):
        out.copy_(torch.as_tensor(frame_hwc).permute(2, 0, 1))
        if to_float32:
            divide_by_255_(out)
        return
    frame_hwc = np.asarray(frame_hwc)
    if (_kernel is not None and frame_hwc.ndim == 3 and frame_hwc.shape[2] == 3 and frame_hwc.dtype == np.uint8
            and frame_hwc.flags.c_contiguous and out.shape == (3, *frame_hwc.shape[:2])
            and out.dtype == (np.float32 if to_float32 else np.uint8)
            # The kernel reads and writes plain contiguous memory (an unaligned float32 array
            # exports another format, which it refuses) and assumes the two do not overlap.
            and out.flags.c_contiguous and out.flags.aligned and out.flags.writeable
            and not np.may_share_memory(out, frame_hwc)):
        _kernel.hwc_to_chw(frame_hwc, out)
        return
    frame_chw = frame_hwc.transpose(2, 0, 1)
    np.copyto(out, frame_chw)
    if to_float32:
        # Cast, then divide in place: numpy's one-pass divide of the strided uint8 frame goes
        # through a cast buffer and is slower for the same values.
        np.divide(out, _UINT8_MAX, out=out)


class FrameWrites:
    """Decoded frames of one file (``frames_nhwc``, (N, H, W, C) uint8) written into one batch array
    (``out``, (..., C, H, W)) as ``write_chw`` writes them: ``add`` says which row goes to which
    frame of ``out`` (its leading dimensions flattened), ``flush`` writes all of them.

    Collected, not written at once, so that the compiled kernel writes a decode group's frames in
    one call that releases the GIL once (``flush_all``: every camera's and batch's together): with
    many decode threads each release and retake is a hand-off between threads. The kernel's
    conditions are checked once here for the two arrays (they hold for every frame of a
    C-contiguous, aligned ``out`` and every row of a C-contiguous ``frames_nhwc``); elsewhere
    (another layout, accelerator memory, no kernel) each frame goes through ``write_chw``.
    """

    def __init__(self, out: np.ndarray | torch.Tensor, frames_nhwc: np.ndarray | torch.Tensor, *,
                 to_float32: bool) -> None:
        self._out = out
        contiguous = out.flags.c_contiguous if isinstance(out, np.ndarray) else out.is_contiguous()
        # Contiguous: a flat view of the frames (the kernel's dst); else frames by index into ``out``
        # (a reshape would copy, and writes to the copy would be lost).
        self._flat = out.reshape(-1, *out.shape[-3:]) if contiguous else None
        self._source = frames_nhwc
        self._to_float32 = to_float32
        self._pairs: list[int] = []  # src row, out frame, src row, out frame, ...
        self._kernel = (_kernel is not None and isinstance(out, np.ndarray) and isinstance(frames_nhwc, np.ndarray)
                        and frames_nhwc.ndim == 4 and frames_nhwc.shape[3] == 3 and frames_nhwc.dtype == np.uint8
                        and frames_nhwc.flags.c_contiguous and out.ndim >= 3
                        and out.shape[-3:] == (3, *frames_nhwc.shape[1:3])
                        and out.dtype == (np.float32 if to_float32 else np.uint8)
                        and out.flags.c_contiguous and out.flags.aligned and out.flags.writeable
                        and not np.may_share_memory(out, frames_nhwc))

    def frame(self, index: int) -> np.ndarray | torch.Tensor:
        """Frame ``index`` of ``out`` ((C, H, W), a view)."""
        if self._flat is not None:
            return self._flat[index]
        return self._out[tuple(int(i) for i in np.unravel_index(index, self._out.shape[:-3]))]

    def add(self, index: int, row: int) -> None:
        """``frames_nhwc[row]`` goes to frame ``index`` of ``out`` at the next ``flush``."""
        self._pairs += (row, index)

    def flush(self) -> None:
        job = self._kernel_job()
        if job is not None:
            assert _kernel is not None
            _kernel.hwc_to_chw_rows(*job)
            return
        pairs, self._pairs = self._pairs, []
        for row, index in zip(pairs[::2], pairs[1::2]):
            write_chw(self.frame(index), self._source[row], to_float32=self._to_float32)

    def _kernel_job(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The writes added since the last flush as one kernel job (``hwc_to_chw_rows``' arguments),
        forgotten here (None: nothing to write, or the kernel does not take these arrays)."""
        if not self._kernel or not self._pairs:
            return None
        pairs, self._pairs = self._pairs, []
        # The kernel takes these arrays only when both are numpy (``__init__``).
        return cast(np.ndarray, self._source), cast(np.ndarray, self._flat), np.array(pairs, dtype=np.int64)


def flush_all(writes: Iterable[FrameWrites]) -> None:
    """``flush`` every one of ``writes``: all that the compiled kernel takes in one call, which releases
    the GIL once for a decode group's frames of every camera (each release costs a decode thread a
    wait behind the others to take it back: benchmarks/LOG.md, "One frame-writer call per decode
    group, and what limits 32 threads at 0.2 ms"), the rest one by one. A kernel built before that
    call existed flushes each on its own."""
    jobs = []
    many = getattr(_kernel, "hwc_to_chw_jobs", None)
    for one in writes:
        job = one._kernel_job() if many is not None else None
        if job is None:
            one.flush()
        else:
            jobs.append(job)
    if jobs and many is not None:  # jobs are only made where ``many`` exists
        many(jobs)


def gather_chw(frames_nhwc: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """Rows ``rows`` of decoded (N, H, W, C) uint8 frames as one contiguous uint8 (T, C, H, W) tensor."""
    if frames_nhwc.device.type != "cpu":
        # One gathering, transposing copy on the device: later conversion and collation then run
        # on contiguous memory.
        index = torch.tensor(rows, device=frames_nhwc.device)
        return frames_nhwc.permute(0, 3, 1, 2).index_select(0, index).contiguous()
    _, height, width, channels = frames_nhwc.shape
    out = torch.empty((len(rows), channels, height, width), dtype=frames_nhwc.dtype)
    frames, written = frames_nhwc.numpy(), out.numpy()
    for i, row in enumerate(rows):
        write_chw(written[i], frames[row], to_float32=False)
    return out


def divide_by_255_(frames_float32: torch.Tensor) -> torch.Tensor:
    """``frames_float32 / 255`` in place, as IEEE float32 division (LeRobot's CPU ``frames / 255.0``)
    on any device. PyTorch's CUDA kernel turns division by a Python number into multiplication by
    its reciprocal, one bit off for 126 of the 256 byte values; dividing by a 0-dim tensor on the
    frames' own device keeps it a division there."""
    if frames_float32.device.type == "cpu":
        return frames_float32.div_(255)
    return frames_float32.div_(torch.full((), 255.0, dtype=torch.float32, device=frames_float32.device))
