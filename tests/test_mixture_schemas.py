"""Mixtures across schemas (``EpisodeMixture(keys=..., resize=...)``) and their exact stats.

Three small video datasets of different robots: ``arm`` (6-dim state, a front camera), ``bimanual``
(14-dim state, front and wrist cameras) and ``wide`` (6-dim, a front camera twice as wide). Every
mixture sample is checked against its component's own sample of the same frame.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from episodestream import EpisodeDataset, EpisodeLoader, EpisodeMixture, EpisodeStreamingDataset
from episodestream.testing import faults
from episodestream.tools.synthetic import write_synthetic_dataset

FRONT, WRIST, STATE, ACTION = "observation.images.front", "observation.images.wrist", "observation.state", "action"
QS = (0.01, 0.1, 0.5, 0.9, 0.99)


def _robot(root, robot_type, **kwargs):
    write_synthetic_dataset(root, num_episodes=3, episode_length=(5, 9), **kwargs)
    info = json.loads((root / "meta/info.json").read_text())
    info["robot_type"] = robot_type
    (root / "meta/info.json").write_text(json.dumps(info))
    return root


@pytest.fixture(scope="module")
def robots(tmp_path_factory):
    base = tmp_path_factory.mktemp("robots")
    return {"arm": _robot(base / "arm", "arm6", cameras=(FRONT,), state_dim=6, seed=1),
            "bimanual": _robot(base / "bimanual", "bimanual14", cameras=(FRONT, WRIST), state_dim=14, seed=2),
            "wide": _robot(base / "wide", "wide6", cameras=(FRONT,), state_dim=6, width=192, seed=3)}


def _mix(roots, weights=None, **kwargs):
    options = {k: kwargs.pop(k) for k in ("delta_timestamps", "image_transforms", "rank", "world_size") if k in kwargs}
    datasets = [EpisodeStreamingDataset(r, episode_pool_size=2, seed=i, **options) for i, r in enumerate(roots)]
    return EpisodeMixture(datasets, weights, seed=5, **kwargs)


def _own_samples(roots):
    return [EpisodeDataset(r) for r in roots]


def test_union_pads_vectors_and_fills_missing_cameras_exactly(robots):
    roots = [robots["arm"], robots["bimanual"]]
    mixture = _mix(roots, [0.5, 0.5], keys="union")
    own = _own_samples(roots)
    samples = list(mixture)
    assert len(samples) == len(mixture) and {int(s["dataset_index"]) for s in samples} == {0, 1}
    for sample in samples:
        i = int(sample["dataset_index"])
        expected = own[i][int(sample["index"])]
        width = (6, 14)[i]
        for key in (STATE, ACTION):
            assert sample[key].shape == (14,) and sample[key].dtype == torch.float32
            assert torch.equal(sample[key][:width], expected[key]) and not sample[key][width:].any()
            assert sample[f"{key}_dim_mask"].dtype == torch.bool
            assert sample[f"{key}_dim_mask"].tolist() == [True] * width + [False] * (14 - width)
        assert torch.equal(sample[FRONT], expected[FRONT])
        if i == 0:
            assert sample[WRIST].shape == (3, 64, 96) and not sample[WRIST].any()
            assert sample[f"{WRIST}_is_missing"].item() is True
        else:
            assert torch.equal(sample[WRIST], expected[WRIST]) and sample[f"{WRIST}_is_missing"].item() is False
        assert sample["robot_type"] == ("arm6", "bimanual14")[i] and sample["task"] == expected["task"]
        for key in ("index", "episode_index", "frame_index", "timestamp"):
            assert torch.equal(sample[key], expected[key])
    assert f"{FRONT}_is_missing" not in samples[0] and "timestamp_dim_mask" not in samples[0]
    assert {k for s in samples for k in s} == set(samples[0])  # every sample has every key
    # The mixture's feature table: widths of the widest, names padded.
    features = mixture.meta.features
    assert features[STATE]["shape"] == (14,) and features[STATE]["names"] == [f"motor_{j}" for j in range(6)] + ["pad"] * 8
    assert features[WRIST]["shape"] == (64, 96, 3) and features[WRIST]["dtype"] == "video"
    assert features[WRIST]["info"] == mixture.datasets[1].meta.features[WRIST]["info"]  # the codec and the rest kept
    assert mixture.meta.robot_types == ["arm6", "bimanual14"]


def test_intersection_keeps_the_shared_keys_and_pads_them(robots):
    roots = [robots["arm"], robots["bimanual"]]
    mixture = _mix(roots, keys="intersection")
    samples = list(mixture)
    assert WRIST not in samples[0] and WRIST not in mixture.meta.features
    assert not any(k.endswith("_is_missing") for k in samples[0])
    assert all(s[STATE].shape == (14,) and s[f"{STATE}_dim_mask"].sum() == (6, 14)[int(s["dataset_index"])]
               for s in samples)
    # Default weights: every frame of each component once.
    frames = Counter((int(s["dataset_index"]), int(s["index"])) for s in samples)
    assert sorted(frames.values()) == [1] * sum(d.num_frames for d in mixture.datasets)


def test_windows_keep_their_pad_masks_and_missing_windows_are_all_pad(robots):
    roots = [robots["arm"], robots["bimanual"]]
    window = {ACTION: [0.0, 1 / 30, 2 / 30]}
    datasets = [EpisodeStreamingDataset(roots[0], delta_timestamps=window, episode_pool_size=2),
                EpisodeStreamingDataset(roots[1], delta_timestamps={**window, WRIST: [0.0, 1 / 30]},
                                        episode_pool_size=2)]
    samples = list(EpisodeMixture(datasets, keys="union"))
    own = _own_samples(roots)
    for sample in samples:
        i = int(sample["dataset_index"])
        assert sample[ACTION].shape == (3, 14) and sample[f"{ACTION}_is_pad"].shape == (3,)
        assert not sample[ACTION][:, (6, 14)[i]:].any()
        assert sample[WRIST].shape == (2, 3, 64, 96)
        if i == 0:
            assert sample[f"{WRIST}_is_pad"].all() and not sample[WRIST].any()
        else:
            assert torch.equal(sample[WRIST][0], own[1][int(sample["index"])][WRIST])


def _detached(batches):
    return [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in b.items()} for b in batches]


def _assert_same_batches(got, expected):
    assert len(got) == len(expected) > 0
    for a, b in zip(got, expected):
        assert list(a) == list(b)
        for key in a:
            if isinstance(a[key], torch.Tensor):
                assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
            else:
                assert a[key] == b[key], key


@pytest.mark.parametrize("keys", ["union", "intersection"])
def test_episode_loader_and_dataloader_workers_give_identical_batches(robots, keys):
    roots = [robots["arm"], robots["bimanual"]]
    expected = list(torch.utils.data.DataLoader(_mix(roots, [0.4, 0.6], keys=keys), batch_size=4))
    with EpisodeLoader(_mix(roots, [0.4, 0.6], keys=keys), 4, num_threads=2) as loader:
        got = _detached(loader)
    _assert_same_batches(got, expected)
    # DataLoader workers: other consumers' orders, but each frame's values are the same bits.
    def by_frame(batches):
        out = {}
        for b in batches:
            for j in range(len(b["index"])):
                out[int(b["dataset_index"][j]), int(b["index"][j])] = {
                    k: v[j] if isinstance(v, torch.Tensor) else v[j] for k, v in b.items()}
        return out

    mixture = _mix(roots, [0.4, 0.6], keys=keys)
    workers = by_frame(torch.utils.data.DataLoader(mixture, batch_size=4, num_workers=2))
    mine = by_frame(got)
    for frame in set(workers) & set(mine):
        for key, value in mine[frame].items():
            other = workers[frame][key]
            assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other, (frame, key)
    assert len(set(workers) & set(mine)) > 0


def _resized(frames, size):
    """What ``resize=`` documents: torch's bilinear ``interpolate`` with antialiasing, uint8 frames
    rounded back to uint8 (written here, not imported, so that the mixture is checked against it)."""
    floats = frames[None].to(torch.float32) if not frames.is_floating_point() else frames[None]
    out = torch.nn.functional.interpolate(floats, size=size, mode="bilinear", antialias=True, align_corners=False)[0]
    return out if frames.is_floating_point() else out.round().clamp(0, 255).to(frames.dtype)


def test_cameras_of_different_sizes_are_refused_unless_resized(robots):
    roots = [robots["arm"], robots["wide"]]
    with pytest.raises(ValueError, match=r"Mixture key 'observation.images.front': dataset 1 \(.*wide\) key "
                                         r"'observation.images.front' .* cameras of different sizes \(\[3, 64, 192\] "
                                         r"and \[3, 64, 96\] as C, H, W\); pass resize="):
        _mix(roots, keys="union")
    with pytest.raises(ValueError, match=r"video \[64, 96, 3\]; dataset 1 .* video \[64, 192, 3\]"):
        _mix(roots)  # keys="same": today's list of differences
    own = _own_samples(roots)
    for keys in ("same", "union"):
        mixture = _mix(roots, keys=keys, resize={FRONT: (64, 96)})
        with EpisodeLoader(mixture, 4) as loader:
            batches = _detached(loader)
        for b in batches:
            assert b[FRONT].shape[1:] == (3, 64, 96)
            for j in range(len(b["index"])):
                i, index = int(b["dataset_index"][j]), int(b["index"][j])
                expected = own[i][index][FRONT]
                expected = expected if i == 0 else _resized(expected, (64, 96))
                assert torch.equal(b[FRONT][j], expected)
    assert _mix(roots, keys="union", resize={FRONT: (32, 48)}).meta.features[FRONT]["shape"] == (32, 48, 3)
    with pytest.raises(ValueError, match=r"resize names \['observation.state'\], which are not camera keys"):
        _mix(roots, keys="union", resize={STATE: (1, 1)})
    with pytest.raises(ValueError, match=r"resize\['observation.images.front'\] must be \(height, width\)"):
        _mix(roots, keys="union", resize={FRONT: (64,)})


def test_irreconcilable_features_name_the_component_its_key_and_the_mixture_key(robots):
    roots = [robots["arm"], robots["bimanual"]]
    datasets = [EpisodeStreamingDataset(r) for r in roots]
    with pytest.raises(ValueError, match=r"Mixture key 'observation.state': dataset 1 \(.*bimanual\) key "
                                         r"'observation.images.wrist' \(video \[64, 96, 3\]\) cannot join dataset 0 "
                                         r".* a camera beside a number"):
        EpisodeMixture(datasets, keys="union", rename=[None, {WRIST: STATE, STATE: "observation.state_14"}])
    windowed = [EpisodeStreamingDataset(roots[0]),
                EpisodeStreamingDataset(roots[1], delta_timestamps={ACTION: [0.0, 1 / 30]})]
    with pytest.raises(ValueError, match=r"Mixture key 'action': dataset 1 .* key 'action' \(float32 \[14\], window "
                                         r"of 2\) .* windows of different lengths"):
        EpisodeMixture(windowed, keys="intersection")
    with pytest.raises(ValueError, match=r"Invalid keys \('all'\). Supported values are 'same', 'union', "
                                         r"'intersection'"):
        EpisodeMixture(datasets, keys="all")
    with pytest.raises(ValueError, match=r"must give the same keys"):  # the default stays today's rule
        EpisodeMixture(datasets)


def _rows(root, key):
    table = pq.read_table(root / "data", columns=[key, "index"]).sort_by("index")
    return np.asarray(table.column(key).to_pylist(), np.float64)


def test_mixture_stats_are_exact_for_the_weighted_rows(robots, monkeypatch):
    roots = [robots["arm"], robots["bimanual"]]
    mixture = _mix(roots, [0.3, 0.7], keys="union")
    counts, frames = mixture.rank_counts(), [d.num_frames for d in mixture.datasets]
    # Every row of component i weighs c_i / F_i: as whole repeats, c_i * L / F_i with L = lcm(F).
    lcm = math.lcm(*frames)
    repeats = [c * lcm // f for c, f in zip(counts, frames)]
    assert all(Fraction(c, f) * lcm == r for c, f, r in zip(counts, frames, repeats))
    stats = mixture.meta.stats
    for key in (STATE, ACTION, "timestamp"):
        parts = [_rows(r, key).reshape(f, -1) for r, f in zip(roots, frames)]
        width = parts[1].shape[1]
        for d in range(width):
            having = [(p[:, d], r) for p, r in zip(parts, repeats) if d < p.shape[1]]
            rows = np.concatenate([np.repeat(p, r) for p, r in having])
            q = np.quantile(rows, QS, method="inverted_cdf")
            got = [stats[key][n].reshape(-1)[d] for n in ("q01", "q10", "q50", "q90", "q99")]
            assert got == q.tolist(), (key, d)
            assert math.isclose(stats[key]["mean"].reshape(-1)[d], rows.mean(), rel_tol=1e-6)
            assert math.isclose(stats[key]["std"].reshape(-1)[d], rows.std(), rel_tol=1e-6)
            assert stats[key]["min"].reshape(-1)[d] == rows.min() and stats[key]["max"].reshape(-1)[d] == rows.max()
        assert stats[key]["count"].tolist() == [sum(frames)]
    assert stats[STATE]["mean"].shape == (14,) and stats["timestamp"]["q50"].shape == (1,)
    # Per component: its own exact stats, padded with the identity.
    arm = mixture.meta.component_stats[0]
    own = mixture.datasets[0].compute_stats()
    np.testing.assert_array_equal(arm[STATE]["q90"][:6], own[STATE]["q90"])
    assert arm[STATE]["std"][6:].tolist() == [1.0] * 8 and arm[STATE]["mean"][6:].tolist() == [0.0] * 8
    assert arm[STATE]["min"][6:].tolist() == [-1.0] * 8 and arm[STATE]["max"][6:].tolist() == [1.0] * 8
    assert arm[WRIST]["std"].shape == (3, 1, 1) and arm[WRIST]["count"].tolist() == [0]  # missing: identity
    # Cameras: the components' stats.json by the weights, and it says so.
    assert "stats.json" in mixture.meta.provenance[WRIST] and "exact" in mixture.meta.provenance[STATE]
    bimanual_json = mixture.datasets[1].meta.stats
    np.testing.assert_allclose(stats[WRIST]["mean"], bimanual_json[WRIST]["mean"])  # one component has it
    # LeRobot's aggregate keeps the keys whose widths agree.
    assert STATE not in mixture.meta.lerobot_stats and "timestamp" in mixture.meta.lerobot_stats
    # A second mixture of the same reads the cache.
    with monkeypatch.context() as patch:
        patch.setattr("episodestream._runtime.mixture.stats.read_columns",
                      lambda *a, **k: pytest.fail("mixture stats computed again instead of read from the cache"))
        with faults.refusing_stats_pass(lambda *a, **k: pytest.fail("component stats computed again")):
            again = _mix(roots, [0.3, 0.7], keys="union").meta.stats
    for key in stats:
        for name in stats[key]:
            np.testing.assert_array_equal(again[key][name], stats[key][name])


def test_exact_resume_is_unchanged_across_schemas(robots):
    roots = [robots["arm"], robots["bimanual"]]
    expected = _detached(EpisodeLoader(_mix(roots, [0.5, 0.5], keys="union"), 4))
    loader = EpisodeLoader(_mix(roots, [0.5, 0.5], keys="union"), 4)
    head = _detached(b for _, b in zip(range(2), loader))
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    resumed = EpisodeLoader(_mix(roots, [0.5, 0.5], keys="union"), 4)
    resumed.load_state_dict(state)
    _assert_same_batches(head + _detached(resumed), expected)


def test_components_at_other_fps_and_without_cameras_mix_under_union(robots, tmp_path):
    slow = _robot(tmp_path / "slow", "slow10", cameras=(), state_dim=4, fps=10, seed=4)
    window = {ACTION: [0.0, 0.1]}  # seconds: 1 frame back at 10 fps, 3 at 30 fps; 2 steps for both
    datasets = [EpisodeStreamingDataset(slow, delta_timestamps=window, episode_pool_size=2),
                EpisodeStreamingDataset(robots["bimanual"], delta_timestamps=window, episode_pool_size=2)]
    mixture = EpisodeMixture(datasets, [0.5, 0.5], keys="union")
    own = [EpisodeDataset(slow, delta_timestamps=window), EpisodeDataset(robots["bimanual"], delta_timestamps=window)]
    with EpisodeLoader(mixture, 4) as loader:
        batches = _detached(loader)
    seen = set()
    for b in batches:
        for j in range(len(b["index"])):
            i = int(b["dataset_index"][j])
            seen.add(i)
            expected = own[i][int(b["index"][j])]
            width = (4, 14)[i]
            assert torch.equal(b[ACTION][j][:, :width], expected[ACTION]) and not b[ACTION][j][:, width:].any()
            assert torch.equal(b[f"{ACTION}_is_pad"][j], expected[f"{ACTION}_is_pad"])
            for camera in (FRONT, WRIST):
                assert b[f"{camera}_is_missing"][j].item() is (i == 0)
                assert (not b[camera][j].any()) if i == 0 else torch.equal(b[camera][j], expected[camera])
    assert seen == {0, 1}


def test_elastic_resume_across_schemas_covers_every_frame_once(robots):
    """2 ranks save after 2 batches each; one rank resumes the epoch: every frame of both robots is
    seen, fill-ins aside (at most one per rank per leg), and every batch has the union's keys."""
    roots = [robots["arm"], robots["bimanual"]]
    seen, states, keys = [], [], set()

    def take(batch):
        keys.add(tuple(sorted(batch)))
        seen.extend(zip(batch["dataset_index"].tolist(), batch["index"].tolist()))

    for rank in range(2):
        loader = EpisodeLoader(_mix(roots, keys="union", rank=rank, world_size=2), 2)
        for _, batch in zip(range(2), loader):
            take(batch)
        states.append(json.loads(json.dumps(loader.state_dict())))
        loader.close()
    assert states[0] == states[1]  # a trainer's state: the same on every rank
    resumed = EpisodeLoader(_mix(roots, keys="union"), 2)
    resumed.load_state_dict(states[0])
    for batch in resumed:
        take(batch)
    expected = {(i, int(x)) for i, root in enumerate(roots)
                for x in pq.read_table(root / "data", columns=["index"]).column("index").to_pylist()}
    counts = Counter(seen)
    assert set(counts) == expected
    assert sum(counts.values()) - len(counts) <= 2 + 1
    assert len(keys) == 1 and {f"{STATE}_dim_mask", f"{WRIST}_is_missing", "robot_type"} <= set(next(iter(keys)))


def test_weights_hold_across_schemas(robots):
    """The weights plan the same counts whatever the schemas: each component's samples over an epoch
    are the mixture's ``rank_counts`` (planning is schema-free; this checks nothing in between drops one)."""
    roots = [robots["arm"], robots["bimanual"], robots["wide"]]
    mixture = _mix(roots, [0.6, 0.3, 0.1], keys="union", resize={FRONT: (64, 96)}, stop=40)
    counts = Counter(int(i) for batch in EpisodeLoader(mixture, 4) for i in batch["dataset_index"].tolist())
    assert [counts[i] for i in range(3)] == mixture.rank_counts() and sum(counts.values()) == 40
