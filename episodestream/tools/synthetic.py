"""Write small, valid LeRobot v3.0 datasets whose every value says which frame it is.

Frames carry (episode, frame, camera) ids as flat gray blocks that survive lossy video coding, and
tabular values are derived from the same ids, so a test can check that a loader returned the right
frame rather than merely a frame of the right shape.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import pathlib
from collections.abc import Iterator, Mapping, Sequence
from fractions import Fraction
from typing import Literal

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image
from tqdm import tqdm

# Camera-less datasets of DROID size (100,000 episodes), written with numpy in seconds.
from episodestream.tools._synthetic_bulk import write_tabular_dataset  # noqa: E402
from episodestream._base.options import check_bool
from episodestream.tools._synthetic_language import language_columns, language_features, language_tools
from episodestream.tools._synthetic_v2 import V2_DATA_PATH, V2_VERSIONS, V2_VIDEO_PATH, PerEpisodeFile, write_v2_metadata
from episodestream.tools._write_folder import check_root, invalid, write_into_place

__all__ = ["decode_frame_ids", "encode_frame_ids", "write_synthetic_dataset", "write_tabular_dataset"]

_CODECS = {"av1": "libsvtav1", "h264": "libx264", "hevc": "libx265"}
# 32 one-bit blocks in a 4x8 grid (16x12 pixels at 64x96, scaling with the frame). Two gray levels
# 192 apart: 16 levels (4 bits a block) misread at crf 30 when ids change a lot between frames.
_GRID_ROWS, _GRID_COLS = 4, 8
_DARK, _LIGHT = 32, 224
_MAX_ID = 4095  # 12 bits each for episode and frame index, 4 for the camera, 4 of checksum
_MIN_SIDE = 64  # SVT-AV1 and flat block centres both want at least 64 pixels a side
_DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
_VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
_EPISODES_PATH = "meta/episodes/chunk-000/file-000.parquet"
_QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}  # the quantiles LeRobot writes


def _checksum(frame_index: int, episode_index: int, camera_index: int) -> int:
    # Any one flipped bit changes the sum of nibbles mod 16; the offset keeps all-black and all-white
    # frames from reading as valid ids.
    nibbles = [(v >> s) & 15 for v in (frame_index, episode_index) for s in (8, 4, 0)] + [camera_index]
    return (sum(nibbles) + 5) % 16


def _blocks(image: np.ndarray) -> np.ndarray:
    """``image`` (H x W or H x W x C) cut into the id grid's blocks: a (rows, block H, cols, block W, ...)
    view, bit ``r * cols + c`` at ``[r, :, c]`` (the most significant bit top left, row by row). Rows
    and columns left over by the integer block size are not part of any block."""
    block_h, block_w = image.shape[0] // _GRID_ROWS, image.shape[1] // _GRID_COLS
    grid = image[:block_h * _GRID_ROWS, :block_w * _GRID_COLS]
    return grid.reshape(_GRID_ROWS, block_h, _GRID_COLS, block_w, *image.shape[2:])


def encode_frame_ids(*, episode_index: int, frame_index: int, camera_index: int, height: int, width: int) -> np.ndarray:
    """Return a uint8 HWC RGB image whose gray blocks spell the ids (episode, frame 0..4095; camera 0..15)."""
    limits = {"episode_index": (episode_index, 0, _MAX_ID), "frame_index": (frame_index, 0, _MAX_ID),
              "camera_index": (camera_index, 0, 15), "height": (height, _MIN_SIDE, 2**16),
              "width": (width, _MIN_SIDE, 2**16)}
    for name, (value, low, high) in limits.items():
        if not low <= value <= high:
            raise invalid(name, value, f"integers in [{low}, {high}]")
    checksum = _checksum(frame_index, episode_index, camera_index)
    word = (frame_index << 20) | (episode_index << 8) | (camera_index << 4) | checksum
    image = np.full((height, width, 3), 128, dtype=np.uint8)
    bits = (word >> (31 - np.arange(_GRID_ROWS * _GRID_COLS))) & 1
    levels = np.where(bits == 1, _LIGHT, _DARK).astype(np.uint8).reshape(_GRID_ROWS, 1, _GRID_COLS, 1, 1)
    _blocks(image)[...] = levels  # a view: fills each whole block (numpy rather than a loop per block)
    return image


def decode_frame_ids(frame) -> tuple[int, int, int]:
    """Read back ``(episode_index, frame_index, camera_index)`` from a (possibly lossy) frame.

    Accepts a numpy array or torch tensor, uint8 in [0, 255] or float in [0, 1], CHW or HWC.
    Raises ValueError when a block is neither dark nor light or the checksum disagrees: not an
    id frame, or one damaged beyond what lossy coding does.
    """
    array = frame.detach().cpu().numpy() if hasattr(frame, "detach") else np.asarray(frame)
    if array.ndim != 3 or 3 not in (array.shape[0], array.shape[-1]):
        raise ValueError(f"Invalid frame shape ({tuple(array.shape)}): expected CHW or HWC with 3 channels.")
    if array.shape[-1] != 3:
        array = array.transpose(1, 2, 0)
    scale = 255.0 if np.issubdtype(array.dtype, np.floating) else 1.0
    threshold, word = (_DARK + _LIGHT) / 2, 0
    blocks = _blocks(array)
    block_h, block_w = blocks.shape[1], blocks.shape[3]
    inset_h, inset_w = block_h // 4, block_w // 4
    # Each block's mean gray level (over its pixels and channels), of its central half only: block
    # edges ring and bleed into neighbours after lossy coding.
    centres = blocks[:, inset_h:block_h - inset_h, :, inset_w:block_w - inset_w]
    levels = centres.mean(axis=(1, 3, 4), dtype=np.float64).ravel() * scale
    for bit, level in enumerate(levels.tolist()):
        if abs(level - threshold) < (_LIGHT - _DARK) / 4:
            raise ValueError(f"Frame does not carry readable ids: block {bit} has mean gray level {level:.1f}.")
        word |= int(level > threshold) << (31 - bit)
    frame_index, episode_index, camera_index = word >> 20, (word >> 8) & _MAX_ID, (word >> 4) & 15
    if word & 15 != _checksum(frame_index, episode_index, camera_index):
        raise ValueError(f"Frame does not carry readable ids: checksum mismatch in {word:#010x}.")
    return episode_index, frame_index, camera_index


def _episode_lengths(episode_length, num_episodes: int, seed: int) -> list[int]:
    """An int; a (min, max) tuple, drawn from per episode; or a sequence of each episode's length."""
    pair = isinstance(episode_length, tuple) and len(episode_length) == 2
    if isinstance(episode_length, int):
        lengths = [episode_length] * num_episodes
    elif isinstance(episode_length, Sequence) and not isinstance(episode_length, str):
        lengths = list(episode_length)
    else:
        lengths = []
    in_range = all(isinstance(n, (int, np.integer)) and 1 <= n <= _MAX_ID + 1 for n in lengths)
    if pair and in_range and lengths[0] <= lengths[1]:
        return [int(n) for n in np.random.default_rng(seed).integers(lengths[0], lengths[1] + 1, size=num_episodes)]
    if pair or not in_range or len(lengths) != num_episodes:
        raise invalid("episode_length", episode_length, f"an int, an inclusive (min, max) tuple, or a list of "
                       f"{num_episodes} lengths, all in [1, {_MAX_ID + 1}] (frame ids have 12 bits)")
    return [int(n) for n in lengths]


def _validate(*, ints, sizes_mb, height, width, codec, cameras, image_keys, max_per_data, max_per_video):
    """Check every option once; return max_episodes_per_video_file as a per-camera dict."""
    for name, (value, low, high) in ints.items():
        if not isinstance(value, int) or not low <= value <= high:
            raise invalid(name, value, f"integers in [{low}, {high}]")
    for name, value in sizes_mb.items():
        if not isinstance(value, (int, float)) or not value > 0:
            raise invalid(name, value, "positive numbers")
    for name, value in (("height", height), ("width", width)):
        # yuv420p needs even sides; SVT-AV1 and readable id blocks want at least 64 pixels.
        if not isinstance(value, int) or value < _MIN_SIDE or value % 8:
            raise invalid(name, value, f"multiples of 8 that are >= {_MIN_SIDE}")
    if codec not in _CODECS:
        raise invalid("codec", codec, ", ".join(map(repr, _CODECS)))
    tabular = {"observation.state", "action", "timestamp", "frame_index", "episode_index", "index", "task_index",
               "next.done"}
    for name, keys, taken in (("cameras", cameras, tabular), ("image_keys", image_keys, tabular | set(cameras))):
        # The camera index of the id frames has 4 bits, so cameras and image keys share 16 slots.
        too_many = len(cameras) + len(image_keys) > 16
        if isinstance(keys, str) or len(set(keys)) != len(keys) or taken & set(keys) or too_many:
            raise invalid(name, keys, "distinct names, none a tabular feature or a camera, 16 in all with the other")
    if max_per_data is not None and (not isinstance(max_per_data, int) or max_per_data < 1):
        raise invalid("max_episodes_per_data_file", max_per_data, "None or a positive int")
    per_camera = max_per_video if isinstance(max_per_video, Mapping) else dict.fromkeys(cameras, max_per_video)
    if set(per_camera) - set(cameras) or any(v is not None and (not isinstance(v, int) or v < 1)
                                             for v in per_camera.values()):
        raise invalid("max_episodes_per_video_file", max_per_video,
                       f"None, a positive int, or a mapping from some of {list(cameras)} to those")
    return {camera: per_camera.get(camera) for camera in cameras}


class _RollingFile:
    """The open file of one stream (the data, or one camera) and where it is in the chunk/file layout."""

    def __init__(self, path_template: str, *, max_bytes: float, max_episodes: int | None, chunks_size: int, **fields):
        self.path_template, self.fields = path_template, fields
        self.max_bytes, self.max_episodes, self.chunks_size = max_bytes, max_episodes, chunks_size
        self.chunk_index = self.file_index = self.num_bytes = self.num_episodes = self.num_frames = 0
        self.handle = None

    def for_next_episode(self, out: pathlib.Path, open_file):
        """Return the file the next episode goes to: the open one, or a new one once that is full."""
        full = self.num_bytes >= self.max_bytes or self.num_episodes >= (self.max_episodes or float("inf"))
        if self.handle is not None and full:
            self.close()
            self.file_index += 1
            if self.file_index >= self.chunks_size:
                self.chunk_index, self.file_index = self.chunk_index + 1, 0
            self.num_bytes = self.num_episodes = self.num_frames = 0
        if self.handle is None:
            path = out / self.path_template.format(chunk_index=self.chunk_index, file_index=self.file_index,
                                                   **self.fields)
            path.parent.mkdir(parents=True, exist_ok=True)
            self.handle = open_file(path)
        return self.handle

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
        self.handle = None


@contextlib.contextmanager
def _environment_default(name: str, value: str | None) -> Iterator[None]:
    """Set ``name`` to ``value`` (unless it is set already, or ``value`` is None) for the block only."""
    if value is None or name in os.environ:
        yield
        return
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)


@contextlib.contextmanager
def _scheduling_kept() -> Iterator[None]:
    """Undo real-time scheduling that the block gives this process's threads.

    SVT-AV1 4.x, run as root, switches the thread that opens an encoder to SCHED_FIFO priority 99
    (its own threads inherit it): a test session or benchmark that writes a dataset then runs in
    real time for the rest of its life and starves every other process of the machine (measured
    here: two such pytest processes on 2 cores left a third unable even to exit). Threads that
    were not real-time before the block are put back to the normal policy.
    """
    if not hasattr(os, "sched_getscheduler") or not os.path.isdir("/proc/self/task"):  # not Linux
        yield
        return
    realtime = {os.SCHED_FIFO, os.SCHED_RR}
    was_realtime = {tid for tid in _thread_ids() if _policy(tid) in realtime}
    try:
        yield
    finally:
        for tid in _thread_ids():
            if tid not in was_realtime and _policy(tid) in realtime:
                try:
                    os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                except OSError:  # the thread ended meanwhile
                    pass


def _thread_ids() -> list[int]:
    return [int(name) for name in os.listdir("/proc/self/task")]


def _policy(tid: int) -> int | None:
    try:
        return os.sched_getscheduler(tid)
    except OSError:  # the thread ended meanwhile
        return None


class _VideoFile:
    """One camera's mp4: a single encoder stream that the file's episodes are appended to."""

    def __init__(self, path: pathlib.Path, *, codec: str, fps: int, height: int, width: int, gop: int, crf: int):
        self.container = av.open(str(path), mode="w")
        self.stream = self.container.add_stream(_CODECS[codec], rate=fps)
        self.stream.width, self.stream.height, self.stream.pix_fmt = width, height, "yuv420p"
        self.stream.codec_context.time_base = Fraction(1, fps)
        # Faster SVT-AV1 presets leave stale blocks of earlier frames in inter frames, which breaks the
        # ids: 11-12 even at g=2, 10 at g>=10. 8 was clean at every size and GOP tried, and as fast here.
        preset = "8" if codec == "av1" else "ultrafast"
        self.stream.options = {"g": str(gop), "crf": str(crf), "preset": preset}
        if codec == "hevc":
            # B-frames and open GOPs, as LeRobot's HEVC (x265's defaults, which "ultrafast" would
            # otherwise trim), so that decode order differs from presentation order as in its files.
            self.stream.options["x265-params"] = "bframes=4:b-adapt=0:open-gop=1:log-level=error"
        # SVT-AV1 prints its whole configuration to stderr for every encoder it opens (dozens of
        # lines per file) unless SVT_LOG says otherwise; 1 keeps its errors. It has no option for
        # this, only the environment variable, read (getenv) when the encoder opens: so the codec
        # is opened here, with SVT_LOG set for that call only and the environment restored after.
        # A user's own SVT_LOG wins. (Opening early encodes exactly as the lazy open at the first
        # frame did: same options, same bytes.)
        with _environment_default("SVT_LOG", "1" if codec == "av1" else None), _scheduling_kept():
            self.stream.codec_context.open()

    def write(self, image: np.ndarray, *, pts: int) -> int:
        """Encode one frame; return the bytes of the packets it released (earlier frames', given encoder delay)."""
        frame = av.VideoFrame.from_ndarray(image, format="rgb24")
        frame.pts = pts
        return self._mux(self.stream.encode(frame))

    def _mux(self, packets) -> int:
        for packet in packets:
            self.container.mux(packet)
        return sum(packet.size for packet in packets)

    def close(self) -> None:
        self._mux(self.stream.encode(None))  # the packets the encoder still holds
        self.container.close()


class _DepthVideoFile(_VideoFile):
    """A depth camera's mp4 as LeRobot 0.6's default depth encoder writes it: HEVC, 12-bit ``gray12le``,
    lossless, GOP 2 with B-frames (x265's defaults)."""

    def __init__(self, path: pathlib.Path, *, fps: int, height: int, width: int, **_: object):
        self.container = av.open(str(path), mode="w")
        self.stream = self.container.add_stream("libx265", rate=fps)
        self.stream.width, self.stream.height, self.stream.pix_fmt = width, height, "gray12le"
        self.stream.codec_context.time_base = Fraction(1, fps)
        self.stream.options = {"g": "2", "x265-params": "lossless=1:log-level=error"}
        with _scheduling_kept():
            self.stream.codec_context.open()

    def write(self, image: np.ndarray, *, pts: int) -> int:
        frame = av.VideoFrame.from_ndarray(image, format="gray12le")
        frame.pts = pts
        return self._mux(self.stream.encode(frame))


# LeRobot 0.6's default depth quantiser (``configs/video.py``), in metres; samples dequantise it exactly.
DEPTH_CODING = {"video.depth_min": 0.01, "video.depth_max": 10.0, "video.shift": 3.5, "video.use_log": True}


def synthetic_depth_mm(*, episode_index: int, frame_index: int, height: int, width: int) -> np.ndarray:
    """The depth (mm, float32 (H, W)) a synthetic depth camera records: 500 mm + 40 mm a frame + 300 mm an
    episode, plus a left-to-right ramp of up to 1 m, so that a frame is told by its depth."""
    ramp = np.linspace(0, 1000, width, dtype=np.float32)[None, :].repeat(height, axis=0)
    return np.float32(500 + 40 * frame_index + 300 * episode_index) + ramp


def quantize_depth_mm(depth_mm: np.ndarray) -> np.ndarray:
    """Depth in mm as LeRobot's ``quantize_depth`` codes it (log, float32 arithmetic in mm), uint16 0..4095."""
    depth_min, depth_max, shift = (np.float32(DEPTH_CODING[f"video.{k}"] * 1000) for k in ("depth_min", "depth_max", "shift"))
    log_min, log_max = np.log(float(depth_min + shift)), np.log(float(depth_max + shift))
    norm = (np.log(depth_mm.astype(np.float32) + shift) - log_min) / (log_max - log_min)
    return np.rint(norm * 4095).clip(0, 4095).astype(np.uint16)


class _ParquetFile:
    """A ParquetWriter on our own sink, so that ``tell()`` gives the bytes written so far."""

    def __init__(self, path: pathlib.Path, schema: pa.Schema):
        self.sink = pa.OSFile(str(path), "wb")
        self.writer = pq.ParquetWriter(self.sink, schema)

    def write(self, table: pa.Table) -> int:
        self.writer.write_table(table, row_group_size=len(table))  # one row group per episode, as LeRobot writes
        return self.sink.tell()

    def close(self) -> None:
        self.writer.close()
        self.sink.close()


def _png(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


def _stats(values: np.ndarray, *, image: bool = False) -> dict[str, list]:
    """One episode's stats as LeRobot writes them: min, max, mean, std, count and the quantiles
    q01..q99; images reduce over frames and pixels to LeRobot's (3, 1, 1) in [0, 1]."""
    if image:
        # From per-channel histograms: exact, and much faster than float reductions over every pixel.
        hist = np.stack([np.bincount(values[..., c].ravel(), minlength=256) for c in range(3)])
        levels, used = np.arange(256) / 255, hist > 0
        mean = hist @ levels / hist.sum(1)
        std = np.sqrt((hist * (levels - mean[:, None]) ** 2).sum(1) / hist.sum(1))
        low, high = levels[used.argmax(1)], levels[255 - used[:, ::-1].argmax(1)]
        cdf = np.cumsum(hist, 1) / hist.sum(1, keepdims=True)
        quantiles = {name: levels[(cdf < q).sum(1)] for name, q in _QUANTILES.items()}  # lowest level reaching q
        summary, shape = {"min": low, "max": high, "mean": mean, "std": std, **quantiles}, (3, 1, 1)
    else:
        flat = values.reshape(len(values), -1).astype(np.float64)
        quantiles = {name: np.quantile(flat, q, axis=0) for name, q in _QUANTILES.items()}
        summary = {"min": flat.min(0), "max": flat.max(0), "mean": flat.mean(0), "std": flat.std(0), **quantiles}
        shape = (-1,)
    return {**{name: stat.reshape(shape).tolist() for name, stat in summary.items()}, "count": [len(values)]}


def _pool(parts: list[dict[str, list]]) -> dict[str, list]:
    """Dataset stats from episode stats: pooled mean and (population) variance, exactly; quantiles
    as LeRobot aggregates them, the count-weighted mean of the episodes' quantiles."""
    counts = np.array([p["count"][0] for p in parts], np.float64)
    means, stds = np.array([p["mean"] for p in parts]), np.array([p["std"] for p in parts])
    weights = (counts / counts.sum()).reshape((-1,) + (1,) * (means.ndim - 1))
    mean = (weights * means).sum(0)
    variance = (weights * (stds**2 + (means - mean) ** 2)).sum(0)
    quantiles = {name: (weights * np.array([p[name] for p in parts])).sum(0).tolist() for name in _QUANTILES}
    return {"min": np.min([p["min"] for p in parts], 0).tolist(), "max": np.max([p["max"] for p in parts], 0).tolist(),
            "mean": mean.tolist(), "std": np.sqrt(variance).tolist(), "count": [int(counts.sum())], **quantiles}


def _features(*, state_dim, cameras, image_keys, height, width, codec, fps, gop, crf) -> dict:
    scalar = lambda dtype: {"dtype": dtype, "shape": [1], "names": None}  # noqa: E731
    vector = {"dtype": "float32", "shape": [state_dim], "names": [f"motor_{j}" for j in range(state_dim)]}
    features = {"observation.state": vector, "action": dict(vector), "timestamp": scalar("float32"),
                "frame_index": scalar("int64"), "episode_index": scalar("int64"), "index": scalar("int64"),
                "task_index": scalar("int64"), "next.done": scalar("bool")}
    image = {"shape": [height, width, 3], "names": ["height", "width", "channels"]}
    for camera in cameras:
        features[camera] = {"dtype": "video", **image, "info": {
            "video.height": height, "video.width": width, "video.codec": codec, "video.pix_fmt": "yuv420p",
            "video.is_depth_map": False, "video.fps": fps, "video.channels": 3, "video.g": gop, "has_audio": False}}
    for key in image_keys:
        features[key] = {"dtype": "image", **image}
    return features


def _lerobot06_features(depth_cameras, extra_dtypes, *, height, width, fps, **_) -> dict:
    features: dict = {}
    for camera in depth_cameras:
        features[camera] = {"dtype": "video", "shape": [height, width, 1], "names": ["height", "width", "channels"],
                            "info": {"is_depth_map": True, "depth_unit": "mm", "video.height": height,
                                     "video.width": width, "video.codec": "hevc", "video.pix_fmt": "gray12le",
                                     "video.fps": fps, "video.channels": 1, "video.g": 2, "has_audio": False,
                                     **DEPTH_CODING}}
    if extra_dtypes:
        features.update({"observation.float64": {"dtype": "float64", "shape": [3], "names": None},
                         "observation.int32": {"dtype": "int32", "shape": [1], "names": None},
                         "observation.matrix": {"dtype": "float32", "shape": [2, 3], "names": None}})
    return features


def _tasks_table(num_tasks: int) -> pa.Table:
    tasks = [f"synthetic task {t}" for t in range(num_tasks)]
    table = pa.table({"task": tasks, "task_index": pa.array(range(num_tasks), pa.int64())})
    # pandas metadata makes `task` the index, as LeRobot's own writer (DataFrame.to_parquet) leaves it.
    column = lambda name, pandas_type, numpy_type: {  # noqa: E731
        "name": name, "field_name": name, "pandas_type": pandas_type, "numpy_type": numpy_type, "metadata": None}
    pandas_meta = {"index_columns": ["task"], "column_indexes": [{**column(None, "unicode", "object"),
                                                                  "metadata": {"encoding": "UTF-8"}}],
                   "columns": [column("task_index", "int64", "int64"), column("task", "unicode", "object")],
                   "creator": {"library": "pyarrow", "version": pa.__version__}, "pandas_version": "2.2.0"}
    return table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})


def write_synthetic_dataset(
    root: str | os.PathLike, *,
    num_episodes: int = 8,
    episode_length: int | tuple[int, int] | Sequence[int] = 50,
    fps: int = 30,
    cameras: Sequence[str] = ("observation.images.front", "observation.images.wrist"),
    height: int = 64, width: int = 96,
    codec: Literal["av1", "h264", "hevc"] = "av1",
    gop: int = 2,
    crf: int = 30,
    state_dim: int = 6,
    image_keys: Sequence[str] = (),
    num_tasks: int = 2,
    chunks_size: int = 1000,
    data_files_size_in_mb: float = 100.0,
    video_files_size_in_mb: float = 200.0,
    max_episodes_per_data_file: int | None = None,
    max_episodes_per_video_file: int | Mapping[str, int] | None = None,
    seed: int = 0,
    overwrite: bool = False,
    progress: bool = False,
    texture: bool = False,
    version: Literal["v3.0", "v2.1", "v2.0"] = "v3.0",
    depth_cameras: Sequence[str] = (),
    extra_dtypes: bool = False,
    language: bool = False,
) -> pathlib.Path:
    """Write a LeRobot v3.0 (or ``version`` v2.1 / v2.0) dataset at ``root`` and return its path.

    What to write: ``num_episodes`` episodes of ``episode_length`` frames (an int; an inclusive
    ``(min, max)`` tuple drawn per episode from ``seed``; or a list of each episode's length; a pair is
    always read as (min, max)) at ``fps``; ``cameras`` as mp4 video (``codec``, ``gop``, ``crf``) and
    ``image_keys`` as PNG in the data parquet, all ``height`` x ``width``.
    ``codec`` "hevc" writes x265 with B-frames and open GOPs, as LeRobot's HEVC (decode order differs
    from presentation order).
    Ids in the values: frames encode ids (``decode_frame_ids``; camera index is the position in
    ``cameras + image_keys``); ``observation.state[j] = episode*1000 + frame + j/8``, ``action =
    state + 0.5``; ``task_index = episode % num_tasks``.
    (``j/8`` keeps the ids readable for ``state_dim <= 8``).
    ``texture`` adds a moving, camera-like texture under the id blocks so that file sizes and decode
    cost resemble real footage (flat blocks alone compress to ~200 bytes a frame and decode far
    faster than any camera video, which would make decoder benchmarks meaningless).
    File layout: ``chunks_size`` files per chunk folder; data and each camera's video roll over to a
    new file past their size in MB or their ``max_episodes_per_*_file`` (video: per camera allowed).
    Video bytes count as the encoder releases packets, so a file can pass its size by the encoder's
    delay (SVT-AV1: tens of frames); ``max_episodes_per_video_file`` is exact.
    LeRobot 0.6 features: ``depth_cameras`` as LeRobot's default depth encoder writes them (HEVC
    ``gray12le``, lossless, B-frames; the depth ``synthetic_depth_mm`` gives, quantised with
    ``DEPTH_CODING``, ``depth_unit`` "mm"; v3.0 only); ``extra_dtypes`` adds ``observation.float64``
    (float64 (3,): the state's first three + 1/3), ``observation.int32`` (int32 (1,): ``frame * 7 +
    episode``) and ``observation.matrix`` (float32 (2, 3) as a ``datasets`` Array2D column: ``state[0] +
    [[0, 1, 2], [3, 4, 5]]``).
    Format: ``version`` "v2.1" or "v2.0" writes LeRobot 0.3.x's layout instead, with the same frames
    and values: one parquet and one mp4 per camera per episode (each starting at timestamp 0, in
    ``chunks_size`` episodes per chunk folder), ``meta/episodes.jsonl``, ``meta/tasks.jsonl`` and
    ``meta/episodes_stats.jsonl`` (v2.1) or ``meta/stats.json`` (v2.0); the file-size and
    ``max_episodes_per_*_file`` options are v3.0's only (v2.x has no multi-episode files).
    ``language`` adds LeRobot 0.6's language annotation columns (``language_persistent``,
    ``language_events``) and info.json ``tools`` as its annotation pipeline writes them (v3.0 only;
    what each frame holds: ``tools/_synthetic_language.py``).
    Safety: a non-empty ``root`` is refused unless ``overwrite``; the dataset is built in a sibling
    temporary folder and renamed into place, so a crash leaves no half-written dataset.
    """
    root = pathlib.Path(root)
    # 2048 episodes keep episode*1000 + frame + j/8 exact in float32 (below 2**21); ids allow 4096 frames.
    ints = {"num_episodes": (num_episodes, 1, 2048), "fps": (fps, 1, 1000), "gop": (gop, 1, 1000),
            "crf": (crf, 0, 51), "state_dim": (state_dim, 1, 1024), "num_tasks": (num_tasks, 1, 2**20),
            "chunks_size": (chunks_size, 1, 2**20), "seed": (seed, 0, 2**63)}
    sizes_mb = {"data_files_size_in_mb": data_files_size_in_mb, "video_files_size_in_mb": video_files_size_in_mb}
    max_per_video = _validate(ints=ints, sizes_mb=sizes_mb, height=height, width=width, codec=codec,
                              cameras=cameras, image_keys=image_keys, max_per_data=max_episodes_per_data_file,
                              max_per_video=max_episodes_per_video_file)
    lengths = _episode_lengths(episode_length, num_episodes, seed)
    if version not in ("v3.0", *V2_VERSIONS):
        raise invalid("version", version, ", ".join(map(repr, ("v3.0", *V2_VERSIONS))))
    if version != "v3.0" and (max_episodes_per_data_file is not None or max_episodes_per_video_file is not None):
        raise invalid("max_episodes_per_data_file" if max_episodes_per_data_file is not None else
                      "max_episodes_per_video_file", max_episodes_per_data_file or max_episodes_per_video_file,
                      f"None with version={version!r} (every v2.x episode has its own files)")
    depth_cameras = list(depth_cameras)
    if isinstance(depth_cameras, str) or len(set(depth_cameras)) != len(depth_cameras) or set(depth_cameras) & {
            *cameras, *image_keys, "observation.state", "action"} or len(cameras) + len(depth_cameras) > 16:
        raise invalid("depth_cameras", depth_cameras, "distinct names, none a camera, image key or tabular feature")
    if depth_cameras and version != "v3.0":
        raise invalid("depth_cameras", depth_cameras, f"() with version={version!r} (depth is LeRobot 0.6, v3.0)")
    extra_dtypes = check_bool("extra_dtypes", extra_dtypes)
    if extra_dtypes and state_dim < 3:
        raise invalid("state_dim", state_dim, "at least 3 with extra_dtypes=True")
    if check_bool("language", language) and version != "v3.0":
        raise invalid("language", language, f"False with version={version!r} (LeRobot 0.6 annotates v3.0 datasets)")
    check_root(root, overwrite=overwrite)
    return write_into_place(root, lambda staging: _write(
        staging, lengths=lengths, fps=fps, cameras=list(cameras), image_keys=list(image_keys),
        encoding=dict(codec=codec, height=height, width=width, gop=gop, crf=crf), state_dim=state_dim,
        num_tasks=num_tasks, chunks_size=chunks_size, data_mb=data_files_size_in_mb,
        video_mb=video_files_size_in_mb, max_per_data=max_episodes_per_data_file, max_per_video=max_per_video,
        progress=progress, texture=check_bool("texture", texture), version=version, depth_cameras=depth_cameras,
        extra_dtypes=extra_dtypes, language=language))


def _add_texture(images: np.ndarray, frames: np.ndarray, *, camera_index: int) -> np.ndarray:
    """Overlay a blocky random texture (+-24 gray levels) that pans one pixel per frame, plus a
    little per-frame noise: inter prediction finds the motion and still pays for a residual, as
    with a real camera. The id blocks are 192 levels apart with a 48-level margin, so ids survive."""
    _, height, width, _ = images.shape
    rng = np.random.default_rng(1000 + camera_index)
    coarse = rng.integers(-24, 25, size=(height // 4 + 1, width // 4 + 2), dtype=np.int16)
    field = np.kron(coarse, np.ones((4, 4), dtype=np.int16))[:height]
    out = np.empty_like(images)
    for i, frame in enumerate(frames):
        shifted = np.roll(field, int(frame), axis=1)[:, :width]
        noise = np.random.default_rng((camera_index, int(frame))).integers(-4, 5, size=(height, width), dtype=np.int16)
        out[i] = np.clip(images[i].astype(np.int16) + (shifted + noise)[..., None], 0, 255).astype(np.uint8)
    return out


def _write_episode(out: pathlib.Path, *, episode_index: int, length: int, global_index: int, data: _RollingFile,
                   videos: dict[str, _RollingFile], image_keys: list[str], fps: int, encoding: dict, state_dim: int,
                   num_tasks: int, texture: bool, depth_cameras=(), extra_dtypes=False,
                   language: bool = False) -> tuple[dict, dict]:
    """Append one episode to the data file and each camera's video; return its metadata row and stats."""
    frames = np.arange(length)
    state = (episode_index * 1000 + frames[:, None] + np.arange(state_dim)[None, :] / 8).astype(np.float32)
    columns = {"observation.state": state, "action": state + np.float32(0.5),
               "timestamp": (frames / fps).astype(np.float32), "frame_index": frames.astype(np.int64),
               "episode_index": np.full(length, episode_index, np.int64),
               "index": np.arange(global_index, global_index + length, dtype=np.int64),
               "task_index": np.full(length, episode_index % num_tasks, np.int64)}
    stats = {key: _stats(values) for key, values in columns.items()}
    table = {key: pa.FixedSizeListArray.from_arrays(values.reshape(-1), state_dim) if values.ndim == 2
             else pa.array(values) for key, values in columns.items()}
    table["next.done"] = pa.array(frames == length - 1)
    if extra_dtypes:
        table.update(_extra_dtype_columns(state, frames, episode_index, stats))
    if language:
        table.update(language_columns(episode_index, length, fps, list(videos)))
    row = {"episode_index": episode_index, "tasks": [f"synthetic task {episode_index % num_tasks}"], "length": length}
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    for key in depth_cameras:
        depth = np.stack([synthetic_depth_mm(episode_index=episode_index, frame_index=int(f), height=encoding["height"],
                                             width=encoding["width"]) for f in frames])
        # Per-pixel stats in mm with LeRobot's (1, 1, 1) shape; ``count`` is the frames'.
        pixel_stats = _stats(depth.reshape(-1, 1))
        stats[key] = {name: np.asarray(value).reshape(1, 1, 1).tolist() for name, value in pixel_stats.items()
                      if name != "count"} | {"count": [length]}
        _append_video(out, videos[key], quantize_depth_mm(depth), row, key=key, length=length, fps=fps,
                      open_file=functools.partial(_DepthVideoFile, fps=fps, **encoding))
    for camera_index, key in enumerate([*(k for k in videos if k not in depth_cameras), *image_keys]):
        images = np.stack([encode_frame_ids(episode_index=episode_index, frame_index=int(f), camera_index=camera_index,
                                            height=encoding["height"], width=encoding["width"]) for f in frames])
        if texture:
            images = _add_texture(images, frames, camera_index=camera_index)
        stats[key] = _stats(images, image=True)
        if key in image_keys:
            table[key] = pa.array([{"bytes": _png(image), "path": None} for image in images], image_type)
            continue
        _append_video(out, videos[key], images, row, key=key, length=length, fps=fps,
                      open_file=functools.partial(_VideoFile, fps=fps, **encoding))
    table = pa.table(table)
    parquet = data.for_next_episode(out, functools.partial(_ParquetFile, schema=table.schema))
    data.num_bytes, data.num_episodes = parquet.write(table), data.num_episodes + 1
    row.update({"data/chunk_index": data.chunk_index, "data/file_index": data.file_index,
                "dataset_from_index": global_index, "dataset_to_index": global_index + length,
                "meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0})
    row.update({f"stats/{key}/{name}": value for key, values in stats.items() for name, value in values.items()})
    return row, stats


def _append_video(out: pathlib.Path, roll, images: np.ndarray, row: dict, *, key: str, length: int, fps: int,
                  open_file) -> None:
    """Append an episode's ``images`` to ``key``'s rolling video file and record its span in ``row``."""
    video = roll.for_next_episode(out, open_file)
    # pts run on across the file's episodes, so a frame plays at from_timestamp + frame_index / fps.
    roll.num_bytes += sum(video.write(image, pts=roll.num_frames + f) for f, image in enumerate(images))
    row.update({f"videos/{key}/chunk_index": roll.chunk_index, f"videos/{key}/file_index": roll.file_index,
                f"videos/{key}/from_timestamp": roll.num_frames / fps,
                f"videos/{key}/to_timestamp": (roll.num_frames + length) / fps})
    roll.num_frames, roll.num_episodes = roll.num_frames + length, roll.num_episodes + 1


def _extra_dtype_columns(state: np.ndarray, frames: np.ndarray, episode_index: int, stats: dict) -> dict:
    """``extra_dtypes``' columns, stored as LeRobot's writer stores them (its stats recorded too)."""
    from datasets.features.features import Array2DExtensionType  # LeRobot's (2, 3) column type

    values: dict[str, np.ndarray] = {"observation.float64": state[:, :3].astype(np.float64) + 1 / 3,
                                     "observation.int32": (frames * 7 + episode_index).astype(np.int32),
                                     "observation.matrix": state[:, :1, None] + np.arange(6, dtype=np.float32).reshape(1, 2, 3)}
    stats.update({key: _stats(v.reshape(len(frames), -1)) for key, v in values.items()})
    matrix = pa.ExtensionArray.from_storage(
        Array2DExtensionType((2, 3), "float32"),
        pa.array(values["observation.matrix"].tolist(), pa.list_(pa.list_(pa.float32()))))
    return {"observation.float64": pa.FixedSizeListArray.from_arrays(values["observation.float64"].reshape(-1), 3),
            "observation.int32": pa.array(values["observation.int32"]), "observation.matrix": matrix}


def _write(out: pathlib.Path, *, lengths, fps, cameras, image_keys, encoding, state_dim, num_tasks, chunks_size,
           data_mb, video_mb, max_per_data, max_per_video, progress, texture, version, depth_cameras=(),
           extra_dtypes=False, language=False) -> None:
    data: _RollingFile | PerEpisodeFile
    videos: dict[str, _RollingFile] | dict[str, PerEpisodeFile]
    if version == "v3.0":
        data = _RollingFile(_DATA_PATH, max_bytes=data_mb * 2**20, max_episodes=max_per_data, chunks_size=chunks_size)
        videos = {camera: _RollingFile(_VIDEO_PATH, max_bytes=video_mb * 2**20, max_episodes=max_per_video[camera],
                                       chunks_size=chunks_size, video_key=camera) for camera in cameras}
        videos.update({camera: _RollingFile(_VIDEO_PATH, max_bytes=video_mb * 2**20, max_episodes=None,
                                            chunks_size=chunks_size, video_key=camera) for camera in depth_cameras})
    else:
        data = PerEpisodeFile(V2_DATA_PATH, chunks_size=chunks_size)
        videos = {camera: PerEpisodeFile(V2_VIDEO_PATH, chunks_size=chunks_size, video_key=camera)
                  for camera in cameras}
    episode_rows, episode_stats, global_index = [], {}, 0
    per_episode_stats = []
    try:
        for episode_index, length in enumerate(tqdm(lengths, desc="episodes", disable=not progress)):
            row, stats = _write_episode(out, episode_index=episode_index, length=length, global_index=global_index,
                                        data=data, videos=videos, image_keys=image_keys, fps=fps, encoding=encoding,
                                        state_dim=state_dim, num_tasks=num_tasks, texture=texture,
                                        depth_cameras=depth_cameras, extra_dtypes=extra_dtypes,
                                        language=language)
            episode_rows.append(row)
            per_episode_stats.append(stats)
            for key, values in stats.items():
                episode_stats.setdefault(key, []).append(values)
            global_index += length
    finally:  # flush what was written; on failure the caller removes the staging folder anyway
        for roll in (data, *videos.values()):
            roll.close()
    stats = {key: _pool(parts) for key, parts in episode_stats.items()}
    features = _features(state_dim=state_dim, cameras=cameras, image_keys=image_keys, fps=fps, **encoding)
    features.update(_lerobot06_features(depth_cameras, extra_dtypes, fps=fps, **encoding))
    if version != "v3.0":
        write_v2_metadata(out, version=version, episode_rows=episode_rows, episode_stats=per_episode_stats,
                          dataset_stats=stats, fps=fps, num_tasks=num_tasks, chunks_size=chunks_size,
                          cameras=cameras, features=features)
        return
    (out / _EPISODES_PATH).parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(episode_rows), out / _EPISODES_PATH)
    pq.write_table(_tasks_table(num_tasks), out / "meta/tasks.parquet")
    (out / "meta/stats.json").write_text(json.dumps(stats, indent=4))
    info = {"codebase_version": "v3.0", "robot_type": "synthetic", "total_episodes": len(lengths),
            "total_frames": global_index, "total_tasks": num_tasks, "chunks_size": chunks_size,
            "data_files_size_in_mb": data_mb, "video_files_size_in_mb": video_mb, "fps": fps,
            "splits": {"train": f"0:{len(lengths)}"}, "data_path": _DATA_PATH,
            "video_path": _VIDEO_PATH if cameras or depth_cameras else None,
            "features": features}
    if language:
        info["features"].update(language_features())
        info["tools"] = language_tools()
    (out / "meta/info.json").write_text(json.dumps(info, indent=4))
