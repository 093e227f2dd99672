"""Exact frames from video whose decode order differs from presentation order (B-frames, open GOP).

LeRobot 0.6 writes depth cameras, and RGB cameras given ``vcodec="hevc"``, as HEVC with x265's
B-frames and open GOPs; the synthetic ``codec="hevc"`` writes the same structure. Every access order
(random, shuffled streams, windows, loader batches, remote spans) must return the frame its query
names, with either backend: the frames spell their ids (``decode_frame_ids``).
"""

from __future__ import annotations

import random
from fractions import Fraction

import av
import numpy as np
import pytest

from episodestream import EpisodeDataset, EpisodeLoader, EpisodeStreamingDataset
from episodestream.testing.video_readers import open_video_reader
from episodestream.testing import HttpServer
from episodestream.tools.synthetic import decode_frame_ids, write_synthetic_dataset

from .conftest import built_once

FPS = 30
CAMERAS = ("observation.images.front", "observation.images.wrist")
# Episodes back to back in one mp4 per camera, so that some start on a B-frame (decode order after
# the keyframe shown after it) and some on a keyframe.
LENGTHS = (23, 31, 40)
BACKENDS = ("torchcodec", "pyav")
WINDOW = [o / FPS for o in (-7, -4, -1, 0, 2, 5)]


@pytest.fixture(scope="session")
def hevc_root(tmp_path_factory):
    return built_once(tmp_path_factory, "hevc-bframes", lambda root: write_synthetic_dataset(
        root, num_episodes=len(LENGTHS), episode_length=list(LENGTHS), fps=FPS, cameras=CAMERAS, codec="hevc",
        seed=3))


def _has_b_frames(root) -> bool:
    with av.open(str(next(root.glob("videos/*/chunk-000/file-000.mp4")))) as container:
        return bool(container.streams.video[0].codec_context.has_b_frames)


def _check(sample: dict, *, window: bool = False) -> None:
    episode, frame = int(sample["episode_index"]), int(sample["frame_index"])
    for camera_index, camera in enumerate(CAMERAS):
        frames = sample[camera]
        if window and camera == CAMERAS[0]:
            wanted = np.clip(frame + np.rint(np.asarray(WINDOW) * FPS).astype(int), 0, LENGTHS[episode] - 1)
            got = [decode_frame_ids(f)[1] for f in frames]
            assert got == wanted.tolist(), (episode, frame, camera)
        else:
            assert decode_frame_ids(frames) == (episode, frame, camera_index), (episode, frame, camera)


def test_the_synthetic_hevc_has_b_frames_as_lerobots(hevc_root):
    assert _has_b_frames(hevc_root)


@pytest.mark.parametrize("backend", BACKENDS)
def test_map_style_random_indices(hevc_root, backend):
    dataset = EpisodeDataset(hevc_root, video_backend=backend)
    indices = list(range(len(dataset)))
    random.Random(0).shuffle(indices)
    for i in indices:
        _check(dataset[i])


@pytest.mark.parametrize("backend", BACKENDS)
def test_map_style_windows(hevc_root, backend):
    dataset = EpisodeDataset(hevc_root, video_backend=backend, delta_timestamps={CAMERAS[0]: WINDOW})
    indices = list(range(len(dataset)))
    random.Random(1).shuffle(indices)
    for i in indices:
        _check(dataset[i], window=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_streamed_shuffled_with_windows(hevc_root, backend):
    dataset = EpisodeStreamingDataset(hevc_root, video_backend=backend, seed=4, delta_timestamps={CAMERAS[0]: WINDOW})
    samples = list(dataset)
    assert len(samples) == sum(LENGTHS)
    for sample in samples:
        _check(sample, window=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_episode_loader_batches(hevc_root, backend):
    dataset = EpisodeStreamingDataset(hevc_root, video_backend=backend, seed=5, decode_group_size=4,
                                      return_uint8=True)
    seen = 0
    for batch in EpisodeLoader(dataset, 5, num_threads=2):
        for row in range(len(batch["index"])):
            _check({key: value[row] for key, value in batch.items() if key in (*CAMERAS, "episode_index",
                                                                                "frame_index")})
            seen += 1
    assert seen == sum(LENGTHS)


@pytest.mark.parametrize("backend", ["torchcodec", "pyav"])
def test_readers_at_sorted_random_batches(hevc_root, backend):
    path = str(next(hevc_root.glob(f"videos/{CAMERAS[1]}/chunk-000/file-000.mp4")))
    decoder, rng = open_video_reader(path, backend=backend), random.Random(2)
    try:
        for _ in range(40):
            wanted = sorted(rng.sample(range(sum(LENGTHS)), rng.randint(1, 6)))
            frames, pts = decoder.frames_played_at([(i + 0.5) / FPS for i in wanted])
            assert np.allclose(pts, np.asarray(wanted) / FPS, atol=1e-6)
            starts = np.cumsum((0, *LENGTHS))
            for frame, i in zip(frames, wanted):
                episode = int(np.searchsorted(starts, i, side="right") - 1)
                assert decode_frame_ids(frame) == (episode, i - starts[episode], 1)
    finally:
        decoder.close()


def test_pyav_gray12le_depth_random_access(tmp_path):
    """A depth camera as LeRobot writes it (HEVC gray12le, lossless, B-frames, GOP 2): each frame
    one 12-bit level, read back exactly whatever the order."""
    path, levels = tmp_path / "depth.mp4", [100 + 97 * i for i in range(24)]
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx265", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = 64, 64, "gray12le"
        stream.codec_context.time_base = Fraction(1, FPS)
        stream.options = {"g": "2", "x265-params": "lossless=1:bframes=4:open-gop=1:log-level=error"}
        for i, level in enumerate(levels):
            frame = av.VideoFrame.from_ndarray(np.full((64, 64), level, np.uint16), format="gray12le")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    reader = open_video_reader(path, backend="pyav", pixel_format="gray12le")
    order = list(range(len(levels)))
    random.Random(3).shuffle(order)
    try:
        for i in order:
            frames, _ = reader.frames_played_at([(i + 0.5) / FPS])
            assert frames.shape == (1, 64, 64, 1) and int(frames[0, 0, 0, 0]) == levels[i], i
    finally:
        reader.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_remote_spans_hold_the_frames_before_their_keyframe(hevc_root, backend, tmp_path):
    """A remote episode is fetched as a byte span of the mp4; one that starts on an open GOP's
    leading B-frame needs the keyframe shown before it, not the one decoded before it."""
    with HttpServer(hevc_root) as server:
        dataset = EpisodeStreamingDataset(server.url, cache_dir=tmp_path / "cache", video_backend=backend, seed=6,
                                          delta_timestamps={CAMERAS[0]: WINDOW})
        try:
            samples = list(dataset)
        finally:
            dataset.close()
    assert len(samples) == sum(LENGTHS)
    for sample in samples:
        _check(sample, window=True)
