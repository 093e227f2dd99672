"""The resume lifecycle's table (``_runtime.resume.epoch.TRANSITIONS``), walked row by row through the
public API: ``load_state_dict``, ``set_epoch``, iterating in the main process, DataLoader workers (forked,
persistent, spawned) and StatefulDataLoader's own snapshots. Every change of the shared resume record
goes through the table's ``next_state``; here it is wrapped to log each transition taken, in whichever
process takes it (forked workers inherit the wrapper), and each scenario checks both the rows it walked
and what the consumers streamed."""

from __future__ import annotations

import itertools
import json

import pytest
import torch.utils.data

import episodestream._runtime.resume.epoch as lifecycle
from episodestream import EpisodeStreamingDataset, stream_state

from .stream_model import key_collate, shut_down_workers

stateful = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed (test extra)")
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")

from episodestream._runtime.resume.epoch import EMPTY, LOADED, OWN, RESUMING  # noqa: E402
BATCH = 4


@pytest.fixture
def walked(monkeypatch, tmp_path):
    """The transitions taken so far, as (state, event, next state), in the order they were taken."""
    log = tmp_path / "transitions"
    table = lifecycle.next_state

    def logged(state: str, event: str) -> str:
        after = table(state, event)
        with open(log, "a") as out:  # one short append per line: whole, from any process
            out.write(f"{state} {event} {after}\n")
        return after

    monkeypatch.setattr(lifecycle, "next_state", logged)
    return lambda: [tuple(line.split()) for line in log.read_text().splitlines()] if log.exists() else []


def _dataset(root):
    return EpisodeStreamingDataset(root, seed=5, episode_pool_size=3)


def _loader(dataset, num_workers, **options):
    return torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=num_workers,
                                       collate_fn=key_collate("index"), **options)


def _ids(loader_or_batches) -> list[int]:
    return [i for batch in loader_or_batches for i in batch["index"]]


def _state(root, batches: int | None, num_workers: int = 0):
    """A trainer's state after ``batches`` of epoch 0 (None: the whole epoch), and the rest of epoch 0."""
    loader = _loader(_dataset(root), num_workers)
    if batches is None:
        taken = list(loader)
        return json.loads(json.dumps(stream_state(loader, len(taken)))), []
    iterator = iter(loader)
    list(itertools.islice(iterator, batches))
    state = json.loads(json.dumps(stream_state(loader, batches)))
    return state, _ids(iterator)


def _resuming(root, state):
    """A dataset whose loaded ``state`` a DataLoader iteration of 2 workers claimed, then stopped early."""
    dataset = _dataset(root)
    dataset.load_state_dict(state)
    loader = _loader(dataset, 2)
    iterator = iter(loader)
    next(iterator)
    shut_down_workers(loader)
    del iterator
    return dataset


SCENARIOS: dict[str, set[tuple[str, str, str]]] = {}


def scenario(*rows: tuple[str, str, str]):
    def register(test):
        SCENARIOS[test.__name__] = set(rows)
        return test
    return register


@scenario((EMPTY, "load", LOADED), (LOADED, "load", LOADED), (LOADED, "load-nothing", EMPTY),
          (EMPTY, "load-nothing", EMPTY))
def test_loads(camera_less_root, walked):
    dataset = _dataset(camera_less_root)
    whole = len(dataset)
    mid, rest = _state(camera_less_root, 5)
    done, _ = _state(camera_less_root, None)
    nothing, _ = _state(camera_less_root, 0)
    dataset.load_state_dict(mid)
    assert len(dataset) == len(rest)
    dataset.load_state_dict(mid)
    assert len(dataset) == len(rest)
    dataset.load_state_dict(done)
    assert dataset.epoch == 1 and len(dataset) == whole
    dataset.load_state_dict(nothing)
    assert dataset.epoch == 0 and len(dataset) == whole
    assert walked() == [(EMPTY, "load", LOADED), (LOADED, "load", LOADED), (LOADED, "load-nothing", EMPTY),
                        (EMPTY, "load-nothing", EMPTY)]


@scenario((EMPTY, "set-other", EMPTY), (LOADED, "set-same", LOADED), (LOADED, "set-other", EMPTY))
def test_set_epoch(camera_less_root, walked):
    dataset = _dataset(camera_less_root)
    whole = len(dataset)
    dataset.set_epoch(3)
    mid, rest = _state(camera_less_root, 5)
    dataset.load_state_dict(mid)
    dataset.set_epoch(0)  # the loaded epoch: still resumed
    assert len(dataset) == len(rest)
    dataset.set_epoch(1)
    assert len(dataset) == whole
    assert walked() == [(EMPTY, "set-other", EMPTY), (EMPTY, "load", LOADED), (LOADED, "set-same", LOADED),
                        (LOADED, "set-other", EMPTY)]


@scenario((LOADED, "claim-main", LOADED), (LOADED, "finish-main", EMPTY))
def test_main_process_passes(camera_less_root, walked):
    """A pass in the main process reads the record at its claim; one stopped early leaves it, one run to its
    end uses it up."""
    mid, rest = _state(camera_less_root, 5)
    dataset = _dataset(camera_less_root)
    dataset.load_state_dict(mid)
    stopped = iter(dataset)
    assert [int(next(stopped)["index"]) for _ in range(3)] == rest[:3]
    del stopped
    assert [int(s["index"]) for s in dataset] == rest
    assert dataset.epoch == 1 and len(dataset) == len(_dataset(camera_less_root))
    assert walked() == [(EMPTY, "load", LOADED), (LOADED, "claim-main", LOADED), (LOADED, "claim-main", LOADED),
                        (LOADED, "finish-main", EMPTY)]


@scenario((LOADED, "claim-first", RESUMING), (RESUMING, "claim-sibling", RESUMING),
          (RESUMING, "finish-worker", RESUMING), (RESUMING, "finish-last", EMPTY))
def test_a_dataloader_iteration(camera_less_root, walked):
    """Two forked workers: the first claim pins the pass, the last worker's end uses the record up."""
    mid, _ = _state(camera_less_root, 5, num_workers=2)
    dataset = _dataset(camera_less_root)
    dataset.load_state_dict(mid)
    expected = len(dataset)
    resumed = _ids(_loader(dataset, 2))
    assert len(resumed) == expected
    taken = walked()
    assert taken[:2] == [(EMPTY, "load", LOADED), (LOADED, "claim-first", RESUMING)]
    # Worker 0 may run its share to the end before worker 1 claims: the pass lives until the last end.
    assert sorted(taken[2:-1]) == [(RESUMING, "claim-sibling", RESUMING), (RESUMING, "finish-worker", RESUMING)]
    assert taken[-1] == (RESUMING, "finish-last", EMPTY)
    assert len(dataset) == len(_dataset(camera_less_root))


@scenario((RESUMING, "set-same", RESUMING), (RESUMING, "claim-first", RESUMING))
def test_an_iteration_stopped_early_is_resumed_again(camera_less_root, walked):
    mid, _ = _state(camera_less_root, 5, num_workers=2)
    dataset = _resuming(camera_less_root, mid)
    dataset.set_epoch(0)
    again = _ids(_loader(dataset, 2))
    fresh = _dataset(camera_less_root)
    fresh.load_state_dict(mid)
    assert again == _ids(_loader(fresh, 2))
    assert (RESUMING, "set-same", RESUMING) in walked() and walked().count((RESUMING, "claim-first", RESUMING)) == 1
    assert walked()[-1] == (RESUMING, "finish-last", EMPTY)


@scenario((RESUMING, "load", LOADED), (RESUMING, "load-nothing", EMPTY), (RESUMING, "set-other", EMPTY),
          (RESUMING, "claim-main", RESUMING), (RESUMING, "finish-main", EMPTY))
def test_what_ends_a_claimed_record(camera_less_root, walked):
    mid, rest = _state(camera_less_root, 5, num_workers=2)
    nothing, _ = _state(camera_less_root, 0)
    whole = len(_dataset(camera_less_root))
    dataset = _resuming(camera_less_root, mid)
    dataset.load_state_dict(mid)
    assert walked()[-1] == (RESUMING, "load", LOADED) and len(dataset) == len(rest)
    dataset = _resuming(camera_less_root, mid)
    dataset.load_state_dict(nothing)
    assert walked()[-1] == (RESUMING, "load-nothing", EMPTY) and len(dataset) == whole
    dataset = _resuming(camera_less_root, mid)
    dataset.set_epoch(1)
    assert walked()[-1] == (RESUMING, "set-other", EMPTY) and len(dataset) == whole
    dataset = _resuming(camera_less_root, mid)  # the main process takes the rest, as EpisodeLoader would
    assert len([s for s in dataset]) == len(rest)
    assert walked()[-2:] == [(RESUMING, "claim-main", RESUMING), (RESUMING, "finish-main", EMPTY)]


@scenario((EMPTY, "load-own", OWN), (OWN, "claim-own", OWN), (OWN, "set-same", OWN), (OWN, "set-other", EMPTY),
          (OWN, "load", EMPTY))
def test_a_workers_own_snapshot(camera_less_root, walked):
    """torchdata's StatefulDataLoader loads each worker's own snapshot inside that worker: an entry that only
    that worker's claim reads, gone at another epoch or a load in the main process."""
    saving = stateful.StatefulDataLoader(_dataset(camera_less_root), batch_size=BATCH, num_workers=2,
                                         collate_fn=key_collate("index"))
    iterator = iter(saving)
    list(itertools.islice(iterator, 5))
    state, rest = saving.state_dict(), _ids(iterator)
    dataset = _dataset(camera_less_root)
    loader = stateful.StatefulDataLoader(dataset, batch_size=BATCH, num_workers=2, collate_fn=key_collate("index"))
    loader.load_state_dict(state)
    assert _ids(loader) == rest
    assert sorted(walked()) == sorted([(EMPTY, "load-own", OWN), (OWN, "claim-own", OWN)] * 2)
    dataset.set_epoch(0)
    assert sorted(walked()[-3:]) == sorted([(OWN, "set-same", OWN)] * 2 + [(EMPTY, "set-other", EMPTY)])
    dataset.set_epoch(1)
    assert sorted(walked()[-3:]) == sorted([(OWN, "set-other", EMPTY)] * 2 + [(EMPTY, "set-other", EMPTY)])
    loader.load_state_dict(state)
    list(itertools.islice(iter(loader), 1))  # the workers load their snapshots again
    mid, _ = _state(camera_less_root, 5)
    dataset.load_state_dict(mid)
    assert walked()[-3:] == [(EMPTY, "load", LOADED), (OWN, "load", EMPTY), (OWN, "load", EMPTY)]


@scenario((OWN, "load-own", OWN))
def test_persistent_workers_load_their_own_snapshot_again(camera_less_root, walked):
    saving = stateful.StatefulDataLoader(_dataset(camera_less_root), batch_size=BATCH, num_workers=2,
                                         collate_fn=key_collate("index"))
    iterator = iter(saving)
    list(itertools.islice(iterator, 5))
    state, rest = saving.state_dict(), _ids(iterator)
    loader = stateful.StatefulDataLoader(_dataset(camera_less_root), batch_size=BATCH, num_workers=2,
                                         collate_fn=key_collate("index"), persistent_workers=True)
    loader.load_state_dict(state)
    assert _ids(loader) == rest
    loader.load_state_dict(state)
    assert _ids(loader) == rest
    shut_down_workers(loader)
    assert walked().count((OWN, "load-own", OWN)) == 2


def test_every_row_of_the_table_is_walked():
    assert set().union(*SCENARIOS.values()) == set(lifecycle.TRANSITIONS)
    assert len(set(lifecycle.TRANSITIONS)) == len(lifecycle.TRANSITIONS)
    assert len({(state, event) for state, event, _ in lifecycle.TRANSITIONS}) == len(lifecycle.TRANSITIONS)


def test_persistent_spawned_workers_read_a_later_load(camera_less_root):
    """A spawned worker gets the shared block pickled at its start; a load after that reaches it at its
    next claim as it reaches forked workers (``StaleWorkerCopy`` is gone: the record is shared)."""
    mid, _ = _state(camera_less_root, 5, num_workers=1)
    dataset = _dataset(camera_less_root)
    loader = _loader(dataset, 1, multiprocessing_context="spawn", persistent_workers=True)
    first = _ids(loader)
    dataset.load_state_dict(mid)
    resumed = _ids(loader)
    shut_down_workers(loader)
    fresh = _dataset(camera_less_root)
    fresh.load_state_dict(mid)
    assert resumed == _ids(_loader(fresh, 1)) and len(resumed) < len(first)


def test_a_request_larger_than_the_record_is_refused_at_the_load():
    """The record is a fixed buffer of shared memory (it must exist before the workers start): a request
    that does not fit is refused where it is written, saying why, and the record keeps what it held."""
    from episodestream._plan.resume import Leg
    from episodestream._runtime.resume.record import CAPACITY_BYTES, Loaded, LoadedRequest, Record, SharedRecord

    record = SharedRecord()
    legs = tuple(Leg(1, 2, (3,) * 50, 4, 5) for _ in range(CAPACITY_BYTES // 100))
    with pytest.raises(ValueError, match="more than the .* the shared resume record holds"):
        record.write(Record(1, Loaded(LOADED, 0, LoadedRequest(0, legs))))
    assert record.read() == Record()
    shared = lifecycle.SharedEpoch(3)
    with pytest.raises(ValueError, match="shared resume record"):
        shared.load(Loaded(LOADED, 0, LoadedRequest(0, legs)), 0)
    assert shared.get() == 3 and shared.loads() == 0  # nothing changed: the epoch either
