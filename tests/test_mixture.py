"""``EpisodeMixture``: decoded samples, DataLoader workers and ranks, features, meta, resume.

Tabular datasets (no video: written in about a second) carry most checks; one mixture of two video
datasets is decoded end to end, its frames read back as the ids they spell.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from episodestream import EpisodeMixture, EpisodeStreamingDataset, stream_state
from episodestream.tools.synthetic import write_synthetic_dataset
from episodestream.tools.synthetic import decode_frame_ids

from .stream_model import key_collate, shut_down_workers

FRONT, CAM = "observation.images.front", "observation.images.cam"


@pytest.fixture(scope="module")
def tabular(tmp_path_factory):
    """Three camera-less datasets: a (6 episodes), b (4 episodes) at 10 fps, c (5 episodes) at 4 fps."""
    root = tmp_path_factory.mktemp("mixture")
    return {name: write_synthetic_dataset(root / name, num_episodes=n, episode_length=(5, 12), fps=fps,
                                          cameras=(), seed=seed)
            for name, n, fps, seed in (("a", 6, 10, 1), ("b", 4, 10, 2), ("c", 5, 4, 3))}


@pytest.fixture(scope="module")
def camera_b(tmp_path_factory):
    """5 short episodes whose one camera is named differently from ``many_episodes_root``'s."""
    return write_synthetic_dataset(tmp_path_factory.mktemp("mixture") / "cam", num_episodes=5,
                                   episode_length=(4, 9), cameras=(CAM,), seed=9)


def _ids(samples) -> list[tuple[int, int, int]]:
    return [(int(s["dataset_index"]), int(s["episode_index"]), int(s["frame_index"])) for s in samples]


IDS = key_collate("dataset_index", "episode_index", "frame_index")  # what _batch_ids reads


def _batch_ids(batches) -> list[tuple[int, int, int]]:
    return [(int(d), int(e), int(f)) for b in batches
            for d, e, f in zip(b["dataset_index"], b["episode_index"], b["frame_index"])]


def _all_frames(roots) -> Counter:
    out = Counter()
    for index, root in enumerate(roots):
        table = pq.read_table(root / "data", columns=["episode_index", "frame_index"])
        out.update((index, int(e), int(f)) for e, f in zip(table["episode_index"].to_pylist(),
                                                            table["frame_index"].to_pylist()))
    return out


def _mixture(roots, weights=None, *, rank=0, world_size=1, pools=(2, 3, 2), **kwargs) -> EpisodeMixture:
    datasets = [EpisodeStreamingDataset(root, episode_pool_size=pool, seed=i, rank=rank, world_size=world_size)
                for i, (root, pool) in enumerate(zip(roots, pools))]
    return EpisodeMixture(datasets, weights, seed=11, **kwargs)


# -- samples ------------------------------------------------------------------------------------


def test_decoded_mixture_covers_each_component_once_with_the_right_frames(many_episodes_root, camera_b):
    roots = [many_episodes_root, camera_b]
    mixture = EpisodeMixture([EpisodeStreamingDataset(many_episodes_root, episode_pool_size=3),
                              EpisodeStreamingDataset(camera_b, episode_pool_size=2)],
                             rename=[None, {CAM: FRONT}], seed=1)
    samples = list(mixture)
    assert len(samples) == len(mixture) == sum(_all_frames(roots).values())
    assert Counter(_ids(samples)) == _all_frames(roots)  # each frame of each component once
    for sample in samples:
        assert CAM not in sample and sample["dataset_index"].dtype == torch.int64 and sample["dataset_index"].ndim == 0
        assert decode_frame_ids(sample[FRONT]) == (int(sample["episode_index"]), int(sample["frame_index"]), 0)
    # Interleaved, not one component after the other.
    sources = [int(s["dataset_index"]) for s in samples]
    assert sum(a != b for a, b in zip(sources, sources[1:])) > 4


@pytest.mark.parametrize("weights", [None, [0.7, 0.2, 0.1]])
def test_dataloader_workers_and_ranks_yield_len_samples(tabular, weights):
    roots = [tabular["a"], tabular["b"], tabular["c"]]
    single = _mixture(roots, weights)
    alone = _ids(single)
    assert len(alone) == len(single) == sum(single.rank_counts())
    with_workers = _batch_ids(_loader(_mixture(roots, weights), 2, batch_size=5))
    assert Counter(d for d, _, _ in with_workers) == Counter(d for d, _, _ in alone)
    if weights is None:  # a shuffled concatenation: each frame once, whatever the workers
        assert Counter(with_workers) == Counter(alone) == _all_frames(roots)
    per_rank = [_ids(_mixture(roots, weights, rank=r, world_size=3)) for r in range(3)]
    assert len({len(ids) for ids in per_rank}) == 1
    assert len(per_rank[0]) == len(_mixture(roots, weights, rank=0, world_size=3))


def test_mixture_is_deterministic_and_epochs_differ(tabular):
    roots = [tabular["a"], tabular["b"]]
    first, again = _mixture(roots, [0.5, 0.5]), _mixture(roots, [0.5, 0.5])
    epoch0 = _ids(first)
    assert epoch0 == _ids(again)
    assert first.epoch == 1  # advanced by running to the end
    assert _ids(first) != epoch0
    first.set_epoch(0)
    assert _ids(first) == epoch0


def test_indexing_a_mixture_says_it_streams(tabular):
    mixture = _mixture([tabular["a"], tabular["b"]], [0.5, 0.5])
    with pytest.raises(TypeError, match=r"EpisodeMixture streams and cannot be indexed \(mixture\[0\]\).*"
                                        r"iterate it.*EpisodeDataset"):
        mixture[0]


def test_windows_in_seconds_mix_two_fps(tabular):
    window = {"observation.state": [-0.5, 0.0]}  # 5 frames back at 10 fps, 2 at 4 fps
    mixture = EpisodeMixture([EpisodeStreamingDataset(tabular["a"], delta_timestamps=window),
                              EpisodeStreamingDataset(tabular["c"], delta_timestamps=window)])
    samples = list(mixture)
    for sample in samples:
        state, fps = sample["observation.state"], (10, 4)[int(sample["dataset_index"])]
        assert state.shape == (2, 6)
        frame = int(sample["frame_index"])
        back = max(0, frame - int(0.5 * fps))  # clamped to the episode, as LeRobot pads
        assert state[0, 0].item() == int(sample["episode_index"]) * 1000 + back
    assert mixture.meta.fps == [10, 4]


def test_window_off_one_fps_names_the_dataset_and_its_fps(tabular):
    window = {"observation.state": [-0.25, 0.0]}  # 1 frame at 4 fps, 2.5 at 10 fps
    EpisodeStreamingDataset(tabular["c"], delta_timestamps=window)
    with pytest.raises(ValueError, match="not multiples of 1/fps") as caught:
        EpisodeStreamingDataset(tabular["a"], delta_timestamps=window)
    assert str(tabular["a"]) in str(caught.value) and "10 fps" in str(caught.value)


# -- features -----------------------------------------------------------------------------------


def test_feature_mismatch_lists_every_difference(tabular, many_episodes_root, tmp_path):
    narrow = write_synthetic_dataset(tmp_path / "narrow", num_episodes=2, episode_length=5, cameras=(), state_dim=4)
    with pytest.raises(ValueError) as caught:
        EpisodeMixture([EpisodeStreamingDataset(tabular["a"]), EpisodeStreamingDataset(narrow),
                        EpisodeStreamingDataset(many_episodes_root)])
    message = str(caught.value)
    for text in ("'observation.state'", "'action'", f"'{FRONT}'", "float32 [6]", "float32 [4]", "missing",
                 str(narrow), "dataset 2"):
        assert text in message, text
    assert "'timestamp'" not in message  # the same everywhere: not listed


def test_rename_meets_keys_and_unknown_keys_are_refused(many_episodes_root, camera_b):
    with pytest.raises(ValueError, match=CAM):
        EpisodeMixture([EpisodeStreamingDataset(many_episodes_root), EpisodeStreamingDataset(camera_b)])
    with pytest.raises(ValueError, match="does not have"):
        EpisodeMixture([EpisodeStreamingDataset(many_episodes_root), EpisodeStreamingDataset(camera_b)],
                       rename=[None, {"observation.images.nope": FRONT}])
    mixture = EpisodeMixture([EpisodeStreamingDataset(many_episodes_root), EpisodeStreamingDataset(camera_b)],
                             rename=[None, {CAM: FRONT}])
    assert mixture.meta.camera_keys == [FRONT]
    assert FRONT in mixture.meta.stats and CAM not in mixture.meta.stats


STATE, ACTION = "observation.state", "action"  # both float32 [6]: renamed onto each other, features still agree


@pytest.mark.parametrize("rename, message", [
    ({STATE: "x", ACTION: "x"}, r"rename\[0\] renames 'observation.state' and 'action' both onto 'x'"),
    ({ACTION: STATE}, r"rename\[0\] renames 'action' onto 'observation.state', which .* already has and does not "
                      r"rename away"),
    ({ACTION: "dataset_index"}, r"rename\[0\] renames 'action' onto 'dataset_index', a key every mixture sample has"),
    ({ACTION: "task"}, r"rename\[0\] renames 'action' onto 'task', a key every mixture sample has"),
    ({ACTION: "index", "index": "global_index"}, r"rename\[0\] renames 'action' onto 'index', a key every"),
    ({ACTION: "observation.state_is_pad"}, r"rename\[0\] renames 'action' onto 'observation.state_is_pad': keys "
                                           r"ending in '_is_pad' are the padding masks"),
], ids=["two_onto_one", "onto_a_kept_key", "onto_dataset_index", "onto_task", "onto_index", "onto_a_pad_mask"])
def test_renames_that_make_keys_collide_are_refused(tabular, rename, message):
    # Each was accepted: the sample kept one of the colliding values and silently dropped the other.
    # Component 0 is renamed alike, so that the features agree and only the collision is wrong.
    with pytest.raises(ValueError, match=message):
        EpisodeMixture([EpisodeStreamingDataset(tabular["a"]), EpisodeStreamingDataset(tabular["b"])],
                       rename=[dict(rename), dict(rename)])


def test_a_swap_of_two_keys_is_a_rename_not_a_collision(tabular):
    swap = {STATE: ACTION, ACTION: STATE}
    mixture = EpisodeMixture([EpisodeStreamingDataset(tabular["a"]), EpisodeStreamingDataset(tabular["b"])],
                             rename=[None, swap], stop=8)
    plain = EpisodeMixture([EpisodeStreamingDataset(tabular["a"]), EpisodeStreamingDataset(tabular["b"])], stop=8)
    for got, expected in zip(mixture, plain, strict=True):
        swapped = int(expected["dataset_index"]) == 1
        assert torch.equal(got[STATE], expected[ACTION if swapped else STATE])
        assert torch.equal(got[ACTION], expected[STATE if swapped else ACTION])


def test_windowed_camera_pad_masks_are_renamed(many_episodes_root, camera_b):
    mixture = EpisodeMixture([EpisodeStreamingDataset(many_episodes_root, delta_timestamps={FRONT: [-1 / 30, 0]}),
                              EpisodeStreamingDataset(camera_b, delta_timestamps={CAM: [-1 / 30, 0]})],
                             rename=[None, {CAM: FRONT}], stop=6)
    for sample in mixture:
        assert sample[FRONT].shape[0] == 2 and f"{FRONT}_is_pad" in sample and f"{CAM}_is_pad" not in sample


@pytest.mark.parametrize("change, message", [
    (dict(weights=[1.0]), "weights must be a list of 2"),
    (dict(weights=[1.0, 0.0]), "positive finite"),
    (dict(stop="most"), "Invalid stop"),
    (dict(stop=0), "stop must be >= 1"),
    (dict(rename={"a": "b"}), "rename must be a list"),
])
def test_options_are_validated(tabular, change, message):
    with pytest.raises(ValueError, match=message):
        EpisodeMixture([EpisodeStreamingDataset(tabular["a"]), EpisodeStreamingDataset(tabular["b"])], **change)


@pytest.mark.parametrize("weights, stop, same_as", [
    (np.array([0.3, 0.7]), np.int64(40), ([0.3, 0.7], 40)),
    ([np.float32(0.25), np.int64(3)], np.array(40), ([0.25, 3.0], 40)),
    ([1e308, 1e308], "all", ([1.0, 1.0], "all")),  # their sum overflows a float
], ids=["array_and_numpy_int", "numpy_scalars_and_0d_array", "huge_equal_weights"])
def test_numpy_and_extreme_numbers_are_weights_and_stops_like_any(tabular, weights, stop, same_as):
    def mixture(weights, stop):
        return EpisodeMixture([EpisodeStreamingDataset(tabular["a"]), EpisodeStreamingDataset(tabular["b"])],
                              weights, stop=stop, seed=4)
    got, expected = mixture(weights, stop), mixture(*same_as)
    assert got.weights == expected.weights and got.stop == expected.stop and type(got.stop) is type(expected.stop)
    assert len(got) == len(expected) and _ids(got) == _ids(expected)
    json.dumps(got.state_dict())  # numpy numbers would not survive a JSON checkpoint


def test_an_epoch_too_large_to_plan_is_refused_when_the_mixture_is_built(tabular):
    # A weight near 1e-9 made len() try ~1e9 epoch sizes (hours); stop=10**15 built a pass object
    # per pass until memory ran out. Both are refused at once, naming what to change.
    for weights, stop in (([1.0, 1e-9], "all"), (None, 10**15)):
        with pytest.raises(ValueError, match=r"weights=.* and stop=.* make an epoch of at least \d+ samples per "
                                             r"rank, in which dataset \d .* would run \d+ passes"):
            EpisodeMixture([EpisodeStreamingDataset(tabular["a"]), EpisodeStreamingDataset(tabular["b"])],
                           weights, stop=stop)


def test_components_must_share_rank_and_be_streaming_datasets(tabular):
    with pytest.raises(ValueError, match="rank and world_size"):
        EpisodeMixture([EpisodeStreamingDataset(tabular["a"]),
                        EpisodeStreamingDataset(tabular["b"], rank=1, world_size=2)])
    with pytest.raises(TypeError, match="non-empty list"):
        EpisodeMixture([])
    with pytest.raises(TypeError, match="EpisodeStreamingDataset"):
        EpisodeMixture([EpisodeStreamingDataset(tabular["a"]), "b"])


# -- meta ---------------------------------------------------------------------------------------


def test_meta_lerobot_stats_aggregate_stats_json_as_the_concatenated_data_gives_them(tabular):
    roots = [tabular["a"], tabular["b"], tabular["c"]]
    mixture = _mixture(roots, [0.2, 0.3, 0.5])
    assert [m.repo_id for m in mixture.meta.sources] == [str(r) for r in roots]
    assert mixture.meta.sources[1] is mixture.datasets[1].meta
    for key in ("observation.state", "action"):
        values = np.concatenate([np.stack(pq.read_table(r / "data", columns=[key])[key].to_numpy(zero_copy_only=False))
                                 for r in roots]).astype(np.float64)
        stats = mixture.meta.lerobot_stats[key]
        np.testing.assert_allclose(stats["mean"], values.mean(0), rtol=1e-9)
        np.testing.assert_allclose(stats["std"], values.std(0), rtol=1e-6)
        np.testing.assert_allclose(stats["min"], values.min(0), rtol=1e-6)
        np.testing.assert_allclose(stats["max"], values.max(0), rtol=1e-6)
        assert stats["count"].tolist() == [len(values)]
        # Weighted by frames, not by the mixture's weights, as LeRobot's aggregate_stats.
        assert not np.allclose(stats["mean"], sum(w * m.stats[key]["mean"] for w, m in
                                                  zip((0.2, 0.3, 0.5), mixture.meta.sources)))
        # meta.stats is weighted by the epoch's shares instead (tests/test_mixture_schemas.py checks its values).
        assert not np.allclose(mixture.meta.stats[key]["mean"], stats["mean"])
    # Without weights the mixture is the concatenation: its exact stats are the rows'.
    unweighted = _mixture(roots).meta.stats
    for key in ("observation.state", "action"):
        values = np.concatenate([np.stack(pq.read_table(r / "data", columns=[key])[key].to_numpy(zero_copy_only=False))
                                 for r in roots]).astype(np.float64)
        np.testing.assert_allclose(unweighted[key]["mean"], values.mean(0), rtol=1e-9)
        np.testing.assert_array_equal(unweighted[key]["q10"], np.quantile(values, 0.1, axis=0, method="inverted_cdf"))


# -- resume -------------------------------------------------------------------------------------


def _loader(mixture, num_workers, batch_size=4):
    """Batches of what ``_batch_ids`` reads, not the samples' tensors (``stream_model.key_collate``)."""
    return torch.utils.data.DataLoader(mixture, batch_size=batch_size, num_workers=num_workers, collate_fn=IDS)


@pytest.mark.parametrize("weights, stop", [(None, "all"), ([0.6, 0.3, 0.1], "all"), ([0.2, 0.3, 0.5], 90)])
def test_dataloader_exact_resume_equals_the_uninterrupted_stream(tabular, weights, stop):
    roots = [tabular["a"], tabular["b"], tabular["c"]]
    # States saved along one uninterrupted pass, as a trainer saves and goes on (a pass stopped
    # after the save gives the same state: stream_state reads the count, not the workers).
    loader, expected, states = _loader(_mixture(roots, weights, stop=stop), 2), [], {}
    for batches, batch in enumerate(loader):
        if batches in (0, 3, 7):
            states[batches] = json.loads(json.dumps(stream_state(loader, batches)))
        expected += _batch_ids([batch])
    assert set(states) == {0, 3, 7}
    for consumed, state in states.items():
        resumed = _mixture(roots, weights, stop=stop)
        resumed.load_state_dict(state)
        assert len(resumed) == len(expected) - consumed * 4
        assert _batch_ids(_loader(resumed, 2)) == expected[consumed * 4:], consumed


def _consume(mixtures, num_workers, batches, before=0):
    """Batches from every rank's DataLoader, and a state saved after ``batches`` of each
    (``before``: batches of the epoch consumed in earlier legs; the count runs from its start)."""
    out, states = [], []
    for mixture in mixtures:
        loader = _loader(mixture, num_workers)
        taken = [b for _, b in zip(range(batches), loader)]
        out += _batch_ids(taken)
        states.append(stream_state(loader, before + len(taken)))
    assert all(s == states[0] for s in states)  # every rank saves the same state
    return out, json.loads(json.dumps(states[0]))


def test_dataloader_elastic_resume_over_three_legs_covers_every_frame_once(tabular):
    roots = [tabular["a"], tabular["b"], tabular["c"]]
    samples, state = _consume([_mixture(roots, rank=r, world_size=2) for r in range(2)], 2, 3)
    leg1 = [_mixture(roots) for _ in range(1)]
    leg1[0].load_state_dict(state)
    more, state = _consume(leg1, 0, 5, before=3)
    assert len(state["legs"]) == 1 and state["batches_consumed"] == 8
    samples += more
    leg2 = [_mixture(roots, rank=r, world_size=3, pools=(1, 1, 4)) for r in range(3)]
    for mixture in leg2:
        mixture.load_state_dict(state)
    assert len({len(m) for m in leg2}) == 1
    rest, _ = _consume(leg2, 1, 10**6, before=8)
    samples += rest
    seen, expected = Counter(samples), _all_frames(roots)
    assert set(seen) == set(expected)
    assert sum(seen.values()) - len(seen) <= 2 + 1 + 3  # fill-ins: at most one per rank per leg


def test_dataloader_elastic_resume_keeps_the_weighted_counts(tabular):
    roots = [tabular["a"], tabular["b"], tabular["c"]]
    weights = [0.6, 0.3, 0.1]
    whole = _mixture(roots, weights, rank=0, world_size=2)
    counts = [2 * c for c in whole.rank_counts()]  # samples per component over the epoch, both ranks
    samples, state = _consume([_mixture(roots, weights, rank=r, world_size=2) for r in range(2)], 2, 4)
    resumed = _mixture(roots, weights)
    resumed.load_state_dict(state)
    rest, _ = _consume([resumed], 1, 10**6)
    got = Counter(d for d, _, _ in samples + rest)
    frames = Counter(d for d, _, _ in _all_frames(roots))
    for index, count in enumerate(counts):
        # Per pass: a whole pass's fill-ins not yet taken are not owed again (at most 1 per old rank),
        # and each leg adds at most one per rank; a partial pass is rounded up per new rank (+0 here).
        passes = -(-count // (2 * -(-frames[index] // 2)))
        assert count - passes <= got[index] <= count + passes * (2 + 1), (index, got[index], count)
    assert got[0] > 5 * got[2]  # still by weight: 0.6 against 0.1
    # The component weighted above its share repeats whole passes: every frame at least twice.
    frames_a = {k for k in _all_frames(roots) if k[0] == 0}
    seen_a = Counter(s for s in samples + rest if s[0] == 0)
    assert set(seen_a) == frames_a and min(seen_a.values()) >= counts[0] // len(frames_a)


def test_mismatched_state_is_refused_with_the_fields(tabular):
    roots = [tabular["a"], tabular["b"]]
    mixture = _mixture(roots, [0.5, 0.5])
    state = {**mixture.state_dict(), "batches_consumed": 1, "batch_size": 2, "num_workers": 0}
    with pytest.raises(ValueError, match="weights: saved"):
        _mixture(roots, [0.4, 0.6]).load_state_dict(state)
    with pytest.raises(ValueError, match=r"components\[1\].fingerprint.source"):
        _mixture([tabular["a"], tabular["c"]], [0.5, 0.5]).load_state_dict(state)
    # state_dict() itself is a per-consumer state (it loads, tests/test_stateful_dataloader.py); less its
    # consumer it says nothing of where the trainer stands
    bare = {k: v for k, v in mixture.state_dict().items() if k != "consumer"}
    with pytest.raises(ValueError, match="lacks 'batches_consumed'"):
        _mixture(roots, [0.5, 0.5]).load_state_dict(bare)
    with pytest.raises(ValueError, match="more than epoch 0"):
        _mixture(roots, [0.5, 0.5]).load_state_dict({**state, "batches_consumed": 10**6})
    with pytest.raises(ValueError, match="Not an episodestream mixture state"):
        _mixture(roots, [0.5, 0.5]).load_state_dict({**state, "format": "episodestream.stream_state/2"})
    # The older formats' components opened a pool of the whole share without a ramp (/5), drew their
    # keys from a Philox generator per segment (/4), a random point per stratum (/3), iid keys (/2):
    # another order for the same seed.
    for older in (5, 4, 3, 2):
        with pytest.raises(ValueError, match=rf"another episodestream version \(format 'episodestream.mixture_state/{older}'"):
            _mixture(roots, [0.5, 0.5]).load_state_dict({**state, "format": f"episodestream.mixture_state/{older}"})


# -- EpisodeLoader ------------------------------------------------------------------------------


def _video_mixture(many_episodes_root, camera_b, **options) -> EpisodeMixture:
    transforms = options.pop("image_transforms", None)
    return EpisodeMixture([EpisodeStreamingDataset(many_episodes_root, episode_pool_size=3, decode_group_size=4,
                                                   **options),
                           EpisodeStreamingDataset(camera_b, episode_pool_size=2, image_transforms=transforms,
                                                   **options)],
                          [0.6, 0.4], rename=[None, {CAM: FRONT}], seed=3, stop=60)


def _assert_same_batches(got, expected):
    assert len(got) == len(expected) > 0
    for a, b in zip(got, expected):
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(a[key], torch.Tensor):
                assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
            else:
                assert a[key] == b[key], key


@pytest.mark.parametrize("transforms", [None, lambda frame: frame.flip(-1)], ids=["in-place", "transformed"])
def test_episode_loader_gives_the_dataloader_batches(many_episodes_root, camera_b, transforms):
    from episodestream import EpisodeLoader

    expected = list(torch.utils.data.DataLoader(_video_mixture(many_episodes_root, camera_b,
                                                               image_transforms=transforms), batch_size=8))
    with EpisodeLoader(_video_mixture(many_episodes_root, camera_b, image_transforms=transforms), 8,
                       num_threads=2) as loader:
        assert len(loader) == len(expected)
        got = [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in b.items()} for b in loader]
    _assert_same_batches(got, expected)
    assert FRONT in got[0] and CAM not in got[0] and got[0]["dataset_index"].dtype == torch.int64
    # The transform is the second component's only: its frames come flipped.
    flipped = [decode_frame_ids(f.flip(-1) if transforms and d == 1 else f)
               for b in got for f, d in zip(b[FRONT], b["dataset_index"])]
    assert flipped == [(int(e), int(f), 0) for b in got for e, f in zip(b["episode_index"], b["frame_index"])]


def test_decode_threads_give_the_same_samples(many_episodes_root, camera_b):
    one = list(_video_mixture(many_episodes_root, camera_b))
    two = list(_video_mixture(many_episodes_root, camera_b, decode_threads=2))
    _assert_same_batches(two, one)


def test_episode_loader_resumes_exactly_and_across_loaders(tabular):
    from episodestream import EpisodeLoader

    roots = [tabular["a"], tabular["b"], tabular["c"]]
    weights = [0.5, 0.3, 0.2]
    expected = _batch_ids(EpisodeLoader(_mixture(roots, weights), 4, num_threads=2))
    loader = EpisodeLoader(_mixture(roots, weights), 4, num_threads=2)
    taken = [b for _, b in zip(range(5), loader)]
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    assert _batch_ids(taken) == expected[:20] and state["batches_consumed"] == 5
    resumed = EpisodeLoader(_mixture(roots, weights), 4, num_threads=1)
    resumed.load_state_dict(state)
    assert len(resumed) == -(-(len(expected) - 20) // 4)
    assert _batch_ids(resumed) == expected[20:]  # exact: the same stream, sample for sample
    # A DataLoader with workers continues the EpisodeLoader's state (elastically: other workers).
    mixture = _mixture(roots, weights)
    mixture.load_state_dict(state)
    rest = _batch_ids(_loader(mixture, 2))
    assert Counter(d for d, _, _ in _batch_ids(taken) + rest) == Counter(d for d, _, _ in expected)
    # And an EpisodeLoader continues a DataLoader's.
    dataloader_mixture = _mixture(roots)
    first = _loader(dataloader_mixture, 2)
    head = _batch_ids(b for _, b in zip(range(3), first))
    state = json.loads(json.dumps(stream_state(first, 3)))
    continued = EpisodeLoader(_mixture(roots), 4, num_threads=2)
    continued.load_state_dict(state)
    tail = _batch_ids(continued)
    assert Counter(head + tail) == _all_frames(roots)  # default weights: every frame once (no fill-ins at W=1)


def test_episode_loaders_resume_elastically_on_more_ranks(tabular):
    from episodestream import EpisodeLoader

    roots = [tabular["a"], tabular["b"], tabular["c"]]
    head, states = [], []
    for rank in range(2):
        with EpisodeLoader(_mixture(roots, rank=rank, world_size=2), 3, num_threads=2) as loader:
            head += _batch_ids(b for _, b in zip(range(4), loader))
            states.append(json.loads(json.dumps(loader.state_dict())))
    assert states[0] == states[1]
    tail, lengths = [], set()
    for rank in range(3):
        loader = EpisodeLoader(_mixture(roots, rank=rank, world_size=3, pools=(3, 1, 2)), 3, num_threads=2)
        loader.load_state_dict(states[0])
        batches = list(loader)
        lengths.add(len(batches))
        tail += _batch_ids(batches)
    assert len(lengths) == 1  # every rank the same number of batches
    seen = Counter(head + tail)
    assert set(seen) == set(_all_frames(roots))
    assert sum(seen.values()) - len(seen) <= 2 + 3  # fill-ins: at most one per rank per leg


def test_a_load_after_persistent_workers_started_reaches_them(tabular):
    """The loaded request is in the mixture's shared record, which persistent workers read at their next
    claim: the same DataLoader resumes as one built after the load does."""
    mixture = _mixture([tabular["a"], tabular["b"]])
    loader = torch.utils.data.DataLoader(mixture, batch_size=4, num_workers=1, persistent_workers=True)
    assert list(loader)
    state = {**json.loads(json.dumps(stream_state(loader, 1))), "epoch": 1}
    mixture.load_state_dict(state)
    resumed = _batch_ids(list(loader))
    shut_down_workers(loader)
    fresh = _mixture([tabular["a"], tabular["b"]])
    fresh.load_state_dict(state)
    assert len(resumed) == len(fresh) > 0  # the rest of epoch 1 after its first batch
    assert resumed == _batch_ids(list(torch.utils.data.DataLoader(fresh, batch_size=4, num_workers=1)))


def test_frames_of_one_dtype_are_required(many_episodes_root):
    with pytest.raises(ValueError, match=r"one dtype .*\['float32', 'uint8'\]"):
        EpisodeMixture([EpisodeStreamingDataset(many_episodes_root),
                        EpisodeStreamingDataset(many_episodes_root, return_uint8=True)])


def test_selections_of_one_folder_decode_each_file_once(many_episodes_root):
    """Components over one folder share its video files: a group decodes each file in one call."""
    from episodestream import EpisodeLoader

    mixture = EpisodeMixture([EpisodeStreamingDataset(many_episodes_root, episodes=list(range(0, 20, 2))),
                              EpisodeStreamingDataset(many_episodes_root, episodes=list(range(1, 20, 2)))])
    with EpisodeLoader(mixture, 8, num_threads=2) as loader:
        ids = [(int(d), decode_frame_ids(f), int(e), int(i)) for b in loader
               for d, f, e, i in zip(b["dataset_index"], b[FRONT], b["episode_index"], b["frame_index"])]
    assert len(ids) == len(mixture)
    assert all(frame == (episode, index, 0) and episode % 2 == d for d, frame, episode, index in ids)


def test_a_resumed_mixture_epoch_is_whole_again_after_a_pass_ran_to_its_end(tabular):
    roots = [tabular["a"], tabular["b"], tabular["c"]]
    expected = _batch_ids(_loader(_mixture(roots, [0.6, 0.3, 0.1]), 2))
    first = _mixture(roots, [0.6, 0.3, 0.1])
    loader = _loader(first, 2)
    for _ in zip(range(3), loader):
        pass
    state = json.loads(json.dumps(stream_state(loader, 3)))
    resumed = _mixture(roots, [0.6, 0.3, 0.1])
    resumed.load_state_dict(state)
    assert _batch_ids(_loader(resumed, 2)) == expected[3 * 4:]
    resumed.set_epoch(0)
    assert len(resumed) == len(expected)
    assert _batch_ids(_loader(resumed, 2)) == expected


@pytest.mark.parametrize("change,message", [
    ({"weights": "half"}, r"state\['weights'\] must be None or a list of numbers, got 'half'"),
    ({"stop": 0}, r"state\['stop'\] must be >= 1, got 0"),
    ({"pool_sizes": [2, 3]}, r"state\['pool_sizes'\] must list 3 ints"),
    ({"components": [{"seed": "a", "shuffle": True, "fingerprint": {}}] * 3},
     r"state\['components'\]\[0\]\['seed'\] must be an int, got 'a'"),
])
def test_a_mixture_state_field_of_the_wrong_type_is_named_even_when_not_strict(tabular, change, message):
    """Before the one parse, a mismatched weights or stop of any type loaded with strict=False."""
    roots = [tabular["a"], tabular["b"], tabular["c"]]
    state = {**_mixture(roots, [0.5, 0.3, 0.2]).state_dict(), **change}
    trainer = {**state, "batches_consumed": 1, "batch_size": 2, "num_workers": 0}
    trainer.pop("consumer")
    for loaded in (state, trainer):
        with pytest.raises((TypeError, ValueError), match=message):
            _mixture(roots, [0.5, 0.3, 0.2]).load_state_dict(loaded, strict=False)
