"""``accelerator.prepare(DataLoader(dataset))`` on several processes shards an IterableDataset again
(a DataLoaderDispatcher by default, an IterableDatasetShard with dispatch_batches=False); our dataset
already streams only its rank's share, so the first batch raises instead of silently training on 1/N
of the epoch. The wrappers are built here in one process (the dataset told it is rank 0 of 2), as
Accelerate builds them on each of N; tests/datasets/test_accelerate_prepare.py launches 2 processes."""

from __future__ import annotations

import pytest
import torch

from episodestream import EpisodeStreamingDataset

data_loader = pytest.importorskip("accelerate.data_loader", reason="accelerate is not installed (test extra)")

MESSAGE = r"accelerator.prepare wrapped this DataLoader in an? {}.*rank 0 of 2.*send_to_device"


@pytest.mark.parametrize("num_workers", [0, 1])
def test_dispatcher_and_shard_raise_on_the_first_batch(camera_less_root, num_workers):
    from accelerate import PartialState

    PartialState()  # the dispatcher reads the process layout (here: one process)
    dataset = EpisodeStreamingDataset(camera_less_root, rank=0, world_size=2, seed=0)
    dispatcher = data_loader.DataLoaderDispatcher(dataset, batch_size=4, num_workers=num_workers)
    with pytest.raises(RuntimeError, match=MESSAGE.format("DataLoaderDispatcher")):
        next(iter(dispatcher))
    shard = data_loader.IterableDatasetShard(dataset, batch_size=4, num_processes=2, process_index=0)
    loader = torch.utils.data.DataLoader(shard, batch_size=4, num_workers=num_workers)
    with pytest.raises(RuntimeError, match=MESSAGE.format("IterableDatasetShard")):
        next(iter(loader))


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
