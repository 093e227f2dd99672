"""Exact statistics (``_format.exact_stats``, ``dataset.compute_stats()``): values against numpy on
the rows themselves, LeRobot's keys and shapes, the cache."""

from __future__ import annotations

import json
import os
from fractions import Fraction

import numpy as np
import pyarrow.parquet as pq
import pytest

from episodestream import EpisodeDataset, EpisodeStreamingDataset
from episodestream.testing import faults
from episodestream._format.exact_stats import QUANTILES, feature_stats, weighted_feature_stats, weighted_quantiles
from episodestream._runtime.mixture.meta import aggregate_stats

QS = [float(q) for q in QUANTILES.values()]


def _repeated_quantiles(parts, repeats):
    rows = np.concatenate([np.repeat(p, r, axis=0) for p, r in zip(parts, repeats)])
    return np.quantile(rows, QS, method="inverted_cdf", axis=0), rows


@pytest.mark.parametrize("seed", range(6))
def test_weighted_quantiles_are_numpys_of_the_repeated_rows(seed):
    rng = np.random.default_rng(seed)
    parts = [np.round(rng.normal(loc, scale, size=n), 1)  # rounded: ties across and within parts
             for loc, scale, n in ((0, 1, int(rng.integers(1, 300))), (3, 0.5, int(rng.integers(1, 50))),
                                   (-2, 4, int(rng.integers(1, 120))))]
    repeats = [int(r) for r in rng.integers(1, 7, size=3)]
    expected, _ = _repeated_quantiles(parts, repeats)
    got = weighted_quantiles(parts, [Fraction(r) for r in repeats])
    np.testing.assert_array_equal(got, expected)
    # Scaling every weight alike changes nothing, fractions included.
    np.testing.assert_array_equal(weighted_quantiles(parts, [Fraction(r, 7) for r in repeats]), expected)


def test_one_part_is_numpys_inverted_cdf():
    values = np.random.default_rng(1).normal(size=(1001, 3)).astype(np.float32)
    stats = feature_stats(values, (3,))
    expected = np.quantile(values, QS, method="inverted_cdf", axis=0)
    for name, row in zip(QUANTILES, expected):
        np.testing.assert_array_equal(stats[name], row)
    np.testing.assert_allclose(stats["mean"], values.astype(np.float64).mean(0), rtol=1e-12)
    np.testing.assert_allclose(stats["std"], values.astype(np.float64).std(0), rtol=1e-12)
    assert stats["count"].tolist() == [1001] and stats["count"].dtype == np.int64


def test_mixture_quantiles_are_not_the_mean_of_the_parts_quantiles():
    """LeRobot's aggregate_stats merges quantiles as the frame-weighted mean of each source's: for
    two robots whose values do not overlap that lands between them, where no row is."""
    rng = np.random.default_rng(0)
    a = rng.uniform(0, 1, size=(900, 2))
    b = rng.uniform(10, 11, size=(100, 2))
    repeats = [1, 3]  # b weighted three times its share of frames
    exact = weighted_feature_stats([a, b], [Fraction(r) for r in repeats], (2,))
    expected, rows = _repeated_quantiles([a, b], repeats)
    for name, row in zip(QUANTILES, expected):
        np.testing.assert_array_equal(exact[name], row)
    np.testing.assert_allclose(exact["mean"], rows.mean(0), rtol=1e-6)
    np.testing.assert_allclose(exact["std"], rows.std(0), rtol=1e-6)
    # What the count-weighted mean of quantiles gives (even with counts that include the weights):
    per_part = [{"x": feature_stats(np.repeat(p, r, axis=0), (2,))} for p, r in zip((a, b), repeats)]
    merged = aggregate_stats(per_part)["x"]
    assert not np.allclose(merged["q50"], exact["q50"], rtol=0.05)
    assert np.allclose(merged["mean"], exact["mean"])  # the mean alone merges exactly


def test_weighted_mean_and_std_within_1e6_of_a_direct_computation():
    rng = np.random.default_rng(2)
    parts = [rng.normal(1e4, 3, size=(n, 4)).astype(np.float32) for n in (500, 37, 2000)]
    repeats = [2, 5, 1]
    stats = weighted_feature_stats(parts, [Fraction(r) for r in repeats], (4,))
    rows = np.concatenate([np.repeat(p, r, axis=0) for p, r in zip(parts, repeats)]).astype(np.float64)
    np.testing.assert_allclose(stats["mean"], rows.mean(0), rtol=1e-6)
    np.testing.assert_allclose(stats["std"], rows.std(0), rtol=1e-6)
    assert stats["count"].tolist() == [2537]  # rows, not weights
    np.testing.assert_array_equal(stats["min"], rows.min(0))
    np.testing.assert_array_equal(stats["max"], rows.max(0))


def _rows_of(root, episodes, key):
    tables = [pq.read_table(p, columns=[key, "episode_index"]) for p in sorted(root.glob("data/*/*.parquet"))]
    out = []
    for table in tables:
        values = np.asarray(table.column(key).to_pylist(), np.float64)
        keep = np.isin(table.column("episode_index").to_numpy(), episodes)
        out.append(values[keep])
    return np.concatenate(out).reshape(-1, *(values.shape[1:] or (1,)))


def test_compute_stats_of_a_selection_matches_its_rows(dataset_root, tmp_path):
    episodes = [0, 3, 5]
    dataset = EpisodeStreamingDataset(dataset_root, episodes=episodes, cache_dir=tmp_path)
    stats = dataset.compute_stats()
    lerobot = dataset.meta.stats
    for key in ("observation.state", "action", "timestamp", "index", "frame_index", "task_index"):
        rows = _rows_of(dataset_root, episodes, key)
        expected = np.quantile(rows, QS, method="inverted_cdf", axis=0)
        for name, row in zip(QUANTILES, expected):
            np.testing.assert_array_equal(stats[key][name], row, err_msg=f"{key} {name}")
        np.testing.assert_allclose(stats[key]["mean"], rows.mean(0), rtol=1e-9)
        np.testing.assert_allclose(stats[key]["std"], rows.std(0), rtol=1e-9, atol=1e-12)
        assert stats[key]["count"].tolist() == [dataset.num_frames]
        # LeRobot's keys and shapes (stats.json of the synthetic writer has them all).
        assert set(stats[key]) == set(lerobot[key]), key
        assert {n: v.shape for n, v in stats[key].items()} == {n: v.shape for n, v in lerobot[key].items()}, key
    # Cameras keep stats.json's (whole dataset): the file's values, shape (3, 1, 1).
    for camera in dataset.meta.camera_keys:
        assert camera in stats
        np.testing.assert_array_equal(stats[camera]["mean"], lerobot[camera]["mean"])
    assert "task" not in stats
    # The map-style dataset computes the same.
    same = EpisodeDataset(dataset_root, episodes=episodes, cache_dir=tmp_path).compute_stats()
    for key in stats:
        for name in stats[key]:
            np.testing.assert_array_equal(same[key][name], stats[key][name])


def test_the_whole_dataset_agrees_with_stats_json_where_it_is_exact(camera_less_root, tmp_path):
    dataset = EpisodeStreamingDataset(camera_less_root, cache_dir=tmp_path)
    stats, lerobot = dataset.compute_stats(), dataset.meta.stats
    for key in lerobot:
        for name in ("min", "max", "count"):
            np.testing.assert_array_equal(stats[key][name], lerobot[key][name], err_msg=f"{key} {name}")
        np.testing.assert_allclose(stats[key]["mean"], lerobot[key]["mean"], rtol=1e-9)


def test_the_cache_is_read_back_and_follows_the_data(camera_less_root, tmp_path):
    root = tmp_path / "data"
    import shutil

    shutil.copytree(camera_less_root, root)
    dataset = EpisodeStreamingDataset(root, episodes=[1, 2, 3], cache_dir=tmp_path / "cache")
    first = dataset.compute_stats()
    cached = list((tmp_path / "cache" / "stats").glob("*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["episodes"] == 3

    def refuse(*args, **kwargs):
        raise AssertionError("computed again instead of read from the cache")

    with faults.refusing_stats_pass(refuse):
        again = EpisodeStreamingDataset(root, episodes=[1, 2, 3], cache_dir=tmp_path / "cache").compute_stats()
        for key in first:
            for name in first[key]:
                np.testing.assert_array_equal(again[key][name], first[key][name])
                assert again[key][name].dtype == first[key][name].dtype
        with pytest.raises(AssertionError, match="computed again"):  # another selection is another entry
            EpisodeStreamingDataset(root, episodes=[1, 2], cache_dir=tmp_path / "cache").compute_stats()
    # A rewritten data file (same size) is a new entry.
    data_file = sorted(root.glob("data/*/*.parquet"))[0]
    stat = os.stat(data_file)
    data_file.write_bytes(data_file.read_bytes())
    os.utime(data_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    dataset.compute_stats()
    assert len(list((tmp_path / "cache" / "stats").glob("*.json"))) == 2  # [1, 2, 3] before and after the rewrite


def test_not_finite_values_name_the_file_episode_and_key(tmp_path):
    from episodestream.tools.synthetic import write_tabular_dataset

    root = write_tabular_dataset(tmp_path / "nan", num_episodes=3, episode_length=5)
    path = sorted(root.glob("data/*/*.parquet"))[0]
    table = pq.read_table(path)
    state = np.asarray(table.column("observation.state").to_pylist(), np.float32)
    state[7, 2] = np.nan
    import pyarrow as pa

    table = table.set_column(table.schema.get_field_index("observation.state"), "observation.state",
                             pa.FixedSizeListArray.from_arrays(state.reshape(-1), 6))
    pq.write_table(table, path, row_group_size=5)
    dataset = EpisodeStreamingDataset(root, cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match=r"episode_index 1\) frame 2: 'observation.state' is .*nan.*not finite"):
        dataset.compute_stats()


def test_the_stats_command_prints_and_writes_the_selections_stats(camera_less_root, tmp_path, capsys):
    from episodestream.tools.cli import main

    out = tmp_path / "stats.json"
    assert main(["stats", str(camera_less_root), "--episodes", "1-3,7", "--cache-dir", str(tmp_path / "c"),
                 "--json", "--out", str(out), "--no-progress"]) == 0
    printed = json.loads(capsys.readouterr().out)
    expected = EpisodeStreamingDataset(camera_less_root, episodes=[1, 2, 3, 7], cache_dir=tmp_path / "c").compute_stats()
    assert printed == json.loads(out.read_text())
    assert printed == {k: {n: v.tolist() for n, v in e.items()} for k, e in expected.items()}
    assert main(["stats", str(camera_less_root), "--no-cache"]) == 0
    text = capsys.readouterr()
    assert "24 episodes" in text.out and "observation.state [6]: mean" in text.out and "stats" in text.err  # tqdm bar
    assert main(["stats", str(camera_less_root), "--episodes", "99", "--no-progress"]) != 0
    assert "--episodes '99': '99' goes past the last episode of" in capsys.readouterr().err
