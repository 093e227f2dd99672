"""``dataset.compute_stats()`` against LeRobot 0.6's own ``compute_episode_stats`` on the same rows: the
same keys and shapes, the same mean, min, max and count, and quantiles within one of LeRobot's
histogram bins (its 5,000 bins between min and max) of the exact ones. ``std`` is checked against
numpy in float64: LeRobot's is ``sqrt(E[x^2] - E[x]^2)`` in float32, which loses digits when the
values are far from 0 (here state ~6,000 with a spread of 4: 4.47 and 4.0 for 4.32)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

try:
    from lerobot.datasets.compute_stats import compute_episode_stats
except ImportError as error:  # CI: LeRobot is not installed
    pytest.skip(f"LeRobot is not importable here ({error}); these tests need a LeRobot 0.6 venv "
                f"(LeRobot needs Python >= 3.12 and torchvision)", allow_module_level=True)

from episodestream import EpisodeStreamingDataset


def test_one_episode_matches_lerobots_compute_episode_stats(camera_less_root, tmp_path):
    dataset = EpisodeStreamingDataset(camera_less_root, episodes=[6], cache_dir=tmp_path)
    ours = dataset.compute_stats()
    table = pq.read_table(camera_less_root / "data").to_pandas()
    rows = table[table["episode_index"] == 6]
    features = dict(dataset.meta.features)
    episode = {key: np.stack(rows[key].to_numpy()) if features[key]["shape"][0] > 1 else rows[key].to_numpy()
               for key in ours}
    theirs = compute_episode_stats(episode, {k: features[k] for k in ours})
    for key in ours:
        assert set(ours[key]) == set(theirs[key]), key
        for name, value in theirs[key].items():
            assert np.shape(ours[key][name]) == np.shape(value), (key, name)
        for name in ("mean", "min", "max"):
            np.testing.assert_allclose(ours[key][name], theirs[key][name], rtol=1e-5, atol=1e-6, err_msg=f"{key} {name}")
        exact_std = np.asarray(episode[key], np.float64).reshape(len(rows), -1).std(0).reshape(ours[key]["std"].shape)
        np.testing.assert_allclose(ours[key]["std"], exact_std, rtol=1e-9, atol=1e-12, err_msg=key)
        assert ours[key]["count"].tolist() == np.asarray(theirs[key]["count"]).tolist()
        span = np.asarray(theirs[key]["max"], np.float64) - np.asarray(theirs[key]["min"], np.float64)
        for name in ("q01", "q10", "q50", "q90", "q99"):
            assert np.all(np.abs(ours[key][name] - theirs[key][name]) <= span / 5000 * 2 + 1e-6), (key, name)
