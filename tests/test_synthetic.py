"""The synthetic writer must produce LeRobot v3.0 files whose frames say which frame they are."""

import io
import json
import os

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from episodestream.tools import synthetic
from episodestream.tools.synthetic import decode_frame_ids, encode_frame_ids, write_synthetic_dataset

FRONT, WRIST, TOP = "observation.images.front", "observation.images.wrist", "observation.images.top"
FPS = 30


@pytest.fixture(scope="module")
def av1_dataset(tmp_path_factory):
    # Cameras roll over after different episode counts; data rolls over on its own schedule too.
    return write_synthetic_dataset(
        tmp_path_factory.mktemp("av1") / "ds", num_episodes=5, episode_length=(10, 40), fps=FPS, cameras=(FRONT, WRIST),
        image_keys=(TOP,), max_episodes_per_data_file=3, max_episodes_per_video_file={FRONT: 2, WRIST: 3}, seed=3)


@pytest.fixture(scope="module")
def h264_dataset(tmp_path_factory):
    # Tiny size limits put every episode in its own file; chunks_size=2 forces a second chunk folder.
    return write_synthetic_dataset(
        tmp_path_factory.mktemp("h264") / "ds", num_episodes=3, episode_length=16, fps=FPS, cameras=(FRONT,),
        codec="h264", gop=4, chunks_size=2, data_files_size_in_mb=1e-6, video_files_size_in_mb=1e-6)


def _episodes(root):
    return pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()


def _info(root):
    return json.loads((root / "meta/info.json").read_text())


def _video_path(root, episode, camera):
    chunk_index, file_index = episode[f"videos/{camera}/chunk_index"], episode[f"videos/{camera}/file_index"]
    return root / _info(root)["video_path"].format(video_key=camera, chunk_index=chunk_index, file_index=file_index)


def _data_path(root, episode):
    return root / _info(root)["data_path"].format(chunk_index=episode["data/chunk_index"],
                                                   file_index=episode["data/file_index"])


def _decoded_frames(path):
    """All frames of a video file as {frame number in the file: rgb24 array}, via PyAV."""
    with av.open(str(path)) as container:
        return {round(frame.time * FPS): frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)}


def test_info_json(av1_dataset):
    info = _info(av1_dataset)
    lengths = [e["length"] for e in _episodes(av1_dataset)]
    assert info["codebase_version"] == "v3.0" and info["robot_type"] == "synthetic"
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (5, sum(lengths), 2)
    assert (info["fps"], info["chunks_size"], info["splits"]) == (FPS, 1000, {"train": "0:5"})
    assert (info["data_files_size_in_mb"], info["video_files_size_in_mb"]) == (100.0, 200.0)
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["video_path"] == "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    features = info["features"]
    assert features["observation.state"]["dtype"] == "float32" and features["observation.state"]["shape"] == [6]
    scalars = ("frame_index", "episode_index", "index", "task_index", "next.done", "timestamp")
    assert [(features[k]["dtype"], features[k]["shape"]) for k in scalars] == [
        ("int64", [1]), ("int64", [1]), ("int64", [1]), ("int64", [1]), ("bool", [1]), ("float32", [1])]
    assert features[FRONT]["dtype"] == "video" and features[FRONT]["shape"] == [64, 96, 3]
    assert features[FRONT]["info"]["video.codec"] == "av1" and features[FRONT]["info"]["video.g"] == 2
    assert features[FRONT]["info"]["video.pix_fmt"] == "yuv420p" and features[FRONT]["info"]["video.fps"] == FPS
    assert features[TOP] == {"dtype": "image", "shape": [64, 96, 3], "names": ["height", "width", "channels"]}
    no_video = write_synthetic_dataset(av1_dataset.parent / "novideo", num_episodes=1, episode_length=2, cameras=())
    assert _info(no_video)["video_path"] is None and not (no_video / "videos").exists()


def test_episode_index_columns_and_video_timestamps(av1_dataset):
    episodes = _episodes(av1_dataset)
    assert [e["episode_index"] for e in episodes] == list(range(5))
    assert [e["tasks"] for e in episodes] == [[f"synthetic task {i % 2}"] for i in range(5)]
    assert [e["dataset_from_index"] for e in episodes] == [0] + [e["dataset_to_index"] for e in episodes[:-1]]
    assert all(e["dataset_to_index"] - e["dataset_from_index"] == e["length"] for e in episodes)
    assert [e[f"videos/{FRONT}/file_index"] for e in episodes] == [0, 0, 1, 1, 2]
    assert [e[f"videos/{WRIST}/file_index"] for e in episodes] == [0, 0, 0, 1, 1]
    for camera in (FRONT, WRIST):
        frames_in_file = {}
        for e in episodes:
            before = frames_in_file.get(e[f"videos/{camera}/file_index"], 0)
            assert e[f"videos/{camera}/from_timestamp"] == pytest.approx(before / FPS)
            assert e[f"videos/{camera}/to_timestamp"] == pytest.approx((before + e["length"]) / FPS)
            frames_in_file[e[f"videos/{camera}/file_index"]] = before + e["length"]
        for file_index, count in frames_in_file.items():
            where = {f"videos/{camera}/chunk_index": 0, f"videos/{camera}/file_index": file_index}
            assert len(_decoded_frames(_video_path(av1_dataset, where, camera))) == count
    # The restart at 0.0 is what separates a correct loader from one using index / fps.
    assert episodes[2][f"videos/{FRONT}/from_timestamp"] == 0.0 and episodes[2][f"videos/{WRIST}/from_timestamp"] > 0
    assert episodes[3][f"videos/{WRIST}/from_timestamp"] == 0.0 and episodes[3][f"videos/{FRONT}/from_timestamp"] > 0
    assert episodes[0]["stats/observation.state/count"] == [episodes[0]["length"]]


def test_data_files_one_row_group_per_episode_and_values(av1_dataset):
    episodes = _episodes(av1_dataset)
    assert [(e["data/chunk_index"], e["data/file_index"]) for e in episodes] == [(0, 0)] * 3 + [(0, 1)] * 2
    for members in (episodes[:3], episodes[3:]):
        metadata = pq.ParquetFile(_data_path(av1_dataset, members[0])).metadata
        row_groups = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
        assert row_groups == [e["length"] for e in members]
    table = pq.read_table(_data_path(av1_dataset, episodes[3])).to_pydict()
    e, n = episodes[4], episodes[4]["length"]
    rows = slice(episodes[3]["length"], episodes[3]["length"] + n)
    assert table["episode_index"][rows] == [4] * n and table["frame_index"][rows] == list(range(n))
    assert table["index"][rows] == list(range(e["dataset_from_index"], e["dataset_to_index"]))
    assert table["task_index"][rows] == [0] * n and table["next.done"][rows] == [False] * (n - 1) + [True]
    assert table["timestamp"][rows] == [np.float32(f / FPS) for f in range(n)]
    assert table["observation.state"][rows][7] == [4007 + j / 8 for j in range(6)]
    assert table["action"][rows][7] == [4007.5 + j / 8 for j in range(6)]
    stats = json.loads((av1_dataset / "meta/stats.json").read_text())
    assert stats["observation.state"]["max"][0] == 4000 + n - 1
    assert stats["index"]["count"] == [_info(av1_dataset)["total_frames"]]
    assert stats["index"]["mean"] == pytest.approx([(_info(av1_dataset)["total_frames"] - 1) / 2])
    assert len(stats[FRONT]["mean"]) == 3 and 0.0 < stats[FRONT]["mean"][0][0][0] < 1.0
    tasks = pq.read_table(av1_dataset / "meta/tasks.parquet").to_pydict()
    assert tasks == {"task": ["synthetic task 0", "synthetic task 1"], "task_index": [0, 1]}


def test_size_rollover_and_chunks(h264_dataset):
    episodes = _episodes(h264_dataset)
    expected = [(0, 0), (0, 1), (1, 0)]  # chunks_size=2
    assert [(e["data/chunk_index"], e["data/file_index"]) for e in episodes] == expected
    assert [(e[f"videos/{FRONT}/chunk_index"], e[f"videos/{FRONT}/file_index"]) for e in episodes] == expected
    assert all(e[f"videos/{FRONT}/from_timestamp"] == 0.0 for e in episodes)
    assert all(_video_path(h264_dataset, e, FRONT).is_file() and _data_path(h264_dataset, e).is_file()
               for e in episodes)


@pytest.mark.parametrize("dataset, camera, camera_index",
                         [("av1_dataset", FRONT, 0), ("av1_dataset", WRIST, 1), ("h264_dataset", FRONT, 0)])
def test_frames_decode_to_their_ids_with_pyav_and_torchcodec(request, dataset, camera, camera_index):
    from torchcodec.decoders import VideoDecoder

    root = request.getfixturevalue(dataset)
    # An episode in a later video file: av1 front ep 3 starts mid-file, wrist ep 4 mid-file, h264 ep 2 in chunk 1.
    episode = _episodes(root)[-2 if camera == FRONT and dataset == "av1_dataset" else -1]
    assert (episode[f"videos/{camera}/chunk_index"], episode[f"videos/{camera}/file_index"]) != (0, 0)
    path, start = _video_path(root, episode, camera), episode[f"videos/{camera}/from_timestamp"]
    seconds = [start + f / FPS for f in range(episode["length"])]
    expected = [(episode["episode_index"], f, camera_index) for f in range(episode["length"])]
    decoded = _decoded_frames(path)
    assert [decode_frame_ids(decoded[round(s * FPS)]) for s in seconds] == expected
    # The float sum can fall one ulp short of the frame's pts (0.5 + 8/30 < 23/30), and "played at"
    # then returns the previous frame; a tolerance well under a frame (LeRobot's 1e-4 s) avoids it.
    batch = VideoDecoder(str(path)).get_frames_played_at(seconds=[s + 1e-4 for s in seconds])
    assert batch.data.dtype == torch.uint8 and tuple(batch.data.shape[1:]) == (3, 64, 96)
    assert [decode_frame_ids(frame) for frame in batch.data] == expected
    assert batch.pts_seconds.tolist() == pytest.approx(seconds, abs=1e-6)


@pytest.mark.parametrize("dataset, gop", [("av1_dataset", 2), ("h264_dataset", 4)])
def test_gop_is_honoured(request, dataset, gop):
    root = request.getfixturevalue(dataset)
    with av.open(str(_video_path(root, _episodes(root)[0], FRONT))) as container:
        keyframes = [i for i, frame in enumerate(container.decode(video=0)) if frame.key_frame]
        count = container.streams.video[0].frames
    assert count > gop and keyframes == list(range(0, count, gop))


def test_explicit_episode_lengths(tmp_path):
    root = write_synthetic_dataset(tmp_path / "ds", num_episodes=3, episode_length=(4, 9, 2), cameras=())
    assert [e["length"] for e in _episodes(root)] == [4, 9, 2]
    pair = write_synthetic_dataset(tmp_path / "pair", num_episodes=6, episode_length=(2, 3), cameras=(), seed=1)
    assert {e["length"] for e in _episodes(pair)} == {2, 3}  # a pair is a (min, max) range


def test_long_gop_av1_frames_stay_readable(tmp_path):
    # Fast SVT-AV1 presets corrupt inter frames at long GOPs; every frame must still decode to its ids.
    root = write_synthetic_dataset(tmp_path / "ds", num_episodes=2, episode_length=40, cameras=(FRONT,), gop=30)
    frames = _decoded_frames(root / "videos" / FRONT / "chunk-000/file-000.mp4")
    assert [decode_frame_ids(frames[i]) for i in range(80)] == [(e, f, 0) for e in range(2) for f in range(40)]


def test_png_image_keys_round_trip(av1_dataset):
    episode = _episodes(av1_dataset)[1]
    table = pq.read_table(_data_path(av1_dataset, episode), columns=[TOP, "frame_index", "episode_index"]).to_pydict()
    cells = [(cell, f) for cell, f, e in zip(table[TOP], table["frame_index"], table["episode_index"]) if e == 1]
    assert len(cells) == episode["length"]
    for cell, frame_index in cells:
        assert cell["path"] is None
        image = np.asarray(Image.open(io.BytesIO(cell["bytes"])))
        assert decode_frame_ids(image) == (1, frame_index, 2)  # image keys are numbered after the cameras
        expected = encode_frame_ids(episode_index=1, frame_index=frame_index, camera_index=2, height=64, width=96)
        assert np.array_equal(image, expected)


def test_encode_decode_layouts_and_rejects_non_id_frames():
    image = encode_frame_ids(episode_index=4095, frame_index=1234, camera_index=15, height=240, width=320)
    assert image.shape == (240, 320, 3) and image.dtype == np.uint8
    chw_float = torch.from_numpy(image).permute(2, 0, 1).float() / 255
    for layout in (image, chw_float, image.transpose(2, 0, 1), image / 255.0):
        assert decode_frame_ids(layout) == (4095, 1234, 15)
    noise = np.random.default_rng(0).integers(-40, 41, image.shape)
    assert decode_frame_ids(np.clip(image.astype(int) + noise, 0, 255).astype(np.uint8)) == (4095, 1234, 15)
    for blank in (0, 128, 255):
        with pytest.raises(ValueError, match="ids"):
            decode_frame_ids(np.full((64, 96, 3), blank, np.uint8))
    with pytest.raises(ValueError, match="episode_index"):
        encode_frame_ids(episode_index=4096, frame_index=0, camera_index=0, height=64, width=96)


@pytest.mark.parametrize("argument, value", [
    ("codec", "vp9"), ("episode_length", (5, 2)), ("episode_length", 0), ("episode_length", [3, 4, 5]),
    ("height", 60), ("width", 100), ("gop", 0),
    ("num_episodes", 0), ("fps", -1), ("data_files_size_in_mb", 0), ("video_files_size_in_mb", -1.0), ("crf", 99),
    ("max_episodes_per_data_file", 0), ("max_episodes_per_video_file", {"observation.images.nope": 1}),
    ("image_keys", ("observation.images.front",)), ("cameras", ("index",)),
])
def test_bad_options_raise_naming_the_argument(tmp_path, argument, value):
    with pytest.raises(ValueError, match=f"Invalid {argument} ") as error:
        write_synthetic_dataset(tmp_path / "ds", **{argument: value})
    assert repr(value) in str(error.value)
    assert list(tmp_path.iterdir()) == []


def test_refuses_non_empty_root_and_leaves_nothing_on_crash(tmp_path, monkeypatch):
    root = tmp_path / "ds"
    root.mkdir()
    (root / "keep.txt").write_text("x")
    with pytest.raises(ValueError, match="overwrite"):
        write_synthetic_dataset(root, num_episodes=1, episode_length=2, cameras=())
    write_synthetic_dataset(root, num_episodes=1, episode_length=2, cameras=(), overwrite=True)
    assert not (root / "keep.txt").exists() and (root / "meta/info.json").is_file()

    def crash(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(synthetic, "_write", crash)
    with pytest.raises(RuntimeError):
        write_synthetic_dataset(tmp_path / "other", num_episodes=1, episode_length=2, cameras=())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


def test_texture_makes_realistic_files_and_keeps_ids(tmp_path):
    from torchcodec.decoders import VideoDecoder

    flat = write_synthetic_dataset(tmp_path / "flat", num_episodes=1, episode_length=12, cameras=("cam",),
                                   height=64, width=96)
    textured = write_synthetic_dataset(tmp_path / "textured", num_episodes=1, episode_length=12, cameras=("cam",),
                                       height=64, width=96, texture=True)
    video = "videos/cam/chunk-000/file-000.mp4"
    # Several times the flat file's bytes: 5.2x with PyAV 18.1.0's encoder, 3.8x with 18.1.1's (its
    # flat file grew by a third, the textured one is the same).
    assert (textured / video).stat().st_size > 3 * (flat / video).stat().st_size
    frames = VideoDecoder(str(textured / video)).get_frames_played_at(seconds=[(f + 0.5) / 30 for f in range(12)])
    assert [decode_frame_ids(frame) for frame in frames.data] == [(0, f, 0) for f in range(12)]
    plain = VideoDecoder(str(flat / video)).get_frames_played_at(seconds=[(f + 0.5) / 30 for f in range(12)])
    assert (frames.data.float() - plain.data.float()).abs().mean() > 8  # the texture is really there


def test_tabular_writer_past_2048_episodes(tmp_path):
    """The bulk writer: thousands of episodes, one row group each, readable by both datasets."""
    from episodestream import EpisodeDataset, EpisodeStreamingDataset
    from episodestream.tools.synthetic import write_tabular_dataset

    root = write_tabular_dataset(tmp_path / "ds", num_episodes=2100, episode_length=(1, 4), episodes_per_data_file=700)
    info = _info(root)
    episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet")
    lengths = episodes.column("length").to_numpy()
    assert info["total_episodes"] == 2100 and info["total_frames"] == lengths.sum() and info["video_path"] is None
    data = pq.ParquetFile(root / "data/chunk-000/file-001.parquet")
    assert data.metadata.num_row_groups == 700
    assert [data.metadata.row_group(g).num_rows for g in range(700)] == lengths[700:1400].tolist()
    dataset = EpisodeDataset(root)
    assert len(dataset) == lengths.sum()
    last = dataset[len(dataset) - 1]
    frame = int(lengths[-1]) - 1
    assert int(last["episode_index"]) == 2099 and int(last["frame_index"]) == frame
    assert last["observation.state"][0].item() == np.float32(2099 * 1000 + frame)
    assert last["task"] == f"synthetic task {2099 % 2}"
    assert sum(1 for _ in EpisodeStreamingDataset(root, rank=0, world_size=7)) == -(-lengths.sum() // 7)
    with pytest.raises(ValueError, match=r"Invalid num_episodes \(0\)"):
        write_tabular_dataset(tmp_path / "bad", num_episodes=0)


@pytest.mark.skipif(not hasattr(os, "sched_getscheduler") or not os.path.isdir("/proc/self/task"),
                    reason="thread scheduling policies are read from Linux /proc")
def test_writing_av1_leaves_no_thread_in_real_time(tmp_path):
    # SVT-AV1 4.x run as root puts the thread that opens an encoder in SCHED_FIFO 99; a test
    # session then ran in real time and starved the rest of the machine. (Not root: SVT cannot
    # raise the priority and this checks nothing changed either.)
    realtime = {os.SCHED_FIFO, os.SCHED_RR}

    def realtime_threads() -> list[int]:
        found = []
        for name in os.listdir("/proc/self/task"):
            try:
                if os.sched_getscheduler(int(name)) in realtime:
                    found.append(int(name))
            except OSError:
                pass
        return found

    assert realtime_threads() == []
    write_synthetic_dataset(tmp_path / "ds", num_episodes=1, episode_length=3, cameras=("observation.images.a",),
                            codec="av1")
    assert realtime_threads() == []
