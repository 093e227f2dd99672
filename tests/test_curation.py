"""Curation at load time on the datasets: keep-ranges, predicates, weights; split, len and resume.

The split and resume properties run on the schedule alone (``stream_model``: no rows read,
nothing decoded) over 120 random keep-range layouts of the camera-less dataset, some weighted,
with random ranks, workers, pools and batches; the decoded tests check that a curated sample is
bit-equal to the uncurated dataset's same sample (windows read outside the kept ranges).
"""

from __future__ import annotations

import json
import pickle
import re
from collections import Counter

import numpy as np
import pyarrow.compute as pc
import pytest
import torch
import torch.utils.data

from episodestream import EpisodeDataset, EpisodeMixture, EpisodeStreamingDataset, stream_state

from .conftest import EPISODE_LENGTHS, TABULAR_LENGTHS
from .stream_model import chunks, loader_batches, sweep, worker_streams
from .test_curation_plan import random_keep
from .test_stream_properties import Layout, changed_layout, check_split, random_layout

pytestmark = pytest.mark.filterwarnings("ignore:The epoch has .* frames for:RuntimeWarning")

SEED = 3


def kept_pairs(keep: dict, weights: dict | None = None) -> Counter:
    """The anchors of an integer-weighted keep layout, as (episode, frame) with multiplicity."""
    out: Counter = Counter()
    for key, ranges in keep.items():
        w = 1 if weights is None else weights.get(int(key), 1)
        for a, b in ranges:
            for f in range(a, b):
                out[(int(key), f)] += w
    return out


def check_multiset_split(expected: Counter, per_rank: list[list]) -> None:
    """Every anchor as often as its weight across ranks, equal counts per rank, and the only
    extra samples are the fill-ins (ceil(A / ranks) * ranks - A of them, repeats of anchors)."""
    world_size, total = len(per_rank), sum(expected.values())
    per = -(-total // world_size)
    assert [len(samples) for samples in per_rank] == [per] * world_size
    seen = Counter(sample for samples in per_rank for sample in samples)
    assert not expected - seen, "an anchor came fewer times than its weight"
    extra = seen - expected
    assert sum(extra.values()) == per * world_size - total and set(extra) <= set(expected)


class Curated:
    """One random curated configuration: a keep layout, maybe integer weights, and a dataset per
    (rank, layout), fresh or a pickled copy ("resumer", as a DataLoader worker gets it)."""

    def __init__(self, root, rng: np.random.Generator) -> None:
        self.root = root
        self.keep = {}
        while not self.keep or not kept_pairs(self.keep):
            self.keep = random_keep(rng, np.array(TABULAR_LENGTHS))
        self.weights = ({e: int(rng.integers(0, 4)) for e in map(int, self.keep) if rng.random() < 0.5}
                        if rng.random() < 0.4 else None)
        if not kept_pairs(self.keep, self.weights):
            self.weights = None
        self.shuffle = bool(rng.random() < 0.85)
        self.anchors = kept_pairs(self.keep, self.weights)
        self._built: dict = {}

    def dataset(self, layout: Layout, rank: int, role: str = "fresh") -> EpisodeStreamingDataset:
        key = (layout.world_size, rank, layout.pool_size)
        if key not in self._built:
            self._built[key] = EpisodeStreamingDataset(
                self.root, keep_frames=self.keep, episode_weights=self.weights, shuffle=self.shuffle, seed=SEED,
                world_size=layout.world_size, rank=rank, episode_pool_size=layout.pool_size)
        if role == "fresh":
            return self._built[key]
        return pickle.loads(pickle.dumps(self._built[key]))


def _streams(dataset, layout, epoch):
    return worker_streams(dataset, num_workers=layout.num_workers, epoch=epoch)


def _curated_split_and_resume(root, config):
    rng = np.random.default_rng(30_000 + config)
    case = Curated(root, rng)
    layout, epoch = random_layout(rng), int(rng.integers(0, 3))
    ranks = [case.dataset(layout, r) for r in range(layout.world_size)]
    streams = [_streams(d, layout, epoch) for d in ranks]
    per_rank = [[s for stream in rank_streams for s in stream] for rank_streams in streams]
    assert [len(d) for d in ranks] == [len(p) for p in per_rank]
    if case.weights is None:
        check_split(case.anchors, per_rank)  # each kept frame exactly once
    else:
        check_multiset_split(case.anchors, per_rank)
    assert {e for p in per_rank for e, _ in p} <= {int(k) for k in case.keep}

    # Save after some batches; resume exactly (same layout) or elastically (changed).
    produced = [len(loader_batches(s, batch_size=layout.batch_size, drop_last=layout.drop_last)) for s in streams]
    batches = int(rng.integers(0, max(produced) + 1))
    for d in ranks:
        d.set_epoch(epoch)
    states = []
    for d in ranks:
        loader = torch.utils.data.DataLoader(d, batch_size=layout.batch_size, num_workers=layout.num_workers,
                                             drop_last=layout.drop_last)
        states.append(json.loads(json.dumps(stream_state(loader, batches))))
    assert all(s == states[0] for s in states)
    state = states[0]
    assert state["fingerprint"]["curation"]["keep_frames"]
    per_worker, consumed = [], Counter()
    for rank_streams in streams:
        delivered = loader_batches(rank_streams, batch_size=layout.batch_size, drop_last=layout.drop_last)[:batches]
        per_worker.append([sum(len(b) for w, b in delivered if w == k) for k in range(len(rank_streams))])
        consumed.update(s for _, b in delivered for s in b)
    second = changed_layout(layout, rng)
    resumed, lengths, epochs = [], [], set()
    for r in range(second.world_size):
        d = case.dataset(second, r, "resumer")
        d.load_state_dict(state)
        epochs.add(d.epoch)
        resumed.append(_streams(d, second, d.epoch))
        lengths.append(len(d))
    if batches >= max(produced):
        assert epochs == {epoch + 1}
        return
    assert epochs == {epoch}
    flat = [[s for stream in rank_streams for s in stream] for rank_streams in resumed]
    assert lengths == [len(p) for p in flat]
    if layout.same_stream(second):
        for rank, rank_streams in enumerate(resumed):
            expected = Counter(tuple(stream[taken:]) for stream, taken in zip(streams[rank], per_worker[rank]))
            assert Counter(tuple(stream) for stream in rank_streams) == expected
    elif case.weights is None:
        left = Counter({frame: 1 for frame in case.anchors if frame not in consumed})
        check_split(left, flat)
        assert not set(consumed) & {s for p in flat for s in p}
    elif sum(case.anchors.values()) % layout.world_size == 0:
        # No fill-in was consumed (none exist): what is left is the anchors' multiset minus the
        # consumed samples, each as often as it is left.
        check_multiset_split(case.anchors - consumed, flat)
    else:
        # A consumed fill-in is one copy of an anchor removed as consumed, and which copy cannot
        # be told from the frame: bounded by the fill-ins (at most one per rank).
        seen = Counter(s for p in flat for s in p)
        assert len(set(lengths)) == 1
        assert sum((case.anchors - consumed - seen).values()) <= layout.world_size


# 60 configurations: the first 40 already reach every arc of episodestream/ that 120 did (coverage.py,
# a context per configuration; benchmarks/LOG.md, "The suite's time: index-only batches and sweeps").
@pytest.mark.parametrize("configs", chunks(60, 20))
def test_curated_split_and_resume_on_the_schedule(camera_less_root, configs):
    sweep(lambda config: _curated_split_and_resume(camera_less_root, config), configs)


def test_weights_counts_per_episode_per_epoch_are_exact(camera_less_root):
    weights = {0: 2, 2: 0.5, 6: 3, 8: 0, 10: 1.25}
    ds = EpisodeStreamingDataset(camera_less_root, episode_weights=weights, seed=1)
    lengths = dict(enumerate(TABULAR_LENGTHS))
    quotas = {e: weights.get(e, 1) * n for e, n in lengths.items()}
    for epoch in range(3):
        got = Counter(e for stream in worker_streams(ds, num_workers=2, epoch=epoch) for e, _ in stream)
        assert got[0] == 14 and got[6] == 45 and 8 not in got and got[2] == 6  # 7 x 2, 15 x 3, 12 x 0.5
        # 11 x 1.25 = 13.75 is the only fractional quota: the total, 206.75 + ..., rounds it up.
        assert got[10] == 14 and all(got[e] == n for e, n in lengths.items() if e not in weights)
        assert sum(got.values()) == round(sum(quotas.values())) == len(ds)
        # Each whole copy: every frame of episode 0 twice.
        frames = Counter(f for stream in worker_streams(ds, num_workers=1, epoch=epoch) for e, f in stream if e == 0)
        assert frames == {f: 2 for f in range(TABULAR_LENGTHS[0])}
    assert 8 not in ds.episode_indices


def test_weights_from_a_column_and_errors(camera_less_root):
    ds = EpisodeStreamingDataset(camera_less_root, episode_weights="length", seed=0)
    assert len(ds) == sum(n * n for n in TABULAR_LENGTHS)
    with pytest.raises(ValueError, match=r"episode_weights='nope' is not a column of .*meta/episodes"):
        EpisodeStreamingDataset(camera_less_root, episode_weights="nope")
    with pytest.raises(TypeError, match=r"episode_weights='tasks': the column is list<"):
        EpisodeStreamingDataset(camera_less_root, episode_weights="tasks")
    with pytest.raises(ValueError, match=r"episode_weights: episode 3 has weight -2.0"):
        EpisodeStreamingDataset(camera_less_root, episode_weights={3: -2})
    with pytest.raises(ValueError, match="leave no frame"):
        EpisodeStreamingDataset(camera_less_root, episode_weights={e: 0 for e in range(len(TABULAR_LENGTHS))})


def test_huge_weights_are_refused_naming_the_epoch_they_imply(camera_less_root):
    """1e18 failed with "__len__() should return >= 0", 2**62 wrapped silently and 1e7 took 19 s and
    3 GB before the first batch (issue 48 item 8): refused up front, as mixtures refuse their stop."""
    for weight in (1e18, 2**62, 1e7):
        with pytest.raises(ValueError, match=rf"episode_weights: episode 3 has weight {re.escape(f'{weight:g}')}, which makes "
                                             r"[0-9,]+ copies of its 3 kept frames in each epoch \(an epoch of "
                                             r"[0-9,]+ samples\); an epoch lays out at most 100,000 copies"):
            EpisodeStreamingDataset(camera_less_root, episode_weights={3: weight})
    assert len(EpisodeStreamingDataset(camera_less_root, episodes=[3], episode_weights={3: 100_000})) == 300_000


def test_predicates_select_episodes_once(camera_less_root):
    by_expression = EpisodeStreamingDataset(camera_less_root, episodes=pc.field("length") >= 10)
    expected = [e for e, n in enumerate(TABULAR_LENGTHS) if n >= 10]
    assert by_expression.episode_indices == expected == by_expression.episodes
    calls = []

    def short(row):
        calls.append(row["episode_index"])
        return row["length"] < 3 and row["tasks"]

    by_callable = EpisodeStreamingDataset(camera_less_root, episodes=short)
    assert by_callable.episode_indices == [e for e, n in enumerate(TABULAR_LENGTHS) if n < 3]
    assert sorted(calls) == list(range(len(TABULAR_LENGTHS)))  # once per episode, at construction
    len(by_callable), worker_streams(by_callable, num_workers=1)
    assert len(calls) == len(TABULAR_LENGTHS)
    # Composes with keep_frames: the predicate's episodes, their kept frames.
    both = EpisodeStreamingDataset(camera_less_root, episodes=pc.field("length") >= 10, keep_frames={2: [(0, 4)], 0: [(0, 1)]})
    assert both.episode_indices == [2] and len(both) == 4


@pytest.mark.parametrize("predicate, message", [
    (lambda row: row["success"], r"episodes: the predicate raised on episode 0: KeyError: 'success'"),
    (lambda row: row["length"] > 1000, r"episodes: the predicate .* selects no episode of .* \(24 episodes\)"),
    (pc.field("success") == True, r"episodes: the expression .* cannot be evaluated over .*meta/episodes"),  # noqa: E712
    (pc.field("length") > 1000, r"selects no episode"),
])
def test_predicate_errors(camera_less_root, predicate, message):
    with pytest.raises(ValueError, match=message):
        EpisodeStreamingDataset(camera_less_root, episodes=predicate)


def test_a_predicate_returning_an_array_is_named(camera_less_root):
    """numpy's bare "truth value of an array ... is ambiguous" named neither the predicate nor the
    episode (issue 48 item 14)."""
    def by_length(row):
        return np.array([row["length"] > 3, row["length"] < 10])

    with pytest.raises(TypeError, match=r"episodes: the predicate <function .*by_length.* returned array\(\[.*\]\) "
                                        r"for episode 0, which is neither true nor false .* it must return a bool"):
        EpisodeStreamingDataset(camera_less_root, episodes=by_length)


def test_keep_frames_from_json_and_errors_name_the_file(camera_less_root, tmp_path):
    path = tmp_path / "keep.json"
    path.write_text(json.dumps({"0": [[1, 3]], "2": [[0, 2], [5, 7]]}))
    ds = EpisodeStreamingDataset(camera_less_root, keep_frames=path, shuffle=False)
    assert worker_streams(ds, num_workers=1)[0] == [(0, 1), (0, 2), (2, 0), (2, 1), (2, 5), (2, 6)]
    assert len(EpisodeDataset(camera_less_root, keep_frames=str(path))) == 6
    path.write_text(json.dumps({"0": [[1, 30]]}))
    with pytest.raises(ValueError, match=r"keep_frames \(.*keep.json\)\[0\]: range \(1, 30\) is out of the episode"):
        EpisodeStreamingDataset(camera_less_root, keep_frames=path)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="must hold a JSON object"):
        EpisodeStreamingDataset(camera_less_root, keep_frames=path)
    with pytest.raises(FileNotFoundError, match="no such JSON file"):
        EpisodeStreamingDataset(camera_less_root, keep_frames=tmp_path / "missing.json")


def test_a_state_of_other_curation_is_refused(camera_less_root):
    ds = EpisodeStreamingDataset(camera_less_root, keep_frames={0: [(0, 3)], 2: [(0, 5)]})
    state = {**ds.state_dict(), "batches_consumed": 1, "batch_size": 2, "num_workers": 0}
    other = EpisodeStreamingDataset(camera_less_root, keep_frames={0: [(0, 3)], 2: [(0, 4)]})
    with pytest.raises(ValueError, match="fingerprint.curation"):
        other.load_state_dict(state)
    plain = EpisodeStreamingDataset(camera_less_root)
    with pytest.raises(ValueError, match="fingerprint.curation"):
        plain.load_state_dict(state)


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def test_windows_outside_the_kept_ranges_are_bit_equal_to_uncurated(dataset_root):
    """A kept frame's sample, windows reaching outside the ranges (padded at episode bounds only),
    equals the uncurated dataset's sample of that frame: map-style and streaming alike."""
    windows = {"observation.state": [-0.3, -0.1, 0.0, 0.2], "observation.images.front": [-0.2, 0.0, 0.1],
               "action": [0.0, 0.1, 0.2, 0.3]}
    keep = {1: [(60, 62), (100, 101)], 3: [(0, 2), (40, 41)], 5: [(30, 31)]}
    kwargs = dict(delta_timestamps=windows, return_uint8=True)
    plain = EpisodeDataset(dataset_root, **kwargs)
    curated = EpisodeDataset(dataset_root, keep_frames=keep, **kwargs)
    assert len(curated) == 7 and curated.episode_indices == [1, 3, 5]
    starts = np.concatenate([[0], np.cumsum(EPISODE_LENGTHS)])
    for i in range(len(curated)):
        episode, frame = curated.locate(i)
        sample = curated[i]
        _same(sample, plain[int(starts[episode]) + frame])
        assert sample["frame_index"] == frame
    assert curated.locate(3) == (3, 0)
    first = curated[3]  # episode 3, frame 0: windows padded before the episode's start only
    assert first["observation.state_is_pad"].tolist() == [True, True, False, False]
    assert curated.absolute_to_relative_idx == {int(starts[e]) + f: i for i, (e, f) in
                                                enumerate(curated.locate(k) for k in range(len(curated)))}
    streaming = EpisodeStreamingDataset(dataset_root, keep_frames=keep, seed=0, **kwargs)
    seen = 0
    for sample in streaming:
        episode, frame = int(sample["episode_index"]), int(sample["frame_index"])
        _same(sample, plain[int(starts[episode]) + frame])
        seen += 1
    assert seen == len(streaming) == 7


def test_mixture_components_take_their_own_curation(camera_less_root):
    a = EpisodeStreamingDataset(camera_less_root, keep_frames={0: [(0, 7)], 2: [(3, 9)]}, seed=0)
    b = EpisodeStreamingDataset(camera_less_root, episodes=[4, 6], episode_weights={4: 2}, seed=0)
    mixture = EpisodeMixture([a, b], seed=0)
    assert len(mixture) == len(a) + len(b) == 13 + 2 * 9 + 15
    got = Counter((int(s["dataset_index"]), int(s["episode_index"]), int(s["frame_index"])) for s in mixture)
    assert got == Counter([(0, 0, f) for f in range(7)] + [(0, 2, f) for f in range(3, 9)]
                          + [(1, 4, f) for f in range(9)] * 2 + [(1, 6, f) for f in range(15)])


def _lerobots_split(base, episode_tasks, eval_split):
    """LeRobot 0.6.1's ``make_train_eval_datasets`` split, as its source writes it
    (tests/with_lerobot checks ``split_episodes`` against the real one)."""
    import math
    task_to_episodes: dict = {}
    for ep_idx in base:
        task_key = episode_tasks[ep_idx][0] if episode_tasks[ep_idx] else ""
        task_to_episodes.setdefault(task_key, []).append(ep_idx)
    train_episodes, eval_episodes = [], []
    for eps in task_to_episodes.values():
        n_eval = math.ceil(len(eps) * eval_split)
        train_episodes.extend(eps[: len(eps) - n_eval])
        eval_episodes.extend(eps[len(eps) - n_eval:])
    return train_episodes, eval_episodes


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.25, 0.5, 0.6])
def test_split_episodes_unseeded_is_lerobots(camera_less_root, fraction):
    from episodestream import split_episodes

    tasks = EpisodeDataset(camera_less_root).meta.episodes["tasks"]
    assert split_episodes(camera_less_root, fraction) == _lerobots_split(range(len(TABULAR_LENGTHS)), tasks, fraction)
    given = [20, 3, 7, 1, 12, 9, 4]
    assert split_episodes(EpisodeDataset(camera_less_root, episodes=given), fraction) == \
        _lerobots_split(given, tasks, fraction)


def test_split_episodes_seeded_per_task_and_composes(camera_less_root):
    from episodestream import split_episodes

    tasks = EpisodeDataset(camera_less_root).meta.episodes["tasks"]
    train, held_out = split_episodes(camera_less_root, 0.25, seed=4)
    assert train == sorted(train) and held_out == sorted(held_out)
    assert sorted(train + held_out) == list(range(len(TABULAR_LENGTHS)))
    for task in {t[0] for t in tasks}:
        members = [e for e in range(len(TABULAR_LENGTHS)) if tasks[e][0] == task]
        assert sum(e in held_out for e in members) == -(-len(members) // 4)
    assert split_episodes(camera_less_root, 0.25, seed=4) == (train, held_out)
    assert split_episodes(camera_less_root, 0.25, seed=5) != (train, held_out)
    assert split_episodes(camera_less_root, 0.25, by=None) == (list(range(18)), list(range(18, 24)))
    # The held-out episodes with the other options: a predicate-curated source, keep_frames after.
    curated = EpisodeStreamingDataset(camera_less_root, episodes=pc.field("length") >= 5)
    train, held_out = split_episodes(curated, 0.5, by=None)
    assert held_out == curated.episode_indices[len(curated.episode_indices) // 2:]
    evaluation = EpisodeDataset(camera_less_root, episodes=held_out, keep_frames={e: [(0, 2)] for e in held_out})
    assert len(evaluation) == 2 * len(held_out)
    by_length = split_episodes(camera_less_root, 0.5, by="length")
    assert set(by_length[1]) >= {e for e, n in enumerate(TABULAR_LENGTHS) if TABULAR_LENGTHS.count(n) == 1}
    with pytest.raises(ValueError, match="eval_fraction must be a number in"):
        split_episodes(camera_less_root, 1.0)
    with pytest.raises(ValueError, match="by='nope' is neither 'task' nor a column"):
        split_episodes(camera_less_root, 0.2, by="nope")
    with pytest.raises(ValueError, match="leaves 0 training episodes"):
        split_episodes(EpisodeDataset(camera_less_root, episodes=[0]), 0.5)


def test_episode_loader_over_a_curated_weighted_dataset_resumes_exactly(many_episodes_root):
    """``EpisodeLoader`` composes: decoded batches of a keep-ranged, weighted dataset, a state
    taken mid-epoch, and a new loader continuing batch for batch (then a full next epoch)."""
    from episodestream import EpisodeLoader

    keep = {0: [(1, 4)], 3: [(0, 2), (4, 6)], 5: [(2, 5)], 7: [(0, 3)]}

    def loader():
        dataset = EpisodeStreamingDataset(many_episodes_root, keep_frames=keep, episode_weights={3: 2, 7: 1.5},
                                          seed=2, episode_pool_size=2, return_uint8=True)
        return EpisodeLoader(dataset, batch_size=3, num_threads=2)

    def ids(batches):
        return [(int(e), int(f)) for b in batches for e, f in zip(b["episode_index"], b["frame_index"])]

    first = loader()
    epoch0, epoch1 = ids(first), ids(first)
    assert Counter(e for e, _ in epoch0) == {0: 3, 3: 8, 5: 3, 7: 5} and len(epoch0) == 19
    assert epoch0 != epoch1 and Counter(e for e, _ in epoch1) == Counter(e for e, _ in epoch0)
    part = loader()
    iterator = iter(part)
    taken = ids(next(iterator) for _ in range(3))
    state = json.loads(json.dumps(part.state_dict()))
    del iterator
    resumed = loader()
    resumed.load_state_dict(state)
    assert taken + ids(resumed) == epoch0
    assert ids(resumed) == epoch1


def test_an_unweighted_mixture_mixes_curated_components_by_anchors(camera_less_root):
    a = EpisodeStreamingDataset(camera_less_root, keep_frames={0: [(0, 3)]}, seed=0)
    b = EpisodeStreamingDataset(camera_less_root, episodes=[2], seed=0)
    mixture = EpisodeMixture([a, b], seed=0)
    assert mixture.meta.weights == pytest.approx((3 / 15, 12 / 15))
    assert len(mixture) == 15


def test_compute_stats_of_a_curated_dataset_weighs_each_kept_frame_by_its_anchors(camera_less_root, tmp_path):
    """The stats of what an epoch samples: frames outside keep_frames left out, an integer weight w
    counting each kept frame w times, a fractional one its expected share; exact against numpy on
    the repeated rows (rows doubled throughout so the 0.5 weight becomes a whole repeat)."""
    import pyarrow.parquet as pq

    keep = {0: [(2, 6)], 2: [(0, 3), (5, 8)], 4: [(0, 8)]}  # episodes of 7, 12 and 9 frames
    weights = {2: 3, 4: 0.5}  # episode 4: 8 kept frames, 4 anchors an epoch
    dataset = EpisodeStreamingDataset(camera_less_root, episodes=[0, 2, 4], keep_frames=keep, episode_weights=weights,
                                      cache_dir=tmp_path)
    stats = dataset.compute_stats()
    table = pq.read_table(camera_less_root / "data").to_pydict()
    repeats = {0: 2, 2: 6, 4: 1}
    for key in ("observation.state", "action"):
        rows = []
        for values, episode, frame in zip(table[key], table["episode_index"], table["frame_index"]):
            if episode not in repeats or (episode in keep and not any(a <= frame < b for a, b in keep[episode])):
                continue
            rows += [values] * repeats[episode]
        rows = np.asarray(rows, np.float64)
        np.testing.assert_allclose(stats[key]["mean"], rows.mean(0), rtol=1e-9)
        np.testing.assert_allclose(stats[key]["std"], rows.std(0), rtol=1e-6)
        np.testing.assert_array_equal(stats[key]["min"], rows.min(0))
        np.testing.assert_array_equal(stats[key]["max"], rows.max(0))
        for name, q in (("q01", 0.01), ("q10", 0.1), ("q50", 0.5), ("q90", 0.9), ("q99", 0.99)):
            np.testing.assert_array_equal(stats[key][name], np.quantile(rows, q, axis=0, method="inverted_cdf"))
    # Cached per curation: the uncurated dataset's stats are another entry, and differ.
    again = EpisodeStreamingDataset(camera_less_root, episodes=[0, 2, 4], keep_frames=keep, episode_weights=weights,
                                    cache_dir=tmp_path).compute_stats()
    np.testing.assert_array_equal(again["action"]["mean"], stats["action"]["mean"])
    whole = EpisodeStreamingDataset(camera_less_root, episodes=[0, 2, 4], cache_dir=tmp_path).compute_stats()
    assert not np.allclose(whole["action"]["mean"], stats["action"]["mean"])


def _sampled_rows(root, key: str, repeats: dict[int, int], keep: dict) -> np.ndarray:
    """Rows of ``key`` as an epoch samples them: each episode's kept frames, ``repeats[e]`` times."""
    import pyarrow.parquet as pq

    table = pq.read_table(root / "data").to_pydict()
    rows = []
    for values, episode, frame in zip(table[key], table["episode_index"], table["frame_index"]):
        if episode in repeats and (episode not in keep or any(a <= frame < b for a, b in keep[episode])):
            rows += [values] * repeats[episode]
    return np.asarray(rows, np.float64)


def test_mixture_stats_weigh_a_curated_component_as_it_is_sampled(camera_less_root, tmp_path):
    """``mixture.meta.stats`` of a key shared by the components took every row of a curated
    component's selected episodes, not its kept frames and weights (issue 48 item 2)."""
    keep = {0: [(2, 6)], 2: [(0, 3), (5, 8)]}
    a = EpisodeStreamingDataset(camera_less_root, episodes=[0, 2], keep_frames=keep, episode_weights={2: 3},
                                cache_dir=tmp_path)
    b = EpisodeStreamingDataset(camera_less_root, episodes=[4], cache_dir=tmp_path)
    mixture = EpisodeMixture([a, b], seed=0)  # unweighted: every anchor the same
    rows = _sampled_rows(camera_less_root, "action", {0: 1, 2: 3, 4: 1}, keep)
    assert len(mixture) == len(rows) == 4 + 3 * 6 + 9
    stats = mixture.meta.stats["action"]
    np.testing.assert_allclose(stats["mean"], rows.mean(0), rtol=1e-9)
    np.testing.assert_allclose(stats["std"], rows.std(0), rtol=1e-6)
    np.testing.assert_array_equal(stats["min"], rows.min(0))
    np.testing.assert_array_equal(stats["q50"], np.quantile(rows, 0.5, axis=0, method="inverted_cdf"))
    assert int(np.ravel(stats["count"])[0]) == 4 + 6 + 9  # the frames that entered


def test_mixture_stats_are_cached_per_component_curation(camera_less_root, tmp_path):
    """Two mixtures differing only in a component's ``keep_frames`` shared one cache entry, so the
    second got the first's stats (issue 48 item 3)."""
    b = EpisodeStreamingDataset(camera_less_root, episodes=[4], cache_dir=tmp_path)
    means = []
    for keep in ({0: [(0, 3)]}, {0: [(3, 7)]}):
        a = EpisodeStreamingDataset(camera_less_root, episodes=[0], keep_frames=keep, cache_dir=tmp_path)
        means.append(EpisodeMixture([a, b], seed=0).meta.stats["action"]["mean"])
    assert len(list((tmp_path / "stats").glob("mixture-*.json"))) == 2
