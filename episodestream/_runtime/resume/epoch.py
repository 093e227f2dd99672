"""The shared block of a dataset (or mixture): its epoch counter and its loaded resume request, seen alike by
the process that built it and its DataLoader workers (forked, spawned or persistent).

DataLoader workers iterate copies of the dataset, so an epoch counter advanced inside a worker would be
lost when the workers are re-created for the next epoch, ``set_epoch`` in the main process would not
reach persistent workers, and neither would a ``load_state_dict``. Shared memory fixes all three: six
counter slots, and one record of the loaded request (``resume.record``).

The resume lifecycle is one table, ``TRANSITIONS`` (state, event, next state), which every change of the
record goes through (``_step``); ``tests/test_resume_lifecycle.py`` walks each row through the public API.
The record's ``main`` entry is in one of three states:

- ``EMPTY``: nothing to resume; an iteration streams its epoch from the start;
- ``LOADED``: a state of epoch E was loaded and no DataLoader iteration has claimed it yet (the main
  process's own passes read it at each claim and do not change it: a pass stopped early leaves it);
- ``RESUMING``: the workers of one DataLoader iteration claimed epoch E from it; ``passing`` counts those
  that have not run their share to the end (a sibling that starts late must still find the resume point).

A worker's own snapshot (a StatefulDataLoader's, loaded inside worker w) is an entry of its own, ``OWN``,
which only worker w reads. A per-consumer state's position (``consumer``) is read once: by the main
process's next claim, or by the claims of the first DataLoader iteration after the load (``bound``).

The walk of a saved state to its first sample (docs/resume.md, "From ``load_state_dict`` to the first
sample"): ``load_state_dict`` parses and checks it (``Resumable``), then ``load`` writes the record; each
consumer's ``iter()`` claims (``claim``: the epoch and what it resumes, the record's one read); its pass
plans from the claimed request and skips the claimed consumer's samples; the end of the pass
(``finished``) uses the record up.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from dataclasses import dataclass, replace
from multiprocessing import sharedctypes
from multiprocessing.context import get_spawning_popen
from typing import Any

from episodestream._plan.saved_state import ConsumerPosition
from episodestream._runtime.resume.record import Loaded, LoadedRequest, Record, SharedRecord

# The counter slots: the epoch the next iteration streams; the latest one started (-1: none); the epoch
# of the DataLoader iteration whose workers are still claiming, how many of its workers have not claimed
# yet, and how many it has; how many DataLoader iterations claimed an epoch so far (``Claim.iteration``).
_NEXT, _STARTED, _CLAIM_EPOCH, _CLAIMS_LEFT, _CLAIM_WORKERS, _ITERATIONS = range(6)

EMPTY, LOADED, RESUMING, OWN = "EMPTY", "LOADED", "RESUMING", "OWN"

# (state, event, next state): every change of the record. Events:
#   load            load_state_dict() in the main process, of a state partway through its epoch
#   load-nothing    load_state_dict() of a state that finished its epoch or took nothing of it
#   load-own        load_state_dict() inside DataLoader worker w (its own snapshot: an entry of its own)
#   set-same        set_epoch(E), the loaded epoch        set-other: set_epoch() of another epoch
#   claim-main      iter() in the main process (EpisodeLoader, a DataLoader without workers)
#   claim-first     the first worker of a DataLoader iteration claims epoch E
#   claim-sibling   another worker of that iteration claims it
#   claim-own       worker w's iter() after loading its own snapshot
#   finish-main     the main process's pass over E ran to its end
#   finish-worker   a worker's pass over E ran to its end, siblings still running
#   finish-last     the last worker of the claimed iteration ran its share of E to its end
TRANSITIONS: tuple[tuple[str, str, str], ...] = (
    (EMPTY, "load", LOADED),
    (EMPTY, "load-nothing", EMPTY),
    (LOADED, "load", LOADED),
    (LOADED, "load-nothing", EMPTY),
    (RESUMING, "load", LOADED),
    (RESUMING, "load-nothing", EMPTY),
    (EMPTY, "set-other", EMPTY),
    (LOADED, "set-same", LOADED),
    (LOADED, "set-other", EMPTY),
    (RESUMING, "set-same", RESUMING),
    (RESUMING, "set-other", EMPTY),
    (LOADED, "claim-main", LOADED),
    (RESUMING, "claim-main", RESUMING),
    (LOADED, "claim-first", RESUMING),
    (RESUMING, "claim-first", RESUMING),  # a pass stopped early, started again: passing counts afresh
    (RESUMING, "claim-sibling", RESUMING),
    (LOADED, "finish-main", EMPTY),
    (RESUMING, "finish-main", EMPTY),
    (RESUMING, "finish-worker", RESUMING),
    (RESUMING, "finish-last", EMPTY),
    (EMPTY, "load-own", OWN),
    (OWN, "load-own", OWN),
    (OWN, "claim-own", OWN),
    (OWN, "set-same", OWN),
    (OWN, "set-other", EMPTY),
    (OWN, "load", EMPTY),  # a load in the main process replaces every worker's own
)
# A claim or an end of another epoch than the entry's, or a worker's end outside the DataLoader iteration
# that claimed the entry, leaves the record as it is.
_NEXT_STATE = {(state, event): after for state, event, after in TRANSITIONS}


def next_state(state: str, event: str) -> str:
    """``TRANSITIONS``' next state (a pair it lacks is a bug: the table is the rules)."""
    try:
        return _NEXT_STATE[state, event]
    except KeyError:
        raise RuntimeError(f"no resume transition from {state} on {event} (a bug: please report it)") from None


@dataclass(frozen=True)
class Claim:
    """What one consumer's ``iter()`` streams: the epoch, the DataLoader iteration it belongs to (None in
    the main process, or a worker resuming its own snapshot: no turn), the request it resumes (None: the
    epoch from its start), a per-consumer position to continue (None: none) and the batches of a trainer's
    state whose line waits for its consumers (``Resumable._announce_resume``)."""

    epoch: int
    iteration: int | None = None
    request: LoadedRequest | None = None
    consumer: ConsumerPosition | None = None
    announce: int | None = None  # a trainer's state whose line its first consumers log: its batches


class SharedEpoch:
    def __init__(self, epoch: int = 0) -> None:
        self._slots = sharedctypes.RawArray("q", [epoch, -1, -1, 0, 0, 0])
        self.record = SharedRecord()
        # A spawn-context lock: DataLoader workers started with "spawn" or "forkserver" (LeRobot's
        # trainer asks for spawn) receive it pickled, which a fork-context lock refuses; forked
        # workers inherit it either way.
        self._lock = multiprocessing.get_context("spawn").Lock()

    # -- the counter ------------------------------------------------------------------------------

    def get(self) -> int:
        """The epoch the next iteration streams."""
        return self._slots[_NEXT]

    def started(self) -> int | None:
        """The epoch of the latest iteration that started, if any."""
        value = self._slots[_STARTED]
        return None if value < 0 else value

    def start(self, epoch: int) -> None:
        self._slots[_STARTED] = epoch

    def _select(self, epoch: int) -> None:
        self._slots[_NEXT], self._slots[_STARTED], self._slots[_CLAIMS_LEFT] = epoch, -1, 0

    # -- the lifecycle (``TRANSITIONS``) ----------------------------------------------------------

    def set(self, epoch: int) -> None:
        """Select ``epoch`` for the next iteration (set-same / set-other)."""
        with self._lock:
            self._select(epoch)
            record = self.record.read()

            def select(entry: Loaded | None) -> Loaded | None:
                return self._step(entry, "set-same" if entry is not None and entry.epoch == epoch else "set-other")

            workers = {w: kept for w, own in record.workers.items() if (kept := select(own)) is not None}
            self.record.write(record.replace(main=select(record.main), workers=workers))

    def load(self, loaded: Loaded | None, epoch: int) -> int:
        """A state was loaded in the main process (``loaded``: what it resumes; None: nothing, a finished epoch
        or one that took nothing): ``epoch`` streams next. Returns the new count of loads."""
        with self._lock:
            record = self.record.read()
            next_state(EMPTY if record.main is None else record.main.state, "load-nothing" if loaded is None else "load")
            for own in record.workers.values():
                self._step(own, "load")  # every worker's own entry goes
            self.record.write(Record(record.loads + 1, loaded, {}))  # first: one too large changes nothing
            self._select(epoch)
            return record.loads + 1

    def load_own(self, worker: int, loaded: Loaded) -> None:
        """Worker ``worker`` loaded its own snapshot (a StatefulDataLoader's): for its next claim only."""
        with self._lock:
            record = self.record.read()
            own = record.workers.get(worker)
            next_state(EMPTY if own is None else own.state, "load-own")
            self.record.write(record.replace(workers={**record.workers, worker: loaded}))

    def claim(self, worker: int | None, num_workers: int) -> Claim:
        """The epoch, and what it resumes, of one consumer's ``iter()``: the record's one read per consumer.

        In the main process (``worker`` None) the counter says the epoch. A DataLoader worker must not
        read the counter on its own: one that starts late could see it already advanced by a sibling
        that finished its whole share. Every worker calls ``iter(dataset)`` exactly once per iteration
        (when it starts, or when a persistent worker is told a new iteration began), so the first claim
        of an iteration pins the epoch and the next ``num_workers - 1`` claims read it; the iteration's
        number (new for each iteration) orders its workers' downloads (``lookahead.worker_turns``). A
        worker that loaded its own snapshot resumes that snapshot's epoch and claims nothing.
        """
        with self._lock:
            record = self.record.read()
            own = record.workers.get(worker) if worker is not None else None
            if worker is not None and own is not None and own.consumer is not None:
                read = self._step(own, "claim-own", consumer=None)  # its position is read once
                self.record.write(record.replace(workers={**record.workers, worker: read}))
                return Claim(own.epoch, None, own.request, own.consumer)
            main = record.main
            if worker is None:
                epoch = self._slots[_NEXT]
                if main is None or main.epoch != epoch:
                    return Claim(epoch)
                self.record.write(record.replace(main=self._step(main, "claim-main", consumer=None)))
                return Claim(epoch, None, main.request, main.consumer, main.announce)
            slots = self._slots
            first = slots[_CLAIMS_LEFT] <= 0 or slots[_CLAIM_WORKERS] != num_workers
            if first:
                slots[_CLAIM_EPOCH], slots[_CLAIMS_LEFT], slots[_CLAIM_WORKERS] = slots[_NEXT], num_workers, num_workers
                slots[_ITERATIONS] += 1
            slots[_CLAIMS_LEFT] -= 1
            epoch, iteration = slots[_CLAIM_EPOCH], slots[_ITERATIONS]
            if main is None or main.epoch != epoch:
                return Claim(epoch, iteration)
            # A per-consumer position is read by the workers of the first iteration that claims it.
            bound = iteration if first and main.consumer is not None and main.bound is None else main.bound
            consumer = main.consumer if bound == iteration else None
            self.record.write(record.replace(main=self._step(
                main, "claim-first" if first else "claim-sibling", consumer=consumer, bound=bound,
                passing=num_workers if first else main.passing)))
            return Claim(epoch, iteration, main.request, consumer, main.announce)

    def finished(self, epoch: int) -> None:
        """Called by every consumer that reaches the end of ``epoch``: advances the counter once, and
        uses the loaded request of ``epoch`` up once every consumer of its pass got here."""
        import torch.utils.data  # only when iterating: this module loads without torch

        in_worker = torch.utils.data.get_worker_info() is not None
        with self._lock:
            # Below ``epoch`` only where a worker's own snapshot chose the epoch.
            if self._slots[_NEXT] <= epoch:
                self._slots[_NEXT] = epoch + 1
            record = self.record.read()
            main = record.main
            if main is None or main.epoch != epoch:
                return
            if not in_worker:  # the main process is its pass's one consumer
                self.record.write(record.replace(main=self._step(main, "finish-main")))
            elif main.state == RESUMING and self._slots[_CLAIM_EPOCH] == epoch:
                event = "finish-last" if main.passing <= 1 else "finish-worker"
                self.record.write(record.replace(main=self._step(main, event, passing=main.passing - 1)))

    @staticmethod
    def _step(entry: Loaded | None, event: str, **changes: Any) -> Loaded | None:
        """``entry`` after ``event``: in the state ``TRANSITIONS`` gives (None for EMPTY), with ``changes``."""
        state = next_state(EMPTY if entry is None else entry.state, event)
        return None if entry is None or state == EMPTY else replace(entry, state=state, **changes)

    # -- what the record says, for lookups outside a claim ----------------------------------------

    def loaded(self, epoch: int, worker: int | None) -> Loaded | None:
        """The entry ``worker``'s (None: the main process's) lookups of ``epoch`` read: its own snapshot's,
        else the main process's load, while it lives."""
        with self._lock:
            record = self.record.read()
        own = record.workers.get(worker) if worker is not None else None
        for entry in (own, record.main):
            if entry is not None and entry.epoch == epoch:
                return entry
        return None

    def loads(self) -> int:
        """How many states were loaded in the main process (``Record.loads``)."""
        with self._lock:
            return self.record.read().loads

    def __getstate__(self) -> dict:
        # Shared memory can travel only to a process being started (DataLoader workers, fork or
        # spawn); a plain pickle or deepcopy gets private slots at the current values.
        if get_spawning_popen() is not None:
            return {"slots": self._slots, "lock": self._lock, "record": self.record}
        return {"slots": list(self._slots), "lock": None, "record": self.record}

    def __setstate__(self, state: dict) -> None:
        slots, lock = state["slots"], state["lock"]
        self._slots = sharedctypes.RawArray("q", slots) if isinstance(slots, list) else slots
        self._lock = lock if lock is not None else multiprocessing.get_context("spawn").Lock()
        self.record = state["record"]


def raising(error: BaseException) -> Iterator[Any]:
    """An iterator whose first ``next()`` raises ``error``: a persistent worker calls ``iter()``
    where an exception kills the worker and its message is lost, but a failed fetch reaches the
    trainer."""
    raise error
    yield  # a generator: the error comes from the first next()
