"""DataLoader workers started with "spawn" (LeRobot's trainer default) or "forkserver" receive the
dataset pickled, shared epoch counter included; a fork-context lock in it made them fail at start."""

from __future__ import annotations

import torch

from episodestream import EpisodeStreamingDataset


def test_spawned_workers_stream_the_epoch_and_advance_it(camera_less_root):
    # Persistent, as LeRobot's trainer has them: one spawn (each imports torch, seconds) for two epochs.
    dataset = EpisodeStreamingDataset(camera_less_root, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, num_workers=1, multiprocessing_context="spawn",
                                         persistent_workers=True)
    first = [i for batch in loader for i in batch["index"].tolist()]
    assert sorted(first) == list(range(dataset.num_frames)) and dataset.epoch == 1
    second = [i for batch in loader for i in batch["index"].tolist()]
    assert sorted(second) == sorted(first) and second != first  # epoch 1: reshuffled
