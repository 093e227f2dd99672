"""LeRobot v2.1 / v2.0 datasets read in place give the samples of the same data written as v3.0.

Golden-style: the synthetic writer writes the same episodes once as v2.1 (one parquet and one mp4 per
episode) and once as v3.0 with one episode per video file (so both encode every episode's frames from
a fresh encoder and hold the same video bytes; data files still hold two episodes each). Every face
must then give equal samples, key for key and value for value, and the v2.1 stats must be those of
LeRobot's converter (``aggregate_stats`` of the episodes' stats).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torch.utils.data

from episodestream import EpisodeDataset, EpisodeLoader, EpisodeMixture, EpisodeStreamingDataset, stream_state
from episodestream.tools.cli import main
from episodestream.tools.synthetic import decode_frame_ids, write_synthetic_dataset

from .conftest import built_once
from .stream_model import unbatch

CAMERA, IMAGE = "observation.images.front", "observation.images.top"
LENGTHS = (6, 11, 4, 9, 7)
FPS = 30
WINDOWS = {CAMERA: [-2 / FPS, 0.0], "action": [0.0, 1 / FPS, 2 / FPS]}
COMMON = dict(num_episodes=len(LENGTHS), episode_length=list(LENGTHS), fps=FPS, cameras=(CAMERA,), image_keys=(IMAGE,),
              height=64, width=64, chunks_size=2, seed=0)


@pytest.fixture(scope="session")
def v21_root(tmp_path_factory) -> Path:
    return built_once(tmp_path_factory, "v2x-v21", lambda root: write_synthetic_dataset(root, version="v2.1", **COMMON))


@pytest.fixture(scope="session")
def v20_root(tmp_path_factory) -> Path:
    return built_once(tmp_path_factory, "v2x-v20", lambda root: write_synthetic_dataset(root, version="v2.0", **COMMON))


@pytest.fixture(scope="session")
def v30_root(tmp_path_factory) -> Path:
    return built_once(tmp_path_factory, "v2x-v30", lambda root: write_synthetic_dataset(
        root, max_episodes_per_video_file=1, max_episodes_per_data_file=2, **COMMON))


def assert_same_sample(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def assert_same_samples(a: list, b: list) -> None:
    assert len(a) == len(b) and len(a) > 0
    for x, y in zip(a, b):
        assert_same_sample(x, y)


# -- the writer's v2.x layout -------------------------------------------------------------------


def test_writer_lays_out_v21_as_lerobot_0_3(v21_root):
    info = json.loads((v21_root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v2.1" and info["chunks_size"] == 2 and info["total_chunks"] == 3
    assert info["data_path"] == "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
    assert info["video_path"] == "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
    assert (info["total_episodes"], info["total_frames"], info["total_videos"]) == (5, sum(LENGTHS), 5)
    lines = [json.loads(line) for line in (v21_root / "meta/episodes.jsonl").read_text().splitlines()]
    assert lines == [{"episode_index": e, "tasks": [f"synthetic task {e % 2}"], "length": n}
                     for e, n in enumerate(LENGTHS)]
    tasks = [json.loads(line) for line in (v21_root / "meta/tasks.jsonl").read_text().splitlines()]
    assert tasks == [{"task_index": 0, "task": "synthetic task 0"}, {"task_index": 1, "task": "synthetic task 1"}]
    stats = [json.loads(line) for line in (v21_root / "meta/episodes_stats.jsonl").read_text().splitlines()]
    assert [s["episode_index"] for s in stats] == list(range(5))
    assert set(stats[0]["stats"]["action"]) == {"min", "max", "mean", "std", "count"}  # no quantiles before v3.0
    assert not (v21_root / "meta/stats.json").exists() and not (v21_root / "meta/episodes").exists()
    start = 0
    for episode, length in enumerate(LENGTHS):
        chunk = episode // 2
        table = pq.read_table(v21_root / info["data_path"].format(episode_chunk=chunk, episode_index=episode))
        assert table["index"].to_pylist() == list(range(start, start + length))  # the global frame index
        assert table["frame_index"].to_pylist() == list(range(length))
        start += length
        video = v21_root / info["video_path"].format(episode_chunk=chunk, video_key=CAMERA, episode_index=episode)
        with av.open(str(video)) as container:
            frames = list(container.decode(video=0))
        assert [round(f.time * FPS) for f in frames] == list(range(length))  # each mp4 starts at 0
        assert decode_frame_ids(frames[-1].to_ndarray(format="rgb24")) == (episode, length - 1, 0)


def test_writer_v20_has_stats_json_and_refuses_v3_only_options(v20_root, tmp_path):
    assert json.loads((v20_root / "meta/info.json").read_text())["codebase_version"] == "v2.0"
    assert (v20_root / "meta/stats.json").exists() and not (v20_root / "meta/episodes_stats.jsonl").exists()
    with pytest.raises(ValueError, match=r"Invalid version \('v1.6'\)"):
        write_synthetic_dataset(tmp_path / "a", version="v1.6")
    with pytest.raises(ValueError, match="max_episodes_per_video_file.*version='v2.1'"):
        write_synthetic_dataset(tmp_path / "b", version="v2.1", max_episodes_per_video_file=2)


# -- equal samples through every face -------------------------------------------------------------


def test_map_style_samples_equal_v30(v21_root, v30_root):
    for options in ({}, {"delta_timestamps": WINDOWS, "return_uint8": True}):
        a, b = EpisodeDataset(v21_root, **options), EpisodeDataset(v30_root, **options)
        try:
            assert len(a) == len(b) == sum(LENGTHS)
            assert_same_samples([a[i] for i in range(len(a))], [b[i] for i in range(len(b))])
            assert [int(a[i]["index"]) for i in range(len(a))] == list(range(sum(LENGTHS)))
        finally:
            a.close()
            b.close()


def test_streaming_samples_equal_v30(v21_root, v30_root):
    options = dict(seed=4, episode_pool_size=2, delta_timestamps=WINDOWS)
    a = list(EpisodeStreamingDataset(v21_root, **options))
    b = list(EpisodeStreamingDataset(v30_root, **options))
    assert_same_samples(a, b)
    for sample in a:
        assert decode_frame_ids(sample[CAMERA][-1]) == (int(sample["episode_index"]), int(sample["frame_index"]), 0)


def test_default_decode_groups_are_larger_where_each_episode_has_its_own_files(v21_root, v30_root):
    """v2.1 groups spread over one file per episode, so their default is twice v3.0's; a given
    size is kept, and the samples are those of v3.0 either way (the tests above and below)."""
    assert EpisodeStreamingDataset(v21_root).decode_group_size == 32
    assert EpisodeStreamingDataset(v30_root).decode_group_size == 16
    assert EpisodeStreamingDataset(v21_root, decode_group_size=5).decode_group_size == 5
    with pytest.raises(ValueError, match="decode_group_size must be >= 1, got 0"):
        EpisodeStreamingDataset(v21_root, decode_group_size=0)


@pytest.mark.parametrize("num_threads", [2, 5])
def test_loader_batches_are_the_same_with_the_first_batch_split_over_threads(v21_root, num_threads):
    """v2.1's groups of 32 are larger than a thread's share of a batch of 8: the loader cuts the
    first batch into parts (``split_opening``), which must not change a sample."""
    def batches(threads):
        loader = EpisodeLoader(EpisodeStreamingDataset(v21_root, seed=6, episode_pool_size=3), 8, num_threads=threads)
        return list(loader)
    one, many = batches(1), batches(num_threads)
    assert len(one) == len(many) > 1
    for x, y in zip(one, many):
        assert_same_sample(x, y)


def test_loader_batches_equal_v30(v21_root, v30_root):
    got = {}
    for name, root in (("v21", v21_root), ("v30", v30_root)):
        loader = EpisodeLoader(EpisodeStreamingDataset(root, seed=2, episode_pool_size=3), 4, num_threads=2)
        got[name] = [list(loader), list(loader)]  # two epochs
    for a, b in zip(got["v21"], got["v30"]):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert x[CAMERA].dtype == torch.float32
            assert_same_sample(x, y)


def test_mixture_of_a_v21_and_a_v30_component(v21_root, v30_root):
    def mixture(first):
        return EpisodeMixture([EpisodeStreamingDataset(first, seed=1, episode_pool_size=2),
                               EpisodeStreamingDataset(v30_root, seed=2, episode_pool_size=3)], [0.5, 0.5], seed=7)

    mixed, reference = list(mixture(v21_root)), list(mixture(v30_root))
    assert {int(s["dataset_index"]) for s in mixed} == {0, 1}
    assert_same_samples(mixed, reference)


def test_exact_resume_on_v21(v21_root):
    def make():
        return EpisodeStreamingDataset(v21_root, seed=3, episode_pool_size=2, return_uint8=True)

    def loader_for(dataset):
        return torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=0)

    epoch = list(loader_for(make()))
    loader = loader_for(make())
    iterator = iter(loader)
    consumed = list(itertools.islice(iterator, 3))
    state = json.loads(json.dumps(stream_state(loader, 3)))
    del iterator
    resumed = make()
    resumed.load_state_dict(state)
    rest = list(loader_for(resumed))
    flat = lambda batches: [s for batch in batches for s in unbatch(batch)]  # noqa: E731
    assert_same_samples(flat(consumed + rest), flat(epoch))


# -- meta ----------------------------------------------------------------------------------------


def test_meta_is_lerobot_shaped(v21_root, v30_root):
    a, b = EpisodeDataset(v21_root), EpisodeDataset(v30_root)
    try:
        assert a.meta.features == b.meta.features and a.meta.fps == b.meta.fps
        assert a.meta.info["codebase_version"] == "v2.1" and a.meta.total_frames == sum(LENGTHS)
        assert list(a.meta.tasks.index) == list(b.meta.tasks.index)
        for column in ("episode_index", "tasks", "length", "dataset_from_index", "dataset_to_index",
                       f"videos/{CAMERA}/from_timestamp", f"videos/{CAMERA}/to_timestamp"):
            assert list(a.meta.episodes[column]) == list(b.meta.episodes[column]), column
        assert str(a.meta.get_video_file_path(3, CAMERA)) == f"videos/chunk-001/{CAMERA}/episode_000003.mp4"
        assert str(a.meta.get_data_file_path(4)) == "data/chunk-002/episode_000004.parquet"
        assert a.meta.stats.keys() == b.meta.stats.keys()
        for key, values in a.meta.stats.items():
            assert set(values) == {"min", "max", "mean", "std", "count"}, key
            for name, value in values.items():
                expected = b.meta.stats[key][name]  # v3.0's from the writer's own pooling
                assert value.shape == expected.shape and value.dtype.kind == expected.dtype.kind, (key, name)
                np.testing.assert_allclose(value, expected, rtol=1e-12, atol=1e-12, err_msg=f"{key} {name}")
    finally:
        a.close()
        b.close()


def test_v21_stats_are_aggregated_as_lerobot_does(v21_root):
    """LeRobot's ``aggregate_feature_stats`` spelled out independently, on the file's own lines."""
    lines = [json.loads(line) for line in (v21_root / "meta/episodes_stats.jsonl").read_text().splitlines()]
    dataset = EpisodeDataset(v21_root)
    try:
        stats = dataset.meta.stats
    finally:
        dataset.close()
    for key in ("observation.state", CAMERA, "index"):
        parts = [{k: np.atleast_1d(np.array(v)) for k, v in line["stats"][key].items()} for line in lines]
        counts = np.array([p["count"][0] for p in parts])
        means = np.stack([p["mean"] for p in parts])
        weights = counts.reshape((-1,) + (1,) * (means.ndim - 1))
        mean = (means * weights).sum(0) / counts.sum()
        variance = ((np.stack([p["std"] for p in parts]) ** 2 + (means - mean) ** 2) * weights).sum(0) / counts.sum()
        assert np.array_equal(stats[key]["mean"], mean) and np.array_equal(stats[key]["std"], np.sqrt(variance))
        assert stats[key]["count"].tolist() == [sum(LENGTHS)]
        assert np.array_equal(stats[key]["min"], np.min([p["min"] for p in parts], 0))
    assert stats[CAMERA]["mean"].shape == (3, 1, 1)


def test_v20_reads_with_its_stats_json(v20_root, v30_root):
    a = EpisodeDataset(v20_root)
    try:
        expected = json.loads((v20_root / "meta/stats.json").read_text())
        assert a.meta.stats["action"]["mean"].tolist() == expected["action"]["mean"]
        b = list(EpisodeStreamingDataset(v30_root, seed=1))
        assert_same_samples(list(EpisodeStreamingDataset(v20_root, seed=1)), b)
    finally:
        a.close()


def test_cli_info_on_v21(v21_root, capsys):
    assert main(["info", str(v21_root), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["codebase_version"] == "v2.1"
    assert (info["episodes"], info["frames"], info["data_files"]) == (5, sum(LENGTHS), 5)
    assert info["cameras"][CAMERA]["files"] == 5 and info["stats"]["action"]["size"] == 6
    assert main(["info", str(v21_root)]) == 0
    assert "v2.1" in capsys.readouterr().out


def test_rank_and_worker_splits_equal_v30(v21_root, v30_root):
    """2 ranks x 2 DataLoader workers: each rank's samples are v3.0's, and together every frame (once,
    but for the one fill-in that evens 37 frames out over 2 ranks)."""
    seen = []
    for rank in range(2):
        got = {}
        for name, root in (("v21", v21_root), ("v30", v30_root)):
            dataset = EpisodeStreamingDataset(root, seed=6, episode_pool_size=2, rank=rank, world_size=2,
                                              return_uint8=True)
            loader = torch.utils.data.DataLoader(dataset, batch_size=3, num_workers=2)
            got[name] = [s for batch in loader for s in unbatch(batch)]
        assert_same_samples(got["v21"], got["v30"])
        seen += [int(s["index"]) for s in got["v21"]]
    assert set(seen) == set(range(sum(LENGTHS))) and len(seen) == sum(LENGTHS) + 1


def test_curation_by_episodes_table_on_v21_equals_v30(v21_root, v30_root):
    """Predicates and weight columns read v2.x's episodes table (the converter's columns), as they
    read v3.0's ``meta/episodes`` (issue 48 item 9: ``meta/episodes/ holds no parquet files``)."""
    import pyarrow.compute as pc

    for episodes, weights in ((pc.field("length") >= 7, None), (lambda row: row["length"] < 7, None),
                              (None, "length")):
        v21, v30 = (EpisodeStreamingDataset(root, episodes=episodes, episode_weights=weights, seed=0)
                    for root in (v21_root, v30_root))
        assert v21.episode_indices == v30.episode_indices and len(v21) == len(v30)
    assert EpisodeStreamingDataset(v21_root, episode_weights="length").__len__() == sum(n * n for n in LENGTHS)
    with pytest.raises(ValueError, match=r"episode_weights='nope' is not a column of .*meta/episodes.jsonl"):
        EpisodeStreamingDataset(v21_root, episode_weights="nope")


def test_split_episodes_on_v21_equals_v30(v21_root, v30_root):
    """``split_episodes`` on a v2.x path and ``by=<column>`` on a v2.x dataset (issue 48 item 10:
    "this reader reads 'v3.0' only", and ``by=`` looked for ``meta/episodes/``)."""
    from episodestream import split_episodes

    for by in ("task", None, "tasks"):
        assert split_episodes(v21_root, 0.4, by=by) == split_episodes(v30_root, 0.4, by=by)
        assert split_episodes(EpisodeDataset(v21_root), 0.4, by=by, seed=3) == \
            split_episodes(EpisodeDataset(v30_root), 0.4, by=by, seed=3)
