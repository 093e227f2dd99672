"""Split, coverage and resume, checked on the schedule alone over hundreds of configurations.

Which frames a rank's DataLoader hands out is decided before any row is read or frame decoded:
``EpisodeStreamingDataset.schedule(world, epoch)`` gives each consumer's steps from metadata alone.
So these properties are checked here on a camera-less dataset, in seconds, for many world sizes,
worker counts, pool sizes, batch sizes, drop_last, episode selections and save points:

- the split: every selected frame exactly once per epoch across ranks (fill-ins aside), equal
  counts per rank, ``len`` equal to the count;
- exact resume (same ranks, workers and pool): the resumed stream is the uninterrupted one,
  sample for sample;
- elastic resume (ranks, workers or pool changed): every unconsumed frame once, nothing consumed
  again, equal counts per rank; and a state saved in a resumed epoch resumes again (legs chain).

The DataLoader is simulated (``stream_model.loader_batches``: each worker batches its own stream,
the loader takes one batch from each worker in turn, skipping exhausted ones);
``test_the_simulated_loader_is_the_real_one`` checks that simulation against real DataLoaders over
a decoded dataset, and ``tests/test_resume.py`` keeps one decoded end-to-end test per property.
"""

from __future__ import annotations

import json
import pickle
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch.utils.data

from episodestream import EpisodeStreamingDataset, stream_state

from .conftest import TABULAR_LENGTHS
from .stream_model import chunks, loader_batches, pairs, sweep, worker_streams

# Tiny selections leave some consumers nothing but fill-ins, which warns (tested in test_streaming).
pytestmark = pytest.mark.filterwarnings("ignore:The epoch has .* frames for:RuntimeWarning")

SEED = 5
# Episode selections: all, every other one, a few (unsorted on purpose), one, two tiny ones (fewer
# frames than some layouts have consumers: ranks and workers with nothing but fill-ins).
SELECTIONS = (None, tuple(range(0, 24, 2)), (17, 3, 20, 8), (6,), (1, 5))


@dataclass(frozen=True)
class Layout:
    """How one leg of an epoch is read: the dataset's ranks and pool, the DataLoader's settings."""

    world_size: int
    num_workers: int  # as passed to the DataLoader
    pool_size: int
    batch_size: int
    drop_last: bool

    @property
    def workers(self) -> int:
        return max(1, self.num_workers)

    def same_stream(self, other: Layout) -> bool:
        return (self.world_size, self.workers, self.pool_size) == (other.world_size, other.workers, other.pool_size)


def random_layout(rng: np.random.Generator) -> Layout:
    return Layout(world_size=int(rng.integers(1, 5)), num_workers=int(rng.integers(0, 4)),
                  pool_size=int(rng.choice([1, 3])), batch_size=int(rng.choice([1, 2, 3, 4, 7])),
                  drop_last=bool(rng.random() < 0.3))


def changed_layout(layout: Layout, rng: np.random.Generator) -> Layout:
    """The same layout (an exact resume) 40% of the time, else one to three settings changed."""
    if rng.random() < 0.4:
        return layout
    fresh = random_layout(rng)
    fields = ["world_size", "num_workers", "pool_size", "batch_size", "drop_last"]
    changes = rng.choice(fields, size=int(rng.integers(1, 4)), replace=False)
    return replace(layout, **{f: getattr(fresh, f) for f in changes})


def all_frames(selection) -> Counter:
    episodes = range(len(TABULAR_LENGTHS)) if selection is None else selection
    return Counter((e, f) for e in episodes for f in range(TABULAR_LENGTHS[e]))


@pytest.fixture(scope="module")
def datasets(camera_less_root):
    """``datasets(role, selection, shuffle, world_size, rank, pool_size)``, built once per module
    (construction reads metadata): "fresh" ones are never resumed; a "resumer" is a pickled copy of
    the fresh one (as a DataLoader worker gets it), given a state before each use."""
    built: dict[tuple, EpisodeStreamingDataset] = {}

    def get(role: str, selection, shuffle: bool, world_size: int, rank: int,
            pool_size: int) -> EpisodeStreamingDataset:
        key = (selection, shuffle, world_size, rank, pool_size)
        if key not in built:
            built[key] = EpisodeStreamingDataset(
                camera_less_root, episodes=None if selection is None else list(selection), shuffle=shuffle,
                seed=SEED, world_size=world_size, rank=rank, episode_pool_size=pool_size)
        if role == "fresh":
            return built[key]
        if (role, *key) not in built:
            built[(role, *key)] = pickle.loads(pickle.dumps(built[key]))
        return built[(role, *key)]

    return get


class Case:
    """One configuration: an episode selection, shuffle, and the datasets of each rank."""

    def __init__(self, datasets, selection, shuffle: bool) -> None:
        self.datasets, self.selection, self.shuffle = datasets, selection, shuffle
        self.frames = all_frames(selection)

    def dataset(self, layout: Layout, rank: int, role: str = "fresh") -> EpisodeStreamingDataset:
        return self.datasets(role, self.selection, self.shuffle, layout.world_size, rank, layout.pool_size)

    def streams(self, dataset: EpisodeStreamingDataset, layout: Layout, epoch: int) -> list[list]:
        """Each worker's emitted (episode, frame) pairs, in order."""
        return worker_streams(dataset, num_workers=layout.num_workers, epoch=epoch)

    def save(self, datasets_by_rank, layout: Layout, batches_consumed: int) -> dict:
        """``stream_state`` as each rank's trainer would save it (all ranks save the same state)."""
        states = []
        for dataset in datasets_by_rank:
            loader = torch.utils.data.DataLoader(dataset, batch_size=layout.batch_size,
                                                 num_workers=layout.num_workers, drop_last=layout.drop_last)
            states.append(json.loads(json.dumps(stream_state(loader, batches_consumed))))
        assert all(state == states[0] for state in states), "every rank saves the same state"
        return states[0]

    def resume(self, state: dict, layout: Layout) -> tuple[int, list[list[list]], list[int]]:
        """Load ``state`` on every rank of ``layout``: the epoch resumed, each rank's worker
        streams, and each rank's ``len``."""
        epochs, streams, lengths = set(), [], []
        for rank in range(layout.world_size):
            dataset = self.dataset(layout, rank, "resumer")
            dataset.load_state_dict(state)
            epochs.add(dataset.epoch)
            streams.append(self.streams(dataset, layout, dataset.epoch))
            lengths.append(len(dataset))
        assert len(epochs) == 1
        return epochs.pop(), streams, lengths


def flat(batches) -> list:
    return [sample for _, batch in batches for sample in batch]


def check_split(frames: Counter, per_rank: list[list]) -> None:
    """Every frame of ``frames`` at least once, equal counts per rank, and the only repeats are
    fill-ins: ceil(F / ranks) * ranks - F of them, each repeating a frame of its own rank."""
    world_size, total = len(per_rank), sum(frames.values())
    expected = -(-total // world_size)
    assert [len(samples) for samples in per_rank] == [expected] * world_size
    seen = Counter(sample for samples in per_rank for sample in samples)
    assert set(seen) == set(frames)
    assert sum(seen.values()) - len(seen) == expected * world_size - total
    if total >= world_size:  # every rank owns frames: its fill-in repeats one of its own
        for frame in (f for f, n in seen.items() if n > 1):
            assert sum(frame in set(samples) for samples in per_rank) == 1, frame


# Split: 90 configurations (the first 21 reach every arc of episodestream/ that 300 did); resume: 150
# (the first 126 reach every arc that 250 did). By coverage.py with a context per configuration
# (benchmarks/LOG.md, "The suite's time: index-only batches and sweeps").
CONFIGS = 90
RESUME_CONFIGS = 150


def _split_covers_every_frame_once_with_equal_counts(datasets, config):
    rng = np.random.default_rng(config)
    case = Case(datasets, SELECTIONS[config % len(SELECTIONS)], shuffle=rng.random() < 0.85)
    layout, epoch = random_layout(rng), int(rng.integers(0, 3))
    per_rank = []
    for rank in range(layout.world_size):
        dataset = case.dataset(layout, rank)
        streams = case.streams(dataset, layout, epoch)
        per_rank.append([sample for stream in streams for sample in stream])
        assert len(dataset) == len(per_rank[-1])
        # The loader hands out every sample of the rank's workers (drop_last aside).
        delivered = flat(loader_batches(streams, batch_size=layout.batch_size, drop_last=layout.drop_last))
        assert Counter(delivered) <= Counter(per_rank[-1])
        assert len(per_rank[-1]) - len(delivered) <= (layout.batch_size - 1) * layout.workers * layout.drop_last
    check_split(case.frames, per_rank)
    # Ranks' parts are disjoint (fill-ins repeat their own rank's frames).
    if sum(case.frames.values()) >= layout.world_size:
        for a in range(layout.world_size):
            for b in range(a):
                assert not set(per_rank[a]) & set(per_rank[b])


@pytest.mark.parametrize("configs", chunks(CONFIGS, 30))
def test_split_covers_every_frame_once_with_equal_counts(datasets, configs):
    sweep(lambda config: _split_covers_every_frame_once_with_equal_counts(datasets, config), configs)


def save_points(rng: np.random.Generator, batches_per_rank: list[int]) -> list[int]:
    """The start or the first batch, one more, the last batch of the shortest rank, and the end."""
    shortest, longest = min(batches_per_rank), max(batches_per_rank)
    points = {int(rng.integers(0, 2)), int(rng.integers(0, longest + 1)), shortest - 1, longest}
    return sorted(p for p in points if 0 <= p <= longest)


def check_resumed(case: Case, *, exact: bool, before: list[list[list]], consumed_per_worker: list[list[int]],
                  consumed: Counter, resumed: list[list[list]], lengths: list[int]) -> None:
    """A resumed leg: against the leg ``before`` it (exact), or against what is left (elastic)."""
    per_rank = [[sample for stream in streams for sample in stream] for streams in resumed]
    assert lengths == [len(samples) for samples in per_rank]  # len() is the count, whatever the new workers
    if exact:
        # Each worker role continues its stream after what was consumed of it (roles rotate so
        # that the loader's first batch comes from the worker whose turn was next).
        for rank, streams in enumerate(resumed):
            expected = Counter(tuple(stream[taken:]) for stream, taken in zip(before[rank], consumed_per_worker[rank]))
            assert Counter(tuple(stream) for stream in streams) == expected, rank
        return
    # Elastic: what is left, split afresh; nothing consumed comes again.
    left = Counter({frame: 1 for frame in case.frames if frame not in consumed})
    check_split(left, per_rank)
    assert not set(consumed) & {sample for samples in per_rank for sample in samples}


def consume(case: Case, streams_by_rank: list[list[list]], layout: Layout, batches: int):
    """Each rank's first ``batches`` batches: the samples taken of each worker, and all of them."""
    per_worker, taken = [], Counter()
    for streams in streams_by_rank:
        delivered = loader_batches(streams, batch_size=layout.batch_size, drop_last=layout.drop_last)[:batches]
        per_worker.append([sum(len(batch) for worker, batch in delivered if worker == w) for w in range(len(streams))])
        taken.update(flat(delivered))
    return per_worker, taken


def batch_counts(streams_by_rank: list[list[list]], layout: Layout) -> list[int]:
    return [len(loader_batches(streams, batch_size=layout.batch_size, drop_last=layout.drop_last))
            for streams in streams_by_rank]


def _resume_exact_or_elastic_and_again(datasets, config):
    """Save at several points of a leg, resume under the same or a changed layout; then save again
    in the resumed leg and resume a third time (legs chain)."""
    rng = np.random.default_rng(10_000 + config)
    case = Case(datasets, SELECTIONS[config % len(SELECTIONS)], shuffle=rng.random() < 0.85)
    first, epoch = random_layout(rng), int(rng.integers(0, 3))
    first_ranks = [case.dataset(first, rank) for rank in range(first.world_size)]
    for dataset in first_ranks:
        dataset.set_epoch(epoch)  # the epoch a state saved now names
    uninterrupted = [case.streams(dataset, first, epoch) for dataset in first_ranks]
    produced = batch_counts(uninterrupted, first)
    for batches in save_points(rng, produced):
        second = changed_layout(first, rng)
        state = case.save(first_ranks, first, batches)
        assert state["epoch"] == epoch and state["legs"] == []
        per_worker, consumed = consume(case, uninterrupted, first, batches)
        resumed_epoch, resumed, lengths = case.resume(state, second)
        if batches >= max(produced):  # every rank took its whole epoch: a full next epoch follows
            assert resumed_epoch == epoch + 1
            assert resumed == [case.streams(case.dataset(second, r), second, epoch + 1)
                               for r in range(second.world_size)]
            continue
        assert resumed_epoch == epoch
        check_resumed(case, exact=first.same_stream(second), before=uninterrupted, consumed_per_worker=per_worker,
                      consumed=consumed, resumed=resumed, lengths=lengths)

        # A second save, within the resumed leg; batches_consumed counts from the start of the epoch.
        second_produced = batch_counts(resumed, second)
        more = int(rng.integers(0, 1 + max(second_produced)))
        state2 = case.save([case.dataset(second, rank, "resumer") for rank in range(second.world_size)], second,
                           batches + more)
        third = changed_layout(second, rng)
        if (batches and first.same_stream(second)
                and (first.batch_size, first.drop_last) != (second.batch_size, second.drop_last)):
            # The resumed leg continued the first one exactly but in other batches: the saved
            # batches_consumed can no longer be mapped to samples. (A first state that took no
            # batch resumes nothing: the epoch started afresh, in the second run's batches.)
            with pytest.raises(ValueError, match="batches_consumed cannot be mapped to samples"):
                case.dataset(third, 0, "resumer").load_state_dict(state2)
            continue
        per_worker2, consumed2 = consume(case, resumed, second, more)
        taken = consumed + consumed2
        epoch3, resumed3, lengths3 = case.resume(state2, third)
        if more >= max(second_produced):
            assert epoch3 == epoch + 1
            continue
        assert epoch3 == epoch
        check_resumed(case, exact=second.same_stream(third), before=resumed, consumed_per_worker=per_worker2,
                      consumed=taken, resumed=resumed3, lengths=lengths3)


@pytest.mark.parametrize("configs", chunks(RESUME_CONFIGS, 25))
def test_resume_exact_or_elastic_and_again(datasets, configs):
    sweep(lambda config: _resume_exact_or_elastic_and_again(datasets, config), configs)


def test_the_simulated_loader_is_the_real_one(many_episodes_root):
    """``loader_batches`` over ``schedule()`` against real DataLoaders with 2 workers over decoded
    samples: a fresh epoch in which one worker runs out a batch before the other, an exact resume
    (worker roles rotated), and an elastic one onto 2 ranks with drop_last."""
    def make(**kwargs):
        # 73 frames: the two workers get 37 and 36.
        return EpisodeStreamingDataset(many_episodes_root, episodes=[0, 1, 2, 4, 5, 6, 7, 8], seed=3,
                                       episode_pool_size=3, return_uint8=True, **kwargs)

    def simulated(dataset, *, batch_size, drop_last=False):
        streams = worker_streams(dataset, num_workers=2)
        return [batch for _, batch in loader_batches(streams, batch_size=batch_size, drop_last=drop_last)]

    def real(dataset, *, batch_size, drop_last=False):
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=2, drop_last=drop_last,
                                             collate_fn=pairs)
        return [batch for batch in loader]

    fresh = make()
    counts = [len(stream) for stream in worker_streams(fresh, num_workers=2)]
    # A batch size at which the workers' batch counts differ: the loader skips the exhausted one.
    batch_size = next(b for b in range(3, 9) if -(-counts[0] // b) != -(-counts[1] // b))
    expected = simulated(fresh, batch_size=batch_size)
    uninterrupted = real(fresh, batch_size=batch_size)
    assert uninterrupted == expected

    taken = len(expected) // 2 + 1
    state = stream_state(torch.utils.data.DataLoader(make(), batch_size=batch_size, num_workers=2), taken)
    resumed = make()
    resumed.load_state_dict(state)
    expected = simulated(resumed, batch_size=batch_size)
    assert real(resumed, batch_size=batch_size) == expected
    assert uninterrupted[:taken] + expected == uninterrupted

    elastic = make(world_size=2, rank=1)
    elastic.load_state_dict(state)
    expected = simulated(elastic, batch_size=3, drop_last=True)
    assert real(elastic, batch_size=3, drop_last=True) == expected
    assert not {s for batch in expected for s in batch} & {s for batch in uninterrupted[:taken] for s in batch}

