"""The one resume state type, ``SavedState``: parsed and validated once where a state enters, and
written back by ``to_state``.

A state comes in three formats (docs/resume.md):
- a trainer's state (``stream_state``'s, ``EpisodeLoader.state_dict()``): the stream's
  ``state_dict()`` less its ``consumer``, plus ``batches_consumed``, ``batch_size``, ``num_workers``
  and ``drop_last`` (``TrainerCount``);
- a per-consumer state (``dataset.state_dict()`` itself, what torchdata's StatefulDataLoader saves
  per worker): its ``consumer`` section says where that one consumer stands (``ConsumerPosition``);
- a StatefulDataLoader's whole state: its workers' per-consumer states, each parsed here, made into
  a trainer's by ``_runtime.resume.loader_state`` (which needs the runtime to check every position).

``parse_state`` reads the first two, told apart by their fields, against a ``StateSpec`` (what a
dataset's or a mixture's states look like): the format, then every field's type and range, errors
naming the field (``state['legs'][0]['batch_size']``). What identifies the stream (a dataset's seed,
shuffle and fingerprint; a mixture's seed, weights, stop and components) is compared with the
loading runtime's by ``refuse_mismatches``. Plain data only: no torch, no files.
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from episodestream._base.options import check_bool, check_int
from episodestream._base.warn import warn_user
from episodestream._base.world import World
from episodestream._plan.resume import (MAX_BATCH_SIZE, MAX_BATCHES, MAX_NUM_WORKERS, MAX_WORLD_SIZE, Leg,
                                        check_consumers, read_pools, refuse_other_format)

TRAINER_FIELDS = ("batches_consumed", "batch_size", "num_workers")
CONSUMER_FIELDS = ("epoch", "rank", "world_size", "worker", "num_workers", "samples_yielded")

# How a refusal ends for a Python caller; a command line replaces it with what its user can do.
STRICT_HINT = " Pass strict=False to load it anyway."



@dataclass(frozen=True)
class ConsumerPosition:
    """Where one consumer (a rank's DataLoader worker, or its main process) stands in ``epoch``."""

    epoch: int
    rank: int
    world_size: int
    worker: int
    num_workers: int
    samples_yielded: int

    @classmethod
    def from_state(cls, value: Any, where: str = "state['consumer']") -> ConsumerPosition:
        if not isinstance(value, Mapping) or set(value) != set(CONSUMER_FIELDS):
            raise ValueError(f"{where} must be a dict with keys {sorted(CONSUMER_FIELDS)}, got {value!r:.200}.")
        minimum = {"world_size": 1, "num_workers": 1}
        maximum = {"world_size": MAX_WORLD_SIZE, "num_workers": MAX_NUM_WORKERS}
        position = cls(**{k: check_int(f"{where}[{k!r}]", value[k], minimum=minimum.get(k, 0), maximum=maximum.get(k))
                          for k in CONSUMER_FIELDS})
        # Out of its count, the consumer has no share: planning it failed with a bare IndexError.
        for index, count in (("rank", "world_size"), ("worker", "num_workers")):
            if getattr(position, index) >= getattr(position, count):
                raise ValueError(f"{where}[{index!r}]={getattr(position, index)} must be < {where}[{count!r}]="
                                 f"{getattr(position, count)}: the state is not one a consumer saved; load the state_dict() it returned, unchanged.")
        check_consumers(where, position.world_size, position.num_workers)
        return position

    def to_state(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in CONSUMER_FIELDS}

    def same_consumer(self, world: World) -> bool:
        return (self.rank, self.world_size, self.worker, self.num_workers) == (
            world.rank, world.world_size, world.worker, world.num_workers)


@dataclass(frozen=True)
class TrainerCount:
    """What a trainer adds to a stream's state: the batches it took of the saved epoch (from the
    epoch's start, across resumes), their size, its DataLoader's ``num_workers`` and ``drop_last``."""

    batches_consumed: int
    batch_size: int
    num_workers: int
    drop_last: bool = False




def _check_seed(where: str, value: Any) -> int:
    return check_int(where, value, minimum=0)


def _check_fingerprint(where: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be a dict, got {type(value).__name__} {value!r:.200}.")
    return value


def _check_weights(where: str, value: Any) -> list[float] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(w, numbers.Real) and not isinstance(w, bool) for w in value):
        raise ValueError(f"{where} must be None or a list of numbers, got {value!r:.200}.")
    return value


def _check_stop(where: str, value: Any) -> str | int:
    if isinstance(value, str) and value in ("all", "first"):
        return value
    return check_int(where, value, minimum=1)


# What identifies a dataset's stream, and each field's check.
DATASET_IDENTITY: Mapping[str, Callable[[str, Any], Any]] = {
    "seed": _check_seed, "shuffle": check_bool, "fingerprint": _check_fingerprint}


def _check_components(count: int) -> Callable[[str, Any], list[dict[str, Any]]]:
    def check(where: str, value: Any) -> list[dict[str, Any]]:
        if not isinstance(value, list) or len(value) != count:
            raise ValueError(f"{where} must list {count} components (this mixture's), got {value!r:.200}.")
        return [_identity(component, DATASET_IDENTITY, f"{where}[{i}]") for i, component in enumerate(value)]
    return check


def mixture_identity(components: int) -> Mapping[str, Callable[[str, Any], Any]]:
    """What identifies a mixture's stream of ``components`` datasets, and each field's check."""
    return {"seed": _check_seed, "weights": _check_weights, "stop": _check_stop,
            "components": _check_components(components)}


def _identity(state: Any, checks: Mapping[str, Callable[[str, Any], Any]], where: str) -> dict[str, Any]:
    if not isinstance(state, Mapping):
        raise ValueError(f"{where} must be a dict, got {state!r:.200}.")
    return {key: check(f"{where}[{key!r}]", state.get(key)) for key, check in checks.items()}


@dataclass(frozen=True)
class StateSpec:
    """What one runtime's states look like: their ``format``, what errors call them (``kind``:
    "stream", "mixture"), where they keep their pool sizes (``pools_field``: "episode_pool_size", an
    int, or "pool_sizes", a list of ``components``), how their legs do (``leg_pools_key``), and what
    identifies the stream (``identity``: each field's check)."""

    format: str
    kind: str
    pools_field: str
    leg_pools_key: str
    identity: Mapping[str, Callable[[str, Any], Any]]
    components: int = 1


@dataclass(frozen=True)
class SavedState:
    """A resume state, every field checked: the epoch it names, what identifies its stream, the
    layout it was saved in (``world_size``, ``pools``), the epoch's earlier legs, and either what a
    trainer took (``trainer``) or where one consumer stands (``consumer``); neither: a stream's state
    as ``state_dict()`` makes it before a trainer adds its count."""

    format: str
    epoch: int
    identity: Mapping[str, Any]
    world_size: int
    pools: tuple[int, ...]
    legs: tuple[Leg, ...] = ()
    trainer: TrainerCount | None = None
    consumer: ConsumerPosition | None = None

    @property
    def earlier_batches(self) -> int:
        """The batches of the epoch's earlier legs."""
        return sum(leg.batches for leg in self.legs)

    def stream(self) -> SavedState:
        """This state less its consumer or trainer: what identifies the stream and where its epoch's
        earlier legs left it (the same for every consumer of one run)."""
        return SavedState(self.format, self.epoch, self.identity, self.world_size, self.pools, self.legs)

    def with_trainer(self, trainer: TrainerCount) -> SavedState:
        """This stream's state as a trainer's: ``trainer``'s count, no consumer."""
        return replace(self, trainer=trainer, consumer=None)

    def trainer_legs(self) -> tuple[Leg, ...]:
        """A trainer's state's legs: the saved ones, then the current one holding what
        ``batches_consumed`` (from the epoch's start) leaves; a saved last leg that the saving run
        continued exactly is the same stream as the current one: merged."""
        trainer = self.trainer
        if trainer is None:
            raise ValueError("a per-consumer state has no trainer's legs (a bug: please report it)")
        current = Leg(self.world_size, trainer.num_workers, self.pools, trainer.batch_size, 0, trainer.drop_last)
        earlier = list(self.legs)
        if earlier and earlier[-1].same_stream(current):  # the saving run continued that leg exactly
            last = earlier.pop()
            if (last.batch_size, last.drop_last) != (current.batch_size, current.drop_last):
                raise ValueError(f"The saving run resumed an epoch with batch_size={last.batch_size}, "
                                 f"drop_last={last.drop_last} and continued it with batch_size={current.batch_size}, "
                                 f"drop_last={current.drop_last}; batches_consumed cannot be mapped to samples.")
        batches = trainer.batches_consumed - sum(leg.batches for leg in earlier)
        if batches < 0:
            raise ValueError(f"state['batches_consumed']={trainer.batches_consumed} is fewer than the "
                             f"{trainer.batches_consumed - batches} batches of the epoch's earlier legs: it counts "
                             f"from the start of the epoch.")
        return (*earlier, replace(current, batches=batches))

    def to_state(self, spec: StateSpec) -> dict[str, Any]:
        """The JSON-serialisable dict ``parse_state(..., spec)`` reads back."""
        pools: Any = self.pools[0] if spec.pools_field == "episode_pool_size" else list(self.pools)
        state = {"format": self.format, "epoch": self.epoch, **self.identity, spec.pools_field: pools,
                 "world_size": self.world_size, "legs": [leg.to_state(spec.leg_pools_key) for leg in self.legs]}
        if self.consumer is not None:
            state["consumer"] = self.consumer.to_state()
        if self.trainer is not None:
            state.update(batches_consumed=self.trainer.batches_consumed, batch_size=self.trainer.batch_size,
                         num_workers=self.trainer.num_workers, drop_last=self.trainer.drop_last)
        return state


def parse_state(state: Any, spec: StateSpec) -> SavedState:
    """``state`` (a trainer's or a per-consumer state) as a ``SavedState``, every field checked: an
    error names the field, its value and what it must be, and nothing is left to check later."""
    refuse_other_format(state, spec.format, spec.kind)
    consumer_section = "batches_consumed" not in state and "consumer" in state
    if not consumer_section:
        for key in TRAINER_FIELDS:
            if key not in state:
                raise lacks_trainer_field(key)
    legs = state.get("legs", [])
    if not isinstance(legs, (list, tuple)):
        raise ValueError(f"state['legs'] must be a list of legs, got {legs!r:.200}.")
    saved = SavedState(
        format=spec.format,
        epoch=check_int("state['epoch']", state.get("epoch"), minimum=0),
        identity=_identity(state, spec.identity, "state"),
        world_size=check_int("state['world_size']", state.get("world_size"), minimum=1, maximum=MAX_WORLD_SIZE),
        pools=_pools(state.get(spec.pools_field), spec),
        legs=tuple(Leg.from_state(leg, f"state['legs'][{i}]", spec.leg_pools_key) for i, leg in enumerate(legs)))
    if consumer_section:
        consumer = ConsumerPosition.from_state(state["consumer"])
        if consumer.epoch != saved.epoch:
            raise ValueError(f"state['consumer']['epoch']={consumer.epoch} differs from state['epoch']={saved.epoch}.")
        return replace(saved, consumer=consumer)
    trainer = TrainerCount(
        batches_consumed=check_int("state['batches_consumed']", state["batches_consumed"], minimum=0,
                                   maximum=MAX_BATCHES),
        batch_size=check_int("state['batch_size']", state["batch_size"], minimum=1, maximum=MAX_BATCH_SIZE),
        num_workers=check_int("state['num_workers']", state["num_workers"], minimum=0, maximum=MAX_NUM_WORKERS),
        drop_last=check_bool("state['drop_last']", state.get("drop_last", False)))
    check_consumers("state", saved.world_size, trainer.num_workers)
    return saved.with_trainer(trainer)


def lacks_trainer_field(key: str) -> ValueError:
    """The error for a state that is not a trainer's where one is needed: it lacks ``key``."""
    return ValueError(f"The state lacks {key!r}: add what the trainer knows, e.g. stream_state(loader, "
                      f"batches_consumed) or {{**state, 'batches_consumed': n, 'batch_size': b, 'num_workers': w}}.")


def _pools(value: Any, spec: StateSpec) -> tuple[int, ...]:
    where = f"state[{spec.pools_field!r}]"
    if spec.pools_field == "episode_pool_size":
        return (check_int(where, value, minimum=1),)
    if not isinstance(value, list) or len(value) != spec.components:
        raise ValueError(f"{where} must list {spec.components} ints, got {value!r:.200}.")
    return read_pools(value, where, "pool_sizes")


def identity_differences(saved: Mapping[str, Any], now: Mapping[str, Any],
                         prefix: str = "") -> list[tuple[str, Any, Any]]:
    """``(field, saved, now)`` for every field of ``now`` (a runtime's identity) that ``saved`` (a
    ``SavedState``'s, checked: the same shape) holds otherwise, as they survive a JSON round trip
    (tuples become lists, keys strings). A fingerprint is compared key by key
    (``fingerprint.source``), a mixture's components one by one (``components[1].seed``)."""
    out: list[tuple[str, Any, Any]] = []
    for key, value in now.items():
        name, old = f"{prefix}{key}", saved.get(key)
        if key == "fingerprint":
            out += [(f"{name}.{k}", old.get(k), v) for k, v in value.items() if _differ(old.get(k), v)]
        elif key == "components":
            for i, (old_component, component) in enumerate(zip(old, value)):
                out += identity_differences(old_component, component, f"{name}[{i}].")
        elif _differ(old, value):
            out.append((name, old, value))
    return out


def _differ(saved: Any, now: Any) -> bool:
    return bool(json.loads(json.dumps(saved)) != json.loads(json.dumps(now)))


def refuse_mismatches(differences: Sequence[tuple[str, Any, Any]], *, state: str, what: str, strict: bool) -> None:
    """Name every field of ``differences`` (``identity_differences``): a ValueError, or with
    ``strict=False`` a warning blamed on the user's line (the caller of ``load_state_dict``)."""
    if not differences:
        return
    message = (f"The {state} state does not match this {what}: "
               + "; ".join(f"{name}: saved {saved!r}, this {what} {now!r}" for name, saved, now in differences) + ".")
    if strict:
        raise ValueError(message + STRICT_HINT)
    warn_user(message + " Loading anyway (strict=False).", RuntimeWarning)


def check_consumer_share(samples_yielded: int, share_left: int, *, epoch: int, who: str) -> None:
    """A per-consumer state cannot have yielded more than its share of the epoch held: it would
    load silently and stream nothing."""
    if samples_yielded > share_left:
        raise ValueError(f"state['consumer']['samples_yielded']={samples_yielded} is more than {who} streams of "
                         f"epoch {epoch} ({share_left} samples): the state is not one this consumer saved. A "
                         f"per-consumer state counts the samples its own iteration yielded.")
