"""Resume on v2.x datasets beyond the exact case of ``test_v2x``: elastic (another world size and
worker count), through torchdata's StatefulDataLoader, and a v2.1 + v3.0 mixture resumed elastically.
Each checks that every frame of the epoch comes once across the interrupted run and the resumed one."""

from __future__ import annotations

import itertools
import json

import pytest
import torch.utils.data

from episodestream import EpisodeLoader, EpisodeMixture, EpisodeStreamingDataset, load_loader_state, stream_state

from .test_v2x import v21_root, v30_root  # noqa: F401 (session fixtures shared with those tests)

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


def _dataset(root, **options):
    return EpisodeStreamingDataset(root, seed=3, episode_pool_size=2, return_uint8=True, **options)


def _frames(batches) -> list[tuple[int, int]]:
    """(episode, frame) of every sample, with the dataset's index when the batches are a mixture's."""
    out = []
    for batch in batches:
        source = batch.get("dataset_index", torch.zeros_like(batch["index"])).tolist()
        out += zip(source, batch["episode_index"].tolist(), batch["frame_index"].tolist())
    return out


def test_elastic_resume_on_v21_from_two_ranks_of_two_workers_to_one_loader(v21_root):  # noqa: F811
    every = sorted(_frames(torch.utils.data.DataLoader(_dataset(v21_root), batch_size=3)))
    consumed, state = [], None
    for rank in (0, 1):
        loader = torch.utils.data.DataLoader(_dataset(v21_root, rank=rank, world_size=2), batch_size=3, num_workers=2)
        consumed += _frames(itertools.islice(loader, 2))
        state = json.loads(json.dumps(stream_state(loader, 2)))  # the same on both ranks
    resumed = _dataset(v21_root)
    resumed.load_state_dict(state)
    rest = _frames(EpisodeLoader(resumed, batch_size=3, num_threads=2))
    assert len(consumed) == 12 and sorted(consumed + rest) == every


def test_stateful_dataloader_on_v21_resumes_another_worker_count(v21_root):  # noqa: F811
    stateful = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed (test extra)")
    every = sorted(_frames(torch.utils.data.DataLoader(_dataset(v21_root), batch_size=3)))
    loader = stateful.StatefulDataLoader(_dataset(v21_root), batch_size=3, num_workers=2)
    iterator = iter(loader)
    head = _frames(itertools.islice(iterator, 3))
    state = loader.state_dict()
    del iterator
    resumed = stateful.StatefulDataLoader(_dataset(v21_root), batch_size=3, num_workers=0)
    load_loader_state(resumed, state)
    assert sorted(head + _frames(resumed)) == every


def test_a_v21_and_v30_mixture_resumes_elastically(v21_root, v30_root):  # noqa: F811
    def mixture():
        return EpisodeMixture([_dataset(v21_root), EpisodeStreamingDataset(v30_root, seed=2, episode_pool_size=3,
                                                                       return_uint8=True)],
                              seed=7)

    every = sorted(_frames(torch.utils.data.DataLoader(mixture(), batch_size=4)))
    loader = torch.utils.data.DataLoader(mixture(), batch_size=4, num_workers=2)
    head = _frames(itertools.islice(loader, 3))
    state = json.loads(json.dumps(stream_state(loader, 3)))
    resumed = mixture()
    resumed.load_state_dict(state)
    rest = _frames(EpisodeLoader(resumed, batch_size=4))
    assert {source for source, _, _ in head + rest} == {0, 1}
    assert sorted(head + rest) == every
