"""Turns (``_base.turns``, ``_runtime.lookahead.worker_turns``): the order DataLoader workers start downloading in.
How a remote consumer uses its turn is tested in ``remote_streaming/test_first_batch.py``."""

from __future__ import annotations

import pickle
import threading
import time

from episodestream._base.turns import Turn
from episodestream._base.world import World
from episodestream._runtime.resume.epoch import SharedEpoch
from episodestream._runtime.lookahead.worker_turns import MAX_TURN_WORKERS, WorkerTurns


def _turns(turns: WorkerTurns, iteration: int, num_workers: int = 3, wait_s: float = 30.0):
    return [turns.turn(World(0, 1, worker=w, num_workers=num_workers), iteration, wait_s=wait_s)
            for w in range(num_workers)]


def test_a_turn_waits_for_the_one_before_to_pass_its_own_on():
    first, second, third = _turns(WorkerTurns(), iteration=1)
    first.wait()  # the first never waits
    waited = threading.Thread(target=second.wait)
    waited.start()
    time.sleep(0.05)
    assert waited.is_alive()
    third_waited = threading.Thread(target=third.wait)
    third_waited.start()
    first.pass_on()
    waited.join(5)
    assert not waited.is_alive()
    time.sleep(0.05)
    assert third_waited.is_alive()  # its turn is after the second's, not the first's
    second.pass_on()
    second.pass_on()  # once is enough; again changes nothing
    third_waited.join(5)
    assert not third_waited.is_alive() and first.passed and second.passed and not third.passed


def test_the_rest_of_every_download_waits_for_the_last_head_start():
    first, second, third = _turns(WorkerTurns(), iteration=1)
    waiting = [threading.Thread(target=turn.wait_for_all) for turn in (first, second, third)]
    for thread in waiting:
        thread.start()
    first.pass_on()
    second.pass_on()
    time.sleep(0.05)
    assert all(thread.is_alive() for thread in waiting)  # the last worker's head start is not local yet
    third.pass_on()
    for thread in waiting:
        thread.join(5)
    assert not any(thread.is_alive() for thread in waiting)


def test_an_earlier_iterations_pass_does_not_open_a_later_iterations_turn():
    turns = WorkerTurns()
    first, _, _ = _turns(turns, iteration=1)
    first.pass_on()
    _, later, _ = _turns(turns, iteration=2, wait_s=0.2)
    start_s = time.monotonic()
    later.wait()
    assert time.monotonic() - start_s >= 0.2  # bounded: nobody passed on in iteration 2
    _, earlier, _ = _turns(turns, iteration=1, wait_s=5)
    start_s = time.monotonic()
    earlier.wait()
    assert time.monotonic() - start_s < 1


def test_a_wait_is_bounded_from_its_first_call_for_every_thread():
    turn = Turn(ready=lambda: False, wait_s=0.2)
    start_s = time.monotonic()
    threads = [threading.Thread(target=turn.wait) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    turn.wait()  # over: returns at once
    assert 0.2 <= time.monotonic() - start_s < 2


def test_no_turn_outside_a_dataloader_iteration_or_for_a_lone_worker():
    turns = WorkerTurns()
    assert turns.turn(World(0, 1), 1) is None  # the main process
    assert turns.turn(World(0, 1, worker=0, num_workers=2), None) is None  # no claimed iteration
    assert turns.turn(World(0, 1, worker=MAX_TURN_WORKERS, num_workers=MAX_TURN_WORKERS + 1), 1) is None


def test_a_plain_copy_of_the_turns_has_slots_of_its_own():
    turns = WorkerTurns()
    copy = pickle.loads(pickle.dumps(turns))
    first, _, _ = _turns(copy, iteration=1)
    first.pass_on()
    assert list(copy._slots[:1]) == [1] and list(turns._slots[:1]) == [0]


def test_every_worker_of_one_dataloader_iteration_claims_the_same_iteration_number():
    shared = SharedEpoch()
    numbers = []
    for _ in range(2):  # two DataLoader iterations of two workers
        for worker in range(2):
            numbers.append(shared.claim(worker, 2).iteration)
    assert numbers == [1, 1, 2, 2]
    shared.set(5)  # set_epoch between iterations: the numbering goes on
    assert shared.claim(0, 2).iteration == 3
