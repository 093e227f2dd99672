"""Video decoder backends behind one small interface: frames played at given times, from local bytes."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

import numpy as np
import torch

from episodestream._base.gc_pause import gc_paused
from episodestream._base.options import check_choice, env_override
from episodestream._base.warn import warn_user
from episodestream._format.mp4 import Mp4LayoutError, VideoTrack, read_local_track
from episodestream._format.served_video import ServedVideo

VideoBackend = Literal["torchcodec", "pyav"]
VIDEO_BACKENDS: tuple[VideoBackend, ...] = ("torchcodec", "pyav")
VIDEO_BACKEND_ENV = "EPISODESTREAM_VIDEO_BACKEND"


class VideoReader(Protocol):
    def frames_played_at(self, seconds: Sequence[float]) -> tuple[torch.Tensor, np.ndarray]:
        """Frames shown at ``seconds`` (sorted ascending) as contiguous uint8 NHWC, and their pts in seconds."""
        ...

    def close(self) -> None: ...


# Codecs whose mp4 samples are always stored in presentation order (AV1 and VP9 reorder inside
# the bitstream, invisibly to the container), so approximate seeking lands on the right frame.
_IN_ORDER_CODECS = frozenset({"av1", "vp8", "vp9"})


class TorchCodecReader:
    def __init__(self, path: str, *, device: str = "cpu") -> None:
        from torchcodec.decoders import VideoDecoder

        # "approximate" avoids scanning the whole file at open: the mp4 index is enough for
        # constant-frame-rate LeRobot videos, and a scan would read every byte of a 200 MB file
        # (or of a sparse partial download). Returned pts are checked against the query anyway.
        # One FFmpeg thread: parallelism comes from DataLoader workers. NHWC is FFmpeg's own
        # layout (NCHW would be a strided view, and every later copy of it a slow transpose).
        self._decoder = VideoDecoder(_source(path), seek_mode="approximate", dimension_order="NHWC",
                                     num_ffmpeg_threads=1, device=device)
        if self._decoder.metadata.codec not in _IN_ORDER_CODECS:
            exact = _exact_seeking(path)
            if exact is not None:
                self._decoder = VideoDecoder(_source(path), dimension_order="NHWC", num_ffmpeg_threads=1,
                                             device=device, **exact)

    def frames_played_at(self, seconds: Sequence[float]) -> tuple[torch.Tensor, np.ndarray]:
        batch = self._decoder.get_frames_played_at(seconds=list(seconds))
        return batch.data, batch.pts_seconds.numpy()

    def close(self) -> None:
        self._decoder = None


def _source(path: str) -> Any:
    """What a decoder opens: the file, or a served video's bytes (``ServedVideo``)."""
    return path.open_bytes() if isinstance(path, ServedVideo) else path


def video_track(path: str) -> VideoTrack:
    """``path``'s sample index: a served video's own, else read from the file's ``moov``."""
    return path.track if isinstance(path, ServedVideo) else read_local_track(path)


def _exact_seeking(path: str) -> dict[str, Any] | None:
    """torchcodec's options for exact seeking in ``path``, or None where approximate is exact.

    With B-frames (decode order differs from presentation order) approximate seeking lands on a
    keyframe by decode time and can return a neighbouring frame; with an open GOP the frames
    shown just before a keyframe are dropped when decoding starts there. Frame mappings (each
    frame's pts and keyframe flag, from the mp4 index in ``moov``) make seeking exact without
    the scan of ``seek_mode="exact"``, which reads every byte of the file at each open.
    """
    try:
        track = video_track(path)
    except Mp4LayoutError:
        return {"seek_mode": "exact"}
    if track.reorder_depth == 0:
        return None
    order = np.argsort(track.pts_s, kind="stable")
    pts = np.rint(track.pts_s[order] * track.timescale).astype(np.int64).tolist()
    durations = np.rint(track.duration_s[order] * track.timescale).astype(np.int64).tolist()
    keys = track.is_sync[order].astype(np.int8).tolist()
    frames = ",".join(f'{{"pts":{p},"duration":{d},"key_frame":{k}}}' for p, d, k in zip(pts, durations, keys))
    return {"custom_frame_mappings": f'{{"frames":[{frames}]}}'}


PixelFormat = Literal["rgb24", "gray12le"]


class PyAVReader:
    """Sequential-friendly PyAV reader: seeks only when the next query is behind or far ahead.

    ``pixel_format`` "rgb24" gives (N, H, W, 3) uint8 frames; "gray12le" gives a depth camera's
    12-bit codes as (N, H, W, 1) uint16, straight from its planes (no 8-bit step), as LeRobot
    decodes depth (with PyAV whatever its backend: torchcodec converts every frame to RGB24).
    """

    # A seek (and the decoder's restart from a keyframe) costs about as much as decoding this many
    # frames forward, for AV1 at GOP 2 and for HEVC with B-frames alike (benchmarks/LOG.md, "Depth
    # cameras"): a query further ahead seeks, a nearer one decodes forward.
    _SEEK_AHEAD_FRAMES = 5

    def __init__(self, path: str, *, pixel_format: PixelFormat = "rgb24") -> None:
        import av

        self._pixel_format = check_choice("pixel_format", pixel_format, ("rgb24", "gray12le"))
        self._path = path
        self._container = av.open(_source(path))
        self._stream = self._container.streams.video[0]
        self._frames = None  # the decode iterator since the last seek
        self._current = None  # last frame taken from it (pts <= the last query)
        self._lookahead = None  # the frame after ``_current`` once decoded (None: not yet, or the end)
        self._ended = False  # the decode iterator since the last seek has no frame left
        # A frame is shown for 1/fps (LeRobot's constant frame rate); one that ends after a query is
        # the frame played then, with no need to decode the next.
        rate = self._stream.average_rate or self._stream.guessed_rate
        self._duration_s = float(1 / rate) if rate else 0.0
        self._seek_ahead_s = self._SEEK_AHEAD_FRAMES * (self._duration_s or 1 / 30)
        self._index: list[tuple[int, int, bool]] | None = None  # the demuxer's (pos, time, keyframe), read when needed

    def _seek(self, t: float) -> None:
        # With B-frames the demuxer can pick a keyframe shown after ``t``, and an open GOP's frames
        # shown before their keyframe are dropped when decoding starts there: the first frame
        # decoded is then after ``t``. Seek again to the keyframe before, one keyframe at a time:
        # a step back in seconds could land outside a remote episode's byte span, in bytes never
        # fetched.
        target = int(t / self._stream.time_base) + (self._stream.start_time or 0)
        while True:
            self._container.seek(target, stream=self._stream, backward=True, any_frame=False)
            packets = self._container.demux(self._stream)
            first = next(packets, None)
            self._frames = self._decode(first, packets)
            self._current = next(self._frames, None)
            if self._current is None or self._current.time <= t:
                break
            before = self._keyframe_before(first.pos)
            if before is None or before >= target:
                break  # the file's first keyframe: nothing earlier to decode from
            target = before
        self._lookahead = None
        self._ended = False

    def _keyframe_before(self, pos: int | None) -> int | None:
        """The seek target that lands on the keyframe before the sample at byte ``pos``. The mp4
        demuxer seeks by its index times (decode times) shifted to start at the stream's start
        (its first pts): a target computed from a packet's dts would land a keyframe too early."""
        if self._index is None:
            self._index = self._index_entries()
        at = next((i for i, entry in enumerate(self._index) if entry[0] == pos), None)
        if at is None:
            return None
        shift = (self._stream.start_time or 0) - self._index[0][1]
        return next((entry[1] + shift for entry in reversed(self._index[:at]) if entry[2]), None)

    def _index_entries(self) -> list[tuple[int, int, bool]]:
        """The demuxer's index: (byte position, time, keyframe) per sample in decode order. PyAV before
        16 does not expose it; there the mp4's own index gives the same table (its decode times),
        and a file that is not a readable mp4 gives none (no stepping back)."""
        entries = getattr(self._stream, "index_entries", None)
        if entries is not None:
            return [(e.pos, e.timestamp, e.is_keyframe) for e in entries]
        try:
            track = video_track(self._path)
        except (Mp4LayoutError, OSError):
            return []
        if track.dts is None:
            return []
        return list(zip(track.offsets.tolist(), track.dts.tolist(), track.is_sync.tolist()))

    @staticmethod
    def _decode(first, packets):
        """The frames of ``first`` and the packets after it (the last, empty, flushes the decoder)."""
        if first is not None:
            yield from first.decode()
        for packet in packets:
            yield from packet.decode()

    def _played_at(self, t: float):
        if (self._current is None or t < self._current.time
                or t - self._current.time > self._seek_ahead_s):
            self._seek(t)
        # The next frame is decoded only when the current one ends at or before ``t``: with B-frames
        # each frame decoded ahead costs the decoder's reorder delay in packets too (a random
        # access decoded ~8 packets for one frame with a look-ahead, most of them for it).
        while self._current is not None and self._current.time + self._duration_s <= t:
            if self._lookahead is None and not self._ended:
                self._lookahead = next(self._frames, None)
                self._ended = self._lookahead is None
            if self._lookahead is None or self._lookahead.time > t:
                break
            self._current, self._lookahead = self._lookahead, None
        if self._current is None or self._current.time > t:
            raise RuntimeError(f"no frame is played at {t:.6f} s")
        return self._current

    def frames_played_at(self, seconds: Sequence[float]) -> tuple[torch.Tensor, np.ndarray]:
        frames, pts = [], []
        for t in seconds:
            frame = self._played_at(t)
            frames.append(frame.to_ndarray(format=self._pixel_format))
            pts.append(frame.time)
        stacked = np.stack(frames)
        return torch.from_numpy(stacked if stacked.ndim == 4 else stacked[..., None]), np.asarray(pts, dtype=np.float64)

    def close(self) -> None:
        self._container.close()


def _torchcodec_error() -> str | None:
    try:
        # Importing torchcodec imports torch._dynamo (~120k objects that live as long as the
        # process); with the cyclic collector paused meanwhile, the first dataset a process builds
        # costs ~0.3 CPU-s less (0.80-0.85 s against 1.10-1.13 s to import it after torch, here).
        with gc_paused():
            import torchcodec.decoders  # noqa: F401  (loads libtorchcodec and the FFmpeg libraries)
    except Exception as error:  # ImportError, or RuntimeError when FFmpeg's libraries are missing
        return f"{type(error).__name__}: {error}".splitlines()[0]
    return None


def _check_device(decode_device: str) -> str:
    if not isinstance(decode_device, str) or not (decode_device == "cpu" or decode_device.startswith("cuda")):
        raise ValueError(f"Invalid decode_device ({decode_device!r}). Supported values are 'cpu', 'cuda', 'cuda:N'.")
    if decode_device != "cpu" and not torch.cuda.is_available():
        raise RuntimeError(f"decode_device={decode_device!r} needs a CUDA GPU and a CUDA build of torch and "
                           f"torchcodec; this torch ({torch.__version__}) sees no GPU. Use decode_device='cpu'.")
    return decode_device


def resolve_backend(video_backend: str | None, decode_device: str = "cpu", *,
                    has_video: bool = True) -> Callable[[str], VideoReader]:
    """The reader factory for ``video_backend`` (argument, else ``EPISODESTREAM_VIDEO_BACKEND``).

    Unset means torchcodec when it loads, else PyAV with a warning saying why. ``decode_device``
    "cuda" decodes on the GPU (NVDEC through torchcodec; PyAV decodes on the CPU only).
    A dataset without video (``has_video=False``) only has its options checked: loading torchcodec
    and FFmpeg costs ~1 s and ~110 MB of RSS in every process, for nothing.
    """
    decode_device = _check_device(decode_device)
    if not has_video:
        name = env_override("video_backend", video_backend, VIDEO_BACKEND_ENV, str)
        if name is not None:
            check_choice("video_backend", name, VIDEO_BACKENDS)
        return PyAVReader if name == "pyav" else TorchCodecReader
    if decode_device != "cpu":
        if video_backend not in (None, "torchcodec"):
            raise ValueError(f"decode_device={decode_device!r} needs video_backend='torchcodec', got {video_backend!r}.")
        if error := _torchcodec_error():
            raise RuntimeError(f"decode_device={decode_device!r} needs torchcodec, which cannot load ({error}).")
        return functools.partial(TorchCodecReader, device=decode_device)
    name = env_override("video_backend", video_backend, VIDEO_BACKEND_ENV, str)
    if name is not None:
        check_choice("video_backend", name, VIDEO_BACKENDS)
        if name == "torchcodec" and (error := _torchcodec_error()):
            raise RuntimeError(f"video_backend='torchcodec' was asked for but torchcodec cannot load ({error}). "
                               f"Install torchcodec and FFmpeg's shared libraries, or pass video_backend='pyav'.")
        return TorchCodecReader if name == "torchcodec" else PyAVReader
    if error := _torchcodec_error():
        warn_user(f"torchcodec cannot load ({error}); decoding video with PyAV instead, which is slower.",
                  RuntimeWarning)
        return PyAVReader
    return TorchCodecReader
