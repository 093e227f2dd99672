"""Building one sample from an episode's rows: values, windows, padding masks, video and task.

Both datasets build samples here, so streamed and map-style samples cannot drift apart. The
result matches LeRobot's map-style ``LeRobotDataset.__getitem__`` key for key, dtype for dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from episodestream._format.depth import DEFAULT_DEPTH_UNIT, DepthUnit, coding_of, in_unit, stored_unit
from episodestream._sample.chw import FrameWrites, divide_by_255_
from episodestream._format.files import EpisodeVideos
from episodestream._format.language import copy_rows
from episodestream._format.metadata import DatasetMeta
from episodestream._format.rows import EpisodeRows
from episodestream._sample.depth import DepthDecoding
from episodestream._sample.images import decode_image
from episodestream._sample.video.decoder_cache import DecodedFile, DecoderCache, DecoderShare, FrameQuery, decode_files


def delta_indices(meta: DatasetMeta, delta_timestamps: Mapping[str, Sequence[float]] | None,
                  tolerance_s: float) -> dict[str, np.ndarray]:
    """Check ``delta_timestamps`` once and turn it into frame offsets (``round(delta * fps)``)."""
    if delta_timestamps is None:
        return {}
    if not isinstance(delta_timestamps, Mapping):
        raise TypeError(f"delta_timestamps must be a dict {{feature_key: [seconds, ...]}}, got {delta_timestamps!r}.")
    offsets = {}
    for key, deltas in delta_timestamps.items():
        if key not in meta.features:
            raise ValueError(f"delta_timestamps key {key!r} is not a feature of {meta.description}. "
                             f"Valid keys are {sorted(meta.features)}.")
        if meta.features[key].dtype == "language":
            raise ValueError(f"delta_timestamps key {key!r}: windows of a language column are not supported "
                             f"(LeRobot's reader cannot stack its lists of rows either); leave {key!r} out of "
                             f"delta_timestamps, each sample carries its own frame's rows.")
        if isinstance(deltas, (str, bytes)) or not isinstance(deltas, Sequence) or not deltas:
            raise ValueError(f"delta_timestamps[{key!r}] must be a non-empty list of seconds, got {deltas!r}.")
        not_numbers = [d for d in deltas if isinstance(d, (bool, np.bool_))
                       or not isinstance(d, (int, float, np.integer, np.floating))]
        if not_numbers:
            raise ValueError(f"delta_timestamps[{key!r}] must be a list of numbers (seconds); {not_numbers[0]!r} "
                             f"is not one.")
        seconds = np.asarray(deltas, dtype=np.float64)
        # NaN or inf would round to garbage offsets and silently come back as padded frame 0.
        not_finite = [float(d) for d, finite in zip(deltas, np.isfinite(seconds)) if not finite]
        if not_finite:
            raise ValueError(f"delta_timestamps[{key!r}] has non-finite values {not_finite}; every delta must be "
                             f"a finite number of seconds.")
        steps = seconds * meta.fps
        # Same test as LeRobot's check_delta_timestamps: the time error of rounding to a frame.
        off = np.abs(steps - np.round(steps)) / meta.fps > tolerance_s
        if off.any():
            raise ValueError(
                f"delta_timestamps[{key!r}] has values {[d for d, bad in zip(deltas, off) if bad]} that are not multiples "
                f"of 1/fps = 1/{meta.fps} s within tolerance_s={tolerance_s} ({meta.description} runs at {meta.fps} fps).")
        offsets[key] = np.round(steps).astype(np.int64)
    return offsets


@dataclass(slots=True)
class PendingSample:
    """A sample whose tabular part is built and whose video frames are still to decode.

    ``item`` holds the tabular values as numpy arrays and scalars the sample owns (copies, never
    views of the pool's rows), strings, and decoded PNG images as tensors: ``finish`` makes them
    tensors one sample at a time, ``EpisodeLoader`` copies them into its batch arrays, a batch at a
    time, with no tensor per value (``as_tensor`` is the one conversion both give).
    """

    item: dict[str, Any]
    video_keys: list[str]  # parallel to ``queries``
    windowed: list[bool]
    queries: list[FrameQuery]
    task: str


class SampleBuilder:
    def __init__(self, meta: DatasetMeta, *, offsets: Mapping[str, np.ndarray], tolerance_s: float,
                 return_uint8: bool, image_transforms: Callable | None,
                 depth_output_unit: DepthUnit = DEFAULT_DEPTH_UNIT) -> None:
        self._meta = meta
        self._offsets = offsets
        self._tolerance_s = tolerance_s
        self._return_uint8 = return_uint8
        self._image_transforms = image_transforms
        self.depth_output_unit = depth_output_unit
        features = meta.features
        where = f"{meta.description}/meta/info.json"
        # Depth cameras: videos dequantised from their codes, parquet images converted from the unit
        # they were recorded in; neither divided by 255 nor given to image_transforms (LeRobot's reader).
        self._depth = {key: DepthDecoding(coding_of(features[key].info, f"{where} features[{key!r}]"),
                                          depth_output_unit)
                       for key in meta.depth_keys if features[key].dtype == "video"}
        self._image_unit = {key: stored_unit(features[key].info) for key in meta.depth_keys
                            if features[key].dtype == "image"}

    def _rows_at(self, key: str, frame: int, length: int) -> tuple[np.ndarray | int, np.ndarray | None]:
        offsets = self._offsets.get(key)
        return (frame, None) if offsets is None else self._window(offsets, frame, length)

    def _camera(self, key: str, frames: torch.Tensor) -> torch.Tensor:
        """A video camera's decoded frames as the sample holds them (a depth camera's are final)."""
        return frames if key in self._depth else self._image(frames)

    def _image(self, frames_uint8: torch.Tensor) -> torch.Tensor:
        # Bit-identical to LeRobot's ``frames / 255.0`` (a float32 division either way), but the
        # mixed-dtype division takes PyTorch's slow casting loop: converting first is faster.
        return frames_uint8 if self._return_uint8 else divide_by_255_(frames_uint8.to(torch.float32))

    @property
    def frame_dtype(self) -> torch.dtype:
        """The dtype of video camera frames in a sample (a depth camera's are float32)."""
        return torch.uint8 if self._return_uint8 else torch.float32

    @property
    def writes_in_place(self) -> bool:
        """Whether ``frame_writer`` gives what ``finish`` would (no ``image_transforms`` to apply)."""
        return self._image_transforms is None

    def frame_writer(self, out: np.ndarray | torch.Tensor, frames_nhwc: np.ndarray | torch.Tensor) -> FrameWrites:
        """Decoded frames ``frames_nhwc`` ((N, H, W, C)) written straight into their places in ``out``
        (batch memory, (..., C, H, W)), converted as ``finish`` converts frames (the same float32
        division, bit for bit), with no temporary (``chw.FrameWrites``: ``add``, then ``flush``)."""
        # On CPU one single-threaded pass that releases the GIL: PyTorch would start an OpenMP team
        # per decode thread for a frame this size and oversubscribe the cores the decoders need.
        # Frames that are not uint8 (a depth camera's float32 depth) are final: copied as they are.
        return FrameWrites(out, frames_nhwc, to_float32=not self._return_uint8 and frames_nhwc.dtype in _UINT8)

    def plan(self, rows: EpisodeRows, frame: int, videos: EpisodeVideos, *, pair: int = 0) -> PendingSample:
        """The sample of ``frame`` with its frames still to decode. ``pair``: 1 where the stream
        emits the frame before its GOP mate (frame ``frame ^ 1``), 2 where after, 0 outside pairs
        (``GopPairs``)."""
        episode = rows.episode
        length = episode.length
        pads: dict[str, np.ndarray] = {}
        offsets = self._offsets
        # np.array copies the value (the sample must not share the pool's rows) and keeps its
        # dtype and shape; a scalar column gives a 0-d array, as torch.tensor would. With no
        # windowed column (single-frame training) one comprehension: this runs for every sample,
        # under the pipeline's planning lock.
        columns = rows.columns
        if offsets.keys().isdisjoint(columns):
            item: dict[str, Any] = {name: np.array(column[frame]) for name, column in columns.items()}
        else:
            item = {}
            for name, column in columns.items():
                window = offsets.get(name)
                if window is None:
                    item[name] = np.array(column[frame])
                else:
                    at, pads[f"{name}_is_pad"] = self._window(window, frame, length)
                    item[name] = column[at]  # fancy indexing copies
        for name, values in rows.strings.items():
            at, pad = self._rows_at(name, frame, length)
            dtype = self._meta.features[name].dtype
            if dtype == "language":  # never windowed (delta_indices): this frame's rows, the sample's own copy
                item[name] = copy_rows(values[frame])
            elif dtype != "image":
                item[name] = [values[i] for i in at] if pad is not None else values[at]
            else:
                where = f"{self._meta.description} episode {episode.episode_index} frame {frame} key {name!r}"
                images = [decode_image(values[i], where) for i in np.atleast_1d(at)]
                image = torch.stack(images) if pad is not None else images[0]
                if name in self._image_unit:
                    image = in_unit(image, self._image_unit[name], self.depth_output_unit)
                item[name] = image
            if pad is not None:
                pads[f"{name}_is_pad"] = pad
        video_keys, windowed, queries = [], [], []
        timestamps = rows.columns["timestamp"]
        for key, span in episode.videos.items():
            window = offsets.get(key)
            video_keys.append(key)
            # LeRobot squeezes a video query's leading axis (``_query_videos``: ``frames.squeeze(0)``),
            # so a one-step window is a frame, (C, H, W), as without a window; its ``_is_pad`` stays.
            windowed.append(window is not None and len(window) > 1)
            # Time within the file: the episode's start in it plus the row's own timestamp, never index/fps.
            mate_s = None
            if window is None:
                times = [span.from_timestamp_s + float(timestamps[frame])]
                if pair and key not in self._depth:
                    mate_s = span.from_timestamp_s + float(timestamps[frame ^ 1])
            else:
                at, pads[f"{key}_is_pad"] = self._window(window, frame, length)
                times = (span.from_timestamp_s + timestamps[at].astype(np.float64)).tolist()
            queries.append(FrameQuery(videos.path(episode, key), times, episode.episode_index, key,
                                      self._depth.get(key), mate_s, pair == 1))
        item.update(pads)
        return PendingSample(item, video_keys, windowed, queries,
                             task_of(self._meta, episode.episode_index, frame, int(rows.columns["task_index"][frame])))

    def frame_queries(self, rows: EpisodeRows, frames: Sequence[int], videos: EpisodeVideos) -> list[FrameQuery]:
        """One query per camera for the episode's ``frames``, at the file times ``plan`` asks for
        (the episode's start in its file plus each row's own timestamp): ``episodestream doctor``
        decodes an episode's frames as a sample would, without building samples."""
        episode, timestamps = rows.episode, rows.columns["timestamp"]
        at = np.asarray(frames, dtype=np.int64)
        return [FrameQuery(videos.path(episode, key), (span.from_timestamp_s + timestamps[at].astype(np.float64)).tolist(),
                           episode.episode_index, key, self._depth.get(key))
                for key, span in episode.videos.items()]

    @staticmethod
    def _window(offsets: np.ndarray, frame: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        wanted = frame + offsets
        # Out-of-episode rows repeat the boundary frame and are flagged, as LeRobot pads.
        return np.clip(wanted, 0, length - 1), (wanted < 0) | (wanted >= length)

    def tabular(self, pending: PendingSample) -> dict[str, Any]:
        """Every key of the sample but its camera frames, as ``pending.item`` holds the values
        (numpy, strings, tensors): what ``finish`` makes tensors of beside the frames, and what
        ``EpisodeLoader`` collates beside the frames it wrote in place."""
        return {**pending.item, "task": pending.task}

    def finish(self, pending: PendingSample, frames: Sequence[torch.Tensor]) -> dict[str, Any]:
        item = {}
        for key, window, decoded in zip(pending.video_keys, pending.windowed, frames):
            item[key] = self._camera(key, decoded if window else decoded[0])
        item.update((key, as_tensor(value)) for key, value in self.tabular(pending).items())
        if self._image_transforms is not None:
            for key in self._meta.camera_keys:
                if not self._meta.features[key].depth:
                    item[key] = self._image_transforms(item[key])
        return item

    def decode(self, cache: DecoderCache | DecoderShare, pendings: Sequence[PendingSample]) -> dict[str, DecodedFile]:
        """Decode the frames of several samples together: one decoder call per file."""
        return decode_files(cache, [q for p in pendings for q in p.queries], fps=self._meta.fps,
                            tolerance_s=self._tolerance_s)


_UINT8 = (np.uint8, torch.uint8)


def task_of(meta: DatasetMeta, episode_index: int, frame: int, task_index: int) -> str:
    """The task string of a frame whose row says ``task_index``; ValueError when no task has it."""
    if not 0 <= task_index < len(meta.tasks):
        raise ValueError(f"{meta.description} episode {episode_index} frame {frame}: task_index "
                         f"{task_index} is not in {meta.tasks_where} ({len(meta.tasks)} tasks).")
    return meta.tasks[task_index]


def check_task_indices(meta: DatasetMeta, episode_index: int, task_index: np.ndarray) -> None:
    """Every frame's ``task_index`` names a task: the error ``plan`` raises at the first frame that
    does not, raised before any sample is planned."""
    task_index = np.ravel(task_index)  # (frames,), or (frames, 1) where stored as one-value lists
    bad = np.flatnonzero((task_index < 0) | (task_index >= len(meta.tasks)))
    if bad.size:
        task_of(meta, episode_index, int(bad[0]), int(task_index[bad[0]]))


def as_tensor(value: Any) -> Any:
    """A tabular value of a sample as the sample holds it: numpy arrays and scalars become tensors
    of their dtype and shape (sharing the array, which the sample owns); strings, lists and tensors
    stay as they are."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if isinstance(value, np.generic):
        return torch.from_numpy(np.array(value))
    return value


def finish_decoded(builder: Any, pending: PendingSample, decoded: Mapping[str, DecodedFile]) -> dict[str, Any]:
    """``pending`` finished by ``builder`` (a ``SampleBuilder`` or a mixture's) from its group's
    decoded files: the one place a sample is made whole outside ``EpisodeLoader``'s in-place writes."""
    return builder.finish(pending, [decoded[q.path].gather(q) for q in pending.queries])


def build_samples(builder: Any, decoders: Any, pendings: Sequence[PendingSample]) -> list[dict[str, Any]]:
    """Decode the frames of several samples together (one call per file) and finish them."""
    decoded = builder.decode(decoders, pendings)
    return [finish_decoded(builder, p, decoded) for p in pendings]
