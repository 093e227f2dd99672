"""``dataset.state_dict()`` carries this consumer's position (``_runtime.position``), so the
dataset round-trips on its own and under torchdata's StatefulDataLoader, which snapshots it inside
each consumer (main process or worker) and hands each its own snapshot back on resume."""

from __future__ import annotations

import pytest
import torch

from episodestream import EpisodeStreamingDataset, stream_state

stateful = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed (test extra)")
# torchdata 0.11 calls a torch function that torch 2.13 deprecates, on every StatefulDataLoader.
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")

MIDPOINTS = [0, 3, 7]  # batches taken before the state is saved (of 11-13 per epoch below)


def _indices(batches) -> list[int]:
    return [i for batch in batches for i in batch["index"].tolist()]


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
    whole = _indices(stateful.StatefulDataLoader(_dataset(camera_less_root), batch_size=4, num_workers=num_workers))
    for taken in MIDPOINTS:
        loader = stateful.StatefulDataLoader(_dataset(camera_less_root), batch_size=4, num_workers=num_workers)
        iterator = iter(loader)
        head = [next(iterator) for _ in range(taken)]
        state = loader.state_dict()
        assert _indices(head) + _indices(iterator) == whole, "saving changed nothing"
        resumed_loader = stateful.StatefulDataLoader(_dataset(camera_less_root), batch_size=4,
                                                     num_workers=num_workers)
        resumed_loader.load_state_dict(state)
        assert _indices(resumed_loader) == whole[4 * taken:], f"resumed after {taken} batches"
        following = _indices(resumed_loader)  # then epoch 1: all of it, reshuffled
        assert sorted(following) == sorted(whole) and following != whole


def test_another_worker_count_or_dataset_is_refused(camera_less_root):
    loader = stateful.StatefulDataLoader(_dataset(camera_less_root), batch_size=4, num_workers=2)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    del iterator
    fewer = stateful.StatefulDataLoader(_dataset(camera_less_root), batch_size=4, num_workers=1)
    fewer.load_state_dict(state)
    with pytest.raises(ValueError, match=r"consumer 0 of 2 .* this iteration is consumer 0 of 1.*stream_state"):
        next(iter(fewer))
    dataset = _dataset(camera_less_root)
    next(iter(dataset))
    with pytest.raises(ValueError, match=r"seed: saved 5, this dataset 6"):
        EpisodeStreamingDataset(camera_less_root, seed=6, episode_pool_size=3).load_state_dict(dataset.state_dict())


def test_stream_state_of_a_plain_dataloader_still_resumes_by_batches(camera_less_root):
    loader = torch.utils.data.DataLoader(_dataset(camera_less_root), batch_size=4, num_workers=2)
    whole = _indices(loader)
    state = stream_state(loader, 5)
    resumed = _dataset(camera_less_root)
    resumed.load_state_dict(state)  # batches_consumed present: the trainer's count decides, consumer ignored
    assert _indices(torch.utils.data.DataLoader(resumed, batch_size=4, num_workers=2)) == whole[20:]
