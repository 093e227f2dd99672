"""DataLoader workers started with "spawn" (LeRobot's trainer default) or "forkserver" receive the
dataset pickled, shared epoch counter included; a fork-context lock in it made them fail at start.
Forked workers hand batches over through PyTorch's default sharing strategy as through the one the
rest of the suite uses (conftest), bit for bit."""

from __future__ import annotations

import torch
import torch.multiprocessing

from episodestream import EpisodeStreamingDataset

from .conftest import EPISODE_LENGTHS
from .test_resume import assert_same_samples


def test_spawned_workers_stream_the_epoch_and_advance_it(camera_less_root):
    # Persistent, as LeRobot's trainer has them: one spawn (each imports torch, seconds) for two epochs.
    dataset = EpisodeStreamingDataset(camera_less_root, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, num_workers=1, multiprocessing_context="spawn",
                                         persistent_workers=True)
    first = [i for batch in loader for i in batch["index"].tolist()]
    assert sorted(first) == list(range(dataset.num_frames)) and dataset.epoch == 1
    second = [i for batch in loader for i in batch["index"].tolist()]
    assert sorted(second) == sorted(first) and second != first  # epoch 1: reshuffled


def test_forked_workers_hand_over_the_same_batches_through_pytorchs_default_sharing_strategy(dataset_root):
    """Two forked workers, video and windows: an epoch handed over by PyTorch's default strategy on
    Linux (a descriptor per tensor) equals the one the suite's file-backed strategy hands over."""
    options = dict(seed=0, delta_timestamps={"observation.images.front": [-0.1, 0.0], "action": [0.0, 0.1]})
    suite_strategy = torch.multiprocessing.get_sharing_strategy()
    epochs = {}
    try:
        for strategy in ("file_descriptor", "file_system"):
            torch.multiprocessing.set_sharing_strategy(strategy)
            loader = torch.utils.data.DataLoader(EpisodeStreamingDataset(dataset_root, **options), batch_size=8,
                                                 num_workers=2)
            epochs[strategy] = list(loader)
    finally:
        torch.multiprocessing.set_sharing_strategy(suite_strategy)
    assert sum(len(batch["index"]) for batch in epochs["file_descriptor"]) == sum(EPISODE_LENGTHS)
    assert_same_samples(epochs["file_descriptor"], epochs["file_system"])
