"""Node-wide permits: the sum in flight across processes never exceeds the budget, resizing never
overshoots, dead processes leak nothing, and waiting threads queue without spinning."""

from __future__ import annotations

import multiprocessing
import os
import random
import shutil
import signal
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from episodestream.testing.downloads import NodePermits

FORK = multiprocessing.get_context("fork")  # children must not re-import torch (spawn would)


@pytest.fixture
def node_dir(tmp_path):
    """A permits directory on tmpfs when there is one, as in production."""
    if not os.access("/dev/shm", os.W_OK):
        yield tmp_path / "permits"
        return
    directory = tempfile.mkdtemp(prefix="episodestream-test-", dir="/dev/shm")
    yield Path(directory) / "permits"
    shutil.rmtree(directory, ignore_errors=True)


def _hammer(directory, stop, acquired, peak, counter, lock, results, seed):
    """One process: take a permit, note how many are in their critical section, hold, release."""
    permits = NodePermits(directory=directory)
    rng = random.Random(seed)
    log = []
    while not stop.is_set():
        started_s = time.monotonic()
        with permits.acquire(timeout_s=5) as slot:
            with lock:
                counter.value += 1
                acquired.value += 1
                in_flight = counter.value
                peak.value = max(peak.value, in_flight)
            log.append((started_s, slot, in_flight))
            time.sleep(rng.uniform(0.002, 0.006))
            with lock:
                counter.value -= 1
    results.put(log)


def test_sum_in_flight_never_exceeds_budget_across_processes(node_dir):
    old_budget, new_budget, processes = 5, 2, 8
    permits = NodePermits(directory=node_dir)
    permits.set_budget(old_budget)
    counter, acquired, peak = (FORK.Value("i", 0, lock=False) for _ in range(3))
    lock, stop, results = FORK.Lock(), FORK.Event(), FORK.Queue()
    children = [FORK.Process(target=_hammer, args=(node_dir, stop, acquired, peak, counter, lock, results, seed))
                for seed in range(processes)]

    def until_acquired(count: int, *, in_flight: int = 0) -> None:
        # Phases end by what the children did, not by the clock: on a loaded machine (a parallel
        # test run, coverage) forked children can take most of a second to start.
        deadline_s = time.monotonic() + 60
        while (acquired.value < count or peak.value < in_flight) and time.monotonic() < deadline_s:
            time.sleep(0.005)

    for child in children:
        child.start()
    until_acquired(60, in_flight=old_budget)  # demand has filled the old budget at least once
    in_flight_at_shrink = permits.in_flight()
    permits.set_budget(new_budget)
    shrunk_s = time.monotonic()
    until_acquired(acquired.value + 60)  # at most 8 of these began before the shrink
    stop.set()
    logs = [entry for _ in children for entry in results.get(timeout=30)]
    for child in children:
        child.join(timeout=30)
        assert child.exitcode == 0
    before = [entry for entry in logs if entry[0] < shrunk_s]
    after = [entry for entry in logs if entry[0] > shrunk_s]  # acquire began after the shrink
    assert len(before) > 20 and len(after) > 20  # both phases really ran
    assert max(n for _, _, n in logs) <= old_budget
    assert max(n for _, _, n in before) == old_budget  # demand really exceeded the budget
    # Permits taken after the shrink use slots below the new budget, and the permits that were
    # in flight at the shrink counted against it: never more than the new budget at once.
    assert all(slot < new_budget for _, slot, _ in after)
    assert max(n for _, _, n in after) <= new_budget
    assert in_flight_at_shrink <= old_budget
    assert permits.in_flight() == 0


def test_shrink_counts_in_flight_permits_against_new_budget(node_dir):
    permits = NodePermits(directory=node_dir, default_budget=6)
    with ExitStack() as outer:
        held = [ExitStack() for _ in range(6)]
        slots = [held[i].enter_context(permits.acquire(timeout_s=0)) for i in range(6)]
        for stack in held:
            outer.push(stack)
        assert sorted(slots) == list(range(6)) and permits.in_flight() == 6
        permits.set_budget(2)
        assert permits.in_flight() == 6  # nothing is revoked
        held[0].close()  # slot 0 is free and below the budget, but 5 are still in flight
        with pytest.raises(TimeoutError):
            with permits.acquire(timeout_s=0):
                pass
        for stack in held[1:5]:
            stack.close()
        assert permits.in_flight() == 1  # only slot 5, taken under the old budget
        with permits.acquire(timeout_s=0) as slot:
            assert slot < 2 and permits.in_flight() == 2
            with pytest.raises(TimeoutError):
                with permits.acquire(timeout_s=0):
                    pass
    assert permits.in_flight() == 0


def test_growing_the_budget_admits_more_at_once(node_dir):
    permits = NodePermits(directory=node_dir, default_budget=1)
    with permits.acquire(timeout_s=0):
        with pytest.raises(TimeoutError):
            with permits.acquire(timeout_s=0):
                pass
        permits.set_budget(3)
        with permits.acquire(timeout_s=0), permits.acquire(timeout_s=0):
            assert permits.in_flight() == 3


def _hold_until_killed(directory, ready):
    permits = NodePermits(directory=directory)
    with permits.acquire():
        ready.set()
        time.sleep(60)


def test_dead_process_leaves_no_stale_permit(node_dir):
    permits = NodePermits(directory=node_dir, default_budget=1)
    ready = FORK.Event()
    child = FORK.Process(target=_hold_until_killed, args=(node_dir, ready))
    child.start()
    assert ready.wait(20)
    assert permits.in_flight() == 1
    with pytest.raises(TimeoutError):
        with permits.acquire(timeout_s=0.05):
            pass
    os.kill(child.pid, signal.SIGKILL)
    child.join(20)
    with permits.acquire(timeout_s=5):  # the kernel dropped the dead process's lock
        assert permits.in_flight() == 1


def test_forked_worker_does_not_keep_a_dead_parents_permit(node_dir):
    # A process holding a permit forks a "DataLoader worker", then dies without releasing. The
    # worker inherited the locked descriptor; if it kept it, the permit would leak until the
    # worker exits. (Plain os.fork: a multiprocessing child's join would wait for the worker.)
    permits = NodePermits(directory=node_dir, default_budget=1)
    read_end, write_end = os.pipe()
    parent = os.fork()
    if parent == 0:
        try:
            with permits.acquire():
                if os.fork() == 0:
                    permits.in_flight()  # the worker's first use (closes inherited locks)
                    os.write(write_end, f"{os.getpid()}\n".encode())
                    time.sleep(60)
                os._exit(0)  # die holding the permit: no release, no unlock
        finally:
            os._exit(0)
    os.close(write_end)
    worker = int(os.read(read_end, 64).decode().split()[0])
    os.close(read_end)
    try:
        os.waitpid(parent, 0)
        with permits.acquire(timeout_s=5):  # the worker still lives; the permit is free anyway
            pass
    finally:
        os.kill(worker, signal.SIGKILL)


def test_waiting_threads_are_served_in_order_without_spinning(node_dir):
    permits = NodePermits(directory=node_dir, default_budget=1)
    order, threads = [], []

    def worker(name):
        with permits.acquire(timeout_s=10):
            order.append(name)
            time.sleep(0.01)

    with permits.acquire():
        for name in range(3):
            thread = threading.Thread(target=worker, args=(name,))
            thread.start()
            threads.append(thread)
            while len(permits._queue) < name + 1:  # enqueue strictly one after another
                time.sleep(0.001)
        cpu_before = time.process_time()
        time.sleep(0.4)
        cpu_waiting = time.process_time() - cpu_before
    for thread in threads:
        thread.join(10)
    assert order == [0, 1, 2]
    assert cpu_waiting < 0.1, f"waiting threads used {cpu_waiting:.3f} s of CPU in 0.4 s"


def test_acquire_times_out_and_validates(node_dir):
    permits = NodePermits(directory=node_dir, default_budget=1)
    with permits.acquire():
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="budget 1"):
            with permits.acquire(timeout_s=0.1):
                pass
        assert 0.09 <= time.monotonic() - started < 1.0
    with pytest.raises(ValueError, match=r"permits must be an int in 1\.\.4096, got 0"):
        permits.set_budget(0)
    with pytest.raises(ValueError, match="got True"):
        permits.set_budget(True)
    with pytest.raises(ValueError, match="timeout_s"):
        with permits.acquire(timeout_s=-1):
            pass
    assert permits.budget() == 1
