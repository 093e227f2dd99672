"""LeRobot 0.6's feature types beyond RGB video, as its reader returns them (issue 47), on synthetic datasets
written as LeRobot's writer writes them: depth cameras (HEVC ``gray12le``, log-quantised, B-frames) as
float32 (1, H, W) depth in "mm" or "m", depth and greyscale images in parquet, every stored dtype (float64
as float32, int32 as int64, ``Array2D`` columns), stored-vs-declared casts, and refusals naming the key.
``tests/with_lerobot/test_features_lerobot.py`` compares the same with LeRobot itself, bit for bit."""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from episodestream import EpisodeDataset, EpisodeLoader, EpisodeMixture, EpisodeStreamingDataset
from episodestream import DatasetFormatError
from episodestream.tools.synthetic import write_synthetic_dataset
from episodestream.tools.synthetic import synthetic_depth_mm
from tests.conftest import built_once

DEPTH, FRONT = "observation.images.depth", "observation.images.front"
LENGTHS = [9, 14, 11]
FPS = 10
# The log quantiser's step at 10 m is ~3.3 mm (a code is 1/4095 of log(13.5 / 3.51)); half a step
# of error, plus the rounding to whole mm.
STEP_MM = 13500 * (np.log(13.5 / 3.51) / 4095) / 2 + 0.5


@pytest.fixture(scope="session")
def depth_root(tmp_path_factory):
    return built_once(tmp_path_factory, "lerobot06", lambda root: write_synthetic_dataset(
        root, num_episodes=len(LENGTHS), episode_length=LENGTHS, fps=FPS, cameras=(FRONT,), depth_cameras=(DEPTH,),
        extra_dtypes=True, height=64, width=64, max_episodes_per_video_file={FRONT: 2}, seed=0))


def expected_depth(episode: int, frame: int) -> np.ndarray:
    return synthetic_depth_mm(episode_index=episode, frame_index=frame, height=64, width=64)[None]


def test_depth_camera_is_float32_millimetres_of_the_right_frame(depth_root):
    dataset = EpisodeDataset(depth_root)
    starts = np.cumsum([0, *LENGTHS])
    for i in np.random.default_rng(0).permutation(len(dataset)).tolist():  # random access over B-frames
        sample = dataset[i]
        depth = sample[DEPTH]
        assert depth.dtype == torch.float32 and tuple(depth.shape) == (1, 64, 64)
        episode = int(np.searchsorted(starts, i, side="right") - 1)
        error = np.abs(depth.numpy() - expected_depth(episode, i - starts[episode]))
        assert error.max() <= STEP_MM, (i, error.max())
        assert torch.equal(depth, depth.round())  # "mm" comes out in whole millimetres, as LeRobot's
    assert dataset.meta.depth_keys == [DEPTH]


def test_depth_in_metres_and_windows(depth_root):
    windows = {DEPTH: [-2 / FPS, 0.0, 1 / FPS]}
    mm = EpisodeDataset(depth_root, delta_timestamps=windows)
    m = EpisodeDataset(depth_root, delta_timestamps=windows, depth_output_unit="m")
    sample, metres = mm[10], m[10]  # episode 1, frame 1: the first step pads
    assert tuple(sample[DEPTH].shape) == (3, 1, 64, 64) and sample[f"{DEPTH}_is_pad"].tolist() == [True, False, False]
    assert np.abs(sample[DEPTH][0].numpy() - expected_depth(1, 0)).max() <= STEP_MM  # the pad: the first frame
    assert np.abs(sample[DEPTH][2].numpy() - expected_depth(1, 2)).max() <= STEP_MM
    assert metres[DEPTH].dtype == torch.float32
    assert np.abs(metres[DEPTH].numpy() * 1000 - sample[DEPTH].numpy()).max() <= 0.5 + 1e-3
    stats_mm, stats_m = mm.meta.stats[DEPTH], m.meta.stats[DEPTH]
    np.testing.assert_allclose(stats_m["mean"], stats_mm["mean"] / 1000)
    assert stats_m["count"].tolist() == stats_mm["count"].tolist()
    with pytest.raises(ValueError, match=r"depth_output_unit \('cm'\).*'mm', 'm'"):
        EpisodeDataset(depth_root, depth_output_unit="cm")


def test_return_uint8_and_image_transforms_leave_depth_alone(depth_root):
    seen = []
    dataset = EpisodeDataset(depth_root, return_uint8=True, image_transforms=lambda x: seen.append(x.shape) or x * 0)
    plain = EpisodeDataset(depth_root)
    sample = dataset[4]
    assert sample[FRONT].dtype == torch.uint8 and not sample[FRONT].any()  # the RGB camera went through them
    assert torch.equal(sample[DEPTH], plain[4][DEPTH])
    assert seen == [(3, 64, 64)]


def test_stream_and_loader_equal_map_style(depth_root):
    windows = {DEPTH: [-1 / FPS, 0.0], FRONT: [0.0, 1 / FPS], "observation.matrix": [0.0, 1 / FPS]}
    reference = EpisodeDataset(depth_root, delta_timestamps=windows)
    streamed = list(EpisodeStreamingDataset(depth_root, delta_timestamps=windows, seed=3, episode_pool_size=2))
    assert sorted(int(s["index"]) for s in streamed) == list(range(sum(LENGTHS)))
    for sample in streamed:
        expected = reference[int(sample["index"])]
        for key, value in expected.items():
            assert (torch.equal(sample[key], value) and sample[key].dtype == value.dtype
                    if isinstance(value, torch.Tensor) else sample[key] == value), key
    loader = EpisodeLoader(EpisodeStreamingDataset(depth_root, delta_timestamps=windows, seed=4, episode_pool_size=2),
                           batch_size=5, num_threads=2)
    for batch in loader:
        assert batch[DEPTH].dtype == torch.float32 and batch[DEPTH].shape[1:] == (2, 1, 64, 64)
        for row, index in enumerate(batch["index"].tolist()):
            for key in (DEPTH, FRONT, "observation.matrix", "observation.float64", "observation.int32"):
                assert torch.equal(batch[key][row], reference[index][key]), (index, key)


def test_stored_dtypes_come_out_as_lerobot_returns_them(depth_root):
    sample = EpisodeDataset(depth_root)[12]  # episode 1, frame 3
    assert sample[DEPTH].dtype == torch.float32
    assert sample["observation.float64"].dtype == torch.float32
    stored = (np.float32(1003) + np.arange(3, dtype=np.float32) / 8).astype(np.float64) + 1 / 3
    np.testing.assert_array_equal(sample["observation.float64"].numpy(), stored.astype(np.float32))
    assert sample["observation.int32"].dtype == torch.int64 and sample["observation.int32"].item() == 3 * 7 + 1
    assert sample["observation.matrix"].dtype == torch.float32
    assert sample["observation.matrix"].tolist() == [[1003, 1004, 1005], [1006, 1007, 1008]]


def _rewrite_column(root, key: str, array_of, declared: str | None = None) -> None:
    """Replace column ``key`` of every data file with ``array_of(old_column)``; set its declared dtype."""
    for path in sorted((root / "data").rglob("*.parquet")):
        table = pq.read_table(path)
        table = table.set_column(table.schema.get_field_index(key), key, array_of(table.column(key)))
        pq.write_table(table, path)
    if declared is not None:
        info = json.loads((root / "meta/info.json").read_text())
        info["features"][key]["dtype"] = declared
        (root / "meta/info.json").write_text(json.dumps(info))


@pytest.fixture
def tabular_copy(tmp_path):
    root = write_synthetic_dataset(tmp_path / "ds", num_episodes=2, episode_length=6, cameras=(), seed=0)
    return root


def test_a_column_stored_wider_than_declared_is_cast_to_the_declared_type(tabular_copy):
    _rewrite_column(tabular_copy, "observation.state", lambda c: c.cast(pa.list_(pa.float64(), 6)))
    state = EpisodeDataset(tabular_copy)[1]["observation.state"]
    assert state.dtype == torch.float32
    _rewrite_column(tabular_copy, "frame_index", lambda c: c.cast(pa.int64()), declared="float16")
    assert EpisodeDataset(tabular_copy, column_cache=False)[4]["frame_index"].dtype == torch.float32


def test_a_cast_that_loses_values_is_refused_naming_key_and_types(tabular_copy):
    _rewrite_column(tabular_copy, "observation.state", lambda c: c, declared="int8")
    with pytest.raises(DatasetFormatError, match=r"column 'observation.state'.*stored as float.*declared 'int8'"):
        EpisodeDataset(tabular_copy)[0]
    with pytest.raises(DatasetFormatError, match=r"observation.state.*declared 'int8'"):
        list(EpisodeStreamingDataset(tabular_copy))


def test_an_unknown_dtype_is_refused_at_construction_as_not_supported(tabular_copy):
    info = json.loads((tabular_copy / "meta/info.json").read_text())
    info["features"]["observation.state"]["dtype"] = "complex64"
    (tabular_copy / "meta/info.json").write_text(json.dumps(info))
    for face in (EpisodeDataset, EpisodeStreamingDataset):
        with pytest.raises(DatasetFormatError, match=r"'observation.state' has dtype 'complex64', which "
                                                     r"episodestream does not support"):
            face(tabular_copy)


def _tiff(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="TIFF")
    return out.getvalue()


def _png(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG")
    return out.getvalue()


def test_image_cameras_decode_as_lerobot(tmp_path):
    """A PNG camera stays float32 with return_uint8 (LeRobot's return_uint8 is for video); greyscale
    has one channel; depth TIFFs (uint16 mm, float32 m) come out float32 (1, H, W) in the output unit."""
    root = write_synthetic_dataset(tmp_path / "ds", num_episodes=1, episode_length=4, cameras=(),
                                   image_keys=("observation.images.top",), seed=0)
    grey = np.arange(64 * 64, dtype=np.uint16).reshape(64, 64)
    images = {"grey": _png((grey % 256).astype(np.uint8)), "mm": _tiff(grey + 400),
              "m": _tiff(((grey + 400) / 1000).astype(np.float32))}
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    path = next((root / "data").rglob("*.parquet"))
    table = pq.read_table(path)
    for name, data in images.items():
        table = table.append_column(f"observation.images.{name}", pa.array([{"bytes": data, "path": None}] * 4,
                                                                               image_type))
    pq.write_table(table, path)
    info = json.loads((root / "meta/info.json").read_text())
    spec = {"dtype": "image", "shape": [64, 64, 1], "names": ["height", "width", "channels"]}
    info["features"]["observation.images.grey"] = spec
    for unit in ("mm", "m"):
        info["features"][f"observation.images.{unit}"] = {**spec, "info": {"is_depth_map": True, "depth_unit": unit}}
    (root / "meta/info.json").write_text(json.dumps(info))
    sample = EpisodeDataset(root, return_uint8=True, cache_dir=tmp_path / "cache")[2]
    assert sample["observation.images.top"].dtype == torch.float32
    assert tuple(sample["observation.images.grey"].shape) == (1, 64, 64)
    assert torch.equal(sample["observation.images.grey"][0], torch.from_numpy((grey % 256) / np.float32(255)).float())
    assert sample["observation.images.mm"].dtype == torch.float32
    assert torch.equal(sample["observation.images.mm"][0], torch.from_numpy((grey + 400).astype(np.float32)))
    metres_in_mm = sample["observation.images.m"][0].numpy()
    np.testing.assert_allclose(metres_in_mm, grey + 400, rtol=1e-6)
    in_metres = EpisodeDataset(root, depth_output_unit="m", cache_dir=tmp_path / "cache")[2]
    assert torch.equal(in_metres["observation.images.mm"][0],
                       torch.from_numpy((grey + 400).astype(np.float32) / np.float32(1000)))


def test_a_mixture_takes_float64_beside_float32(depth_root, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(depth_root, other)
    _rewrite_column(other, "observation.float64", lambda c: c.cast(pa.list_(pa.float32(), 3)), declared="float32")
    mixture = EpisodeMixture([EpisodeStreamingDataset(depth_root, seed=0), EpisodeStreamingDataset(other, seed=0)],
                             weights=[1, 1])
    values = {sample["observation.float64"].dtype for sample in mixture}
    assert values == {torch.float32}


def test_a_mixtures_depth_stats_are_in_its_depth_output_unit_whatever_was_cached(depth_root, tmp_path):
    """The mixture's stats cache is keyed by what its numbers come from: a "mm" mixture built first
    (its stats cached) must not hand its millimetres to the same mixture in "m" (issue 62 item 2)."""
    def mixture(unit):
        return EpisodeMixture([EpisodeStreamingDataset(depth_root, seed=0, depth_output_unit=unit, cache_dir=tmp_path)
                               for _ in range(2)], weights=[1, 1])

    in_mm = mixture("mm").meta
    mm = in_mm.stats[DEPTH]
    in_m = mixture("m").meta
    assert in_m.stats is not in_mm.stats
    for name in ("mean", "std", "min", "max", "q50"):
        np.testing.assert_allclose(in_m.stats[DEPTH][name], mm[name] / 1000, err_msg=name)
        np.testing.assert_allclose(in_m.stats[DEPTH][name], in_m.component_stats[0][DEPTH][name], err_msg=name)
    np.testing.assert_allclose(mixture("mm").meta.stats[DEPTH]["mean"], mm["mean"])


def test_remote_depth_equals_local(depth_root, tmp_path):
    """Depth from a remote source (sparse per-span downloads into the node cache), as LeRobot's own
    streaming dataset does not read it."""
    from episodestream.testing import HttpServer

    served = tmp_path / "served"
    shutil.copytree(depth_root, served / "depth")
    options = dict(seed=1, episode_pool_size=2, delta_timestamps={DEPTH: [-1 / FPS, 0.0]})
    expected = {int(s["index"]): s for s in EpisodeStreamingDataset(depth_root, **options)}
    with HttpServer(served) as server:
        dataset = EpisodeStreamingDataset(server.url_for("depth"), cache_dir=tmp_path / "cache", **options)
        try:
            got = list(dataset)
        finally:
            dataset.close()
    assert sorted(int(s["index"]) for s in got) == sorted(expected)
    for sample in got:
        assert torch.equal(sample[DEPTH], expected[int(sample["index"])][DEPTH]), int(sample["index"])


def test_a_union_mixture_of_depth_and_language_datasets(depth_root, tmp_path):
    """Each key present in one component only: the depth camera (float32 zeros and flagged where
    missing, whatever return_uint8) and the language columns; ``meta`` says both."""
    annotated = write_synthetic_dataset(tmp_path / "annotated", num_episodes=2, episode_length=5, fps=FPS,
                                        cameras=(FRONT,), height=64, width=64, language=True, seed=2)
    mixture = EpisodeMixture([EpisodeStreamingDataset(depth_root, seed=0, return_uint8=True),
                              EpisodeStreamingDataset(annotated, seed=0, return_uint8=True)],
                             weights=[1, 1], keys="union")
    assert mixture.meta.depth_keys == [DEPTH] and mixture.meta.has_language_columns
    assert mixture.meta.tools and mixture.meta.tools[0]["function"]["name"] == "say"
    batches = list(EpisodeLoader(mixture, batch_size=8, num_threads=2))
    assert batches
    seen = set()
    for batch in batches:
        assert batch[DEPTH].dtype == torch.float32 and batch[FRONT].dtype == torch.uint8
        from_depth = batch["dataset_index"] == 0
        assert batch[f"{DEPTH}_is_missing"].tolist() == (~from_depth).tolist()
        assert not batch[DEPTH][~from_depth].any() and (batch[DEPTH][from_depth] >= 500).all()
        # LeRobot's trainer's batch: the language columns left out (language_columns="keep" keeps them)
        assert "language_persistent" not in batch and len(batch["language_persistent_is_missing"]) == len(from_depth)
        seen |= set(batch["dataset_index"].tolist())
    assert seen == {0, 1}


@pytest.mark.parametrize("dims", [2, 3, 4, 5])
def test_array_nd_columns_read_through_their_storage(dims):
    """``datasets``' Array2D..Array5D extension columns (LeRobot's shaped features), any stored dtype."""
    from datasets.features import features as hf

    from episodestream._format.dtypes import sample_values

    shape = (2, 3, 1, 2, 1)[:dims]
    kind = {2: hf.Array2DExtensionType, 3: hf.Array3DExtensionType, 4: hf.Array4DExtensionType,
            5: hf.Array5DExtensionType}[dims]
    values = np.arange(4 * int(np.prod(shape)), dtype=np.float64).reshape(4, *shape) / 3
    storage = pa.array(values.tolist(), kind(shape, "float64").storage_type)
    column = pa.ExtensionArray.from_storage(kind(shape, "float64"), storage)
    got = sample_values(column, "float64", shape, "test column")
    assert got.dtype == np.float32 and got.shape == (4, *shape)
    np.testing.assert_array_equal(got, values.astype(np.float32))


def test_declared_float16_rounds_through_float16_and_uint64_beyond_int64_is_refused():
    from episodestream._format.dtypes import sample_values

    got = sample_values(pa.array([0.1, 1 / 3], pa.float64()), "float16", (1,), "w")
    np.testing.assert_array_equal(got, np.array([0.1, 1 / 3]).astype(np.float16).astype(np.float32))
    with pytest.raises(DatasetFormatError, match=r"w: declared 'uint64', holds 18446744073709551615, beyond int64"):
        sample_values(pa.array([2**64 - 1], pa.uint64()), "uint64", (1,), "w")


def test_a_one_step_window_on_a_video_key_is_a_frame_as_lerobots(depth_root):
    """LeRobot squeezes a video query's leading axis: a one-step window gives (C, H, W), with its
    (1,) ``_is_pad``; a tabular one keeps its step axis."""
    windows = {FRONT: [-1 / FPS], DEPTH: [0.0], "observation.state": [0.0]}
    reference = EpisodeDataset(depth_root, delta_timestamps=windows)
    sample = reference[9]  # episode 1, frame 0: the front camera's step pads
    assert tuple(sample[FRONT].shape) == (3, 64, 64) and tuple(sample[DEPTH].shape) == (1, 64, 64)
    assert sample[f"{FRONT}_is_pad"].tolist() == [True] and tuple(sample["observation.state"].shape) == (1, 6)
    batch = next(iter(EpisodeLoader(EpisodeStreamingDataset(depth_root, delta_timestamps=windows, seed=1),
                                    batch_size=4)))
    assert tuple(batch[FRONT].shape) == (4, 3, 64, 64) and tuple(batch[DEPTH].shape) == (4, 1, 64, 64)
    for row, index in enumerate(batch["index"].tolist()):
        assert torch.equal(batch[FRONT][row], reference[index][FRONT])
