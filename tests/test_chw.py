"""Decoded (H, W, 3) frames written as (3, H, W): the compiled kernel and the numpy fallback give
LeRobot's values (``frames / 255.0`` in float32), bit for bit."""

import shutil
import sysconfig
import threading

import numpy as np
import pytest
import torch

from episodestream._sample import chw as _chw

SHAPES = [(1, 1), (1, 7), (7, 13), (16, 16), (31, 33), (240, 320)]
PATHS = ["compiled", "numpy"]


def lerobot(chw_uint8: np.ndarray, to_float32: bool) -> np.ndarray:
    """What LeRobot's loader gives for these frames: a float32 ``frames / 255.0``, or the bytes."""
    frames = torch.from_numpy(np.ascontiguousarray(chw_uint8))
    return (frames / 255.0).numpy() if to_float32 else frames.numpy()


def write_view(out: np.ndarray, frame_chw: np.ndarray, *, to_float32: bool) -> None:
    """``write_chw`` of the decoded memory behind a (C, H, W) view (its (H, W, C) self)."""
    _chw.write_chw(out, frame_chw.transpose(1, 2, 0), to_float32=to_float32)


def decoded(height: int, width: int, seed: int) -> np.ndarray:
    """A (3, H, W) view of (H, W, 3) memory, as the loader gets frames from the decoder; every byte
    value appears in every channel where the frame has room for it."""
    rgb = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    for channel in range(3):
        values = np.roll(np.arange(256, dtype=np.uint8), 85 * channel)[:height * width]
        rgb.reshape(-1, 3)[:len(values), channel] = values
    return rgb.transpose(2, 0, 1)


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    if request.param == "compiled" and not _chw.compiled():
        pytest.skip("episodestream._sample._chw_kernel is not built (installed without a C compiler)")
    if request.param == "numpy":
        monkeypatch.setattr(_chw, "_kernel", None)
    return request.param


def test_the_kernel_is_built_where_a_c_compiler_is():
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}) here: the package installs without the kernel, numpy does its work")
    assert _chw.compiled(), ("episodestream._sample._chw_kernel is missing although a C compiler is present: reinstall "
                             "the package (pip install -e .) and look for the build warning")


@pytest.mark.parametrize("to_float32", [True, False], ids=["float32", "uint8"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{h}x{w}" for h, w in SHAPES])
def test_frames_equal_lerobots_bit_for_bit(path, shape, to_float32):
    frame = decoded(*shape, seed=shape[0] * 1000 + shape[1])
    out = np.full(frame.shape, 7, dtype=np.float32 if to_float32 else np.uint8)
    write_view(out, frame, to_float32=to_float32)
    expected = lerobot(frame, to_float32)
    assert out.dtype == expected.dtype
    assert out.tobytes() == expected.tobytes()  # bit for bit, signed zeros included


def test_every_byte_value_converts_as_lerobots(path):
    frame = decoded(16, 16, seed=0)  # 256 pixels: each channel holds every byte value once
    assert all(len(np.unique(frame[c])) == 256 for c in range(3))
    out = np.empty(frame.shape, dtype=np.float32)
    write_view(out, frame, to_float32=True)
    assert out.tobytes() == lerobot(frame, True).tobytes()


@pytest.mark.parametrize("case", ["strided-out", "unaligned-out", "cropped-frame", "one-channel", "four-channels"])
def test_frames_the_kernel_does_not_take_are_written_by_numpy(path, case):
    if case == "strided-out":  # every other row of a larger buffer
        frame = decoded(8, 10, seed=1)
        out = np.zeros((3, 16, 10), dtype=np.float32)[:, ::2]
    elif case == "unaligned-out":  # float32 one byte off its alignment: numpy exports it as "=f"
        frame = decoded(4, 5, seed=4)
        out = np.zeros(3 * 4 * 5 * 4 + 1, dtype=np.uint8)[1:].view(np.float32).reshape(3, 4, 5)
        assert not out.flags.aligned
    elif case == "cropped-frame":  # a crop of decoded memory is not contiguous
        frame = decoded(12, 14, seed=2)[:, 2:9, 3:11]
        out = np.zeros(frame.shape, dtype=np.float32)
    else:
        channels = 1 if case == "one-channel" else 4
        frame = np.random.default_rng(3).integers(0, 256, (9, 11, channels), dtype=np.uint8).transpose(2, 0, 1)
        out = np.zeros(frame.shape, dtype=np.float32)
    write_view(out, frame, to_float32=True)
    assert out.tobytes() == lerobot(frame, True).tobytes()


def test_a_frame_written_over_its_own_memory_is_right(path):
    # The kernel assumes its input and output do not overlap; numpy copes when they do.
    rgb = np.ascontiguousarray(decoded(6, 7, seed=5).transpose(1, 2, 0))
    expected = lerobot(rgb.copy().transpose(2, 0, 1), False)
    write_view(rgb.reshape(3, 6, 7), rgb.transpose(2, 0, 1), to_float32=False)
    assert rgb.reshape(3, 6, 7).tobytes() == expected.tobytes()


def test_the_kernel_refuses_buffers_it_cannot_fill():
    if not _chw.compiled():
        pytest.skip("episodestream._sample._chw_kernel is not built (installed without a C compiler)")
    kernel = _chw._kernel
    rgb = np.zeros((4, 5, 3), dtype=np.uint8)
    with pytest.raises(ValueError, match="dst holds 30 values, src 60"):
        kernel.hwc_to_chw(rgb, np.zeros((3, 2, 5), dtype=np.float32))
    with pytest.raises(ValueError, match="dst must be contiguous float32 or uint8, got format d"):
        kernel.hwc_to_chw(rgb, np.zeros((3, 4, 5), dtype=np.float64))
    with pytest.raises(ValueError, match="src must be contiguous uint8 RGB"):
        kernel.hwc_to_chw(np.zeros(7, dtype=np.uint8), np.zeros(7, dtype=np.uint8))
    with pytest.raises(ValueError, match="not C-contiguous"):  # numpy refuses to export it as the kernel asks
        kernel.hwc_to_chw(rgb, np.zeros((3, 4, 10), dtype=np.float32)[:, :, ::2])


def test_threads_writing_at_once_each_get_their_own_frames(path):
    # The kernel releases the GIL: decode threads call it together on different frames.
    frames = [decoded(60, 80, seed=s) for s in range(8)]
    expected = [lerobot(f, True) for f in frames]
    outs = [np.empty(f.shape, dtype=np.float32) for f in frames]
    errors = []

    def write(i):
        try:
            for _ in range(50):
                write_view(outs[i], frames[i], to_float32=True)
                assert outs[i].tobytes() == expected[i].tobytes()
        except BaseException as error:  # reported in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(frames))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_divide_by_255_gives_lerobots_values():
    frames = torch.arange(256, dtype=torch.uint8)
    assert torch.equal(_chw.divide_by_255_(frames.to(torch.float32)), frames / 255.0)


@pytest.mark.needs_cuda
def test_divide_by_255_on_cuda_gives_the_cpus_values():
    # PyTorch's CUDA kernel multiplies by the reciprocal when the divisor is a Python number.
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU and a CUDA build of torch; this machine has none")
    frames = torch.arange(256, dtype=torch.uint8)
    on_gpu = _chw.divide_by_255_(frames.to("cuda", torch.float32)).cpu()
    assert torch.equal(on_gpu, frames / 255.0)


@pytest.mark.parametrize("to_float32", [True, False], ids=["float32", "uint8"])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])  # strided: no kernel, frames by index
def test_frame_writes_put_each_row_in_its_frame_at_flush(path, to_float32, layout):
    rows = np.stack([decoded(7, 13, seed=s).transpose(1, 2, 0) for s in range(5)])  # (5, H, W, 3), contiguous
    dtype = np.float32 if to_float32 else np.uint8
    memory = np.full((3, 2, 3, 7, 13) if layout == "contiguous" else (3, 4, 3, 7, 13), 7, dtype=dtype)
    out = memory if layout == "contiguous" else memory[:, ::2]  # (3 samples, 2-frame windows, C, H, W)
    writes = _chw.FrameWrites(out, rows, to_float32=to_float32)
    pairs = {0: 4, 3: 0, 5: 2, 2: 2}  # out frame (flattened: sample * 2 + step) -> row
    for frame, row in pairs.items():
        writes.add(frame, row)
    assert (out == 7).all(), "nothing is written before flush"
    writes.flush()
    for frame in range(6):
        sample, step = divmod(frame, 2)
        expected = (lerobot(rows[pairs[frame]].transpose(2, 0, 1), to_float32) if frame in pairs
                    else np.full((3, 7, 13), 7, dtype=dtype))
        assert np.array_equal(out[sample, step], expected), f"frame {frame}"
        assert writes.frame(frame).base is not None and np.shares_memory(writes.frame(frame), memory)
    writes.flush()  # nothing pending: a no-op
    with pytest.raises(IndexError, match=r"pair 0 \(src row 5, dst frame 0\)") if path == "compiled" and \
            layout == "contiguous" else pytest.raises(IndexError):
        writes.add(0, 5)
        writes.flush()


def test_frame_writes_into_tensors_as_accelerator_memory_takes_them():
    # CUDA batch memory comes as tensors (no kernel there): the same places and values, on CPU here.
    rows = torch.from_numpy(np.stack([decoded(4, 5, seed=s).transpose(1, 2, 0) for s in range(3)]))
    out = torch.zeros((2, 2, 3, 4, 5), dtype=torch.float32)
    writes = _chw.FrameWrites(out, rows, to_float32=True)
    writes.add(3, 1)
    writes.add(0, 2)
    writes.flush()
    assert torch.equal(out[1, 1], rows[1].permute(2, 0, 1) / 255.0) and torch.equal(out[0, 0], rows[2].permute(2, 0, 1) / 255.0)
    assert not out[0, 1].any() and not out[1, 0].any() and writes.frame(3).data_ptr() == out[1, 1].data_ptr()


def _group_writes(to_float32: bool, layouts=("contiguous", "contiguous", "strided")):
    """A decode group's writes as the loader makes them: one ``FrameWrites`` per (camera file, batch
    array), each with its own rows and places (a strided one, which the kernel does not take, among
    them); with what each array must hold after a flush."""
    dtype = np.float32 if to_float32 else np.uint8
    cases = []
    for i, layout in enumerate(layouts):
        rows = np.stack([decoded(7, 13, seed=10 * i + s).transpose(1, 2, 0) for s in range(4)])
        memory = np.full((4, 3, 7, 13) if layout == "contiguous" else (8, 3, 7, 13), 7, dtype=dtype)
        out = memory if layout == "contiguous" else memory[::2]
        writes = _chw.FrameWrites(out, rows, to_float32=to_float32)
        places = {0: 3, 2: 1, 3: 1} if i % 2 == 0 else {1: 0}  # out frame -> row
        for frame, row in places.items():
            writes.add(frame, row)
        expected = np.stack([lerobot(rows[places[f]].transpose(2, 0, 1), to_float32) if f in places
                             else np.full((3, 7, 13), 7, dtype=dtype) for f in range(4)])
        cases.append((out, writes, expected))
    return cases


@pytest.mark.parametrize("to_float32", [True, False], ids=["float32", "uint8"])
def test_flush_all_writes_what_each_flush_writes(path, to_float32):
    cases = _group_writes(to_float32)
    _chw.flush_all(writes for _, writes, _ in cases)
    for i, (out, writes, expected) in enumerate(cases):
        assert out.tobytes() == np.ascontiguousarray(expected).tobytes(), f"writes {i}"
        writes.flush()  # nothing left pending
        assert out.tobytes() == np.ascontiguousarray(expected).tobytes(), f"writes {i} after a second flush"


def test_flush_all_calls_the_kernel_once_for_every_array_it_takes(monkeypatch):
    # One call releases the GIL once for the whole group (a decode thread's wait to take it back is
    # paid once, not once per camera); the strided array's frames go one by one (write_chw).
    if not _chw.compiled():
        pytest.skip("episodestream._sample._chw_kernel is not built (installed without a C compiler)")
    calls = []
    kernel = _chw._kernel

    class Counting:
        def hwc_to_chw_jobs(self, jobs):
            calls.append(("jobs", len(jobs)))
            return kernel.hwc_to_chw_jobs(jobs)

        def hwc_to_chw_rows(self, *args):
            calls.append(("rows", 1))
            return kernel.hwc_to_chw_rows(*args)

        def hwc_to_chw(self, *args):
            calls.append(("one", 1))
            return kernel.hwc_to_chw(*args)

    monkeypatch.setattr(_chw, "_kernel", Counting())
    cases = _group_writes(True)
    _chw.flush_all(writes for _, writes, _ in cases)
    assert calls == [("one", 1)] * 3 + [("jobs", 2)]
    for out, _, expected in cases:
        assert out.tobytes() == np.ascontiguousarray(expected).tobytes()


def test_flush_all_with_a_kernel_built_before_it_flushes_each(monkeypatch):
    # An older build of the kernel (no hwc_to_chw_jobs) still writes every frame, one call per array.
    if not _chw.compiled():
        pytest.skip("episodestream._sample._chw_kernel is not built (installed without a C compiler)")
    kernel = _chw._kernel
    calls = []

    class Older:
        def hwc_to_chw_rows(self, *args):
            calls.append("rows")
            return kernel.hwc_to_chw_rows(*args)

        def hwc_to_chw(self, *args):
            return kernel.hwc_to_chw(*args)

    monkeypatch.setattr(_chw, "_kernel", Older())
    cases = _group_writes(False)
    _chw.flush_all(writes for _, writes, _ in cases)
    assert calls == ["rows", "rows"]
    for out, _, expected in cases:
        assert out.tobytes() == np.ascontiguousarray(expected).tobytes()


def test_the_kernel_checks_every_job_before_writing_any():
    if not _chw.compiled():
        pytest.skip("episodestream._sample._chw_kernel is not built (installed without a C compiler)")
    kernel = _chw._kernel
    rows = np.stack([decoded(4, 5, seed=s).transpose(1, 2, 0) for s in range(2)])
    good, bad = np.zeros((2, 3, 4, 5), np.uint8), np.zeros((2, 3, 4, 5), np.uint8)
    with pytest.raises(IndexError, match=r"pair 1 \(src row 2, dst frame 1\)"):
        kernel.hwc_to_chw_jobs([(rows, good, np.array([0, 0, 1, 1], np.int64)),
                                (rows, bad, np.array([0, 0, 2, 1], np.int64))])
    assert not good.any() and not bad.any(), "a job was written although a later one was refused"
    with pytest.raises(TypeError, match="job 1 must be a tuple"):
        kernel.hwc_to_chw_jobs([(rows, good, np.array([0, 0], np.int64)), [rows, bad, np.array([0, 0], np.int64)]])
    with pytest.raises(ValueError, match="dst must be contiguous float32 or uint8"):
        kernel.hwc_to_chw_jobs([(rows, np.zeros((2, 3, 4, 5), np.float64), np.array([0, 0], np.int64))])
    kernel.hwc_to_chw_jobs([])  # nothing to write
    kernel.hwc_to_chw_jobs([(rows, good, np.array([1, 0], np.int64))])
    assert good[0].tobytes() == np.ascontiguousarray(rows[1].transpose(2, 0, 1)).tobytes() and not good[1].any()
