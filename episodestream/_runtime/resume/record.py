"""The loaded resume request: one small record in the shared block a dataset (or mixture) and its DataLoader
workers see, written by every ``load_state_dict`` and read by each consumer's claim (``resume.epoch``).

The record is plain data, kept as JSON in a fixed buffer of shared memory (as Mosaic streaming keeps
its resume request where persistent workers read it at their next epoch): a worker started before a
load reads that load like any other, so no copy of a dataset carries a position of its own.

What it holds (``Record``):
- ``loads``: how many states were loaded (a count of ``load_state_dict`` calls in the main process;
  ``EpisodeLoader`` tells by it whether a load came after the batches it counted);
- ``main``: what the main process loaded (``Loaded``), for its own iterations and its DataLoader
  workers', while it lives (``resume.epoch.TRANSITIONS``);
- ``workers``: what DataLoader worker ``w`` loaded itself (torchdata's StatefulDataLoader hands each
  worker its own snapshot there), for that worker only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from multiprocessing import sharedctypes
from multiprocessing.context import get_spawning_popen
from typing import Any

from episodestream._plan.resume import Leg
from episodestream._plan.saved_state import ConsumerPosition

CAPACITY_BYTES = 64 * 1024  # a record of a few legs is ~300 bytes; a mixture of 50 components' legs ~2 KB each


@dataclass(frozen=True)
class LoadedRequest:
    """A loaded state's epoch and the legs it was streamed in (the last: the one it was saved in), and
    the seed and shuffle it was saved with (a dataset replays its legs with those)."""

    epoch: int
    legs: tuple[Leg, ...]
    seed: int | None = None
    shuffle: bool | None = None


@dataclass(frozen=True)
class Loaded:
    """One load, as the record keeps it: its state in the lifecycle (``resume.epoch.RecordState``), the epoch
    it resumes, its request (None: a per-consumer state without legs, which only skips), a per-consumer
    state's position until a consumer's claim reads it, the batches to announce at the first pass (a trainer's
    state whose line waits for its consumers, ``Resumable._announce_resume``), the DataLoader iteration whose
    workers read ``consumer``, and how many workers of the pass resuming from it have not finished."""

    state: str
    epoch: int
    request: LoadedRequest | None = None
    consumer: ConsumerPosition | None = None
    announce: int | None = None
    bound: int | None = None
    passing: int = 0


@dataclass(frozen=True)
class Record:
    loads: int = 0
    main: Loaded | None = None
    workers: dict[int, Loaded] = field(default_factory=dict)

    def replace(self, **changes: Any) -> Record:
        return replace(self, **changes)


def _encode(record: Record) -> bytes:
    def loaded(entry: Loaded | None) -> dict[str, Any] | None:
        return None if entry is None else asdict(entry)

    return json.dumps({"loads": record.loads, "main": loaded(record.main),
                       "workers": {str(w): loaded(e) for w, e in record.workers.items()}},
                      separators=(",", ":")).encode()


def _decode(data: bytes) -> Record:
    if not data:
        return Record()
    raw = json.loads(data)

    def loaded(value: dict[str, Any] | None) -> Loaded | None:
        if value is None:
            return None
        request, consumer = value.pop("request"), value.pop("consumer")
        if request is not None:
            legs = tuple(Leg(**{**leg, "pools": tuple(leg["pools"])}) for leg in request.pop("legs"))
            request = LoadedRequest(legs=legs, **request)
        return Loaded(request=request, consumer=None if consumer is None else ConsumerPosition(**consumer), **value)

    workers = {int(w): loaded(e) for w, e in raw["workers"].items()}
    return Record(raw["loads"], loaded(raw["main"]), {w: e for w, e in workers.items() if e is not None})


class SharedRecord:
    """The record's bytes in shared memory, with a version that changes at every write (callers hold the
    shared block's lock). A plain pickle or deepcopy gets a private record at the current value, as
    ``SharedEpoch`` gets private slots: shared memory travels only to a process being started."""

    def __init__(self, data: bytes = b"") -> None:
        self._header = sharedctypes.RawArray("q", [0, len(data)])  # version, length
        self._bytes = sharedctypes.RawArray("c", CAPACITY_BYTES)
        self._bytes[:len(data)] = data
        self._cache: tuple[int, Record] = (-1, Record())

    def read(self) -> Record:
        version, length = self._header[0], self._header[1]
        if self._cache[0] != version:
            self._cache = (version, _decode(bytes(self._bytes[:length])))
        return self._cache[1]

    def write(self, record: Record) -> None:
        data = _encode(record)
        if len(data) > CAPACITY_BYTES:
            raise ValueError(f"The loaded state's legs need {len(data)} bytes, more than the {CAPACITY_BYTES} "
                             f"the shared resume record holds: the state was resumed elastically too many times "
                             f"in one epoch; start the epoch afresh (set_epoch) or finish it with the run that saved it.")
        self._bytes[:len(data)] = data
        self._header[1] = len(data)
        self._header[0] += 1
        self._cache = (self._header[0], record)

    def __getstate__(self) -> dict:
        if get_spawning_popen() is not None:
            return {"header": self._header, "bytes": self._bytes}
        return {"data": bytes(self._bytes[:self._header[1]])}

    def __setstate__(self, state: dict) -> None:
        if "data" in state:
            self.__init__(state["data"])  # type: ignore[misc]
            return
        self._header, self._bytes = state["header"], state["bytes"]
        self._cache = (-1, Record())
