"""``dataset.state_dict()`` carries this consumer's position (``_runtime.resume.position``), so the
dataset round-trips on its own and under torchdata's StatefulDataLoader, which snapshots it inside
each consumer (main process or worker) and hands each its own snapshot back on resume."""

from __future__ import annotations

import pytest
import torch

from episodestream import EpisodeMixture, EpisodeStreamingDataset, load_loader_state, stream_state

from .stream_model import key_collate

stateful = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed (test extra)")
# torchdata 0.11 calls a torch function that torch 2.13 deprecates, on every StatefulDataLoader.
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")

MIDPOINTS = [0, 3, 7]  # batches taken before the state is saved (of 11-13 per epoch below)


def _indices(batches) -> list[int]:
    return [int(i) for batch in batches for i in batch["index"]]


def _loader(dataset, loader_class=None, **options):
    """A StatefulDataLoader (or ``loader_class``) whose batches hold only the samples' indices
    (and a mixture's ``dataset_index``): these tests compare which samples came, not their tensors."""
    keys = ("dataset_index", "index") if isinstance(dataset, EpisodeMixture) else ("index",)
    return (loader_class or stateful.StatefulDataLoader)(dataset, collate_fn=key_collate(*keys), **options)


def _dataset(root, **options):
    return EpisodeStreamingDataset(root, seed=5, episode_pool_size=3, **options)


def test_dataset_state_round_trips(camera_less_root):
    dataset = _dataset(camera_less_root)
    iterator = iter(dataset)
    head = [next(iterator)["index"].item() for _ in range(17)]
    state = dataset.state_dict()
    assert state["consumer"] == {"epoch": 0, "rank": 0, "world_size": 1, "worker": 0, "num_workers": 1,
                                 "samples_yielded": 17}
    rest = [s["index"].item() for s in iterator]
    again = _dataset(camera_less_root)
    again.load_state_dict(state)
    assert again.state_dict()["consumer"] == state["consumer"]  # loaded, not iterated: the same position
    assert [s["index"].item() for s in again] == rest and sorted(head + rest) == list(range(len(dataset)))
    assert again.epoch == 1 and again.state_dict()["consumer"]["samples_yielded"] == len(rest) + 17
    same = _dataset(camera_less_root)
    same.load_state_dict(same.state_dict())  # nothing iterated yet: the whole epoch 0
    assert [s["index"].item() for s in same] == head + rest


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_resumes_the_rest_of_the_epoch(camera_less_root, num_workers):
    whole = _indices(_loader(_dataset(camera_less_root), batch_size=4, num_workers=num_workers))
    # One pass, saved at each midpoint and run on to its end, as a trainer saves and goes on.
    loader = _loader(_dataset(camera_less_root), batch_size=4, num_workers=num_workers)
    iterator, states, head = iter(loader), {}, []
    for taken in MIDPOINTS:
        head += [next(iterator) for _ in range(taken - len(head))]
        states[taken] = loader.state_dict()
    assert _indices(head) + _indices(iterator) == whole, "saving changed nothing"
    for taken, state in states.items():
        resumed_loader = _loader(_dataset(camera_less_root), batch_size=4, num_workers=num_workers)
        resumed_loader.load_state_dict(state)
        assert _indices(resumed_loader) == whole[4 * taken:], f"resumed after {taken} batches"
        following = _indices(resumed_loader)  # then epoch 1: all of it, reshuffled
        assert sorted(following) == sorted(whole) and following != whole


def _saved(root, num_workers, taken, *, batch_size=4, **options):
    """A StatefulDataLoader's state after ``taken`` batches, and the indices of those batches."""
    loader = _loader(_dataset(root), batch_size=batch_size, num_workers=num_workers, **options)
    iterator = iter(loader)
    head = [next(iterator) for _ in range(taken)]
    state = loader.state_dict()
    del iterator
    return state, _indices(head)


# (saved with, resumed with) worker counts (fewer, more, to and from the main process), and the
# batches taken before saving (an odd and an even count per worker, early and late in the epoch).
CHANGES = [(2, 1, 5), (2, 3, 1), (2, 0, 9), (0, 2, 6), (3, 2, 7)]


@pytest.mark.parametrize(("saved_workers", "resumed_workers", "taken"), CHANGES)
def test_load_loader_state_resumes_another_worker_count_with_every_frame_once(camera_less_root, saved_workers,
                                                                              resumed_workers, taken):
    every = list(range(len(_dataset(camera_less_root))))
    state, head = _saved(camera_less_root, saved_workers, taken)
    loader = _loader(_dataset(camera_less_root), batch_size=4, num_workers=resumed_workers)
    load_loader_state(loader, state)
    rest = _indices(loader)
    assert sorted(head + rest) == every, f"after {taken} batches: a frame lost or repeated"
    assert len(rest) == len(every) - 4 * taken
    assert sorted(_indices(loader)) == every  # then the next epoch, whole


@pytest.mark.parametrize("options", [{"snapshot_every_n_steps": 3}, {"drop_last": True}], ids=["sparse-snapshots",
                                                                                              "drop_last"])
def test_load_loader_state_counts_batches_after_the_snapshot_and_dropped_ones(camera_less_root, options):
    drop_last = options.get("drop_last", False)
    loader = _loader(_dataset(camera_less_root), batch_size=5, num_workers=2, **options)
    whole = _indices(loader)
    for taken in (2, 7):  # 2: the sparse snapshot is 2 batches behind; 7: 1 behind
        state, head = _saved(camera_less_root, 2, taken, batch_size=5, **options)
        assert head == whole[:5 * taken]
        resumed = _loader(_dataset(camera_less_root), batch_size=5, num_workers=1, drop_last=drop_last)
        load_loader_state(resumed, state)
        rest = _indices(resumed)
        assert not set(rest) & set(head), f"after {taken} batches: a frame again"
        if drop_last:  # each layout drops its own partial batches: fewer than a batch per worker
            assert len(whole) - len(head) - len(rest) < 5 * 2
        else:
            assert sorted(head + rest) == list(range(len(_dataset(camera_less_root))))


def test_load_loader_state_resumes_another_world_size_from_any_ranks_state(camera_less_root):
    saved = {}
    for rank in (0, 1):  # two ranks, 2 workers each, the same 3 batches taken on each
        loader = _loader(_dataset(camera_less_root, rank=rank, world_size=2), batch_size=4, num_workers=2)
        iterator = iter(loader)
        head = _indices([next(iterator) for _ in range(3)])
        saved[rank] = (loader.state_dict(), head)
        del iterator
    heads = saved[0][1] + saved[1][1]
    for rank in (0, 1):
        alone = _loader(_dataset(camera_less_root, rank=0, world_size=1), batch_size=4, num_workers=2)
        load_loader_state(alone, saved[rank][0])
        rest = _indices(alone)
        assert sorted(heads + rest) == list(range(len(_dataset(camera_less_root)))), f"rank {rank}'s state"


def test_a_state_saved_after_an_elastic_resume_resumes_again_exactly_and_elastically(camera_less_root):
    every = list(range(len(_dataset(camera_less_root))))
    state, head = _saved(camera_less_root, 2, 3)
    loader = _loader(_dataset(camera_less_root), batch_size=4, num_workers=3)
    load_loader_state(loader, state)
    iterator = iter(loader)
    middle = [next(iterator) for _ in range(4)]
    second = loader.state_dict()
    tail = _indices(iterator)  # the uninterrupted rest of the resumed epoch
    del iterator
    same = _loader(_dataset(camera_less_root), batch_size=4, num_workers=3)
    load_loader_state(same, second)  # the same workers: torchdata's own exact resume
    assert _indices(same) == tail
    other = _loader(_dataset(camera_less_root), batch_size=4, num_workers=1)
    load_loader_state(other, second)  # a third layout: the epoch's two earlier legs both left out
    rest = _indices(other)
    assert sorted(head + _indices(middle) + rest) == every


def test_load_loader_state_with_the_same_workers_is_the_loaders_exact_resume(camera_less_root):
    whole = _indices(_loader(_dataset(camera_less_root), batch_size=4, num_workers=2))
    state, _ = _saved(camera_less_root, 2, 4)
    loader = _loader(_dataset(camera_less_root), batch_size=4, num_workers=2)
    load_loader_state(loader, state)
    assert _indices(loader) == whole[16:]


def test_load_loader_state_refuses_another_batch_size_and_a_dataset_state(camera_less_root):
    state, _ = _saved(camera_less_root, 2, 3)
    loader = _loader(_dataset(camera_less_root), batch_size=8, num_workers=1)
    with pytest.raises(ValueError, match=r"does not fit batch_size=8, drop_last=False: worker \d yielded \d+ samples"):
        load_loader_state(loader, state)
    with pytest.raises(ValueError, match=r"StatefulDataLoader's state .*load_loader_state"):
        _dataset(camera_less_root).load_state_dict(state)
    from episodestream import EpisodeLoader

    with pytest.raises(ValueError, match=r"StatefulDataLoader's state .*not the dataset's.*load_loader_state"):
        EpisodeLoader(_dataset(camera_less_root), 4).load_state_dict(state)  # told apart where every state is parsed
    with pytest.raises(ValueError, match=r"needs a StatefulDataLoader's state_dict\(\)"):
        load_loader_state(loader, _dataset(camera_less_root).state_dict())
    with pytest.raises(TypeError, match=r"needs a torchdata StatefulDataLoader, got a DataLoader.*stream_state"):
        load_loader_state(torch.utils.data.DataLoader(_dataset(camera_less_root), batch_size=4), state)


def test_another_worker_count_or_dataset_is_refused(camera_less_root):
    loader = _loader(_dataset(camera_less_root), batch_size=4, num_workers=2)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    del iterator
    fewer = _loader(_dataset(camera_less_root), batch_size=4, num_workers=1)
    fewer.load_state_dict(state)
    with pytest.raises(ValueError, match=r"consumer 0 of 2 .* this iteration is consumer 0 of 1.*load_loader_state"):
        next(iter(fewer))
    dataset = _dataset(camera_less_root)
    next(iter(dataset))
    with pytest.raises(ValueError, match=r"seed: saved 5, this dataset 6"):
        EpisodeStreamingDataset(camera_less_root, seed=6, episode_pool_size=3).load_state_dict(dataset.state_dict())


def test_stream_state_of_a_plain_dataloader_still_resumes_by_batches(camera_less_root):
    loader = _loader(_dataset(camera_less_root), torch.utils.data.DataLoader, batch_size=4, num_workers=2)
    whole = _indices(loader)
    state = stream_state(loader, 5)
    resumed = _dataset(camera_less_root)
    resumed.load_state_dict(state)  # batches_consumed present: the trainer's count decides, consumer ignored
    assert _indices(_loader(resumed, torch.utils.data.DataLoader, batch_size=4, num_workers=2)) == whole[20:]


def _mixture(root):
    """Two components of the camera-less dataset (its first and last 12 episodes), by size."""
    from episodestream import EpisodeMixture

    return EpisodeMixture([EpisodeStreamingDataset(root, seed=5, episode_pool_size=3, episodes=list(range(12))),
                           EpisodeStreamingDataset(root, seed=6, episode_pool_size=2, episodes=list(range(12, 24)))],
                          seed=3)


def _keys(batches) -> list[tuple[int, int]]:
    return [(int(d), int(i)) for batch in batches for d, i in zip(batch["dataset_index"], batch["index"])]


@pytest.mark.parametrize(("saved_workers", "resumed_workers"), [(0, 0), (2, 2), (2, 1), (0, 2)])
def test_a_mixture_resumes_under_stateful_dataloader_exactly_or_elastically(camera_less_root, saved_workers,
                                                                            resumed_workers):
    whole = _keys(_loader(_mixture(camera_less_root), batch_size=4, num_workers=saved_workers))
    loader = _loader(_mixture(camera_less_root), batch_size=4, num_workers=saved_workers)
    iterator = iter(loader)
    head = _keys([next(iterator) for _ in range(5)])
    state = loader.state_dict()
    del iterator
    assert head == whole[:20]
    resumed = _loader(_mixture(camera_less_root), batch_size=4, num_workers=resumed_workers)
    if saved_workers == resumed_workers:
        resumed.load_state_dict(state)  # torchdata's own resume: the rest, batch for batch
        assert _keys(resumed) == whole[20:]
    else:
        load_loader_state(resumed, state)
        rest = _keys(resumed)
        assert sorted(head + rest) == sorted(whole) and len(set(head + rest)) == len(whole)
