"""``accelerator.prepare(DataLoader(dataset))`` on several processes shards an IterableDataset again
(a DataLoaderDispatcher by default, an IterableDatasetShard with dispatch_batches=False); our dataset
already streams only its rank's share, so the first batch raises instead of silently training on 1/N
of the epoch. The wrappers are built here in one process (the dataset told it is rank 0 of 2), as
Accelerate builds them on each of N; tests/datasets/test_accelerate_prepare.py launches 2 processes."""

from __future__ import annotations

import re

import pytest
import torch

from episodestream import EpisodeStreamingDataset

data_loader = pytest.importorskip("accelerate.data_loader", reason="accelerate is not installed (test extra)")

MESSAGE = r"accelerator.prepare wrapped this DataLoader in an? {}.*rank 0 of 2.*send_to_device"


def _first_batch_error(loader) -> str:
    """The message of the error the first batch raises. DataLoader workers it leaves are ended at
    once: torch's shutdown of a worker whose fetch raised waits 5 s for it."""
    try:
        next(iter(loader))
    except RuntimeError as error:
        traceback = error.__traceback__
        while traceback is not None:
            for value in traceback.tb_frame.f_locals.values():
                for worker in getattr(value, "_workers", None) or []:
                    worker.terminate()
            traceback = traceback.tb_next
        return str(error)
    raise AssertionError("the first batch did not raise")


@pytest.mark.parametrize("num_workers", [0, 1])
def test_dispatcher_and_shard_raise_on_the_first_batch(camera_less_root, num_workers):
    from accelerate import PartialState

    PartialState()  # the dispatcher reads the process layout (here: one process)
    dataset = EpisodeStreamingDataset(camera_less_root, rank=0, world_size=2, seed=0)
    dispatcher = data_loader.DataLoaderDispatcher(dataset, batch_size=4, num_workers=num_workers)
    assert re.search(MESSAGE.format("DataLoaderDispatcher"), _first_batch_error(dispatcher))
    shard = data_loader.IterableDatasetShard(dataset, batch_size=4, num_processes=2, process_index=0)
    loader = torch.utils.data.DataLoader(shard, batch_size=4, num_workers=num_workers)
    assert re.search(MESSAGE.format("IterableDatasetShard"), _first_batch_error(loader))


def test_plain_loaders_and_one_process_are_untouched(camera_less_root):
    two_ranks = EpisodeStreamingDataset(camera_less_root, rank=0, world_size=2, seed=0)
    assert len(list(torch.utils.data.DataLoader(two_ranks, batch_size=4))) == -(-len(two_ranks) // 4)
    # What 'episodestream lerobot-train' and the error message do: device placement only.
    placed = data_loader.prepare_data_loader(torch.utils.data.DataLoader(two_ranks, batch_size=4), "cpu",
                                             num_processes=1, process_index=0, dispatch_batches=False)
    assert sum(len(b["index"]) for b in placed) == len(two_ranks)
    one_rank = EpisodeStreamingDataset(camera_less_root, seed=0)
    shard = data_loader.IterableDatasetShard(one_rank, batch_size=4, num_processes=1, process_index=0)
    assert "index" in next(iter(shard))  # one process: nothing is lost, nothing to refuse


def test_lerobot_trains_accelerator_keeps_a_resumed_epoch(camera_less_root):
    """A prepared loader sets the dataset's epoch to its own pass count at every pass: after a
    resume into epoch 1 Accelerate's prepare streams epoch 0 again; the Accelerator of
    ``episodestream lerobot-train`` starts its count at the dataset's epoch."""
    from accelerate import Accelerator

    from episodestream import stream_state
    from episodestream.tools.lerobot_train import _accelerator_class

    def resumed():
        dataset = EpisodeStreamingDataset(camera_less_root, seed=0)
        loader = torch.utils.data.DataLoader(dataset, batch_size=4)
        whole = [[i for b in loader for i in b["index"].tolist()] for _ in range(2)]  # epochs 0 and 1
        again = EpisodeStreamingDataset(camera_less_root, seed=0)
        again.load_state_dict({**stream_state(loader, 3), "epoch": 1})  # 3 batches into epoch 1
        return again, whole

    dataset, whole = resumed()
    ours = _accelerator_class(Accelerator)(cpu=True).prepare(torch.utils.data.DataLoader(dataset, batch_size=4))
    assert [i for b in ours for i in b["index"].tolist()] == whole[1][12:]
    dataset, whole = resumed()
    plain = Accelerator(cpu=True).prepare(torch.utils.data.DataLoader(dataset, batch_size=4))
    assert [i for b in plain for i in b["index"].tolist()] == whole[0]  # why ours sets the count
