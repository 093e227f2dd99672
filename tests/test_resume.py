"""Fast-forward resume: exact within an epoch for the same layout, elastic otherwise."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
import torch.utils.data

from episodestream import EpisodeStreamingDataset, stream_state
from episodestream.testing import faults

from .stream_model import shut_down_workers, unbatch

EPISODES = list(range(8))  # about 80 frames of the 20-episode dataset: 20 batches of 4
BATCH = 4


def make(root, *, rank=0, world_size=1, **kwargs):
    kwargs.setdefault("episode_pool_size", 3)
    return EpisodeStreamingDataset(root, episodes=EPISODES, rank=rank, world_size=world_size, seed=3,
                                   return_uint8=True, **kwargs)


def loader_for(dataset, num_workers):
    return torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=num_workers)


def ids(batches):
    return [[int(s["index"]) for s in unbatch(batch)] for batch in batches]


def assert_same_samples(a_batches, b_batches):
    assert ids(a_batches) == ids(b_batches)
    for a, b in zip(itertools.chain(*map(unbatch, a_batches)), itertools.chain(*map(unbatch, b_batches))):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]) if isinstance(a[key], torch.Tensor) else a[key] == b[key], key


def save_after(root, *, rank, world_size, num_workers, epoch_batches, into_next):
    """Consume ``epoch_batches`` batches (of epoch 1 when ``into_next``) and return the state."""
    dataset = make(root, rank=rank, world_size=world_size)
    loader = loader_for(dataset, num_workers)
    consumed = []
    if into_next:
        list(loader)
    iterator = iter(loader)
    for batch in itertools.islice(iterator, epoch_batches):
        consumed.append(batch)
    state = json.loads(json.dumps(stream_state(loader, epoch_batches)))  # what a checkpoint file holds
    del iterator
    return state, consumed


def test_exact_resume(many_episodes_root):
    """Decoded, through real DataLoaders (2 ranks, 2 workers each; rank 1): saved mid-epoch, at the
    end of the epoch and in the next epoch, the resumed stream is the uninterrupted one sample for
    sample, and the epoch after it a normal one. ``tests/test_stream_properties.py`` checks the same
    property on the schedule for hundreds of layouts and save points."""
    rank, world_size, num_workers = 1, 2, 2
    loader = loader_for(make(many_episodes_root, rank=rank, world_size=world_size), num_workers)
    # States saved along the uninterrupted run after each batch, as a trainer saves and goes on
    # (JSON, as a checkpoint file holds them); a run stopped after saving gives the same state
    # (save_after, in the tests below): stream_state reads the count, not the workers.
    epochs, states = [], {}
    for epoch in (0, 1):
        epochs.append([])
        for batch in loader:
            epochs[epoch].append(batch)
            states[epoch, len(epochs[epoch])] = json.loads(json.dumps(stream_state(loader, len(epochs[epoch]))))
    epoch0, epoch1 = epochs
    n = len(epoch0)
    for batches, into_next in [(n // 2, False), (n, False), (2, True)]:
        state, consumed = states[int(into_next), batches], epochs[int(into_next)][:batches]
        assert state["epoch"] == int(into_next)
        resumed_dataset = make(many_episodes_root, rank=rank, world_size=world_size)
        resumed_dataset.load_state_dict(state)
        resumed_loader = loader_for(resumed_dataset, num_workers)
        expected_len = len(resumed_dataset)
        resumed = [batch for batch in resumed_loader]
        assert expected_len == sum(len(b["index"]) for b in resumed)
        if batches == n:  # the whole epoch was consumed: resume starts epoch 1
            assert_same_samples(resumed, epoch1)
            continue
        assert_same_samples(consumed + resumed, epoch1 if into_next else epoch0)
        if not into_next:
            # The epoch after a resumed one is a normal full epoch. (Iterate without list(): list()
            # asks len(loader), which PyTorch answers from its cache of the resumed epoch's length.)
            assert_same_samples([batch for batch in resumed_loader], epoch1)


def consumed_and_state(root, *, world_size, num_workers, batches):
    consumed, states = [], []
    for rank in range(world_size):
        state, batches_seen = save_after(root, rank=rank, world_size=world_size, num_workers=num_workers,
                                         epoch_batches=batches, into_next=False)
        consumed += [int(s["index"]) for batch in batches_seen for s in unbatch(batch)]
        states.append(state)
    assert all(s == states[0] for s in states), "every rank saves the same state"
    return consumed, states[0]


def test_elastic_resume_covers_the_epoch_once(many_episodes_root):
    """Decoded, through real DataLoaders: 1 rank of 2 workers resumed as 2 ranks in their main
    processes. ``tests/test_stream_properties.py`` checks it on the schedule for hundreds of changes."""
    (old_world, old_workers), (new_world, new_workers) = (1, 2), (2, 0)
    consumed, state = consumed_and_state(many_episodes_root, world_size=old_world, num_workers=old_workers, batches=5)
    resumed_per_rank = []
    for rank in range(new_world):
        dataset = make(many_episodes_root, rank=rank, world_size=new_world)
        dataset.load_state_dict(state)
        expected_len = len(dataset)
        resumed_per_rank.append([int(s["index"]) for batch in loader_for(dataset, new_workers) for s in unbatch(batch)])
        assert len(resumed_per_rank[-1]) == expected_len
    assert len({len(r) for r in resumed_per_rank}) == 1, "equal per-rank counts"
    resumed = [i for r in resumed_per_rank for i in r]
    assert not set(consumed) & set(resumed), "nothing consumed is emitted again"
    epoch_frames = {int(s["index"]) for s in make(many_episodes_root, shuffle=False)}
    assert set(consumed) | set(resumed) == epoch_frames
    # Repeats are fill-ins only: at most one per rank in each leg.
    repeats = len(consumed) + len(resumed) - len(epoch_frames)
    assert 0 <= repeats <= old_world + new_world


def test_elastic_resume_saved_again_mid_leg(many_episodes_root):
    """A state saved during an elastically resumed epoch resumes again (legs chain)."""
    consumed, state = consumed_and_state(many_episodes_root, world_size=1, num_workers=2, batches=4)
    dataset = make(many_episodes_root)
    dataset.load_state_dict(state)
    loader = loader_for(dataset, 0)  # elastic: 2 workers -> 0
    second = list(itertools.islice(iter(loader), 3))
    state2 = json.loads(json.dumps(stream_state(loader, 4 + 3)))
    assert len(state2["legs"]) == 1
    again = make(many_episodes_root)
    again.load_state_dict(state2)
    rest = [int(s["index"]) for batch in loader_for(again, 2) for s in unbatch(batch)]
    all_ids = consumed + [int(s["index"]) for batch in second for s in unbatch(batch)] + rest
    assert sorted(all_ids) == sorted({int(s["index"]) for s in make(many_episodes_root, shuffle=False)})


class _CountingReader:
    calls: list = []

    def __init__(self, inner):
        self.inner = inner

    def frames_played_at(self, seconds):
        _CountingReader.calls.append(len(seconds))
        return self.inner.frames_played_at(seconds)

    def close(self):
        self.inner.close()


def test_replay_reads_no_video_and_no_consumed_rows(many_episodes_root, monkeypatch):
    state, consumed = save_after(many_episodes_root, rank=0, world_size=1, num_workers=0, epoch_batches=15,
                                 into_next=False)
    dataset = make(many_episodes_root, decode_group_size=1)
    dataset.load_state_dict(state)
    faults.wrap_video_readers(dataset, lambda reader, path: _CountingReader(reader))
    reads = faults.count_row_reads(dataset)
    _CountingReader.calls = []
    resumed = [s for batch in loader_for(dataset, 0) for s in unbatch(batch)]
    # One decode call per resumed sample (decode_group_size=1, one camera) but for those served a
    # frame kept from their GOP mate's call; a call decodes its frame, and its mate where that is
    # kept: nothing was decoded for the 60 consumed samples but a few such mates.
    stats = dataset.decoder_stats()
    assert len(_CountingReader.calls) + stats["pair_frames_served"] == len(resumed)
    assert sum(_CountingReader.calls) == len(_CountingReader.calls) + stats["pair_frames_kept"]
    assert set(_CountingReader.calls) <= {1, 2} and stats["pair_frames_served"] > 0
    assert len(resumed) + 15 * BATCH == dataset.num_frames
    assert {e for r in reads for e in r} == {int(s["episode_index"]) for s in resumed}


@pytest.mark.parametrize("change,field", [
    ({"seed": 4}, "seed"),
    ({"episodes": [0, 1, 2]}, "fingerprint.episodes"),
    ({"delta_timestamps": {"action": [0.0, 1 / 30]}}, "fingerprint.delta_timestamps"),
])
def test_fingerprint_mismatch_is_refused(many_episodes_root, change, field):
    state, _ = save_after(many_episodes_root, rank=0, world_size=1, num_workers=0, epoch_batches=2, into_next=False)
    kwargs = {"episodes": EPISODES, "seed": 3, "episode_pool_size": 3, **change}
    other = EpisodeStreamingDataset(many_episodes_root, **kwargs)
    with pytest.raises(ValueError, match=rf"{field}: saved .*Pass strict=False"):
        other.load_state_dict(state)
    with pytest.warns(RuntimeWarning, match=field) as warned:
        other.load_state_dict(state, strict=False)
    assert [w.filename for w in warned] == [__file__]  # the warning points at the caller's line


def test_other_dataset_is_refused(many_episodes_root, dataset_root):
    state, _ = save_after(many_episodes_root, rank=0, world_size=1, num_workers=0, epoch_batches=2, into_next=False)
    with pytest.raises(ValueError, match=r"fingerprint.source: saved .*fingerprint.dataset"):
        EpisodeStreamingDataset(dataset_root, episodes=EPISODES[:6], seed=3, episode_pool_size=3).load_state_dict(state)


def test_state_without_trainer_fields_is_explained(many_episodes_root):
    dataset = make(many_episodes_root)
    dataset.load_state_dict(dataset.state_dict())  # a per-consumer state (tests/test_stateful_dataloader.py)
    trainer_state = {k: v for k, v in dataset.state_dict().items() if k != "consumer"}
    with pytest.raises(ValueError, match="lacks 'batches_consumed'"):
        dataset.load_state_dict(trainer_state)
    with pytest.raises(ValueError, match="Not an episodestream stream state"):
        dataset.load_state_dict({"epoch": 1})
    # A state of an earlier version, whose schedule emits another order: refused, saying why
    # (/6: a pool of the whole share without a ramp, /5: a Philox generator per segment, /4: a random
    # point per stratum, /3: iid keys, /2: no ramp).
    assert trainer_state["format"] == "episodestream.stream_state/8"
    for version in (6, 5, 4, 3, 2):
        older = {**trainer_state, "batches_consumed": 1, "batch_size": 4, "num_workers": 0,
                 "format": f"episodestream.stream_state/{version}"}
        with pytest.raises(ValueError, match=rf"another episodestream version \(format 'episodestream.stream_state/{version}'"):
            dataset.load_state_dict(older)
    with pytest.raises(ValueError, match=r"another episodestream version"):
        dataset.load_state_dict({**older, "consumer": {"format": "episodestream.stream_state/2"}})


def test_batches_consumed_beyond_the_epoch_is_refused_or_clamped(many_episodes_root):
    """Regression: a global step saved as batches_consumed silently skipped the next epoch."""
    state, _ = save_after(many_episodes_root, rank=0, world_size=1, num_workers=2, epoch_batches=3, into_next=False)
    epoch_batches = len(list(loader_for(make(many_episodes_root), 2)))
    dataset = make(many_episodes_root)
    with pytest.raises(ValueError, match=rf"batches_consumed'\]=500 is more than epoch 0 has: {epoch_batches} "
                                         rf"batches of {BATCH} per rank.*not a global step"):
        dataset.load_state_dict({**state, "batches_consumed": 500})
    assert dataset.epoch == 0 and len(dataset) == dataset.num_frames  # nothing changed
    dataset.load_state_dict({**state, "batches_consumed": epoch_batches})  # exactly the epoch: fine
    assert dataset.epoch == 1
    with pytest.warns(RuntimeWarning, match="more than epoch 0 has.*Treating the epoch as finished") as warned:
        dataset.load_state_dict({**state, "batches_consumed": 500}, strict=False)
    assert [w.filename for w in warned] == [__file__]
    assert dataset.epoch == 1
    fresh = make(many_episodes_root)
    fresh.set_epoch(1)
    assert ids(loader_for(dataset, 2)) == ids(loader_for(fresh, 2))  # a whole epoch 1 follows


@pytest.mark.parametrize("change,message", [
    ({"legs": [{"world_size": "two"}]}, r"state\['legs'\]\[0\] must be a dict with keys"),
    ({"legs": [{"world_size": 1, "num_workers": 0, "pool_size": 3, "batch_size": "4", "batches": 1}]},
     r"state\['legs'\]\[0\]\['batch_size'\] must be an int, got '4'"),
    ({"legs": "garbage"}, r"state\['legs'\] must be a list of legs"),
    ({"drop_last": "no"}, r"state\['drop_last'\] must be True or False, got 'no'"),
    ({"shuffle": "yes"}, r"state\['shuffle'\] must be True or False"),
])
def test_malformed_state_fields_are_named(many_episodes_root, change, message):
    state, _ = save_after(many_episodes_root, rank=0, world_size=1, num_workers=0, epoch_batches=2, into_next=False)
    with pytest.raises((TypeError, ValueError), match=message):
        make(many_episodes_root).load_state_dict({**state, **change}, strict=False)


def test_a_load_after_persistent_workers_started_reaches_them(many_episodes_root):
    """Persistent workers keep their copy of the dataset, but the loaded request is in the dataset's
    shared record, which they read at their next claim: the same DataLoader resumes the loaded state
    (it used to raise, and before that to ignore the load), as a DataLoader built after the load does."""
    dataset = make(many_episodes_root)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=2, persistent_workers=True)
    list(loader)
    state = {**dataset.state_dict(), "epoch": 1, "batches_consumed": 2, "batch_size": BATCH, "num_workers": 2}
    dataset.load_state_dict(state)
    expected = len(dataset)
    resumed = ids(loader)
    shut_down_workers(loader)
    assert sum(map(len, resumed)) == expected == dataset.num_frames - 2 * BATCH
    fresh = make(many_episodes_root)
    fresh.load_state_dict(state)
    assert ids(loader_for(fresh, 2)) == resumed


def test_out_of_order_delivery_is_refused(camera_less_root):
    """With in_order=False batches come as workers finish them, so batches_consumed no longer says
    how many of each worker's samples were taken: stream_state refuses rather than resume wrongly."""
    dataset = EpisodeStreamingDataset(camera_less_root)
    with pytest.raises(ValueError, match=r"num_workers=2, got in_order=False: batches_consumed cannot be mapped"):
        stream_state(torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=2, in_order=False), 3)
    # One worker, or none, delivers in order whatever in_order says.
    for num_workers in (0, 1):
        loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=num_workers, in_order=False)
        assert stream_state(loader, 3)["batches_consumed"] == 3


def test_a_resumed_epoch_is_whole_again_once_every_worker_ran_it_to_its_end(many_episodes_root):
    """Through a DataLoader with 2 workers: the resumed pass streams the remainder, then the same
    epoch selected again streams all of it, and ``len`` says so at each step."""
    whole = ids(loader_for(make(many_episodes_root), 2))
    state, consumed = save_after(many_episodes_root, rank=0, world_size=1, num_workers=2, epoch_batches=5,
                                 into_next=False)
    resumed = make(many_episodes_root)
    resumed.load_state_dict(state)
    remainder = sum(map(len, whole)) - 5 * BATCH
    assert len(resumed) == remainder
    again = ids(loader_for(resumed, 2))
    assert ids(consumed) + again == whole
    resumed.set_epoch(0)
    assert len(resumed) == sum(map(len, whole))
    assert ids(loader_for(resumed, 2)) == whole
    resumed.load_state_dict(state)  # a new load sets a resume point afresh
    assert len(resumed) == remainder and ids(loader_for(resumed, 2)) == again


# -- the resume point's lifetime and the checks where a state enters (issue 50) -----------------------


def _loader(root, batch_size=BATCH):
    from episodestream import EpisodeLoader

    return EpisodeLoader(make(root), batch_size=batch_size)


def _count(loader):
    return sum(len(batch["index"]) for batch in loader)


def test_a_resume_point_is_gone_once_its_pass_ended_even_after_another_epoch(camera_less_root):
    """Resumed epoch 0 ran to its end, epoch 1 ran, then ``set_epoch(0)``: all of epoch 0 again
    (it streamed only the resumed remainder: the pass marker held the latest epoch only)."""
    first = _loader(camera_less_root)
    iterator = iter(first)
    for _ in range(6):
        next(iterator)
    state = first.state_dict()
    whole = len(make(camera_less_root))
    resumed = _loader(camera_less_root)
    resumed.load_state_dict(state)
    assert _count(resumed) == whole - 6 * BATCH
    assert _count(resumed) == whole  # epoch 1
    resumed.set_epoch(0)
    assert len(resumed) == -(-whole // BATCH) and _count(resumed) == whole
    dataset = make(camera_less_root)  # the dataset's own state, another epoch selected before its pass
    dataset.load_state_dict({**state, "num_workers": 0})
    dataset.set_epoch(1)
    dataset.set_epoch(0)
    assert len(dataset) == whole and len(list(dataset)) == whole


def test_a_consumer_state_beyond_its_share_is_refused(camera_less_root):
    dataset = make(camera_less_root)
    state = dataset.state_dict()
    state["consumer"]["samples_yielded"] = 10**9
    with pytest.raises(ValueError, match=r"state\['consumer'\]\['samples_yielded'\]=1000000000 is more than "
                                         r"consumer 0 of 1 \(rank 0 of 1\) streams of epoch 0 \(\d+ samples\)"):
        dataset.load_state_dict(state)
    assert len(list(dataset)) == len(make(camera_less_root))  # the refused state changed nothing


@pytest.mark.parametrize("fingerprint", [None, "x", [1], 3])
def test_a_fingerprint_that_is_not_a_dict_is_named(camera_less_root, fingerprint):
    consumer_state = {**make(camera_less_root).state_dict(), "fingerprint": fingerprint}
    trainer_state = {**_loader(camera_less_root).state_dict(), "fingerprint": fingerprint}
    for load, state in ((make(camera_less_root).load_state_dict, consumer_state),
                        (make(camera_less_root).load_state_dict, trainer_state),
                        (_loader(camera_less_root).load_state_dict, trainer_state)):
        with pytest.raises(ValueError, match=r"state\['fingerprint'\] must be a dict, got "):
            load(state)


def test_a_state_that_consumed_nothing_loads_with_any_batch_size(camera_less_root):
    state = _loader(camera_less_root).state_dict()  # never iterated: 0 batches of epoch 0
    other = _loader(camera_less_root, batch_size=8)
    other.load_state_dict(state)
    whole = len(make(camera_less_root))
    iterator = iter(other)
    first = next(iterator)
    saved = other.state_dict()
    del iterator
    again = _loader(camera_less_root, batch_size=8)
    again.load_state_dict(saved)
    assert _count(again) == whole - len(first["index"])


def test_a_mixtures_resume_point_is_gone_once_its_pass_ended_even_after_another_epoch(camera_less_root):
    from episodestream import EpisodeLoader, EpisodeMixture

    def mixture():
        return EpisodeMixture([make(camera_less_root), make(camera_less_root, episode_pool_size=2)], weights=[1, 1])

    first = EpisodeLoader(mixture(), batch_size=BATCH)
    iterator = iter(first)
    for _ in range(5):
        next(iterator)
    state = first.state_dict()
    del iterator
    resumed = EpisodeLoader(mixture(), batch_size=BATCH)
    resumed.load_state_dict(state)
    whole = len(mixture())
    assert _count(resumed) == whole - 5 * BATCH
    assert _count(resumed) == whole
    resumed.set_epoch(0)
    assert _count(resumed) == whole


def test_a_resume_says_what_it_did(dataset_root, caplog):
    """A resume logs (logger "episodestream") what it did: exact, or elastic with the samples left to
    this rank (issue 49 item 7: a resume was silent); a mid-epoch one when its consumer starts, not at
    the load, where who reads was not known yet (issue 64 item 8)."""
    import logging
    import re

    from episodestream import EpisodeLoader

    def dataset(**world):
        return EpisodeStreamingDataset(dataset_root, episode_pool_size=2, seed=0, **world)

    def first_batch(loader):
        next(iter(loader))
        if isinstance(loader, EpisodeLoader):
            loader.close()

    loader = EpisodeLoader(dataset(), 8, num_threads=1)
    batches = iter(loader)
    next(batches), next(batches)
    state = loader.state_dict()
    loader.close()
    with caplog.at_level(logging.INFO, logger="episodestream"):
        resumed = EpisodeLoader(dataset(), 8, num_threads=1)
        resumed.load_state_dict(state)
        assert "resumed" not in caplog.text  # its consumer is not known yet
        first_batch(resumed)
        assert "resumed epoch 0 at batch 2 (exact; 1 rank(s) x 1 consumer(s))" in caplog.text
        caplog.clear()
        first_batch(resumed)  # the resume point was not used up (the pass stopped early): it resumes again
        assert caplog.text.count("resumed epoch 0 at batch 2 (exact") == 1, caplog.text
        caplog.clear()
        two_ranks = dataset(rank=0, world_size=2)
        elastic = EpisodeLoader(two_ranks, 8, num_threads=1)
        elastic.load_state_dict(state)
        first_batch(elastic)
        left = re.search(r"resumed epoch 0 after batch 2, elastic: (\d+) samples left for rank 0", caplog.text)
        assert left and int(left.group(1)) == len(two_ranks) == (290 - 16) // 2, caplog.text
        caplog.clear()
        on_dataset = dataset()
        on_dataset.load_state_dict(state)
        assert "resumed" not in caplog.text
        first_batch(torch.utils.data.DataLoader(on_dataset, batch_size=8))
        assert "resumed epoch 0 at batch 2 (exact; 1 rank(s) x 1 consumer(s))" in caplog.text
        caplog.clear()
        on_dataset.load_state_dict({**state, "batches_consumed": 37})  # 290 frames in batches of 8
        # What any consumers would do: said at the load.
        assert "resumed after epoch 0, which the state had finished: epoch 1 streams next" in caplog.text
        caplog.clear()
        streamed = dataset()
        next(iter(streamed))
        dataset().load_state_dict(streamed.state_dict())  # a per-consumer state (StatefulDataLoader's)
        assert ("resumed epoch 0 for consumer 0 of 1 (rank 0 of 1) after 1 sample(s) it yielded (exact: its own state, "
                "as StatefulDataLoader saved it)") in caplog.text


def test_a_mixtures_resume_says_what_it_did_when_its_consumer_starts(camera_less_root, caplog):
    """A mixture's trainer state logs its line where a dataset's does: at the pass's start (issue 64 item 8)."""
    import logging

    from episodestream import EpisodeLoader, EpisodeMixture

    def mixture():
        return EpisodeMixture([make(camera_less_root), make(camera_less_root, episode_pool_size=2)], weights=[1, 1])

    first = EpisodeLoader(mixture(), batch_size=BATCH)
    iterator = iter(first)
    next(iterator), next(iterator)
    state = first.state_dict()
    first.close()
    with caplog.at_level(logging.INFO, logger="episodestream"):
        resumed = EpisodeLoader(mixture(), batch_size=BATCH)
        resumed.load_state_dict(state)
        assert "resumed" not in caplog.text
        next(iter(resumed))
        resumed.close()
    assert "resumed epoch 0 at batch 2 (exact; 1 rank(s) x 1 consumer(s))" in caplog.text, caplog.text


def test_the_resume_line_says_what_the_dataloader_workers_do(dataset_root, tmp_path):
    """An EpisodeLoader's state loaded into a dataset read by ``DataLoader(num_workers=2)`` logged
    "exact; ... num_workers=0, as saved" at the load, then resumed elastically (issue 64 item 8): the
    line now comes from the pass's first worker, with the workers it has. Worker processes log in
    their own process; a file handler, inherited by the forked workers, collects their lines."""
    import logging
    import re

    from episodestream import EpisodeLoader

    def dataset():
        return EpisodeStreamingDataset(dataset_root, episode_pool_size=2, seed=0, return_uint8=True)

    loader = EpisodeLoader(dataset(), 8, num_threads=1)
    batches = iter(loader)
    next(batches), next(batches)
    state = loader.state_dict()  # num_workers=0: one consumer
    loader.close()
    logger = logging.getLogger("episodestream")
    handler = logging.FileHandler(tmp_path / "episodestream.log")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    def logged_by(num_workers, loaded):
        (tmp_path / "episodestream.log").write_text("")
        resumed = dataset()
        resumed.load_state_dict(loaded)
        samples = sum(len(batch["index"]) for batch in torch.utils.data.DataLoader(
            resumed, batch_size=8, num_workers=num_workers, multiprocessing_context="fork" if num_workers else None))
        handler.flush()
        return samples, (tmp_path / "episodestream.log").read_text()

    try:
        samples, text = logged_by(2, state)
        left = re.search(r"resumed epoch 0 after batch 2, elastic: (\d+) samples left for rank 0 \(1 rank\(s\) x 2 "
                         r"consumer\(s\) now; saved with 1 rank\(s\) x 1 consumer\(s\)", text)
        assert left and int(left.group(1)) == samples == 290 - 16, text
        assert text.count("resumed") == 1 and "exact" not in text, text  # worker 0's line only
        samples, text = logged_by(0, state)
        assert samples == 290 - 16 and text.splitlines() == ["resumed epoch 0 at batch 2 (exact; 1 rank(s) x 1 consumer(s))"]
        samples, text = logged_by(2, {**state, "num_workers": 2})  # as if a 2-worker DataLoader had saved it
        assert text.splitlines() == ["resumed epoch 0 at batch 2 (exact; 1 rank(s) x 2 consumer(s))"], text
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        handler.close()


# Every field of a state is checked where it enters, whichever entry it comes through; before the one
# parse, a per-consumer state's world_size and a mismatched field loaded with strict=False were read
# unchecked (a garbage seed was only found when the legs were replayed, if ever).
@pytest.mark.parametrize("change,message", [
    ({"world_size": "two"}, r"state\['world_size'\] must be an int, got 'two'"),
    ({"world_size": 0}, r"state\['world_size'\] must be >= 1, got 0"),
    ({"episode_pool_size": 0}, r"state\['episode_pool_size'\] must be >= 1, got 0"),
    ({"seed": -1}, r"state\['seed'\] must be >= 0, got -1"),
    ({"epoch": None}, r"state\['epoch'\] must be an int, got None"),
])
def test_every_field_is_checked_at_every_entry(camera_less_root, change, message):
    consumer_state = {**make(camera_less_root).state_dict(), **change}
    trainer_state = {**_loader(camera_less_root).state_dict(), **change}
    for load, state in ((make(camera_less_root).load_state_dict, consumer_state),
                        (make(camera_less_root).load_state_dict, trainer_state),
                        (_loader(camera_less_root).load_state_dict, trainer_state)):
        with pytest.raises((TypeError, ValueError), match=message):
            load(state, strict=False)


# Regression (issue 62 item 5): a count no trainer has was accepted, and the first batch replayed every
# consumer of the layout (world_size = 2**40: minutes, memory past 13 GB). Refused where it is parsed.
HUGE = 2**40
LEG = {"world_size": 1, "num_workers": 0, "pool_size": 3, "batch_size": 4, "batches": 1, "drop_last": False}


@pytest.mark.parametrize("change,message", [
    ({"world_size": HUGE}, rf"state\['world_size'\] must be <= {2**20}, got {HUGE}"),
    ({"num_workers": HUGE}, rf"state\['num_workers'\] must be <= {2**10}, got {HUGE}"),
    ({"world_size": 2**20, "num_workers": 2**10},
     rf"state\['world_size'\]={2**20} x state\['num_workers'\]={2**10} is {2**30} consumers, more than {2**22}"),
    ({"batch_size": HUGE}, rf"state\['batch_size'\] must be <= {2**24}, got {HUGE}"),
    ({"batches_consumed": 2**41}, rf"state\['batches_consumed'\] must be <= {2**40}, got {2**41}"),
    ({"legs": [{**LEG, "world_size": HUGE}]}, rf"state\['legs'\]\[0\]\['world_size'\] must be <= {2**20}"),
    ({"legs": [{**LEG, "batch_size": HUGE}]}, rf"state\['legs'\]\[0\]\['batch_size'\] must be <= {2**24}"),
])
def test_out_of_range_counts_are_refused_at_parse(camera_less_root, change, message):
    state = {**_loader(camera_less_root).state_dict(), **change}
    dataset = make(camera_less_root)
    with pytest.raises(ValueError, match=message):
        dataset.load_state_dict(state, strict=False)
    assert len(list(dataset)) == len(make(camera_less_root))  # the refused state changed nothing


@pytest.mark.parametrize("field,value,message", [
    ("world_size", HUGE, rf"state\['consumer'\]\['world_size'\] must be <= {2**20}, got {HUGE}"),
    ("num_workers", HUGE, rf"state\['consumer'\]\['num_workers'\] must be <= {2**10}, got {HUGE}"),
])
def test_out_of_range_consumer_counts_are_refused_at_parse(camera_less_root, field, value, message):
    state = make(camera_less_root).state_dict()
    state["consumer"][field] = value
    with pytest.raises(ValueError, match=message):
        make(camera_less_root).load_state_dict(state)


@pytest.mark.parametrize("change,message", [
    ({"rank": 1}, r"state\['consumer'\]\['rank'\]=1 must be < state\['consumer'\]\['world_size'\]=1"),
    ({"rank": 5, "world_size": 2}, r"state\['consumer'\]\['rank'\]=5 must be < state\['consumer'\]\['world_size'\]=2"),
    ({"worker": 1}, r"state\['consumer'\]\['worker'\]=1 must be < state\['consumer'\]\['num_workers'\]=1"),
])
def test_a_consumer_outside_its_counts_is_refused_at_parse(camera_less_root, change, message):
    """Regression (issue 62 item 6): it loaded, and the first iteration died with a bare IndexError."""
    state = make(camera_less_root).state_dict()
    state["consumer"].update(change)
    dataset = make(camera_less_root)
    with pytest.raises(ValueError, match=message):
        dataset.load_state_dict(state, strict=False)
    assert len(list(dataset)) == len(make(camera_less_root))  # the refused state changed nothing


def test_a_state_round_trips_through_its_one_type(camera_less_root):
    from episodestream._runtime.face import runtime_of

    runtime = runtime_of(make(camera_less_root))
    for state in (runtime.state_dict(), _loader(camera_less_root).state_dict()):
        saved = runtime.parse(state)
        assert saved.to_state(runtime.state_spec) == state
        assert (saved.consumer is None) == ("batches_consumed" in state)
