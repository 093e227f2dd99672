"""Streamed samples equal map-style samples, and both equal what LeRobot's loader builds.

The synthetic dataset's values say which frame they are (state = episode*1000 + frame + j/8, video
frames spell (episode, frame, camera)), so expected values are computed here independently of the
library, from LeRobot's rules in shared/notes/lerobot-v3-format.md.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from episodestream import EpisodeDataset, EpisodeStreamingDataset
from episodestream.tools.synthetic import decode_frame_ids

from .conftest import CAMERAS, EPISODE_LENGTHS

FPS = 30
FRONT, WRIST = CAMERAS
STATE_OFFSETS = list(range(-110, 3))  # a window longer than 100 frames, reaching past both ends
FRONT_OFFSETS = [-70, -60, -50, -40, -30, -20, -10, 0, 5]
DELTAS = {
    "observation.state": [o / FPS for o in STATE_OFFSETS],
    FRONT: [o / FPS for o in FRONT_OFFSETS],
    "observation.images.top": [-1 / FPS, 0.0],
}
STARTS = np.cumsum((0,) + EPISODE_LENGTHS)


def _expected_rows(episode: int, frame: int, offsets: list[int]) -> tuple[np.ndarray, np.ndarray]:
    wanted = frame + np.asarray(offsets)
    length = EPISODE_LENGTHS[episode]
    return np.clip(wanted, 0, length - 1), (wanted < 0) | (wanted >= length)


def check_sample_against_lerobot_rules(sample: dict, *, windows: bool) -> None:
    episode, frame = int(sample["episode_index"]), int(sample["frame_index"])
    assert int(sample["index"]) == STARTS[episode] + frame
    assert sample["timestamp"].dtype == torch.float32 and sample["timestamp"].ndim == 0
    assert float(sample["timestamp"]) == np.float32(frame / FPS)
    assert sample["task"] == f"synthetic task {episode % 2}"
    assert sample["task_index"].dtype == torch.int64 and int(sample["task_index"]) == episode % 2
    state_rows = [frame]
    if windows:
        state_rows, pad = _expected_rows(episode, frame, STATE_OFFSETS)
        assert sample["observation.state_is_pad"].dtype == torch.bool
        assert sample["observation.state_is_pad"].tolist() == pad.tolist()
    expected_state = episode * 1000 + np.asarray(state_rows, dtype=np.float32)[:, None] + np.arange(6) / 8
    got_state = sample["observation.state"].numpy()
    assert got_state.dtype == np.float32
    assert np.array_equal(got_state.reshape(expected_state.shape), expected_state.astype(np.float32))
    assert sample["observation.state"].shape == ((len(STATE_OFFSETS), 6) if windows else (6,))

    for camera_index, camera in enumerate(CAMERAS):
        frames = sample[camera]
        assert frames.dtype == torch.float32 and 0.0 <= frames.min() and frames.max() <= 1.0
        if windows and camera == FRONT:
            rows, pad = _expected_rows(episode, frame, FRONT_OFFSETS)
            assert frames.shape == (len(FRONT_OFFSETS), 3, 64, 96)
            assert sample[f"{FRONT}_is_pad"].tolist() == pad.tolist()
            assert [decode_frame_ids(f) for f in frames] == [(episode, int(r), camera_index) for r in rows]
        else:
            assert frames.shape == (3, 64, 96)
            assert decode_frame_ids(frames) == (episode, frame, camera_index)
    top = sample["observation.images.top"]
    if windows:
        rows, pad = _expected_rows(episode, frame, [-1, 0])
        assert top.shape == (2, 3, 64, 96)
        assert [decode_frame_ids(t)[:2] for t in top] == [(episode, int(r)) for r in rows]
    else:
        assert decode_frame_ids(top)[:2] == (episode, frame)


def assert_samples_equal(a: dict, b: dict) -> None:
    assert list(sorted(a)) == list(sorted(b))
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


@pytest.mark.parametrize("windows", [False, True], ids=["single", "windows"])
def test_streamed_equals_map_style_and_lerobot_rules(dataset_root, windows):
    deltas = DELTAS if windows else None
    dataset = EpisodeStreamingDataset(dataset_root, delta_timestamps=deltas, episode_pool_size=3, seed=5)
    streamed = list(dataset)
    mapped = EpisodeDataset(dataset_root, delta_timestamps=deltas)
    assert sorted(int(s["index"]) for s in streamed) == list(range(sum(EPISODE_LENGTHS)))
    for sample in streamed:
        check_sample_against_lerobot_rules(sample, windows=windows)
        assert_samples_equal(sample, mapped[int(sample["index"])])
    # Single frames (the wrist camera has no window): some came from their GOP mate's decode in an
    # earlier group, kept for their turn, and still equal what map-style indexing decodes alone.
    assert dataset.decoder_stats()["pair_frames_served"] > 0


def test_an_episode_loader_serving_kept_frames_equals_map_style(dataset_root, monkeypatch):
    from episodestream import EpisodeLoader
    from episodestream._sample.video.gop_pairs import GopPairs

    made = []
    init = GopPairs.__init__

    def remembered(self, **kwargs):
        init(self, **kwargs)
        made.append(self)

    monkeypatch.setattr(GopPairs, "__init__", remembered)  # the loader's decoders report no stats
    dataset = EpisodeStreamingDataset(dataset_root, episode_pool_size=4, seed=3)
    mapped = EpisodeDataset(dataset_root)
    samples = 0
    for batch in EpisodeLoader(dataset, batch_size=8, num_threads=2):
        for i, index in enumerate(batch["index"].tolist()):
            single = {k: (v[i] if isinstance(v, torch.Tensor) else v[i]) for k, v in batch.items()}
            want = mapped[index]
            for key in CAMERAS:
                assert torch.equal(single[key], want[key]), (index, key)
            samples += 1
    assert samples == sum(EPISODE_LENGTHS)
    assert sum(pairs.stats()["served"] for pairs in made) > 0


def test_sample_keys_match_lerobot(dataset_root):
    mapped = EpisodeDataset(dataset_root, delta_timestamps=DELTAS)
    features = set(mapped.typed_meta.features)
    expected = features | {f"{k}_is_pad" for k in DELTAS} | {"task"}
    assert set(mapped[0]) == expected


def test_dataset_really_rolls_over(dataset_root):
    """The parity test covers frames after a video-file rollover only if the dataset has them."""
    meta = EpisodeDataset(dataset_root).typed_meta
    for camera in CAMERAS:
        files = {ep.videos[camera].relpath for ep in meta.episodes.values()}
        assert len(files) >= 2, camera
        restarted = [ep for ep in meta.episodes.values() if ep.videos[camera].from_timestamp_s == 0.0]
        assert len(restarted) == len(files) and any(ep.episode_index > 0 for ep in restarted)
    assert len({ep.data_relpath for ep in meta.episodes.values()}) == 3


def test_uint8_and_transforms(dataset_root):
    raw = EpisodeDataset(dataset_root, return_uint8=True)[50]
    flt = EpisodeDataset(dataset_root)[50]
    assert raw[FRONT].dtype == torch.uint8 and raw[FRONT].shape == (3, 64, 96)
    assert torch.equal(raw[FRONT].float() / 255, flt[FRONT])
    uint8_max = torch.tensor(255.0)  # the README's on-device conversion divides by a tensor
    assert torch.equal(raw[FRONT].float().div_(uint8_max), flt[FRONT])
    flipped = EpisodeDataset(dataset_root, image_transforms=lambda x: x.flip(-1))[50]
    for camera in CAMERAS + ("observation.images.top",):
        assert torch.equal(flipped[camera], flt[camera].flip(-1)), camera


def test_pyav_backend_reads_the_same_frames(dataset_root):
    # Every episode but the 140-frame one: every video file of both cameras, in half the decoding.
    episodes = [0, 2, 3, 4, 5]
    # Without the 140-frame episode the windows are longer than every selected episode: said once.
    with pytest.warns(RuntimeWarning, match="pads these windows"):
        streamed = EpisodeStreamingDataset(dataset_root, video_backend="pyav", delta_timestamps=DELTAS,
                                           episode_pool_size=2, seed=1, episodes=episodes)
    count = 0
    for sample in streamed:
        check_sample_against_lerobot_rules(sample, windows=True)
        count += 1
    assert count == sum(EPISODE_LENGTHS[e] for e in episodes)


def test_episode_filter_and_map_style_indexing(dataset_root):
    mapped = EpisodeDataset(dataset_root, episodes=[3, 1])
    assert len(mapped) == EPISODE_LENGTHS[1] + EPISODE_LENGTHS[3]
    assert (int(mapped[0]["episode_index"]), int(mapped[0]["frame_index"])) == (1, 0)
    assert (int(mapped[-1]["episode_index"]), int(mapped[-1]["frame_index"])) == (3, EPISODE_LENGTHS[3] - 1)
    streamed = EpisodeStreamingDataset(dataset_root, episodes=[3, 1], seed=2)
    assert len(streamed) == len(mapped)
    assert sorted(int(s["index"]) for s in streamed) == sorted(int(mapped[i]["index"]) for i in range(len(mapped)))
    with pytest.raises(IndexError, match="out of range"):
        mapped[len(mapped)]


def test_float_frames_are_bit_identical_to_lerobots_division(dataset_root):
    raw = EpisodeDataset(dataset_root, return_uint8=True)[77][FRONT]
    assert torch.equal(EpisodeDataset(dataset_root)[77][FRONT], raw / 255.0)  # LeRobot: frames / 255.0
    every_value = torch.arange(256, dtype=torch.uint8)
    assert torch.equal(every_value.to(torch.float32).div_(255), every_value / 255.0)
